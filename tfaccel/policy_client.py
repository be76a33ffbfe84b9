"""Play an exported tfaccel policy with TensorFlow, numpy and ale-py only: no tfaccel needed.

A policy directory (written by `tfaccel.export.export_policy`, e.g. `RUN_DIR/policy/`) holds a
SavedModel and `tfaccel_policy.json`. The SavedModel's `serving_default` signature takes
`observation`, uint8 [B, H, W, C] (preprocessed, stacked frames), and returns `action` int32 [B]
(greedy), the raw head (`logits`, `q_values` or `probabilities`) and, for `logits`,
`sampled_action`. The json says how the frames were made (its `preprocessing` entry: game, frame
skip, max over the last two frames, crop, size, stack, action names, ...). This file rebuilds that
preprocessing with ale-py and gives the same observations, number for number, as tfaccel's own
`AtariConfig(...).evaluation()` env with the same seed.

It imports nothing from tfaccel, so it can be copied out of the repository and used on its own:

    policy, metadata = load_policy("run/policy")
    game = AtariGame(metadata["preprocessing"], seed=0)
    observation = game.reset()
    while not game.over:
        action = policy(observation[None])["action"][0]
        observation, reward = game.step(action)
    print(game.score, game.length)

or from a shell: `python policy_client.py run/policy --episodes=3` (inside the tfaccel
repository: `python -m tfaccel.policy_client run/policy`).

TensorFlow is imported when a policy is loaded, not before, so a wrong directory is reported
before TensorFlow's start-up messages and the games run without it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import ale_py
import numpy as np
from ale_py import roms

POLICY_FILE = "tfaccel_policy.json"
FORMAT = "tfaccel_policy"
FORMAT_VERSION = 1
HEADS = ("logits", "q_values", "probabilities")
PREPROCESSING_KEYS = (
    "game",
    "frame_skip",
    "max_pool",
    "crop_top",
    "crop_bottom",
    "height",
    "width",
    "stack",
    "noop_max",
    "fire_on_reset",
    "sticky_action_prob",
    "max_agent_steps",
    "action_names",
)


def read_metadata(policy_dir: str) -> dict:
    """Reads and checks `tfaccel_policy.json` of a policy directory.

    Raises:
        ValueError: the directory is missing, or it is not a tfaccel policy.
    """
    if not isinstance(policy_dir, (str, os.PathLike)):
        raise ValueError(f"policy_dir must be a directory path, got {policy_dir!r}")
    if not os.path.exists(policy_dir):
        shipped = os.path.basename(os.path.dirname(os.path.normpath(policy_dir))) == "pretrained"
        raise ValueError(
            f"policy directory {policy_dir} does not exist"
            + (  # a pip install has the commands, not the repository's folders
                "; the pretrained policies come with a checkout of tfaccel's repository, not "
                "with a pip install: give the path of its pretrained/ folder"
                if shipped
                else ""
            )
        )
    if not os.path.isdir(policy_dir):
        raise ValueError(f"policy directory {policy_dir} is not a directory")
    path = os.path.join(policy_dir, POLICY_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"{policy_dir} is not a tfaccel policy: it has no {POLICY_FILE} "
            "(policies are written by tfaccel.export.export_policy, e.g. RUN_DIR/policy)"
        )
    try:
        with open(path) as handle:
            metadata = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f'{path} is not a tfaccel policy file (no "format": "{FORMAT}")')
    if metadata.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {metadata['format_version']}; this client reads up to "
            f"{FORMAT_VERSION}: use a newer policy_client.py"
        )
    _check_types(metadata, path)
    _check_agreement(metadata, path)
    return metadata


# The fields a client reads, by the JSON type each must have (int: a whole number; float: any
# number). `preprocessing` is null for a policy of a non-Atari env.
_TYPES = {"num_actions": int, "head": str, "observation": dict}
_OBSERVATION_TYPES = {"shape": list, "dtype": str}
_PREPROCESSING_TYPES = {
    "game": str, "frame_skip": int, "max_pool": bool, "crop_top": int, "crop_bottom": int,
    "height": int, "width": int, "stack": int, "noop_max": int, "fire_on_reset": bool,
    "sticky_action_prob": float, "max_agent_steps": int, "action_names": list,
}  # fmt: skip


def _check_types(metadata: dict, path: str) -> None:
    """Raises a one-line ValueError naming the first field of `metadata` of the wrong type (a
    hand edit, another program's file): it would fail deep inside the client otherwise."""

    def wrong(value, wanted) -> bool:
        if wanted in (int, float):  # JSON's true and false are not numbers here
            return isinstance(value, bool) or not isinstance(
                value, int if wanted is int else (int, float)
            )
        return not isinstance(value, wanted)

    def check(entries: dict, types: dict, where: str) -> None:
        for key, wanted in types.items():
            if key in entries and wrong(entries[key], wanted):  # a missing one: where needed
                raise ValueError(
                    f"{path}: {where}{key} is {json.dumps(entries[key])}, which is not "
                    f"{_JSON_NAMES[wanted]}"
                )

    missing = [key for key in _TYPES if key not in metadata]
    observation = metadata.get("observation")
    if isinstance(observation, dict) and "shape" not in observation:
        missing.append("observation.shape")
    if missing:
        raise ValueError(f"{path}: it lacks {', '.join(missing)}, which a client needs")
    check(metadata, _TYPES, "")
    check(metadata["observation"] if isinstance(metadata.get("observation"), dict) else {},
          _OBSERVATION_TYPES, "observation.")  # fmt: skip
    shape = metadata.get("observation", {}).get("shape", [])
    if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in shape):
        raise ValueError(f"{path}: observation.shape is {json.dumps(shape)}: sizes must be > 0")
    if metadata.get("head") not in (None, *HEADS):
        raise ValueError(f"{path}: head is {json.dumps(metadata['head'])}; one of {list(HEADS)}")
    preprocessing = metadata.get("preprocessing")
    if preprocessing is not None:
        if not isinstance(preprocessing, dict):
            raise ValueError(f"{path}: preprocessing must be an object or null")
        check(preprocessing, _PREPROCESSING_TYPES, "preprocessing.")


def _check_agreement(metadata: dict, path: str) -> None:
    """Raises a one-line ValueError where fields of `metadata` contradict each other (a hand
    edit): the game would make observations the model does not take, or actions it lacks."""
    num_actions = metadata.get("num_actions")
    if num_actions is not None and num_actions < 1:
        raise ValueError(f"{path}: num_actions is {num_actions}: a policy has 1 action or more")
    preprocessing = metadata.get("preprocessing")
    if not preprocessing:
        return
    sizes = [preprocessing.get(key) for key in ("height", "width", "stack")]
    for key, size in zip(("height", "width", "stack"), sizes, strict=True):
        if size is not None and size < 1:
            raise ValueError(f"{path}: preprocessing.{key} is {size}: it must be 1 or more")
    shape = metadata.get("observation", {}).get("shape")
    if shape is not None and None not in sizes and list(shape) != sizes:
        raise ValueError(
            f"{path}: observation.shape is {json.dumps(shape)}, but the preprocessing makes "
            f"[height, width, stack] = {json.dumps(sizes)}: the two must agree"
        )
    names = preprocessing.get("action_names")
    if isinstance(names, list) and num_actions is not None and len(names) != num_actions:
        raise ValueError(
            f"{path}: num_actions is {num_actions}, but preprocessing.action_names names "
            f"{len(names)}: the two must agree"
        )


def _check_model(signature: Any, metadata: dict, policy_dir: str) -> None:
    """Raises a one-line ValueError where the SavedModel's signature contradicts
    `tfaccel_policy.json` (a json edited or copied from another policy)."""
    path = os.path.join(policy_dir, POLICY_FILE)
    spec = signature.structured_input_signature[1].get("observation")
    if spec is None:
        raise ValueError(
            f"{policy_dir} is not a tfaccel policy: its signature takes no observation"
        )
    taken = [spec.dtype.name, spec.shape.as_list()[1:]]
    described = [metadata["observation"].get("dtype", "uint8"), metadata["observation"]["shape"]]
    if taken != described:
        raise ValueError(
            f"{path}: observation is {described[0]} {json.dumps(described[1])}, but the "
            f"SavedModel takes {taken[0]} {json.dumps(taken[1])}: the json is not this model's"
        )
    outputs = signature.structured_outputs
    head = metadata["head"]
    if head not in outputs:
        raise ValueError(
            f"{path}: head is {json.dumps(head)}, but the SavedModel outputs "
            f"{', '.join(sorted(outputs))}: the json is not this model's"
        )
    shape = outputs[head].shape  # [B, A] or, for probabilities, [B, A, N]
    actions = shape[1] if shape.rank is not None and shape.rank >= 2 else None
    if actions is not None and actions != metadata["num_actions"]:
        raise ValueError(
            f"{path}: num_actions is {metadata['num_actions']}, but the SavedModel's {head} has "
            f"{actions}: the json is not this model's"
        )


_JSON_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string",
               list: "a list", dict: "an object"}  # fmt: skip


class Policy:
    """A loaded SavedModel policy: `policy(observation)` -> dict of numpy outputs.

    Attributes:
        metadata: the contents of `tfaccel_policy.json`.
        observation_shape: (H, W, C) of one observation.
        num_actions: size of the discrete action set.
        head: name of the raw head output (`logits`, `q_values` or `probabilities`).
    """

    def __init__(self, model: Any, signature: Any, metadata: dict):
        self._model = model  # keeps the loaded variables alive as long as the signature
        self._signature = signature
        self.metadata = metadata
        self.observation_shape = tuple(metadata["observation"]["shape"])
        self.observation_dtype = np.dtype(metadata["observation"].get("dtype", "uint8"))
        self.num_actions = int(metadata["num_actions"])
        self.head = metadata["head"]

    def __call__(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        """Runs the policy on a batch of observations.

        Args:
            observation: uint8 [B, H, W, C], preprocessed and stacked as the metadata describes.

        Returns:
            `action` int32 [B] (greedy), the raw head, and `sampled_action` int32 [B] for logits
            (empty arrays for B = 0).

        Raises:
            ValueError: the observation has the wrong shape or dtype.
        """
        observation = np.asarray(observation)
        expected = (None, *self.observation_shape)
        if observation.dtype != self.observation_dtype or observation.shape[1:] != (
            self.observation_shape
        ):
            raise ValueError(
                f"observation must be {self.observation_dtype} {_shape_text(expected)} (a batch "
                f"of the env's observations, preprocessed and stacked as the policy's json says), "
                f"got {observation.dtype} {_shape_text(observation.shape)}"
            )
        if len(observation) == 0:
            # TensorFlow's CPU convolution fails on an empty batch: the outputs of one
            # observation, cut to none, give the empty arrays with their dtypes and shapes.
            one = np.zeros((1, *self.observation_shape), self.observation_dtype)
            outputs = self._signature(observation=one)
            return {name: value.numpy()[:0] for name, value in outputs.items()}
        outputs = self._signature(observation=observation)
        return {name: value.numpy() for name, value in outputs.items()}


def _shape_text(shape) -> str:
    return "[" + ", ".join("B" if n is None else str(n) for n in shape) + "]"


def load_policy(policy_dir: str) -> tuple[Policy, dict]:
    """Loads a policy directory with `tf.saved_model.load` alone.

    Args:
        policy_dir: a directory written by `tfaccel.export.export_policy`.

    Returns:
        (policy, metadata): `policy(observation [B, H, W, C] uint8)` returns a dict of numpy
        outputs; `metadata` is the contents of `tfaccel_policy.json`.

    Raises:
        ValueError: the directory is missing, or it is not a loadable tfaccel policy.
    """
    metadata = read_metadata(policy_dir)
    if not os.path.isfile(os.path.join(policy_dir, "saved_model.pb")):
        raise ValueError(f"{policy_dir} is not a tfaccel policy: it has no saved_model.pb")
    import tensorflow as tf  # here, not at the top: see the module docstring

    try:
        model = tf.saved_model.load(policy_dir)
    except Exception as error:  # TensorFlow raises many types for a damaged SavedModel
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(
            f"cannot load the SavedModel in {policy_dir}: {type(error).__name__}: {first_line}"
        ) from error
    signature = model.signatures.get("serving_default")
    if signature is None:
        raise ValueError(f"{policy_dir} is not a tfaccel policy: no serving_default signature")
    _check_model(signature, metadata, policy_dir)
    return Policy(model, signature, metadata), metadata


def area_weights(n_in: int, n_out: int) -> np.ndarray:
    """Integer weights [n_out, n_in]: how much of input cell j output cell i covers.

    On a grid of n_in * n_out units, output cell i spans [i * n_in, (i + 1) * n_in) and input
    cell j spans [j * n_out, (j + 1) * n_out); the weight is the length of their overlap, so each
    row adds up to n_in. Example: `area_weights(3, 2)` is `[[2, 1, 0], [0, 1, 2]]`.
    """
    weights = np.zeros((n_out, n_in), np.int64)
    for i in range(n_out):
        lo, hi = i * n_in, (i + 1) * n_in
        for j in range(lo // n_out, min(-(-hi // n_out), n_in)):
            weights[i, j] = min(hi, (j + 1) * n_out) - max(lo, j * n_out)
    return weights


def resize(frame: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Area resize of a [h, w] uint8 frame by `rows` = `area_weights(h, H)` and `cols` =
    `area_weights(w, W).T`: the exact mean of each output pixel's area, halves rounded up.

    Each pixel is (2 * t + h * w) // (2 * h * w), t = (rows @ frame @ cols)[i, l], a whole number
    of at most 255 * h * w that float64 holds exactly in any order of addition. An exact x2
    reduction is the same as summing 2x2 blocks in integers: (a + b + c + d + 2) // 4.
    """
    (height, h), (w, width) = rows.shape, cols.shape
    if (h, w) == (height, width):
        return frame
    if (h, w) == (2 * height, 2 * width):
        pairs = frame[0::2].astype(np.uint16) + frame[1::2]  # [H, w]
        blocks = pairs[:, 0::2] + pairs[:, 1::2]  # [H, W]
        return ((blocks + 2) >> 2).astype(np.uint8)
    rows, cols = np.asarray(rows, np.float64), np.asarray(cols, np.float64)
    sums = (rows @ frame.astype(np.float64) @ cols).astype(np.int64)
    return ((2 * sums + h * w) // (2 * h * w)).astype(np.uint8)  # [H, W]


class AtariGame:
    """Full games of one ALE game, preprocessed as a policy's `tfaccel_policy.json` describes.

    No episodic life and raw rewards (tfaccel's evaluation protocol). With the same settings and
    seed it gives the observations of tfaccel's `AtariConfig(...).evaluation()` env: the ALE gets
    `random_seed = seed % (2**31 - 1)`, and the no-ops at a game start are drawn from
    `numpy.random.default_rng(seed)`.

    Attributes:
        over: the last step ended the game (game over or the time limit); call `reset()`.
        score: raw score of the current game.
        length: agent steps of the current game.
        num_actions: size of the action set.
    """

    def __init__(self, preprocessing: dict, seed: int = 0, **overrides):
        """Builds the game.

        Args:
            preprocessing: the `preprocessing` entry of `tfaccel_policy.json`.
            seed: seeds the emulator (sticky actions) and the no-op draws.
            **overrides: replace preprocessing entries, e.g. `noop_max=0`, `max_agent_steps=500`
                or `sticky_action_prob=0.25`.

        Raises:
            ValueError: a setting is missing, unknown or out of range.
        """
        missing = [key for key in PREPROCESSING_KEYS if key not in preprocessing]
        if missing:
            raise ValueError(f"the policy's preprocessing lacks {missing}")
        unknown = sorted(set(overrides) - set(preprocessing))
        if unknown:
            raise ValueError(f"unknown settings {unknown}; valid: {sorted(preprocessing)}")
        self.settings = settings = {**preprocessing, **overrides}
        self._check(settings)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self._ale = ale = ale_py.ALEInterface()
        ale.setInt("random_seed", int(seed) % (2**31 - 1))
        ale.setFloat("repeat_action_probability", float(settings["sticky_action_prob"]))
        ale.setInt("frame_skip", 1)
        ale.loadROM(roms.get_rom_path(settings["game"]))
        self._actions = [ale_py.Action[name] for name in settings["action_names"]]
        self.num_actions = len(self._actions)
        self._fire = ale_py.Action.FIRE in self._actions and settings["fire_on_reset"]
        self._rng = np.random.default_rng(seed)
        rows, columns = (int(n) for n in ale.getScreenDims())  # [210, 160] for most games
        self._check_size(settings, rows, columns)
        self._screens = np.zeros((2, rows, columns), np.uint8)
        self._crop = slice(settings["crop_top"], rows - settings["crop_bottom"])
        cropped_height = rows - settings["crop_top"] - settings["crop_bottom"]
        height, width = settings["height"], settings["width"]
        self._rows = area_weights(cropped_height, height).astype(np.float64)
        self._cols = area_weights(columns, width).T.astype(np.float64)
        self._stack = np.zeros((height, width, settings["stack"]), np.uint8)
        self.over, self.score, self.length = True, 0.0, 0

    @staticmethod
    def _check(settings: dict) -> None:
        if settings["game"] not in roms.get_all_rom_ids():
            close = difflib.get_close_matches(str(settings["game"]), roms.get_all_rom_ids(), n=3)
            raise ValueError(
                f"ale-py {ale_py.__version__} ships no ROM for {settings['game']!r} (the "
                f"policy's game); closest names it has: {', '.join(close) or 'none'}"
            )
        if not ale_py.ALEInterface.isSupportedROM(roms.get_rom_path(settings["game"])):
            raise ValueError(  # loading it would end the process
                f"ale-py {ale_py.__version__} ships a ROM for {settings['game']!r} that ALE "
                "does not recognize"
            )
        names = settings["action_names"]
        bad = [name for name in names if name not in ale_py.Action.__members__]
        if bad or not names:
            raise ValueError(f"unknown ALE actions {bad}; valid: {list(ale_py.Action.__members__)}")
        if settings["frame_skip"] < (2 if settings["max_pool"] else 1):
            raise ValueError(f"frame_skip {settings['frame_skip']} is too small")
        if settings["noop_max"] < 0 or settings["max_agent_steps"] <= 0:
            raise ValueError("noop_max must be >= 0 and max_agent_steps > 0")
        if not 0.0 <= settings["sticky_action_prob"] <= 1.0:
            raise ValueError(
                f"sticky_action_prob must be in [0, 1], got {settings['sticky_action_prob']}"
            )

    @staticmethod
    def _check_size(settings: dict, rows: int, columns: int) -> None:
        cropped = rows - settings["crop_top"] - settings["crop_bottom"]
        if not (0 < settings["height"] <= cropped and 0 < settings["width"] <= columns):
            raise ValueError(f"cannot resize {cropped}x{columns} frames to the policy's size")

    def reset(self) -> np.ndarray:
        """Starts a new game (no-ops, then FIRE where configured); returns [H, W, C] uint8."""
        ale, noop_max = self._ale, self.settings["noop_max"]
        ale.reset_game()
        self.over, self.score, self.length = False, 0.0, 0
        noops = self._rng.integers(1, noop_max + 1) if noop_max else 0
        for _ in range(noops):
            ale.act(ale_py.Action.NOOP)
            if ale.game_over():
                ale.reset_game()
        if self._fire:
            self.score += ale.act(ale_py.Action.FIRE)
        ale.getScreenGrayscale(self._screens[1])
        self._screens[0] = self._screens[1]
        self._stack.fill(0)
        return self._observe()

    def step(self, action: int) -> tuple[np.ndarray, float]:
        """Repeats `action` for frame_skip frames; returns (observation [H, W, C], raw reward).

        Raises:
            ValueError: the action is outside [0, num_actions).
            RuntimeError: the game is over (call `reset()`).
        """
        if self.over:
            raise RuntimeError("the game is over: call reset() to start the next one")
        if not 0 <= action < self.num_actions:
            raise ValueError(f"action {action} outside [0, {self.num_actions})")
        ale, screens, skip = self._ale, self._screens, self.settings["frame_skip"]
        ale_action = self._actions[action]
        reward = 0.0
        for i in range(skip):
            reward += ale.act(ale_action)
            if ale.game_over():
                ale.getScreenGrayscale(screens[1])
                screens[0] = screens[1]
                break
            if i >= skip - 2:  # the last two frames of the skip, for the max
                ale.getScreenGrayscale(screens[i - skip + 2])
        self.score += reward
        self.length += 1
        self.over = ale.game_over() or self.length >= self.settings["max_agent_steps"]
        return self._observe(), reward

    def _observe(self) -> np.ndarray:
        screens = self._screens
        frame = np.maximum(screens[0], screens[1]) if self.settings["max_pool"] else screens[1]
        small = resize(frame[self._crop], self._rows, self._cols)  # [H, W]
        self._stack[:, :, :-1] = self._stack[:, :, 1:]
        self._stack[:, :, -1] = small
        return self._stack.copy()

    def screen_rgb(self) -> np.ndarray:
        """The emulator's current screen, [rows, columns, 3] uint8 RGB, for videos ([210, 160, 3]
        for most games)."""
        return self._ale.getScreenRGB()


class GameRecord(NamedTuple):
    """One played game: raw score, agent steps, and the recorded RGB screens (maybe none)."""

    score: float
    length: int
    frames: list[np.ndarray]


def sample_action(logits: np.ndarray, rng: np.random.Generator) -> int:
    """One action drawn from softmax(`logits` [A]), by the Gumbel-max trick: the argmax of the
    logits plus independent Gumbel noise is distributed as the softmax.

    Example: logits [0, log 3] give action 1 three times in four, on average.
    """
    logits = np.asarray(logits, np.float64)
    return int(np.argmax(logits + rng.gumbel(size=logits.shape)))


def check_can_sample(metadata: dict, policy_dir: str) -> None:
    """Raises ValueError unless the policy in `policy_dir` (its json: `metadata`) has logits to
    sample from."""
    if metadata["head"] != "logits":
        raise ValueError(
            f"sampling needs a policy-gradient policy (a `logits` head); {policy_dir} has "
            f"`{metadata['head']}`: play it greedily, with epsilon for exploration"
        )


def play_games(
    policy: Callable[[np.ndarray], dict[str, np.ndarray]],
    preprocessing: dict,
    episodes: int,
    *,
    seed: int = 0,
    epsilon: float = 0.0,
    sample: bool = False,
    record_every: int = 0,
    on_game: Callable[[int, float, int], None] | None = None,
    **overrides,
) -> list[GameRecord]:
    """Plays full games one after another, epsilon-greedy on the policy's `action` output, or
    with actions drawn from its `logits`.

    Args:
        policy: maps observations [1, H, W, C] uint8 to a dict with `action` [1] (and `logits`
            [1, A] to sample).
        preprocessing: the `preprocessing` entry of `tfaccel_policy.json`.
        episodes: number of games.
        seed: seeds the game (see `AtariGame`) and, with 1 appended, the epsilon draws and the
            samples.
        epsilon: probability of a uniformly random action at each step.
        sample: draw each action from softmax(logits) (a policy-gradient policy as it was
            trained) instead of taking the greedy one.
        record_every: with k > 0, the first game keeps its RGB screen at the start and after
            every k-th agent step (1 + length // k frames).
        on_game: called as `on_game(index, score, length)` when each game ends.
        **overrides: settings that replace the preprocessing's (see `AtariGame`).

    Returns:
        One `GameRecord` per game.
    """
    game = AtariGame(preprocessing, seed, **overrides)
    rng = np.random.default_rng([seed, 1])
    records = []
    for episode in range(episodes):
        record = record_every > 0 and episode == 0
        observation = game.reset()
        frames = [game.screen_rgb()] if record else []
        while not game.over:
            if epsilon > 0 and rng.random() < epsilon:
                action = int(rng.integers(game.num_actions))
            elif sample:
                action = sample_action(policy(observation[None])["logits"][0], rng)
            else:
                action = int(policy(observation[None])["action"][0])
            observation, _ = game.step(action)
            if record and game.length % record_every == 0:
                frames.append(game.screen_rgb())
        records.append(GameRecord(game.score, game.length, frames))
        if on_game is not None:
            on_game(episode, game.score, game.length)
    return records


def _check_arguments(episodes: int, epsilon: float, seed: int) -> None:
    """Raises a one-line ValueError for a setting of `main` out of range, before TensorFlow
    starts (the words of `tfaccel-eval`'s)."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


def main(argv: list[str] | None = None) -> None:
    """Plays games from a shell and prints each one's score and length as a JSON line; a usage
    error exits 2 (argparse's), a bad value or policy 1 with one line `error: ...`."""
    parser = argparse.ArgumentParser(description="Play full games with a tfaccel policy.")
    parser.add_argument("policy_dir")
    parser.add_argument("--episodes", type=int, default=1, help="full games to play (>= 1)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the games (>= 0)")
    parser.add_argument(
        "--epsilon", type=float, default=0.001,
        help="probability of a random action, in [0, 1] (0.001, as tfaccel-eval plays)",
    )  # fmt: skip
    parser.add_argument("--sample", action="store_true", help="draw actions from the logits")
    args = parser.parse_args(argv)
    try:
        _check_arguments(args.episodes, args.epsilon, args.seed)
        policy, metadata = load_policy(args.policy_dir)
        if metadata.get("preprocessing") is None:
            raise ValueError(
                f"{args.policy_dir} is the policy of a non-Atari env: this client plays Atari "
                "games only; call load_policy(dir) and feed it your env's observations"
            )
        if args.sample:
            check_can_sample(metadata, args.policy_dir)
        records = play_games(
            policy,
            metadata["preprocessing"],
            args.episodes,
            seed=args.seed,
            epsilon=args.epsilon,
            sample=args.sample,
        )
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    for record in records:
        print(json.dumps({"score": record.score, "length": record.length}))


if __name__ == "__main__":
    main()
