"""A trained policy outside train.py: load a checkpoint, hand it observations as its task returns
them, get actions.

    from ppo.policy import load_policy

    policy = load_policy("runs/Ant-v4/seed1_2026-11-29_10-00-00")   # a run dir or a checkpoint file
    action = policy(observation)        # one observation, numpy or torch: a [act_dim] tensor
    actions = policy(observations)      # a batch [N, ...]: [N, act_dim]

As `scripts/evaluate.py` replays it: observations are normalised with the statistics the run trained
with, frozen; the action is the policy's mean (`deterministic=False` samples from it), clipped to the
task's action bounds. A Dict of observations (DeepMind Control's) is given as a dict, as the task
returns it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ppo.agent import Agent, make_agent
from ppo.config import TrainSettings, resolve_device, settings_from_dict
from ppo.envs import (
    action_bounds,
    check_env_id,
    leaf_at,
    observation_layout,
    observation_leaves,
    observation_size,
    task_spaces,
)
from ppo.normalize import ObservationNormalizer
from ppo.run.checkpoint import check_observation_layout, load_agent_weights, load_checkpoint, resolve_checkpoint


class Policy:
    """`settings`: the run's (its task in `settings.env`); `agent`, `normalizer` (frozen): its networks
    and observation statistics, on `device`."""

    def __init__(self, settings: TrainSettings, agent: Agent, normalizer: ObservationNormalizer, observation_space,
                 action_space, device: torch.device):
        self.settings, self.agent, self.normalizer, self.device = settings, agent, normalizer, device
        self._leaves = [(path, tuple(leaf.shape)) for path, leaf in observation_leaves(observation_space)]
        self.obs_dim = observation_size(observation_space)
        self.act_dim = int(np.prod(action_space.shape))
        self.action_low, self.action_high = action_bounds(action_space, device)

    @torch.no_grad()
    def __call__(self, observations, deterministic: bool = True) -> torch.Tensor:
        """Actions for one observation (`[act_dim]`) or a batch of them (`[N, act_dim]`), as the task
        returns them: an array or tensor of its observation shape, with a leading N for a batch, or for a
        Dict task a dict of them."""
        parts = [self._part(observations, path, shape) for path, shape in self._leaves]
        batched = {is_batch for _, is_batch in parts}
        if len(batched) > 1 or len({part.shape[0] for part, _ in parts}) > 1:
            raise ValueError(f"observations: its parts disagree on the batch: {[tuple(p.shape) for p, _ in parts]}")
        actions = self.act(torch.cat([part for part, _ in parts], dim=1), deterministic)
        return actions if batched.pop() else actions[0]

    def _part(self, observations, path: tuple[str, ...], shape: tuple[int, ...]) -> tuple[torch.Tensor, bool]:
        """The leaf at `path` as `[B, its size]` on `device`, and whether it came as a batch."""
        task, where = self.settings.env.id, f" at {'/'.join(path)}" if path else ""
        try:
            part = torch.as_tensor(leaf_at(observations, path), dtype=torch.float32, device=self.device)
        except (KeyError, TypeError, IndexError, ValueError, RuntimeError) as error:
            wanted = "a dict with a part" + where if path else f"an array of shape {shape}"
            raise ValueError(f"observations: {task} expects {wanted}, got {type(observations).__name__}") from error
        if part.dim() == len(shape) + 1 and tuple(part.shape[1:]) == shape:
            return part.reshape(part.shape[0], -1), True
        if tuple(part.shape) == shape:
            return part.reshape(1, -1), False
        raise ValueError(f"observations{where}: {task} expects shape {shape}, or [N, *{shape}] for a batch; "
                         f"got {tuple(part.shape)}")

    @torch.no_grad()
    def act(self, observations: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """`[N, act_dim]` actions for `[N, obs_dim]` flattened observations on `device` (as the envs of
        `ppo.envs` return them)."""
        obs = self.normalizer(observations)
        actions = self.agent.act_deterministic(obs) if deterministic else self.agent.sample_action(obs)[0]
        return actions.clamp(self.action_low, self.action_high)


def load_policy(checkpoint: str, device: str | torch.device = "cpu", backend: str | None = None,
                backend_option: str = "backend=") -> Policy:
    """The policy of a run dir or checkpoint file, on `device` (`auto`: CUDA if available); `backend`
    (envpool or gymnasium): read the task's spaces from this backend instead of the run's
    (`backend_option`: how the caller's user spells it, for the errors). Raises FileNotFoundError,
    `ppo.run.checkpoint.CheckpointError` or `ppo.config.ConfigError`, each with one line."""
    device = device if isinstance(device, torch.device) else resolve_device(device)
    path = resolve_checkpoint(checkpoint)
    return policy_from_state(load_checkpoint(path, device), device, backend, backend_option, str(path))


def policy_from_state(state: dict, device: torch.device, backend: str | None = None,
                      backend_option: str = "backend=", what: str = "the policy") -> Policy:
    """The policy of a checkpoint's contents (`settings`, `observation_layout`, `agent`, `obs_normalizer`,
    as `ppo.run.checkpoint.training_state` writes them), on `device`; `what` names it in errors."""
    settings = settings_from_dict({**state["settings"], "resume": None})
    if backend is not None:
        settings = dataclasses.replace(settings, env=dataclasses.replace(settings.env, backend=backend))
    check_env_id(settings.env, backend_option)
    observation_space, action_space = task_spaces(settings.env)
    check_observation_layout(state, observation_layout(observation_space), what)
    obs_dim = observation_size(observation_space)
    agent = make_agent(obs_dim, int(np.prod(action_space.shape)), settings.model).to(device)
    load_agent_weights(agent, state["agent"], f"{what}: its model does not fit {settings.env.id} on "
                                              f"{settings.env.backend}")
    normalizer = ObservationNormalizer(obs_dim, device, settings.ppo.observation_clip,
                                       settings.ppo.normalize_observations)
    normalizer.load_state_dict(state["obs_normalizer"])
    normalizer.frozen = True  # replaying a policy must not move the statistics it was trained with
    return Policy(settings, agent, normalizer, observation_space, action_space, device)
