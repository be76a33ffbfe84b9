"""Terminal hygiene for the bin/ commands (no TensorFlow import at module level)."""

from __future__ import annotations

import contextlib
import errno
import os
import re


@contextlib.contextmanager
def stderr_silenced():
    """Sends file descriptor 2 to /dev/null for the duration (C++ logs printed by a library).

    TensorFlow 2.21 prints oneDNN, CUDA-probe and CPU-feature lines on import and on device setup,
    before its logging honours TF_CPP_MIN_LOG_LEVEL; the commands import it inside this context so
    a user error still ends with one line. Python exceptions raised inside are not lost: they are
    printed after the context restores stderr.
    """
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def call_quietly(module: str, name: str, *args):
    """Imports `module` with TensorFlow's C++ start-up lines silenced, then returns
    `module.name(*args)`: the entry of a spawned process whose code imports TensorFlow (the
    asynchronous learners), which would print them while `spawn` unpickles its target."""
    import importlib

    from tfaccel.commands import tensorflow_imported_quietly

    with tensorflow_imported_quietly():
        function = getattr(importlib.import_module(module), name)
    return function(*args)


def set_up_tensorflow(threads: int = 0, make_strategy=None):
    """Sets TensorFlow's thread pools (0: its default, one thread per core) and initializes its
    devices without the start-up log lines. Call before the first TensorFlow op of the process.

    Args:
        threads: intra- and inter-op threads (0: TensorFlow's default).
        make_strategy: builds the `tf.distribute` strategy while devices initialize (it may
            configure logical devices first); None: just initialize them.

    Returns:
        The strategy, or None.
    """
    import tensorflow as tf

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # already initialized in this process (e.g. a second run in tests)
            pass
    with stderr_silenced():
        if make_strategy is not None:
            return make_strategy()
        tf.config.list_logical_devices()
    return None


def io_failure(error: BaseException) -> str:
    """Why a read or write failed, in a few words: `No space left on device` for a full disk (an
    OSError's errno, or TensorFlow's message, which says so at its end), else the first line of
    the message without TensorFlow's `{{function_node ...}}` tag."""
    if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error):
        return "No space left on device"
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", str(error)).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__
