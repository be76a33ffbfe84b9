"""The exported policy plays like the in-memory network, without tfaccel, from its json alone."""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import export, policy_client
from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.toy import ScriptedConfig
from tfaccel.networks import PolicyValueNetwork

CLIENT_PATH = policy_client.__file__
PONG = AtariConfig(game="pong")

# Runs in a fresh interpreter that never imports tfaccel: the SavedModel through TensorFlow alone,
# and policy_client.py loaded from its file under another module name.
RELOAD_WITHOUT_TFACCEL = """
import importlib.util, sys
import numpy as np
import tensorflow as tf
policy_dir, observation_path, out_path, client_path = sys.argv[1:]
observation = np.load(observation_path)
model = tf.saved_model.load(policy_dir)
outputs = model.signatures["serving_default"](observation=tf.constant(observation))
spec = importlib.util.spec_from_file_location("standalone_client", client_path)
client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client)
policy, metadata = client.load_policy(policy_dir)
via_client = policy(observation)
np.savez(
    out_path,
    action=outputs["action"].numpy(),
    logits=outputs["logits"].numpy(),
    sampled=outputs["sampled_action"].numpy(),
    client_action=via_client["action"],
    client_logits=via_client["logits"],
)
assert "tfaccel" not in sys.modules, sorted(name for name in sys.modules if "tfaccel" in name)
"""


def pong_network(seed=0):
    """A PolicyValueNetwork for Pong whose actions differ across observations."""
    keras.utils.set_random_seed(seed)
    network = PolicyValueNetwork(PONG(0).spec)
    kernel = network.policy_head.kernel
    kernel.assign(np.random.default_rng(seed).normal(0, 0.3, kernel.shape).astype(np.float32))
    return network


def scripted_network():
    """A small PolicyValueNetwork on 36x36x4 frames, with no Atari preprocessing."""
    return PolicyValueNetwork(ScriptedConfig(height=36, width=36, num_actions=3)(0).spec)


def random_observations(n, shape=(104, 80, 4), seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


@pytest.fixture(scope="module")
def pong_policy(tmp_path_factory):
    network = pong_network()
    path = str(tmp_path_factory.mktemp("run") / "policy")
    export.export_policy(network, PONG, path, extra={"env_frames": np.int64(1234)})
    return network, path


def test_reloaded_without_tfaccel_acts_like_the_network(pong_policy, tmp_path):
    network, path = pong_policy
    observation = random_observations(16)
    np.save(tmp_path / "observation.npy", observation)
    out = tmp_path / "out.npz"
    result = subprocess.run(
        [sys.executable, "-c", RELOAD_WITHOUT_TFACCEL, path]
        + [str(tmp_path / "observation.npy"), str(out), CLIENT_PATH],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = np.load(out)
    logits = network(observation)[0].numpy()  # [B, A]
    np.testing.assert_allclose(reloaded["logits"], logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(reloaded["action"], logits.argmax(-1))
    np.testing.assert_array_equal(reloaded["client_action"], reloaded["action"])
    np.testing.assert_array_equal(reloaded["client_logits"], reloaded["logits"])
    assert len(set(reloaded["action"].tolist())) > 1, "weak test: one action for all inputs"
    assert reloaded["action"].dtype == np.int32 and reloaded["sampled"].dtype == np.int32
    assert ((reloaded["sampled"] >= 0) & (reloaded["sampled"] < 6)).all()


def test_metadata_describes_observations_and_preprocessing(pong_policy):
    _, path = pong_policy
    metadata = json.loads(open(os.path.join(path, "tfaccel_policy.json")).read())
    assert metadata["format"] == "tfaccel_policy" and metadata["format_version"] == 1
    assert metadata["tfaccel_version"] == "0.1.0"
    assert metadata["observation"] == {"shape": [104, 80, 4], "dtype": "uint8"}
    assert metadata["num_actions"] == 6 and metadata["head"] == "logits"
    assert metadata["outputs"] == ["action", "logits", "sampled_action"]
    assert metadata["preprocessing"] == PONG.describe()
    assert metadata["preprocessing"]["action_names"][:2] == ["NOOP", "FIRE"]
    assert metadata["extra"] == {"env_frames": 1234}
    _, loaded = export.load_policy(path)
    assert loaded == metadata


def test_observation_of_wrong_shape_or_dtype_is_named(pong_policy):
    policy, _ = export.load_policy(pong_policy[1])
    assert policy(random_observations(2))["action"].shape == (2,)
    expected = r"observation must be uint8 \[B, 104, 80, 4\]"
    with pytest.raises(ValueError, match=expected + r".*got uint8 \[104, 80, 4\]"):
        policy(random_observations(1)[0])
    with pytest.raises(ValueError, match=expected + r".*got float32 \[2, 104, 80, 4\]"):
        policy(random_observations(2).astype(np.float32))
    with pytest.raises(ValueError, match=expected + r".*got uint8 \[2, 84, 84, 4\]"):
        policy(random_observations(2, (84, 84, 4)))


def test_nan_weight_refuses_export(tmp_path):
    network = scripted_network()
    bias = np.zeros(network.value_head.bias.shape, np.float32)
    bias[0] = np.nan
    network.value_head.bias.assign(bias)
    with pytest.raises(ValueError, match=r"variable .*value/bias holds NaN or inf \(1 of 1"):
        export.export_policy(network, None, str(tmp_path / "policy"))
    assert os.listdir(tmp_path) == []


def test_foreign_or_missing_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        export.load_policy(str(tmp_path / "nothing"))
    (tmp_path / "notes.txt").write_text("my files")
    with pytest.raises(ValueError, match="is not a tfaccel policy: it has no tfaccel_policy.json"):
        export.load_policy(str(tmp_path))
    with pytest.raises(ValueError, match="refusing to replace .*: it is not a tfaccel policy"):
        export.export_policy(scripted_network(), None, str(tmp_path))
    assert os.listdir(tmp_path) == ["notes.txt"]
    half = tmp_path / "half"
    half.mkdir()
    (half / "tfaccel_policy.json").write_text(json.dumps({"format": "tfaccel_policy"}))
    with pytest.raises(ValueError, match="it lacks num_actions, head, observation, which a cl"):
        export.load_policy(str(half))
    whole = tmp_path / "whole"
    export.export_policy(scripted_network(), None, str(whole))
    (half / "tfaccel_policy.json").write_text((whole / "tfaccel_policy.json").read_text())
    with pytest.raises(ValueError, match="it has no saved_model.pb"):
        export.load_policy(str(half))
    (half / "tfaccel_policy.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a tfaccel policy file"):
        export.load_policy(str(half))


def outputs_of(path, observation):
    policy, _ = export.load_policy(path)
    return policy(observation)["logits"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_export_replaces_an_old_policy_atomically(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(export, "_exchange", lambda a, b: False)
    path, observation = str(tmp_path / "policy"), random_observations(4, (36, 36, 4))
    old, new = scripted_network(), scripted_network()
    assert not np.allclose(old(observation)[0], new(observation)[0], atol=1e-3)  # told apart
    export.export_policy(old, None, path)
    export.export_policy(new, None, path)
    np.testing.assert_allclose(outputs_of(path, observation), new(observation)[0], atol=1e-5)
    assert os.listdir(tmp_path) == ["policy"]  # no temp dirs, no old copy

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        export.export_policy(old, None, path)
    np.testing.assert_allclose(outputs_of(path, observation), new(observation)[0], atol=1e-5)
    assert os.listdir(tmp_path) == ["policy"]


class CategoricalNetwork(keras.Model):
    """probabilities [B, A, N] from one dense layer: for the distributional export."""

    def __init__(self, spec, atoms):
        super().__init__()
        self.spec, self.atoms = spec, atoms
        self.dense = keras.layers.Dense(spec.num_actions * atoms)
        self.build((None, *spec.observation.shape))

    def build(self, input_shape):
        self.dense.build((None, int(np.prod(input_shape[1:]))))

    def call(self, observation):
        x = keras.ops.reshape(keras.ops.cast(observation, "float32") / 255.0, (-1, 8 * 6 * 4))
        logits = keras.ops.reshape(self.dense(x), (-1, self.spec.num_actions, self.atoms))
        return keras.ops.softmax(logits, axis=-1)  # [B, A, N]


def test_distributional_and_q_value_heads(tmp_path):
    spec = ScriptedConfig(num_actions=4)(0).spec
    network = CategoricalNetwork(spec, atoms=5)
    support = np.linspace(-2.0, 2.0, 5)
    path = str(tmp_path / "c51")
    export.export_policy(network, None, path, head="probabilities", support=support)
    policy, metadata = export.load_policy(path)
    observation = random_observations(32, (8, 6, 4))
    outputs = policy(observation)
    probabilities = network(observation).numpy()  # [B, A, N]
    np.testing.assert_allclose(outputs["probabilities"], probabilities, atol=1e-6)
    expected_q = (probabilities * support.astype(np.float32)).sum(-1)  # [B, A]
    np.testing.assert_array_equal(outputs["action"], expected_q.argmax(-1))
    assert metadata["support"] == support.tolist() and metadata["outputs"] == [
        "action",
        "probabilities",
    ]

    def q_head(output):  # the DQN family's reuse: pick and name another head
        return "q_values", keras.ops.sum(output * support.astype(np.float32), axis=-1)

    export.export_policy(network, None, path, head="q_values", head_fn=q_head)
    policy, metadata = export.load_policy(path)
    outputs = policy(observation)
    np.testing.assert_allclose(outputs["q_values"], expected_q, atol=1e-5)
    assert metadata["head"] == "q_values" and "sampled_action" not in outputs
    with pytest.raises(ValueError, match="head_fn returned head 'q_values', but head is 'logits'"):
        export.export_policy(network, None, path, head_fn=q_head)


def test_mismatched_env_and_network_are_named(tmp_path):
    with pytest.raises(ValueError, match="observation shapes disagree"):
        export.export_policy(scripted_network(), PONG, str(tmp_path / "policy"))
    breakout = AtariConfig(game="breakout")
    with pytest.raises(ValueError, match="the network has 6 actions but breakout has 4"):
        export.export_policy(pong_network(), breakout, str(tmp_path / "policy"))


@pytest.mark.parametrize(
    "config",
    [
        AtariConfig(game="pong", max_agent_steps=70),  # x2 fast path; 30 no-ops drawn alike
        AtariConfig.nature(game="breakout", fire_on_reset=True, sticky_action_prob=0.25),
        AtariConfig(game="air_raid", max_agent_steps=150),  # a 250-row screen
    ],
    ids=["pong-104x80", "breakout-84x84-sticky-fire", "air_raid-250-rows"],
)
def test_client_observations_equal_the_env_frame_by_frame(config):
    seed, steps = 5, 700
    env = config.evaluation()(seed)
    game = policy_client.AtariGame(config.describe(), seed)
    np.testing.assert_array_equal(game.reset(), env.reset())
    rng = np.random.default_rng(0)
    games_over = []
    for _ in range(steps):
        action = int(rng.integers(env.spec.num_actions))
        step = env.step(action)
        observation, reward = game.step(action)
        np.testing.assert_array_equal(observation, step.observation)
        assert reward == step.reward and game.over == env.game.over
        if game.over:
            assert (game.score, game.length) == (env.game.score, env.game.length)
            games_over.append(game.length)
            np.testing.assert_array_equal(game.reset(), env.reset())
    assert len(games_over) >= 2  # Pong by its time limit, Breakout by losing all lives
    assert observation[..., -1].std() > 0


def test_a_policy_of_vector_observations_takes_them_as_they_are(tmp_path):
    from tfaccel.envs.toy import CatchConfig
    from tfaccel.networks import mlp_torso

    keras.utils.set_random_seed(1)
    network = PolicyValueNetwork(CatchConfig(vector=True)(0).spec, torso=mlp_torso)
    kernel = network.policy_head.kernel
    kernel.assign(np.random.default_rng(1).normal(0, 3.0, kernel.shape).astype(np.float32))
    path = str(tmp_path / "policy")
    export.export_policy(network, None, path)
    policy, metadata = policy_client.load_policy(path)
    assert metadata["observation"] == {"shape": [3], "dtype": "float32"}
    observation = np.random.default_rng(0).random((64, 3), np.float32)
    expected = network(observation)[0].numpy().argmax(-1)
    assert len(set(expected.tolist())) > 1, "weak test: one action for all inputs"
    np.testing.assert_array_equal(policy(observation)["action"], expected)
    with pytest.raises(ValueError, match=r"observation must be float32 \[B, 3\]"):
        policy(observation.astype(np.uint8))


def test_the_policy_file_says_in_words_how_observations_are_made(tmp_path):
    """A client in another language needs the grayscale source, the resize kernel and its
    rounding, which frames are max-pooled, the stack order and its zero fill."""
    from tfaccel.envs.atari import AtariConfig

    description = AtariConfig(game="pong").describe()
    pipeline = description["pipeline"]
    assert description["screen"] == [210, 160]
    assert "getScreenGrayscale" in pipeline["grayscale"]
    assert (
        "(a + b + c + d + 2) // 4" in pipeline["resize"] and "floor(x + 0.5)" in pipeline["resize"]
    )
    assert "last two frames of the skip" in pipeline["max_pool"]
    assert "oldest first" in pipeline["stack"] and "zeros" in pipeline["stack"]
    assert {"reset", "crop", "frame_skip", "sticky_actions", "scaling"} <= set(pipeline)


@pytest.mark.parametrize(
    "where, value, message",
    [
        (("num_actions",), "6", 'num_actions is "6", which is not a whole number'),
        (("observation", "shape"), [84, "84", 4], 'observation.shape is [84, "84", 4]'),
        (("head",), "logit", 'head is "logit"; one of'),
        (
            ("preprocessing", "frame_skip"),
            4.5,
            "preprocessing.frame_skip is 4.5, which is not a whole",
        ),
        (
            ("preprocessing", "max_pool"),
            "yes",
            'preprocessing.max_pool is "yes", which is not true',
        ),
        (
            ("preprocessing", "sticky_action_prob"),
            True,
            "sticky_action_prob is true, which is not a number",
        ),
    ],
)
def test_a_policy_file_with_a_field_of_the_wrong_type_is_one_line(
    pong_policy, tmp_path, where, value, message
):
    """A hand-edited or foreign tfaccel_policy.json failed deep in the client with a traceback."""
    import shutil

    copy = tmp_path / "policy"
    shutil.copytree(pong_policy[1], copy)
    metadata = json.loads((copy / "tfaccel_policy.json").read_text())
    entry = metadata
    for key in where[:-1]:
        entry = entry[key]
    entry[where[-1]] = value
    (copy / "tfaccel_policy.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match=re.escape(message)):
        policy_client.read_metadata(str(copy))
    with pytest.raises(ValueError, match=re.escape(message)):
        export.load_policy(str(copy))


@pytest.mark.parametrize(
    "edits, message, read",
    [
        ({("preprocessing", "stack"): 0}, "preprocessing.stack is 0: it must be 1 or more", True),
        (  # the client stacked 4 frames for a model of 3: a shape error on every call
            {("observation", "shape"): [104, 80, 3]},
            "observation.shape is [104, 80, 3], but the preprocessing makes [height, width, "
            "stack] = [104, 80, 4]: the two must agree",
            True,
        ),
        (
            {("observation", "shape"): [84, 84, 4], ("preprocessing", "height"): 84,
             ("preprocessing", "width"): 84},
            "observation is uint8 [84, 84, 4], but the SavedModel takes uint8 [104, 80, 4]: the "
            "json is not this model's",
            False,
        ),  # fmt: skip
        (  # "action 1 outside [0, 1)" at the first step
            {("preprocessing", "action_names"): ["NOOP"]},
            "num_actions is 6, but preprocessing.action_names names 1: the two must agree",
            True,
        ),
        (  # accepted: the games played with 3 of the model's 6 actions
            {("num_actions",): 3, ("preprocessing", "action_names"): ["NOOP", "FIRE", "RIGHT"]},
            "num_actions is 3, but the SavedModel's logits has 6: the json is not this model's",
            False,
        ),
        (  # accepted, exit 0
            {("head",): "q_values"},
            'head is "q_values", but the SavedModel outputs action, logits, sampled_action: the '
            "json is not this model's",
            False,
        ),
        ({("num_actions",): 0}, "num_actions is 0: a policy has 1 action or more", True),
        ({("head",): None}, "head is null", True),
    ],
    ids=["stack_0", "shape_vs_stack", "shape_vs_model", "names", "actions_vs_model", "head",
         "no_actions", "null_head"],
)  # fmt: skip
def test_a_policy_file_that_contradicts_itself_or_its_model_is_one_line(
    pong_policy, tmp_path, edits, message, read
):
    """An edited tfaccel_policy.json was an IndexError or a 258-line TensorFlow TypeError, a
    misleading one-line error, or no error at all."""
    import shutil

    copy = tmp_path / "policy"
    shutil.copytree(pong_policy[1], copy)
    metadata = json.loads((copy / "tfaccel_policy.json").read_text())
    for where, value in edits.items():
        entry = metadata
        for key in where[:-1]:
            entry = entry[key]
        entry[where[-1]] = value
    (copy / "tfaccel_policy.json").write_text(json.dumps(metadata))
    if read:  # told from the file alone
        with pytest.raises(ValueError, match=re.escape(message)):
            policy_client.read_metadata(str(copy))
    else:
        policy_client.read_metadata(str(copy))
    with pytest.raises(ValueError, match=re.escape(message)):
        policy_client.load_policy(str(copy))


def test_a_policy_that_cannot_be_written_is_one_line_and_the_old_one_stays(tmp_path, monkeypatch):
    """A full disk during the export was a 78-line traceback."""
    path = str(tmp_path / "policy")
    export.export_policy(scripted_network(), None, path)
    before = (tmp_path / "policy" / "tfaccel_policy.json").read_text()

    def full_disk(*args, **kwargs):
        # as TensorFlow words it: its op's tag, the file, and the cause at the end
        raise tf.errors.ResourceExhaustedError(None, None, (
            "{{function_node __wrapped__SaveV2_dtypes_12_device_/job:localhost/replica:0/task:0/"
            "device:CPU:0}} " + path + "/variables/variables_temp/part-00000-of-00001.data-00000"
            "-of-00001.tempstate1234567890; No space left on device [Op:SaveV2] name: "
        ))  # fmt: skip

    monkeypatch.setattr(tf.saved_model, "save", full_disk)
    with pytest.raises(export.WriteError, match=re.escape(
        f"cannot write the policy to {path} (ResourceExhaustedError: No space left on device); "
        "the policy there before is intact"
    )):  # fmt: skip
        export.export_policy(scripted_network(), None, path)
    assert (tmp_path / "policy" / "tfaccel_policy.json").read_text() == before
    assert os.listdir(tmp_path) == ["policy"]  # no part left beside it


def test_evaluating_a_non_atari_policy_says_what_works_instead(tmp_path):
    """It said the policy was "exported without an env_config", which names no user setting."""
    from tfaccel import evaluate

    path = str(tmp_path / "policy")
    export.export_policy(scripted_network(), None, path)
    with pytest.raises(ValueError, match=r"is the policy of a non-Atari env .* evaluation plays "
                       r"Atari games only: play it on your env with tfaccel.load_policy"):  # fmt: skip
        evaluate.evaluate(path, episodes=1)
    played = subprocess.run(
        [sys.executable, "-m", "tfaccel.policy_client", path],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert played.returncode != 0 and "is the policy of a non-Atari env" in played.stderr
