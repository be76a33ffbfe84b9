"""tfaccel's gin configs (this directory; `gin_configs/` at the top of a checkout links here).

They ship with the package, so an installed tfaccel finds them too:

    from tfaccel import gin_configs
    gin_configs.parse(["catch_a2c.gin"], ["RunConfig.total_frames = 20_000"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import io
import logging
import os
import pathlib
import re
import tokenize
from collections.abc import Sequence

DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The configs here, e.g. `a2c.gin`, `distribute/mirrored.gin`."""
    found = []
    for folder, _, files in os.walk(DIRECTORY):
        relative = os.path.relpath(folder, DIRECTORY)
        found += [os.path.normpath(os.path.join(relative, f)) for f in files if f.endswith(".gin")]
    return sorted(found)


def path(name: str) -> str:
    """`name` itself if it is a file, else the config of that name here: `reference/x.gin`, or
    a bare `x.gin` at the top (the presets) or, if only one folder has it, in a folder (`smoke.gin`
    is `testing/smoke.gin`, `catch_a2c.gin` is `toy/catch_a2c.gin`).

    Raises:
        ValueError: none exists, or a bare name is in several folders (the message lists them).
    """
    if os.path.isfile(name):
        return _readable(name)
    if os.path.isdir(name):
        raise ValueError(f"gin file {name!r} is a directory: give a .gin file")
    candidate = os.path.join(DIRECTORY, name)
    if os.path.isfile(candidate):
        return candidate
    alike = [found for found in names() if os.path.basename(found) == name]
    if len(alike) == 1:
        return os.path.join(DIRECTORY, alike[0])
    if alike:
        raise ValueError(f"gin file {name!r} is ambiguous: name one of {', '.join(alike)}")
    raise ValueError(f"gin file {name!r} not found; configs in gin_configs/: {', '.join(names())}")


def _readable(name: str) -> str:
    """`name`, after checking that it is text that can be read (gin's own errors for a binary
    file or a missing permission do not name the file)."""
    try:
        with open(name, encoding="utf-8") as handle:
            handle.read()
    except UnicodeDecodeError as error:
        raise ValueError(
            f"gin file {name!r} is not text (not UTF-8 at byte {error.start}): give a .gin file"
        ) from None
    except OSError as error:
        raise ValueError(f"cannot read gin file {name!r}: {error.strerror or error}") from None
    return name


def parse(files: Sequence[str], bindings: Sequence[str] = ()) -> None:
    """Parses `files` (paths, or names of the configs here) and `bindings` into gin, with this
    directory on gin's search path (for `include 'a2c.gin'`); unknown bindings are errors.
    Registers tfaccel's configurables first."""
    import gin

    from tfaccel import trainers  # noqa: F401  (registers the configurables)

    check_one_algorithm(files)
    gin.add_config_file_search_path(DIRECTORY)
    # Gin looks each `include` up as a Python resource first and logs an error-looking
    # "Path not found" before it finds the file on the search path: not a problem, not shown.
    root = logging.getLogger()
    root.addFilter(_not_a_resource_lookup)
    try:
        gin.parse_config_files_and_bindings([path(f) for f in files], bindings, skip_unknown=False)
    except ValueError as error:
        raise with_valid_parameters(error) from None
    except SyntaxError as error:
        if "malformed node" in str(error):
            raise not_a_literal(error) from None
        if error.filename is None:  # in a binding: gin's line of the bindings, joined by \n
            text = error.text or _line("\n".join(bindings), error.lineno)
            raise SyntaxError(f"{error.msg.rstrip('.')} in the binding {text.strip()!r}") from None
        raise error from None
    except tokenize.TokenError:  # an unclosed bracket or quote runs to the end of its text
        raise SyntaxError(_unclosed(files, bindings)) from None
    except OSError as error:  # an `include` of a file that is nowhere on the search path
        missing = re.match(r"Unable to open file: (.+?)\. Searched config paths", str(error))
        if missing is None:
            raise
        raise ValueError(
            f"included gin file {missing.group(1)!r} not found (an include is looked up from "
            f"the working directory, then in gin_configs/); configs in gin_configs/: "
            f"{', '.join(names())}"
        ) from None
    finally:
        root.removeFilter(_not_a_resource_lookup)
    check_binding_types()
    for binding in bindings:
        if macro := re.match(r"\s*(\w+)\s*=", binding):
            _check_macro(macro.group(1), files, bindings)


def _line(text: str, lineno: int | None) -> str:
    """Line `lineno` (from 1) of `text`, or "" when there is no such line."""
    lines = text.splitlines()
    return lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else ""


def _unclosed(files: Sequence[str], bindings: Sequence[str]) -> str:
    """The message for tokenize's error at the end of a text: which file or binding leaves a
    bracket or a triple-quoted string open (gin reads each file, then all bindings as one
    text). Files are read one at a time, up to the first that fails."""
    for where, text in _texts(files, bindings):
        try:
            list(tokenize.generate_tokens(io.StringIO(text).readline))
        except tokenize.TokenError as error:
            if "string" in str(error):
                return f"{where} leaves a triple-quoted string open at its end: close it"
            return f"{where} leaves a bracket open at its end: close each (, [ and {{"
    return "a gin file or binding leaves a bracket or a triple-quoted string open at its end"


def _texts(files: Sequence[str], bindings: Sequence[str]):
    """(where, text) of each gin file, read when reached, then of each binding."""
    for name in files:
        yield f"gin file {name!r}", pathlib.Path(path(name)).read_text(encoding="utf-8")
    for binding in bindings:
        yield f"the binding {binding.strip()!r}", binding


def check_one_algorithm(files: Sequence[str]) -> None:
    """Raises a one-line ValueError when `files` name two of the shipped algorithm configs (the
    presets, reference/ and toy/): gin would let the last override the first, silently."""
    algorithms = [
        name
        for name in files
        if not os.path.isfile(name)
        and not name.startswith(("distribute/", "testing/", "./"))
        and os.path.basename(path(name)) != "smoke.gin"
        and not os.path.relpath(path(name), DIRECTORY).startswith(("distribute", "testing"))
    ]
    if len(algorithms) > 1:
        raise ValueError(
            f"two algorithm configs, {' and '.join(algorithms)}: give one (settings and "
            "modifiers such as smoke.gin or distribute/mirrored.gin go after it)"
        )


# What a parameter annotated with one of these types accepts (an int where a float is asked).
_ACCEPTED = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}


def check_binding_types() -> None:
    """Checks each bound value of a configurable function against its parameter: the type it is
    annotated with (int, float, bool or str), or, for a parameter that takes a factory or a
    function (no simple annotation; a required or callable default), that a reference
    (`@AtariConfig()`) was bound, not a number or a string, and of the kind the trainers take
    (`_check_reference`). None and macros are left alone.

    Raises:
        ValueError: `selector.name = value` is of another type (naming what it must be).
    """
    import typing

    import gin
    from gin import config_parser

    text = gin.config_str()
    for statement in config_parser.ConfigParser(text, _LiteralDelegate()):
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        if not statement.arg_name:  # a macro, `NAME = value`, which bindings use as %NAME
            continue
        configurable = gin.get_configurable(statement.selector)
        value, name = statement.value, f"{statement.selector}.{statement.arg_name}"
        checked = inspect.isfunction(configurable) or dataclasses.is_dataclass(configurable)
        trainer = statement.selector.rpartition(".")[2] in ("train", "train_off_policy")
        if isinstance(value, _Reference) and trainer:
            _check_reference(name, statement.arg_name, value)
        if not checked or value is None or isinstance(value, _Reference):
            continue
        function = inspect.unwrap(configurable)  # a dataclass: its fields' annotations
        try:
            wanted = typing.get_type_hints(function).get(statement.arg_name)
        except (NameError, TypeError):
            wanted = None
        accepted = _ACCEPTED.get(wanted)
        if accepted:
            if not isinstance(value, accepted) or (wanted is int and isinstance(value, bool)):
                article = "an" if wanted.__name__[0] in "aeiou" else "a"
                raise ValueError(f"{name} = {value!r}: it must be {article} {wanted.__name__}")
            continue
        parameter = inspect.signature(function).parameters.get(statement.arg_name)
        default = parameter.default if parameter else None
        if default is gin.REQUIRED or callable(default):
            raise ValueError(
                f"{name} = {value!r}: it takes a reference to a function or factory, e.g. "
                "@AtariConfig() or @a3c_torso, not a literal"
            )


@dataclasses.dataclass(frozen=True)
class _Reference:
    """A `@name` (`evaluate` False) or `@name()` value, as `_LiteralDelegate` reads it."""

    name: str
    evaluate: bool


# The trainers' parameters that take a config object (`@AtariConfig()`, not the class) and
# those that take a factory the trainer calls (`@nature_torso`, not what calling it returns).
_TAKES_AN_INSTANCE = ("env", "algorithm")
_TAKES_A_FACTORY = ("torso", "make_optimizer")


def _check_reference(name: str, parameter: str, reference: _Reference) -> None:
    """A reference bound to a trainer's `parameter` that takes the other kind: a config class
    without its parentheses, or a factory with them (either failed deep in the run with a
    traceback)."""
    import gin

    try:
        target = gin.get_configurable(reference.name)
    except ValueError:  # an unknown name: gin's own error names it
        return
    if parameter in _TAKES_AN_INSTANCE and inspect.isclass(target) and not reference.evaluate:
        raise ValueError(
            f"{name} = @{reference.name}: that is the class; the trainer takes a config made "
            f"from it: @{reference.name}()"
        )
    if parameter in _TAKES_A_FACTORY and reference.evaluate:
        raise ValueError(
            f"{name} = @{reference.name}(): the trainer calls the factory itself: "
            f"@{reference.name}, without the parentheses"
        )


class _LiteralDelegate:
    """Parses a gin file's values as literals; references become `_Reference`s (macros too, as
    an unknown reference)."""

    def configurable_reference(self, scoped_name, evaluate):
        return _Reference(scoped_name, evaluate)

    def macro(self, name):
        return _Reference("%" + name, False)


# Bindings that were renamed, old name -> new name (CHANGELOG.md): the settings both trainers
# share are bound once, on `RunConfig` and `PoolConfig`, no longer on each trainer.
_SHARED = {
    "RunConfig": ("total_frames", "log_interval_frames", "checkpoint_interval_frames",
                  "eval_episodes", "max_wall_seconds", "seed", "on_nonfinite", "tf_threads"),
    "PoolConfig": ("num_workers", "envs_per_worker", "num_groups", "worker_niceness"),
}  # fmt: skip
RENAMED = {
    f"{trainer}.{name}": f"{new}.{name}"
    for new, names in _SHARED.items()
    for name in names
    for trainer in ("train", "train_off_policy")
} | {
    f"make_pool.{name}": f"PoolConfig.{name}"
    for name in ("max_restarts", "restart_window", "timeout")
}


def no_algorithm(error: RuntimeError, first: str = "--gin_file list") -> ValueError | None:
    """Gin's error when no config gave the trainer its env and loss (`Required bindings ...`),
    naming the configs to start `first` with; None for any other RuntimeError."""
    if not str(error).startswith("Required bindings"):
        return None
    algorithms = [name for name in names() if "/" not in name]
    line = str(error).strip().splitlines()[0]
    return ValueError(
        f"{line}: start the {first} with an algorithm's config, e.g. categorical_dqn.gin; "
        f"configs: {', '.join(algorithms)}"
    )


def not_a_literal(error: SyntaxError) -> SyntaxError:
    """Gin's error for a value that is neither a Python literal nor a reference (an unquoted
    string), saying how a value is written."""
    token = re.search(r"Failed to parse token '(.*)'", str(error))
    shown = f" {token.group(1)!r}" if token else ""
    return SyntaxError(
        f"the value{shown} is not a Python literal: strings need quotes (AtariConfig.game = "
        "'pong'), configurables a leading @ (train.torso = @nature_torso)"
    )


def with_valid_parameters(error: ValueError) -> ValueError:
    """Gin's error for a binding of a parameter that does not exist, with the configurable's
    parameters (the closest first); any other error as it is."""
    import gin

    missing = re.match(r"No configurable matching '(.+)'", str(error))
    if missing:
        return _with_valid_configurables(error, missing.group(1))
    unknown = re.match(r"Configurable '(.+)' doesn't have a parameter named '(.+)'", str(error))
    if not unknown:
        return error
    selector, name = unknown.groups()
    if f"{selector}.{name}" in RENAMED:
        return ValueError(
            f"{selector}.{name} is now {RENAMED[f'{selector}.{name}']} (the settings every "
            "trainer shares are bound once; CHANGELOG.md lists the renamed bindings)"
        )
    parameters = _parameters(gin.get_configurable(selector))
    close = difflib.get_close_matches(name, parameters, n=3)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    return ValueError(
        f"{selector} has no parameter {name!r}; {guess}its parameters: {', '.join(parameters)}"
    )


def _parameters(configurable) -> list[str]:
    """The names a gin binding of `configurable` (a function or a class) can set."""
    if dataclasses.is_dataclass(configurable):  # tfaccel's configs (the class's own signature
        return [f.name for f in dataclasses.fields(configurable) if f.init]  # is gin's)
    return [
        parameter.name
        for parameter in inspect.signature(configurable).parameters.values()
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]


def _selectors() -> list[str] | None:
    """The names of tfaccel's (and the user's) configurables in gin's registry, which is
    private: None when it cannot be read."""
    from gin import config as gin_config

    try:
        selectors = gin_config._REGISTRY._selector_map
    except AttributeError:
        return None
    return sorted({s.split(".")[-1] for s in selectors if not s.startswith("gin.")})


def _check_macro(name: str, files: Sequence[str], bindings: Sequence[str]) -> None:
    """Raises a one-line ValueError for a macro given as a binding (`NAME = value`) that no
    config or binding uses (`%NAME`) and that names a parameter of a configurable:
    `total_frames = 5`, meant as `RunConfig.total_frames = 5`, which gin takes as a macro and
    ignores. (A macro the user's code reads with `gin.query_parameter` is best set in a file.)"""
    import gin

    texts = [*bindings, gin.config_str()]
    for name_or_path in files:
        with contextlib.suppress(OSError):
            with open(path(name_or_path)) as handle:
                texts.append(handle.read())
    if re.search(rf"%{re.escape(name)}\b", "\n".join(texts)):
        return
    owners = []
    for selector in _selectors() or ():
        with contextlib.suppress(
            ValueError, TypeError, KeyError
        ):  # shared by two modules; a builtin
            if name in _parameters(gin.get_configurable(selector)):
                owners.append(selector)
    if owners:
        raise ValueError(
            f"{name} = ... binds no configurable (gin reads it as a macro that nothing uses): "
            f"write {owners[0]}.{name} = ...; configurables with a parameter {name!r}: "
            f"{', '.join(owners)}"
        )


def _with_valid_configurables(error: ValueError, name: str) -> ValueError:
    """Gin's error for a binding of a configurable that does not exist, with the closest names
    of those registered and the list (gin's registry is private: without it, the error as is)."""
    moved = sorted(old for old in RENAMED if old.startswith(f"{name}."))
    if moved:  # a configurable of an earlier version whose settings all moved
        return ValueError(
            f"{name} is no longer a configurable: "
            + ", ".join(f"{old} is now {RENAMED[old]}" for old in moved)
        )
    names = _selectors()
    if names is None:
        return error
    close = difflib.get_close_matches(name, names, n=3)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    return ValueError(f"no configurable named {name!r}; {guess}configurables: {', '.join(names)}")


def _not_a_resource_lookup(record: logging.LogRecord) -> bool:
    return record.module != "resource_reader"
