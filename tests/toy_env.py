"""A tiny deterministic environment with known rewards, a terminal state and a time limit.

Each step advances a counter c (the observation) and pays reward c. Even-numbered episodes
terminate when c reaches 2; odd-numbered ones run into the time limit of 3 steps (truncated).
Actions are ignored. `nan_after` makes rewards NaN after that many steps (to test the NaN guard).
"""

from __future__ import annotations

import gymnasium
import numpy as np

TOY_ID = "ToyChain-v0"
TOY_NAN_ID = "ToyChainNaN-v0"


class ToyChain(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, nan_after: int | None = None):
        self.episode, self.counter, self.steps, self.nan_after = -1, 0, 0, nan_after

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.counter = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.counter += 1
        self.steps += 1
        reward = float(self.counter)
        if self.nan_after is not None and self.steps > self.nan_after:
            reward = float("nan")
        terminated = self.episode % 2 == 0 and self.counter == 2
        return np.array([self.counter], np.float32), reward, terminated, False, {}


def register_toy_envs() -> None:
    if TOY_ID not in gymnasium.registry:
        gymnasium.register(TOY_ID, entry_point=ToyChain, max_episode_steps=3)
        gymnasium.register(TOY_NAN_ID, entry_point=ToyChain, max_episode_steps=3, kwargs={"nan_after": 40})
