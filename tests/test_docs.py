"""The code in docs/ runs as written: each example trains and prints a final score.

Fenced blocks are read by their info string:

- ```python: a script. It runs in a fresh subprocess, in a new temporary directory, and must
  exit 0 and print a line with `final score <number>` (the mean raw score of the last games).
- ```<lang> file=NAME: a file the examples need. It is written as NAME into the directory of
  every script of the same page before the script runs.
- ```python norun: a fragment, shown only.
- ```python tf_agents: a script like the first kind that needs the tf_agents extra (skipped
  without it).
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("docs/extending.md", "docs/architecture.md", "docs/tf_agents.md")
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SCORE = re.compile(r"final score (-?\d+(?:\.\d+)?)")
# Both toy tasks score about 0 (corridor) or -0.6 (Catch) with random actions and 1 at best; the
# examples reach 0.9-1.0. A score above this shows that learning happened.
LEARNED = 0.5


def blocks(page: str) -> tuple[dict[str, str], list[tuple[int, str, bool]]]:
    """The files (name -> text) and the scripts (line, code, needs tf-agents) of a page."""
    with open(os.path.join(ROOT, page)) as handle:
        text = handle.read()
    files, scripts = {}, []
    for match in FENCE.finditer(text):
        language, info, code = match.group(1), match.group(2).split(), match.group(3)
        names = [word.removeprefix("file=") for word in info if word.startswith("file=")]
        if names:
            files[names[0]] = code
        elif language == "python" and "norun" not in info:
            scripts.append((text.count("\n", 0, match.start()) + 1, code, "tf_agents" in info))
    return files, scripts


def examples() -> list:
    """One pytest parameter per script of every page, named after its page and line."""
    params = []
    for page in DOCS:
        if os.path.exists(os.path.join(ROOT, page)):
            files, scripts = blocks(page)
            params += [
                pytest.param(
                    files,
                    code,
                    id=f"{os.path.basename(page)}:{line}",
                    marks=[pytest.mark.tf_agents] if needs_tf_agents else [],
                )
                for line, code, needs_tf_agents in scripts
            ]
    return params


def environment(directory) -> dict:
    """The repository and the examples' own modules on the path; TensorFlow quiet."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    paths = [str(directory), ROOT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def write_files(directory, files: dict[str, str]) -> None:
    for name, code in files.items():
        (directory / name).write_text(code)


def test_pages_have_examples():
    assert [page for page in DOCS if not os.path.exists(os.path.join(ROOT, page))] == []
    files, scripts = blocks("docs/extending.md")
    assert len(scripts) >= 3, "extending.md should hold the three worked examples"
    assert {"corridor.py", "corridor.gin"} <= set(files)


@pytest.mark.parametrize("files, code", examples())
def test_example_runs_and_learns(tmp_path, files, code, request):
    if request.node.get_closest_marker("tf_agents"):
        if importlib.util.find_spec("tf_agents") is None:
            pytest.skip("needs the tfaccel[tf_agents] extra")
    write_files(tmp_path, files)
    (tmp_path / "example.py").write_text(code)
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    scores = SCORE.findall(result.stdout)
    assert scores, f"no 'final score' line in:\n{result.stdout[-2000:]}"
    assert float(scores[-1]) > LEARNED, result.stdout[-2000:]


def test_bin_train_takes_the_example_env_through_gin(tmp_path):
    """extending.md's `bin/train` command: the gin file imports the env module from PYTHONPATH."""
    files, _ = blocks("docs/extending.md")
    write_files(tmp_path, files)
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bin", "train"), "--gin_file=corridor.gin",
         "--gin_bindings=RunConfig.total_frames = 2000", "--root_dir=runs/corridor_bin"],
        cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 2,000 frames" in result.stdout, result.stdout[-2000:]
    config = (tmp_path / "runs" / "corridor_bin" / "operative_config.gin").read_text()
    assert "import corridor" in config and "CorridorConfig.cells = 7" in config
    # Its hints name what plays the policy: tfaccel-eval plays Atari only (it was the hint).
    assert "tfaccel.load_policy(" in result.stdout and "eval --policy_dir" not in result.stdout


# `tests/<file>.py::test_name` in a table cell; a bare `test_name...` cell names a test of the
# file named before it in the same cell.
CITED_TEST = re.compile(r"`(?:(tests/[\w/]+\.py)::)?(test_\w+)(\.\.\.)?(?:\[[^\]`]*\])?`")


def test_every_test_the_troubleshooting_tables_cite_exists():
    """Each row of the bad-input and fault tables is backed by a test: a renamed or removed test
    would leave a row that promises what nothing checks."""
    with open(os.path.join(ROOT, "docs", "troubleshooting.md"), encoding="utf-8") as handle:
        rows = [line for line in handle if line.startswith("| ")]
    cited = 0
    for row in rows:
        path = None
        for match in CITED_TEST.finditer(row):
            path = match.group(1) or path
            if path is None:
                continue  # a bare name before any file: nothing to look in
            with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
                source = handle.read()
            end = "" if match.group(3) else r"\("
            assert re.search(rf"def {match.group(2)}{end}", source), (path, match.group(2))
            cited += 1
    assert cited >= 40, cited  # the tables were found and read


def test_docs_policy_names_every_field_of_the_policy_file():
    """A client written from docs/policy.md alone must find every field an export writes."""
    import json

    from tfaccel.envs.atari import AtariConfig

    with open(os.path.join(ROOT, "docs", "policy.md"), encoding="utf-8") as handle:
        page = handle.read()
    named = set(re.findall(r"`(\w+)`", page))
    fields = set()
    for policy in ("a2c_pong", "c51_pong"):
        with open(os.path.join(ROOT, "pretrained", policy, "tfaccel_policy.json")) as handle:
            metadata = json.load(handle)
        fields |= set(metadata) | set(metadata["extra"]) | set(metadata["outputs"])
        fields |= set(metadata["preprocessing"]) | set(metadata["preprocessing"]["pipeline"])
    fields |= set(AtariConfig(game="pong").describe())  # what a new export writes
    fields -= named
    assert not fields, f"docs/policy.md does not name {sorted(fields)}"


def test_the_shipped_policies_describe_their_preprocessing_as_a_new_export_does():
    """The shipped policies' `pipeline` text was an older one that a client built from it
    alone would follow wrongly on games with lives (the stack zeroed after a lost life, FIRE
    after each one): what a new export writes changed, theirs did not."""
    import json

    from tfaccel.envs.atari import AtariConfig

    described = AtariConfig(game="pong").describe()
    for policy in ("a2c_pong", "c51_pong"):
        with open(os.path.join(ROOT, "pretrained", policy, "tfaccel_policy.json")) as handle:
            preprocessing = json.load(handle)["preprocessing"]
        assert preprocessing == described, policy


def test_docs_policy_resize_gives_tfaccels_frames_number_for_number():
    """docs/policy.md said "in floating point, rounds half up floor(x + 0.5)", but tfaccel
    rounded a float32 product that lands below an exact half at some pixels (Breakout at 84x84:
    a mean of 60.5 became 60), so a client written from the page did not match. Its Python
    resize, run as written, must give tfaccel's frames and the client's."""
    import textwrap

    import numpy as np

    from tfaccel import policy_client
    from tfaccel.envs.frames import Resizer

    with open(os.path.join(ROOT, "docs", "policy.md"), encoding="utf-8") as handle:
        page = handle.read()
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", page, re.MULTILINE | re.DOTALL)
    (code,) = [textwrap.dedent(body) for _, body in blocks if "def resize(" in body]
    namespace = {}
    exec(code, namespace)  # noqa: S102
    rng = np.random.default_rng(0)
    for in_shape, out_shape in (((210, 160), (84, 84)), ((208, 160), (104, 80)), ((9, 7), (4, 3))):
        frame = rng.integers(0, 256, in_shape, dtype=np.uint8)
        from_page = np.array(namespace["resize"](frame.tolist(), *out_shape))
        np.testing.assert_array_equal(Resizer(in_shape, out_shape)(frame), from_page)
        rows = policy_client.area_weights(in_shape[0], out_shape[0])
        cols = policy_client.area_weights(in_shape[1], out_shape[1]).T
        np.testing.assert_array_equal(policy_client.resize(frame, rows, cols), from_page)


# Pages whose commands a reader copies. troubleshooting.md is left out: its commands are the
# mistakes it explains.
COMMAND_PAGES = ("README.md", "benchmarks/README.md") + tuple(
    sorted(
        os.path.relpath(os.path.join(folder, name), ROOT)
        for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
        for name in names
        if name.endswith(".md") and name != "troubleshooting.md"
    )
)
CODE_SPAN = re.compile(r"`([^`]+)`")


def gin_commands() -> list:
    """One pytest parameter per command of a page that names gin files or bindings, in a
    fenced block (lines joined at a trailing backslash) or in a code span of the text, with its
    `--gin_file`s (and the bare `.gin` arguments of a script such as `benchmarks/pong.sh`) and
    its `--gin_bindings`. Placeholders (`<seconds>`) and the files a page's examples write
    (`file=corridor.gin`) are left out."""
    import shlex

    params = []
    for page in COMMAND_PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as handle:
            text = handle.read()
        written = set(blocks(page)[0])
        found = []  # (line, command)
        for match in FENCE.finditer(text):
            start = text.count("\n", 0, match.start()) + 2
            for offset, line in enumerate(match.group(3).split("\n")):
                found.append((start + offset, line))
        prose = FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)
        for match in CODE_SPAN.finditer(prose):
            found.append((prose.count("\n", 0, match.start()) + 1, match.group(1)))
        joined = []  # a fenced command's continuation lines, joined to its first
        for line, command in found:
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + command)
            else:
                joined.append((line, command))
        for line, command in joined:
            if "--gin_" not in command:
                continue
            words = shlex.split(command.replace("\n", " "), comments=True)
            files = [word.split("=", 1)[1] for word in words if word.startswith("--gin_file=")]
            files += [word for word in words if word.endswith(".gin") and word[0] not in "-<"]
            bindings = [w.split("=", 1)[1] for w in words if w.startswith("--gin_bindings=")]
            if set(files) & written or any("<" in name or "=" in name for name in files):
                continue
            bindings = [binding for binding in bindings if "<" not in binding]
            if files or bindings:
                params.append(pytest.param(files, bindings, id=f"{page}:{line}"))
    return params


@pytest.mark.parametrize("files, bindings", gin_commands())
def test_the_commands_of_the_docs_name_shipped_configs_and_valid_bindings(files, bindings):
    """A reader copies these commands: a config renamed or a binding whose parameter went would
    leave a page that fails at its first command. Each is parsed as `tfaccel-train` would."""
    import gin

    from tfaccel import gin_configs

    gin.clear_config()
    try:
        gin_configs.parse(files, bindings)
    finally:
        gin.clear_config()


def test_the_commands_of_the_docs_are_found():
    commands = gin_commands()
    pages = {param.id.split(":")[0] for param in commands}
    assert {"README.md", "docs/results.md", "docs/distributed.md"} <= pages, pages
    assert len(commands) >= 25
