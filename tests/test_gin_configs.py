"""Every shipped gin config parses with unknown bindings as errors, and bare names resolve."""

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
    with pytest.raises(ValueError, match=r"gin file 'nope.gin' not found; .*a2c.gin, a2c_256.gin"):
        gin_configs.path("nope.gin")
    assert len(gin_configs.names()) >= 20 and "distribute/mirrored.gin" in gin_configs.names()


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
        ("train.totl_frames = 1", r"train has no parameter 'totl_frames'; did you mean total_f"),
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
