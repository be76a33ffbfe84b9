"""tfaccel's commands: `tfaccel-train`, `tfaccel-eval`, `tfaccel-plot` and `tfaccel-bench` in any
install (console scripts), and the same as `bin/train`, `bin/eval`, ... in a checkout.

Each command parses its own flags here (the library reads none), prints `--help` with every flag
and exits 0, ends a user error with one line `error: ...` and exit status 1, ends after a Ctrl-C
with one line `stopped by SIGINT ...` and exit status 130 (`tfaccel-train` also after a SIGTERM
that comes before its loop takes the signal over: `stopped by SIGTERM ...`, 143), and keeps
TensorFlow's C++ start-up lines off the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

INTERRUPTED_STATUS = 130  # 128 + SIGINT's number: what a shell reports after a Ctrl-C
TERMINATED_STATUS = 143  # 128 + SIGTERM's number


class Terminated(KeyboardInterrupt):
    """A SIGTERM raised where the command stands (`raise_on_sigterm`): what it started unwinds
    and cleans up as after a Ctrl-C, instead of the process dying where it stood."""

    signal_name = "SIGTERM"  # what a KeyboardInterrupt without this attribute is: SIGINT


def raise_on_sigterm() -> None:
    """From now on, a SIGTERM raises `Terminated` (until a handler of the run's own replaces
    this one: the training loop's saves a checkpoint first)."""

    def handler(number, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def quiet_tensorflow() -> None:
    """TensorFlow's C++ logs at errors only, unless TF_CPP_MIN_LOG_LEVEL says otherwise (set
    before TensorFlow is imported); Python-side absl logging at warnings."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with contextlib.suppress(ImportError):
        from absl import logging

        logging.set_verbosity(logging.WARNING)


@contextlib.contextmanager
def tensorflow_imported_quietly():
    """Imports inside run with the C++ start-up lines (oneDNN, CUDA probes, CPU features) sent
    to /dev/null; Python exceptions raised inside still reach the user."""
    quiet_tensorflow()
    from tfaccel import console

    with console.stderr_silenced():
        yield
    if "tensorflow" in sys.modules:
        _tensorflow_logger_at_warnings(sys.modules["tensorflow"])


_LOGGER_SET = []  # once per process: a level the user sets later is theirs


def _tensorflow_logger_at_warnings(tf) -> None:
    """TensorFlow's Python logger logs at INFO in an interactive session (a notebook), on stdout
    and again through the root logger: each export printed "INFO:tensorflow:Assets written to
    ..." twice between the progress lines. That default of TensorFlow's becomes warnings, as in
    a script, the first time tfaccel imports TensorFlow; a level set before or after is kept."""
    if _LOGGER_SET:
        return
    _LOGGER_SET.append(True)
    logger = tf.get_logger()  # made here first, if not yet, so its own INFO does not come later
    if logger.level == logging.INFO:  # TensorFlow's interactive default (a script's is unset)
        logger.setLevel(logging.WARNING)


def tensorflow_started_quietly() -> None:
    """Imports TensorFlow and sets up its devices (which probes CUDA, loudly) without the C++
    start-up lines: for a command that sets no threads or devices of its own (those call
    `console.set_up_tensorflow` before the first op instead)."""
    with tensorflow_imported_quietly():
        import tensorflow as tf

        tf.config.list_logical_devices()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own: the usage, then the error, exit status 2
        fail(f"{message} (flags are --name=value; {self.prog} --help lists them)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstring as written, and each flag's default where its help does not give it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return text if "default" in text else f"{text} (default: %(default)s)"


def parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose --help shows the command's docstring (its first line, then its usage) and
    each flag's default, and whose errors (a missing or unknown flag, a stray argument) are one
    line and exit status 1."""
    first, _, rest = doc.strip().partition("\n")
    return _Parser(
        description=first,
        epilog=rest.strip("\n").rstrip() or None,  # its examples keep their indentation
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )


def fail(message: str) -> NoReturn:
    """Ends the command with `error: <message>` on one line and exit status 1."""
    sys.exit(f"error: {message}")


def interrupted(detail: str = "", error: BaseException | None = None) -> NoReturn:
    """Ends the command after a Ctrl-C (a KeyboardInterrupt its caller caught) with one line on
    stderr, `stopped by SIGINT` then `detail` (e.g. `after 3 of 10 games`), and exit status 130,
    instead of a traceback; after a SIGTERM (`error` a `Terminated`, or an error whose
    `signal_name` is `SIGTERM`), `stopped by SIGTERM` and 143."""
    terminated = getattr(error, "signal_name", "SIGINT") == "SIGTERM"
    print(f"stopped by {'SIGTERM' if terminated else 'SIGINT'} {detail}".strip(), file=sys.stderr)
    sys.exit(TERMINATED_STATUS if terminated else INTERRUPTED_STATUS)


def exit_with(main: Callable[[], int]) -> NoReturn:
    """Runs a command's `main` and exits with the status it returns; a Ctrl-C or SIGTERM that
    `main` does not handle itself (during TensorFlow's import, say) ends with `interrupted()`."""
    raise_on_sigterm()  # a SIGTERM unwinds as a Ctrl-C does, and says so
    try:
        status = main()
    except KeyboardInterrupt as stop:
        interrupted(error=stop)
    sys.exit(status)


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def sibling(command: str) -> str:
    """How the user calls another tfaccel command from where this one was called: `tfaccel-eval`
    after `tfaccel-train`, `bin/eval` after `bin/train` (a checkout's wrappers)."""
    invoked = sys.argv[0] if sys.argv else ""
    wrapper = os.path.join(os.path.dirname(invoked), command)
    if os.path.basename(os.path.dirname(os.path.abspath(invoked))) == "bin" and os.path.isfile(
        wrapper
    ):
        return wrapper
    return f"tfaccel-{command}"
