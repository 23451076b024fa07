"""gymnasium's Swimmer-v5 as a MuJoCo Warp task, written with the public task API alone
(`ppo.envs.mjwarp_tasks`): the model, the observation, the reward terms, the reset noise, no termination.

    python train.py env.backend=mjwarp env.id=examples.mjwarp_swimmer:Swimmer-v5 device=cuda

`train.py` imports this module (the part before the colon), which registers `Swimmer-v5`.
tests/test_mjwarp.py holds it to gymnasium's own Swimmer-v5, as it holds the built-in tasks.
docs/your-own-task.md explains each part.
"""

from __future__ import annotations

import torch

from ppo.envs.mjwarp_tasks import State, Task, gymnasium_asset, register


def observe(s: State) -> torch.Tensor:
    return torch.cat([s.qpos[:, 2:], s.qvel], dim=1)  # the x-y position left out, as v5's default


def rewards(s: State, action: torch.Tensor, before: torch.Tensor, dt: float) -> dict[str, torch.Tensor]:
    x_velocity = (s.qpos[:, 0] - before[:, 0]) / dt
    return {"reward_forward": 1.0 * x_velocity, "reward_ctrl": -1e-4 * action.square().sum(dim=1)}


def swimmer() -> Task:
    return Task(model=gymnasium_asset("swimmer.xml"), frame_skip=4, reset_noise="uniform", reset_noise_scale=0.1,
                position=lambda s: s.qpos[:, :2], rewards=rewards,
                terminated=lambda s: torch.zeros_like(s.qpos[:, 0], dtype=torch.bool), observe=observe)


register("Swimmer-v5", swimmer)
