"""RolloutBuffer: one iteration's transitions, preallocated on the run's device, time-major.

Every tensor is `[num_steps, num_envs, ...]`, so writing step `t` is one contiguous row. Advantages
are computed in place by handing `compute_gae` transposed views (`[num_envs, num_steps]`, no copy).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kernels import compute_gae


@dataclass
class Minibatch:
    """Flattened samples, `mb_` in CleanRL's naming; every tensor has the same first dimension."""

    observations: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


class RolloutBuffer:
    """Preallocated `[num_steps, num_envs, ...]` tensors for one rollout.

    `terminateds` and `truncateds` are stored separately (bool); `bootstrap_values` holds the true
    `V(s_{t+1})` at truncated steps and in the last row, zero elsewhere; `valid` is False on the
    dummy steps of next-step autoreset, which never reach the loss or the advantage statistics.
    """

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device):
        self.num_steps, self.num_envs, self.device = num_steps, num_envs, device
        shape = (num_steps, num_envs)

        def floats(*extra: int) -> torch.Tensor:
            return torch.zeros(*shape, *extra, dtype=torch.float32, device=device)

        self.observations = floats(obs_dim)
        self.actions = floats(act_dim)
        self.log_probs = floats()
        self.values = floats()
        self.rewards = floats()
        self.terminateds = torch.zeros(shape, dtype=torch.bool, device=device)
        self.truncateds = torch.zeros(shape, dtype=torch.bool, device=device)
        self.bootstrap_values = floats()
        self.valid = torch.ones(shape, dtype=torch.bool, device=device)
        self.advantages = floats()
        self.returns = floats()

    def compute_advantages(self, gamma: float, lam: float) -> None:
        """GAE over the buffer, written into `advantages` and `returns` in place."""
        compute_gae(
            self.rewards.T, self.values.T, self.terminateds.T, self.truncateds.T,
            gamma=gamma, lam=lam, bootstrap_values=self.bootstrap_values.T,
            advantages=self.advantages.T, returns=self.returns.T,
        )

    def minibatches(
        self, num_minibatches: int, generator: torch.Generator, normalize_advantages: bool = True,
        epochs: int = 1,
    ) -> Iterator[Minibatch]:
        """`epochs` passes of shuffled minibatches over the valid samples of the flattened buffer.

        The valid samples are gathered once (`b_` -> `mb_`); advantages are normalised over them
        only. Each pass draws a new permutation from `generator` (on the buffer's device), so a
        seeded run shuffles the same way every time. Counting the valid samples syncs once.
        """
        indices = self.valid.reshape(-1).nonzero().squeeze(1)  # [num_valid]
        b_advantages = self.advantages.reshape(-1)[indices]
        if normalize_advantages and indices.numel() > 1:
            b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
        b_observations = self.observations.reshape(-1, self.observations.shape[-1])[indices]
        b_actions = self.actions.reshape(-1, self.actions.shape[-1])[indices]
        b_log_probs = self.log_probs.reshape(-1)[indices]
        b_values = self.values.reshape(-1)[indices]
        b_returns = self.returns.reshape(-1)[indices]
        for _ in range(epochs):
            order = torch.randperm(indices.numel(), generator=generator, device=generator.device).to(self.device)
            for mb in torch.tensor_split(order, num_minibatches):  # sizes differ by at most one
                yield Minibatch(b_observations[mb], b_actions[mb], b_log_probs[mb], b_values[mb],
                                b_advantages[mb], b_returns[mb])
