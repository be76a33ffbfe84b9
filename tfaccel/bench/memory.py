"""Memory and process facts for the soak benchmarks: resident sets, /dev/shm, process trees."""

from __future__ import annotations

import os


def rss_mib(pid: int) -> float:
    """The resident set (VmRSS) of process `pid` in MiB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def pss_mib(pid: int) -> float:
    """The proportional set (Pss) of process `pid` in MiB: its resident pages, each page it
    shares with other processes counted as its share; 0 if it is gone or the kernel lacks
    `smaps_rollup`. Summed over processes that share libraries (two TensorFlow learners), PSS
    counts the shared pages once where RSS counts them in each."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0.0


def shm_used_mib() -> float:
    """Space used in /dev/shm, MiB."""
    stats = os.statvfs("/dev/shm")
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize / 2**20


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def state(pid: int) -> str:
    """The process state letter of `pid` (`Z`: a zombie), or '' if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def plot_memory(
    path: str,
    samples: list[dict],
    lines: dict[str, str],
    title: str,
    *,
    in_minutes: bool = True,
    mark: tuple[float, str] | None = None,
) -> None:
    """Draws figures in MiB of `samples` (dicts with `t` in seconds) against time into the PNG
    `path`: one line per `label: key` of `lines`; `mark`, (seconds, label), adds a dotted
    vertical line there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 60 if in_minutes else 1
    figure, axes = plt.subplots(figsize=(6, 3.5))
    times = [s["t"] / scale for s in samples]
    for label, key in lines.items():
        axes.plot(times, [s[key] for s in samples], label=label)
    if mark is not None:
        axes.axvline(mark[0] / scale, color="gray", linestyle=":", label=mark[1])
    axes.set_xlabel("minutes" if in_minutes else "seconds")
    axes.set_ylabel("MiB")
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
