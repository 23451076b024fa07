"""A tiny deterministic environment with known rewards, a terminal state and a time limit.

Each step advances a counter c (the observation) and pays reward c. Even-numbered episodes
terminate when c reaches 2; odd-numbered ones run into the time limit of 3 steps (truncated).
Actions are ignored. `nan_after` makes rewards NaN after that many steps (to test the NaN guard).

`ToyStagger-v0` staggers the envs of a vector env: an env first reset with seed s begins at episode s
(gymnasium seeds env i of a vector env with seed + i), and episode e pays c * (1 + e % 3) at step c, so
episodes end on different steps in different envs, some on the same step, with returns known in closed
form (`stagger_episodes`).
"""

from __future__ import annotations

import gymnasium
import numpy as np

TOY_ID = "ToyChain-v0"
TOY_NAN_ID = "ToyChainNaN-v0"
STAGGER_ID = "ToyStagger-v0"


class ToyChain(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, nan_after: int | None = None, stagger: bool = False):
        self.episode, self.counter, self.steps, self.nan_after, self.stagger = -1, 0, 0, nan_after, stagger

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode = seed if self.stagger and seed is not None else self.episode + 1
        self.counter = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.counter += 1
        self.steps += 1
        reward = float(self.counter) * (1 + self.episode % 3 if self.stagger else 1)
        if self.nan_after is not None and self.steps > self.nan_after:
            reward = float("nan")
        terminated = self.episode % 2 == 0 and self.counter == 2
        return np.array([self.counter], np.float32), reward, terminated, False, {}


def register_toy_envs() -> None:
    if TOY_ID not in gymnasium.registry:
        gymnasium.register(TOY_ID, entry_point=ToyChain, max_episode_steps=3)
        gymnasium.register(TOY_NAN_ID, entry_point=ToyChain, max_episode_steps=3, kwargs={"nan_after": 40})
        gymnasium.register(STAGGER_ID, entry_point=ToyChain, max_episode_steps=3, kwargs={"stagger": True})


def stagger_episodes(num_envs: int, num_steps: int, seed: int = 0) -> list[tuple[int, int, float, int]]:
    """Every episode `ToyStagger-v0` finishes within `num_steps` steps of `num_envs` envs reset with `seed`,
    as `(step it ended at, env, return, length)`, from its rules alone: env i begins at episode seed + i;
    episode e lasts 2 steps (terminated) if e is even, else 3 (truncated), and returns (1 + e % 3) c summed
    over its steps c = 1..length; the step after it is next-step autoreset's dummy."""
    finished = []
    for env in range(num_envs):
        start, episode = 0, seed + env
        while True:
            length = 2 if episode % 2 == 0 else 3
            end = start + length - 1
            if end >= num_steps:
                break
            finished.append((end, env, (1 + episode % 3) * length * (length + 1) / 2, length))
            start, episode = end + 2, episode + 1
    return sorted(finished)
