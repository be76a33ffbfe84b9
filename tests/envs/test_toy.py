import numpy as np

from tfaccel.envs.toy import CatchConfig, ScriptedConfig


def test_scripted_env_numbers_by_hand():
    env = ScriptedConfig(life_length=2, lives=2, height=2, width=2)(
        seed=1
    )  # lives last 2 + 1 % 3 = 3
    first = env.reset()
    np.testing.assert_array_equal(first[0, 0], [0, 0, 0, 37 % 256])  # 37*1 + 11*0 + 0
    rewards, flags = [], []
    for _ in range(3):
        result = env.step(1)
        rewards.append(result.reward)
        flags.append((result.terminated, result.truncated))
    assert rewards == [0.0, 1.0, -1.0]  # ((t + 1) % 3) - 1 for t = 0, 1, 2
    assert flags == [(False, False), (False, False), (True, False)]
    np.testing.assert_array_equal(result.observation[0, 0], [37, 38, 39, 40])
    assert not env.game.over  # one life left
    np.testing.assert_array_equal(env.reset()[0, 0], [0, 0, 0, 48])  # episode 1: 37 + 11
    second = [env.step(action).reward for action in (2, 0, 0)]
    assert second == [1.0, 0.0, 1.0]  # ((t + a) % 3) - 1
    assert env.game.over and env.game.length == 6 and env.game.score == sum(rewards) + sum(second)


def test_catch_is_won_by_following_the_ball():
    env = CatchConfig()(seed=0)
    obs = env.reset()
    total = 0.0
    for _ in range(9):
        ball = np.argwhere(obs[:36, :, -1] == 255)[0][1] // 4  # rows above the paddle's
        paddle = np.argwhere(obs[36, :, -1] == 255)[0][0] // 4
        result = env.step(int(np.sign(ball - paddle)) + 1)
        obs, total = result.observation, total + result.reward
    assert result.terminated and total == 1.0 and env.game.score == 1.0
    assert obs.shape == (44, 20, 1) and not obs[40:].any()  # the blank row below the paddle
