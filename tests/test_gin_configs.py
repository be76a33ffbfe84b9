"""Every shipped gin config parses with unknown bindings as errors, and bare names resolve."""

import re

import gin
import pytest

from tfaccel import gin_configs


@pytest.mark.parametrize("name", gin_configs.names())
def test_every_config_parses(name):
    gin.clear_config()
    try:
        gin_configs.parse([name])
    finally:
        gin.clear_config()


def test_a_missing_config_lists_the_shipped_ones():
    with pytest.raises(ValueError, match=r"gin file 'nope.gin' not found; .*a2c.gin, a2c_bf16.gin"):
        gin_configs.path("nope.gin")
    assert len(gin_configs.names()) >= 20 and "distribute/mirrored.gin" in gin_configs.names()


def test_a_directory_or_a_binary_file_as_a_config_is_named(tmp_path):
    """A directory was "not found"; a binary file was gin's UnicodeDecodeError without its
    name."""
    with pytest.raises(ValueError, match=f"gin file '{tmp_path}' is a directory: give a .gin"):
        gin_configs.path(str(tmp_path))
    binary = tmp_path / "model.gin"
    binary.write_bytes(b"train.seed = 1\n\x89PNG\xff")
    with pytest.raises(ValueError, match=f"gin file '{binary}' is not text .not UTF-8 at byte 15"):
        gin_configs.path(str(binary))


def test_a_bare_name_finds_a_config_in_a_folder_and_a_path_wins():
    """Presets are at the top; toy and testing configs in folders, found by their bare name
    as long as one folder has it (the contract: `--gin_file=smoke.gin` after any config)."""
    assert gin_configs.path("smoke.gin").endswith("testing/smoke.gin")
    assert gin_configs.path("catch_a2c.gin").endswith("toy/catch_a2c.gin")
    assert gin_configs.path("reference/c51_dopamine.gin").endswith("reference/c51_dopamine.gin")
    assert gin_configs.path("categorical_dqn.gin") == f"{gin_configs.DIRECTORY}/categorical_dqn.gin"


def test_a_bare_name_in_two_folders_is_ambiguous(tmp_path, monkeypatch):
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.gin").write_text("")
    monkeypatch.setattr(gin_configs, "DIRECTORY", str(tmp_path))
    with pytest.raises(ValueError, match=r"'x.gin' is ambiguous: name one of one/x.gin, two/x.gin"):
        gin_configs.path("x.gin")


def test_includes_log_no_error_looking_lines(caplog):
    gin.clear_config()
    try:
        with caplog.at_level("INFO"):
            gin_configs.parse(["catch_a3c.gin"])  # includes catch_a2c.gin, which includes a2c.gin
    finally:
        gin.clear_config()
    assert not [record for record in caplog.records if "Path not found" in record.getMessage()]


@pytest.mark.parametrize(
    "binding, message",
    [  # a function's parameters, a config class's fields, and a name close to none of them
        ("train.horizn = 1", r"train has no parameter 'horizn'; did you mean horizon\?"),
        (
            "RunConfig.total_frame = 1",
            r"RunConfig has no parameter 'total_frame'; did you mean total_frames or",
        ),
        ("AtariConfig.gam = 'pong'", r"did you mean game\? its parameters: game, frame_skip,"),
        ("DQNConfig.zzz = 1", r"DQNConfig has no parameter 'zzz'; its parameters: double,"),
    ],
)
def test_an_unknown_parameter_is_named_with_the_valid_ones(binding, message):
    gin.clear_config()
    try:
        with pytest.raises(ValueError, match=message):
            gin_configs.parse(["dqn.gin"], [binding])
    finally:
        gin.clear_config()


def test_a_package_named_like_a_config_folder_does_not_break_includes(tmp_path, monkeypatch):
    """Gin looks each include up as a Python package first: with a folder `reference/` on the
    path (benchmarks/ has one), `include 'reference/x.gin'` failed with a TypeError."""
    for folder in ("reference", "toy", "distribute"):
        (tmp_path / folder).mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("categorical_dqn.gin", "catch_a3c.gin", "rainbow.gin"):
        gin.clear_config()
        gin_configs.parse([name])
    gin.clear_config()


@pytest.mark.parametrize(
    "config, binding, message",
    [  # renamed since an earlier version: the new name
        ("dqn.gin", "train.total_frames = 1", "train.total_frames is now RunConfig.total_frames"),
        ("dqn.gin", "train_off_policy.num_workers = 1",
         "train_off_policy.num_workers is now PoolConfig."),
        ("dqn.gin", "make_pool.max_restarts = 1",
         "make_pool.max_restarts is now PoolConfig.max_restarts"),
        # a shared setting of the wrong type: what it must be
        ("dqn.gin", "RunConfig.total_frames = 'many'",
         "RunConfig.total_frames = 'many': it must be an int"),
        ("dqn.gin", "PoolConfig.envs_per_worker = 2.5",
         "PoolConfig.envs_per_worker = 2.5: it must be an int"),
        ("dqn.gin", "RunConfig.max_wall_seconds = '1h'",
         "RunConfig.max_wall_seconds = '1h': it must be a "),
        # a reference of the wrong kind, which failed later with a traceback: "'CatchConfig'
        # object has no attribute 'spec'" (the class, not a config), "'list' object is not
        # callable" (the torso's layers, not its factory)
        ("catch_a2c.gin", "train.env = @CatchConfig",
         "train.env = @CatchConfig: that is the class; the trainer takes a config made from it: "
         "@CatchConfig()"),
        ("catch_a2c.gin", "train.algorithm = @A2CConfig", "@A2CConfig: that is the class"),
        ("catch_a2c.gin", "train.torso = @a3c_torso()",
         "train.torso = @a3c_torso(): the trainer calls the factory itself: @a3c_torso, without "
         "the parentheses"),
        ("catch_a2c.gin", "train.make_optimizer = @make_adam()",
         "@make_adam, without the parentheses"),
        # a parameter without its configurable: gin took it as a macro nothing used, and the
        # check of the bindings' types failed on it, `Could not find total_frames in the Gin
        # registry`, naming no valid binding
        ("dqn.gin", "total_frames = 5",
         "total_frames = ... binds no configurable (gin reads it as a macro that nothing uses): "
         "write RunConfig.total_frames = ...; configurables with a parameter 'total_frames': "
         "RunConfig"),
    ],
)  # fmt: skip
def test_a_renamed_mistyped_or_wrong_kind_of_setting_is_one_line(config, binding, message):
    gin.clear_config()
    try:
        with pytest.raises(ValueError, match=re.escape(message)):
            gin_configs.parse([config], [binding])
    finally:
        gin.clear_config()


def test_a_binding_gin_cannot_parse_is_quoted():
    """It was `Couldn't parse statement, expected ':' or '='. (line 1)`, naming no binding."""
    with pytest.raises(SyntaxError, match=re.escape(
        "Couldn't parse statement, expected ':' or '=' in the binding 'RunConfig.total_frames 5'"
    )):  # fmt: skip
        gin_configs.parse(["a2c.gin"], ["RunConfig.seed = 1", "RunConfig.total_frames 5"])
    gin.clear_config()


@pytest.mark.parametrize("value", ["", "@", "%"])
def test_a_binding_without_a_value_is_quoted(value):
    """Gin gives no text for these: it was `Unable to parse value. (line 2)`."""
    binding = f"RunConfig.total_frames = {value}"
    with pytest.raises(SyntaxError, match=re.escape(f"in the binding {binding.strip()!r}")):
        gin_configs.parse(["a2c.gin"], ["RunConfig.seed = 1", binding])
    gin.clear_config()


def test_an_unclosed_bracket_names_its_file_or_binding(tmp_path):
    """It was a traceback of tokenize's `EOF in multi-line statement`."""
    binding = "RunConfig.total_frames = [1,"
    with pytest.raises(SyntaxError, match=re.escape(
        f"the binding {binding!r} leaves a bracket open at its end: close each (, [ and {{"
    )):  # fmt: skip
        gin_configs.parse(["a2c.gin"], ["RunConfig.seed = 1", binding])
    gin.clear_config()
    mine = tmp_path / "mine.gin"
    mine.write_text("RunConfig.seed = 1\nRunConfig.total_frames = (5,\n")
    with pytest.raises(SyntaxError, match=re.escape(f"gin file {str(mine)!r} leaves a bracket")):
        gin_configs.parse(["a2c.gin", str(mine)])
    gin.clear_config()
    with pytest.raises(SyntaxError, match="leaves a triple-quoted string open at its end"):
        gin_configs.parse(["a2c.gin"], ['AtariConfig.game = """pong'])
    gin.clear_config()


def test_a_macro_that_a_binding_uses_is_gins_own_feature(tmp_path):
    """Any macro, `GAME = 'breakout'`, failed the check of the bindings' types."""
    gin.clear_config()
    try:
        gin_configs.parse(["a2c.gin"], ["GAME = 'breakout'", "AtariConfig.game = %GAME",
                                        "UNUSED_NAME = 3"])  # fmt: skip
        assert gin.query_parameter("%GAME") == "breakout"
        # A macro named like a parameter, used in a file whose binding the command overrides.
        gin.clear_config()
        mine = tmp_path / "mine.gin"
        mine.write_text("include 'a2c.gin'\ndiscount = 0.9\nA2CConfig.discount = %discount\n")
        gin_configs.parse([str(mine)], ["A2CConfig.discount = 0.95"])
        assert gin.query_parameter("A2CConfig.discount") == 0.95
    finally:
        gin.clear_config()


def test_an_unquoted_string_says_how_values_are_written():
    with pytest.raises(SyntaxError, match=re.escape(
        "the value 'pong' is not a Python literal: strings need quotes (AtariConfig.game = 'pong')"
    )):  # fmt: skip
        gin_configs.parse(["a2c.gin"], ["AtariConfig.game = pong"])


def test_a_missing_include_is_named_like_a_missing_config(tmp_path):
    """It ended with gin's "Unable to open file: ..., Searched config paths: ['', ...]"."""
    config = tmp_path / "mine.gin"
    config.write_text("include 'toy/catch_ppo2.gin'\n")
    with pytest.raises(ValueError, match=r"included gin file 'toy/catch_ppo2.gin' not found .*; "
                       r"configs in gin_configs/: a2c.gin"):  # fmt: skip
        gin_configs.parse([str(config)])


@pytest.mark.parametrize(
    "configs, bindings, idle",
    [
        (["a2c.gin"], ["train_off_policy.batch_size = 64", "train.horizon = 5"],
         ["warning: train_off_policy.batch_size = 64 changes nothing: this config trains with "
          "train (on-policy); its settings are train.*"]),
        (["dqn.gin"], ["train.horizon = 5", "train_off_policy.batch_size = 64"],
         ["warning: train.horizon = 5 changes nothing: this config trains with train_off_policy "
          "(off-policy); its settings are train_off_policy.*"]),
        (["a3c.gin"], ["train.horizon = 5", "train_async.learners = 2"], []),
        (["a3c.gin"], ["train_off_policy.n_step = 3"],
         ["warning: train_off_policy.n_step = 3 changes nothing: this config trains with "
          "train_async (on-policy); its settings are train.* and train_async.*"]),
    ],
)  # fmt: skip
def test_a_binding_of_a_trainer_the_config_does_not_run_is_warned_about(configs, bindings, idle):
    """`train_off_policy.batch_size = 64` under a2c.gin was taken without a word (smoke.gin
    binds both trainers, so gin cannot refuse it) and changed nothing."""
    from tfaccel import trainers

    gin.clear_config()
    try:
        gin_configs.parse([*configs, "smoke.gin"], bindings)
        assert trainers.idle_binding_warnings(bindings) == idle
        assert trainers.idle_binding_warnings([]) == []  # smoke.gin's own are not the user's
    finally:
        gin.clear_config()
