"""RolloutBuffer: one iteration's transitions, preallocated on the run's device, time-major.

Every tensor is `[num_steps, num_envs, ...]`, so writing step `t` is one contiguous row. Advantages
are computed in place by handing `compute_gae` transposed views (`[num_envs, num_steps]`, no copy).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch

from kernels import compute_gae


@dataclass
class Minibatch:
    """Flattened samples, `mb_` in CleanRL's naming; every tensor has the same first dimension.

    `weights` is 1 for valid samples and 0 for the dummy steps of autoreset: losses and statistics
    are weighted means, so dummies count for nothing while every minibatch keeps a fixed shape (no
    host sync to count valid samples; friendly to torch.compile and CUDA graphs)."""

    observations: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor


class SampleTable:
    """A flat batch packed as the columns of one `[num_samples, obs_dim + act_dim + 5]` tensor, so a
    minibatch is one gather of rows instead of one per field (7 kernels -> 1 per optimiser step;
    on a GPU each is a launch-bound kernel). Its fields are column views of the gathered rows."""

    def __init__(self, num_samples: int, obs_dim: int, act_dim: int, device: torch.device):
        self.widths = (obs_dim, act_dim, 1, 1, 1, 1, 1)  # in Minibatch's field order
        self.data = torch.zeros(num_samples, sum(self.widths), dtype=torch.float32, device=device)

    def fill(self, batch: Minibatch) -> SampleTable:
        """Copy `batch` into the table, in place (its address stays fixed, for CUDA graphs)."""
        for column, field in zip(self._columns(self.data), fields(batch), strict=True):
            value = getattr(batch, field.name)
            column.copy_(value.reshape(column.shape))
        return self

    def select(self, index: torch.Tensor) -> Minibatch:
        """The samples at `index`: one gather, then views."""
        rows = self.data.index_select(0, index)
        columns = self._columns(rows)
        # Scalar fields are `[B]`, as the loss expects; observations and actions stay `[B, dim]`.
        return Minibatch(columns[0], columns[1], *(column.squeeze(-1) for column in columns[2:]))

    def _columns(self, rows: torch.Tensor) -> list[torch.Tensor]:
        return list(rows.split(self.widths, dim=1))


def normalized_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`(A - mean) / (std + 1e-8)` over the samples of weight 1 (std with Bessel's correction, as
    `torch.std`), and 0 on dummy steps (weight 0). No host sync: safe inside a CUDA graph."""
    count = weights.sum().clamp(min=2)
    mean = (advantages * weights).sum() / count
    std = (((advantages - mean) * weights).square().sum() / (count - 1)).sqrt()
    return (advantages - mean) / (std + 1e-8) * weights


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
        self.table = SampleTable(num_steps * num_envs, obs_dim, act_dim, device)

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
        """`epochs` passes of shuffled, equal-sized minibatches over the flattened buffer (`b_` -> `mb_`).

        Dummy steps ride along with weight 0 (see `Minibatch`); advantages are normalised with the
        mean and std of the valid samples only. Each pass draws a new permutation from `generator`
        (on the buffer's device), so a seeded run shuffles the same way every time.
        """
        table = self.sample_table(normalize_advantages)
        for _ in range(epochs):
            for mb in self.shuffled_order(num_minibatches, generator):
                yield table.select(mb)

    def sample_table(self, normalize_advantages: bool = True) -> SampleTable:
        """`flat_batch` packed into the buffer's own `SampleTable` (refilled in place, same address)."""
        return self.table.fill(self.flat_batch(normalize_advantages))

    def flat_batch(self, normalize_advantages: bool = True) -> Minibatch:
        """The whole buffer flattened to `[num_steps * num_envs, ...]` (CleanRL's `b_` tensors).

        Advantages are normalised with the mean and std of the valid samples only and are 0 on
        dummy steps; every other tensor is a view of the buffer's own storage.
        """
        b_weights = self.valid.reshape(-1).float()
        b_advantages = self.advantages.reshape(-1)
        if normalize_advantages:
            b_advantages = normalized_advantages(b_advantages, b_weights)
        return Minibatch(self.observations.reshape(-1, self.observations.shape[-1]),
                         self.actions.reshape(-1, self.actions.shape[-1]), self.log_probs.reshape(-1),
                         self.values.reshape(-1), b_advantages, self.returns.reshape(-1), b_weights)

    def shuffled_order(self, num_minibatches: int, generator: torch.Generator) -> torch.Tensor:
        """`[num_minibatches, minibatch_size]` sample indices: one permutation drawn from `generator`."""
        size = self.num_steps * self.num_envs
        order = torch.randperm(size, generator=generator, device=generator.device).to(self.device)
        return order.view(num_minibatches, -1)  # the batch divides evenly (checked by the config)
