"""One Atari game through the Arcade Learning Environment, preprocessed as in the papers.

Default preprocessing follows Stooke & Abbeel, "Accelerated Methods for Deep Reinforcement
Learning" (2018): frame skip 4 with the max over the last two frames, grayscale, one row cropped at
top and bottom (210 -> 208), a x2 area downsample to 104x80, and a stack of the last 4 frames. The
Nature-DQN variant (Mnih et al., 2015) resizes the uncropped frame to 84x84 instead
(`AtariConfig.nature()`). The rest is the usual Atari protocol (Machado et al., 2018): up to 30
random no-op frames at the start of a game, optional FIRE on reset, episodic life, sign-clipped
rewards for learning with the raw score kept, sticky actions (off by default, as in the papers),
and a limit of 27,000 agent steps (108,000 frames) per game.

Numpy and ale-py only: pool workers import this module, never TensorFlow.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re

import ale_py
import numpy as np
from ale_py import roms

from tfaccel.envs.frames import FrameStack, Resizer, scratch
from tfaccel.types import (
    ArraySpec,
    EnvSpec,
    Game,
    StepResult,
    check_field_ranges,
    check_field_types,
)

# The screen of most games; 13 of ale-py 0.12.1's are taller (250 rows: Adventure, Air Raid,
# Keystone Kapers, King Kong, Klax, Laser Gates, Mr. Do!, Pac-Man, Sir Lancelot, Space War; 230:
# Journey Escape; 220: Pooyan; 214: Carnival): `AtariEnv.screen_shape` is the game's own.
SCREEN_HEIGHT, SCREEN_WIDTH = 210, 160


@functools.cache
def game_names() -> tuple[str, ...]:
    """The games whose ROMs the installed ale-py ships and can load, as snake_case ids
    (`space_invaders`)."""
    return tuple(sorted(set(roms.get_all_rom_ids()) - set(unloadable_games())))


@functools.cache
def unloadable_games() -> tuple[str, ...]:
    """Games whose shipped ROM ALE does not recognize (ale-py 0.12.1: Combat, Joust, Maze Craze
    and Warlords): loading one makes ALE end the whole process, so they are refused first."""
    return tuple(
        sorted(
            game
            for game in roms.get_all_rom_ids()
            if not ale_py.ALEInterface.isSupportedROM(roms.get_rom_path(game))
        )
    )


def canonical_game(name: str) -> str:
    """Maps `pong`, `Pong`, `SpaceInvaders` or `space-invaders` to ale-py's id.

    Raises:
        ValueError: the name is no shipped game; the message lists the closest valid names.
    """
    gym = re.fullmatch(r"(?:ALE/)?(\w+?)(?:NoFrameskip|Deterministic)?-v\d+", name.strip())
    if gym:  # a Gymnasium id: its suffix stands for settings that are AtariConfig's here
        try:
            game = canonical_game(gym.group(1))
        except ValueError:
            game = None
        if game:
            raise ValueError(
                f"{name!r} is a Gymnasium id; AtariConfig.game takes the game's name, "
                f"{game!r} (frame skip and sticky actions are AtariConfig.frame_skip and "
                "AtariConfig.sticky_action_prob)"
            )
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip()).lower().replace("-", "_")
    snake = snake.replace(" ", "_")
    valid = game_names()
    if snake in valid:
        return snake
    if snake in unloadable_games():
        raise ValueError(
            f"ale-py {ale_py.__version__} ships a ROM for {snake!r} that ALE does not recognize "
            f"(its checksum), and loading it would end the process; {len(valid)} games load, "
            "e.g. pong, breakout"
        )
    squashed = {game.replace("_", ""): game for game in valid}
    if snake.replace("_", "") in squashed:
        return squashed[snake.replace("_", "")]
    close = difflib.get_close_matches(snake, valid, n=5, cutoff=0.5)
    if close:
        hint = f"closest valid names: {', '.join(close)}"
    else:
        hint = f"valid names include {', '.join(valid[:8])}, ..."
    raise ValueError(f"unknown Atari game {name!r}; {hint} ({len(valid)} games ship with ale-py)")


# How an observation is made, in words (tfaccel_policy.json's `preprocessing.pipeline`); the
# settings named here are the other entries of `preprocessing`.
PIPELINE = {
    "grayscale": "ALE's getScreenGrayscale(): uint8 luminance of the emulator's palette, "
    "the game's screen (`screen`: [rows, columns], [210, 160] for most games)",
    "frame_skip": "each action is repeated for frame_skip emulator frames; the rewards add up",
    "max_pool": "if max_pool, the element-wise max of the screens after the last two frames of "
    "the skip; else the last screen; when the game ends inside the skip, the rest of the skip "
    "is not played and the screen at that moment is taken alone",
    "crop": "rows crop_top .. rows - crop_bottom - 1 of the screen, both included, all its columns",
    "resize": "area average to height x width: an exact halving takes (a + b + c + d + 2) // 4 "
    "of each 2x2 block in integers; any other size averages the input area each output pixel "
    "covers (partly covered pixels weighted by their share) and rounds half up, floor(x + 0.5)",
    "stack": "the last `stack` frames on the last axis, oldest first; at a game's start the "
    "older slots are zeros; playing full games the stack runs on across lives (in training "
    "with episodic_life it also restarted after a lost life)",
    "reset": "a new game starts with 1..noop_max NOOP emulator frames (uniform; 0: none; their "
    "rewards do not count); if fire_on_reset and FIRE is in action_names, FIRE is pressed for "
    "one emulator frame at a game's start, its reward counted (in training with episodic_life "
    "also after a lost life)",
    "sticky_actions": "ALE's repeat_action_probability = sticky_action_prob",
    "scaling": "the SavedModel takes the uint8 stack as it is and scales it (and subtracts the "
    "game's background pixel, where training did) inside",
}


@dataclasses.dataclass(frozen=True)
class AtariConfig:
    """How to build and preprocess one game; picklable, and called with a seed it makes an env.

    Attributes:
        game: ale-py game id or CamelCase name (`pong`, `SpaceInvaders`).
        frame_skip: emulator frames per agent step; the action repeats, rewards add up.
        max_pool: observe the max over the last two frames of a skip (removes sprite flicker).
        crop_top: screen rows dropped at the top before resizing.
        crop_bottom: screen rows dropped at the bottom before resizing.
        height: observation height after an area resize of the cropped screen.
        width: observation width after an area resize of the cropped screen.
        stack: frames per observation, the last axis, oldest first, zeros at an episode start.
        noop_max: a game starts with a uniform 1..noop_max no-op emulator frames (0: none).
        fire_on_reset: press FIRE at a game start and, with episodic life, after a lost life
            (games that need it). Evaluation plays full games and presses it at the start only
            (as Baselines' wrappers do): a policy must have learned to press FIRE itself.
        episodic_life: a lost life ends the learning episode (terminated) but not the game.
        clip_rewards: learning rewards are sign(reward); the raw score is kept for statistics.
        sticky_action_prob: probability that the emulator repeats the previous action per frame.
        full_action_set: all 18 actions instead of the game's minimal set.
        max_agent_steps: a game is truncated (bootstrapped) after this many agent steps: 27,000
            at frame skip 4 is the usual 108,000 frames (30 minutes); scale it with frame_skip.
    """

    game: str = "pong"
    frame_skip: int = 4
    max_pool: bool = True
    crop_top: int = 1
    crop_bottom: int = 1
    height: int = 104
    width: int = 80
    stack: int = 4
    noop_max: int = 30
    fire_on_reset: bool = False
    episodic_life: bool = True
    clip_rewards: bool = True
    sticky_action_prob: float = 0.0
    full_action_set: bool = False
    max_agent_steps: int = 27_000

    def __post_init__(self):
        check_field_types(self)
        object.__setattr__(self, "game", canonical_game(self.game))
        for field in ("frame_skip", "height", "width", "stack", "max_agent_steps"):
            if getattr(self, field) <= 0:
                raise ValueError(
                    f"AtariConfig.{field} must be positive, got {getattr(self, field)}"
                )
        if (
            self.crop_top < 0
            or self.crop_bottom < 0
            or self.crop_top + self.crop_bottom >= SCREEN_HEIGHT
        ):  # the game's own screen is checked when its env starts
            raise ValueError(
                "AtariConfig.crop_top and crop_bottom must be 0 or more and leave some of the "
                f"{SCREEN_HEIGHT} rows, got {self.crop_top} and {self.crop_bottom}"
            )
        check_field_ranges(self, sticky_action_prob=(0, 1), noop_max=(0, None))
        if self.max_pool and self.frame_skip < 2:
            raise ValueError(
                "AtariConfig.max_pool takes the max over the last two frames of a skip: "
                f"AtariConfig.frame_skip must be 2 or more, got {self.frame_skip}"
            )

    @classmethod
    def nature(cls, game: str = "pong", **overrides) -> AtariConfig:
        """The Nature-DQN preprocessing: no crop, 84x84."""
        settings = dict(game=game, crop_top=0, crop_bottom=0, height=84, width=84)
        settings.update(overrides)
        return cls(**settings)

    def evaluation(self) -> AtariConfig:
        """The same game for evaluation: full games, raw rewards."""
        return dataclasses.replace(self, episodic_life=False, clip_rewards=False)

    @property
    def observation_spec(self) -> ArraySpec:
        """The stacked observation's shape and dtype, without starting an emulator."""
        return ArraySpec((self.height, self.width, self.stack), np.dtype(np.uint8))

    def describe(self) -> dict:
        """Everything a client needs to reproduce the observations, for tfaccel_policy.json:
        the settings, the action names, and `pipeline`, the steps in words, for a client in
        another language."""
        env = AtariEnv(self, seed=0)
        return dict(
            dataclasses.asdict(self),
            action_names=env.action_names,
            screen=list(env.screen_shape),
            pipeline=PIPELINE,
        )

    def __call__(self, seed: int) -> AtariEnv:
        return AtariEnv(self, seed)


def screen_shape(ale: ale_py.ALEInterface, config: AtariConfig) -> tuple[int, int]:
    """The loaded game's screen, [rows, columns].

    Raises:
        ValueError: the config's crop leaves fewer rows than its height.
    """
    rows, columns = (int(n) for n in ale.getScreenDims())
    cropped = rows - config.crop_top - config.crop_bottom
    if not (0 < config.height <= cropped and 0 < config.width <= columns):
        raise ValueError(
            f"{config.game}'s screen is {rows}x{columns}: cropped by {config.crop_top} + "
            f"{config.crop_bottom} rows it is {cropped}x{columns}, which cannot be resized to "
            f"{config.height}x{config.width} (height and width must be 1..that size)"
        )
    return rows, columns


class AtariEnv:
    """One ALE game behind the `tfaccel.types.Env` protocol.

    `reset()` after a lost life (episodic life) continues the same game; after a game over, the
    time limit, or in the middle of an episode it starts a new game. Observations are the env's
    own buffer, overwritten by the next `step` or `reset`: copy what you keep.
    """

    def __init__(self, config: AtariConfig, seed: int):
        self.config = config
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self._ale = ale = ale_py.ALEInterface()
        ale.setInt("random_seed", int(seed) % (2**31 - 1))
        ale.setFloat("repeat_action_probability", float(config.sticky_action_prob))
        ale.setInt("frame_skip", 1)
        ale.loadROM(roms.get_rom_path(config.game))
        actions = ale.getLegalActionSet() if config.full_action_set else ale.getMinimalActionSet()
        self._actions = list(actions)
        self.action_names = [action.name for action in self._actions]
        self._fire = ale_py.Action.FIRE if ale_py.Action.FIRE in self._actions else None
        self.spec = EnvSpec(config.observation_spec, len(self._actions))
        self._rng = np.random.default_rng(seed)
        self.screen_shape = rows, columns = screen_shape(ale, config)
        self._screens = scratch((2, rows, columns), np.uint8, "atari-screens")
        self._rows = slice(config.crop_top, rows - config.crop_bottom)
        cropped = (rows - config.crop_top - config.crop_bottom, columns)
        self._resize = Resizer(cropped, (config.height, config.width))
        self._stack = FrameStack(config.height, config.width, config.stack)
        self._lives = 0
        self._life_lost = False  # the last step ended an episode by a life, not the game
        self.game = Game()

    def reset(self) -> np.ndarray:
        """Starts an episode: after a step that lost a life (episodic life), the same game goes
        on; otherwise (the game over, the time limit, or a reset in the middle of an episode) a
        new game starts. Returns its first observation."""
        ale = self._ale
        if self.game.over or not self._life_lost:
            ale.reset_game()
            self.game.start()
            noops = self._rng.integers(1, self.config.noop_max + 1) if self.config.noop_max else 0
            for _ in range(noops):
                ale.act(ale_py.Action.NOOP)
                if ale.game_over():
                    ale.reset_game()
        self._life_lost = False
        if self.config.fire_on_reset and self._fire is not None:
            self.game.score += ale.act(self._fire)
        self._lives = ale.lives()
        ale.getScreenGrayscale(self._screens[1])
        self._screens[0] = self._screens[1]
        self._stack.clear()
        return self._observe()

    def step(self, action: int) -> StepResult:
        """Takes `action` for `frame_skip` frames; returns the `StepResult`."""
        ale, screens, skip = self._ale, self._screens, self.config.frame_skip
        ale_action = self._actions[action]
        reward = 0.0
        for i in range(skip):
            reward += ale.act(ale_action)
            if ale.game_over():
                ale.getScreenGrayscale(screens[1])
                screens[0] = screens[1]
                break
            if i >= skip - 2:
                ale.getScreenGrayscale(screens[i - skip + 2])
        self.game.record(reward)
        lives = ale.lives()
        game_over = ale.game_over()
        terminated = game_over or (self.config.episodic_life and lives < self._lives)
        time_up = self.game.length >= self.config.max_agent_steps
        truncated = time_up and not terminated
        self._lives = lives
        self.game.over = game_over or time_up
        self._life_lost = terminated and not self.game.over
        if self.config.clip_rewards:
            reward = float((reward > 0) - (reward < 0))
        return StepResult(self._observe(), reward, terminated, truncated)

    def _observe(self) -> np.ndarray:
        screens = self._screens
        if self.config.max_pool:
            np.maximum(screens[0], screens[1], out=screens[0])
            frame = screens[0]
        else:
            frame = screens[1]
        return self._stack.push(self._resize(frame[self._rows]))

    def close(self) -> None:
        """Closes the emulator."""
        self._ale = None
