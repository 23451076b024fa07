"""Running normalisers that live on the run's device and travel in checkpoints.

Observations: running mean/variance shared across envs, clipped. Rewards: divided by the running
std of the discounted return (as gymnasium's NormalizeReward), whose accumulator restarts at
episode ends, clipped. Both can be frozen (evaluation) and both do nothing when disabled.
Values (off by default): the critic's output in units of the returns' running mean and std.
"""

from __future__ import annotations

import torch

from ppo import distributed


class RunningMeanStd:
    """Mean and variance of a stream of `[B, *shape]` batches (parallel algorithm), in float64."""

    def __init__(self, shape: tuple[int, ...], device: torch.device):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.full((), 1e-4, dtype=torch.float64, device=device)

    def update(self, batch: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Fold in a batch; under torchrun, every worker's batch (so all workers stay identical).
        With `weights` (`[B]`, 0 or 1), only the samples of weight 1 count (no host sync to pick them)."""
        batch = batch.to(torch.float64)
        if distributed.active() or weights is not None:
            w = torch.ones(batch.shape[0], dtype=torch.float64, device=batch.device) if weights is None \
                else weights.to(torch.float64)
            w = w.reshape(-1, *([1] * (batch.dim() - 1)))
            sums = torch.stack([w.expand_as(batch).sum(0), (w * batch).sum(0), (w * batch.square()).sum(0)])
            count, total, squares = distributed.all_reduce_sum(sums)
            batch_count = count.flatten()[0]
            # No sample of weight 1 anywhere: the statistics stay as they are (0 / 1 instead of 0 / 0).
            batch_mean = total / batch_count.clamp(min=1)
            batch_var = (squares / batch_count.clamp(min=1) - batch_mean.square()).clamp(min=0)
        else:
            batch_var, batch_mean = torch.var_mean(batch, 0, correction=0)  # one op: ~8 us less per call on a CPU
            batch_count = batch.shape[0]
        # The parallel algorithm (Chan et al.) with the batch's share w = batch_count / (count + batch_count):
        # mean' = lerp(mean, batch_mean, w), var' = lerp(var, batch_var, w) + delta^2 w (1 - w). The same
        # as weighting by the counts, in 9 ops instead of 16: this runs twice per step of the envs.
        # In place throughout: a CUDA graph of the collection step replays these very tensors.
        delta = batch_mean - self.mean
        self.count.add_(batch_count)
        share = batch_count / self.count
        self.mean.lerp_(batch_mean, share)
        self.var.lerp_(batch_var, share).addcmul_(delta.square(), share * (1 - share))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.mean.copy_(state["mean"])
        self.var.copy_(state["var"])
        self.count.copy_(state["count"])


class ObservationNormalizer:
    def __init__(self, obs_dim: int, device: torch.device, clip: float = 10.0, enabled: bool = True):
        self.rms = RunningMeanStd((obs_dim,), device)
        self.clip, self.enabled, self.frozen = clip, enabled, False

    def __call__(self, obs: torch.Tensor, fold_in: bool = True) -> torch.Tensor:
        """Normalise `[N, obs_dim]` observations, first folding them into the statistics unless frozen (or
        not `fold_in`)."""
        if not self.enabled:
            return obs
        if fold_in and not self.frozen:
            self.rms.update(obs)
        normalized = (obs - self.rms.mean.float()) / torch.sqrt(self.rms.var.float() + 1e-8)
        return normalized.clamp(-self.clip, self.clip)

    def state_dict(self) -> dict:
        return self.rms.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state)


class RewardScaler:
    def __init__(self, num_envs: int, gamma: float, device: torch.device, clip: float = 10.0, enabled: bool = True):
        self.rms = RunningMeanStd((), device)
        self.discounted_return = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.gamma, self.clip, self.enabled, self.frozen = gamma, clip, enabled, False

    def __call__(self, rewards: torch.Tensor, dones: torch.Tensor, envs: slice = slice(None)) -> torch.Tensor:
        """Scale the rewards of one step of the envs `envs` (a slice of the N; all by default);
        `dones` (bool) restarts those envs' returns after it."""
        if not self.enabled:
            return rewards
        if not self.frozen:
            returns = self.discounted_return[envs]  # a view: updated in place (see RunningMeanStd.update)
            returns.mul_(self.gamma).add_(rewards)
            self.rms.update(returns)
            returns.masked_fill_(dones, 0.0)
        return (rewards / torch.sqrt(self.rms.var.float() + 1e-8)).clamp(-self.clip, self.clip)

    def state_dict(self) -> dict:
        return {**self.rms.state_dict(), "discounted_return": self.discounted_return}

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state)
        if state["discounted_return"].shape == self.discounted_return.shape:
            self.discounted_return.copy_(state["discounted_return"])


class ValueNormalizer:
    """rl_games' `normalize_value`: the critic's raw output is in units of the running mean and std
    of the returns it is trained on. `denormalize` turns it into a value (the agent does this, so
    collection and GAE see plain values); the loss measures its errors in the normalised units, so
    the value loss keeps one scale however the returns grow. Disabled, both maps are the identity.

    `update` folds in an iteration's returns before the update; `mean` and `std` are float32
    tensors changed in place, which the captured collection and update graphs read."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.rms = RunningMeanStd((), device)
        self.enabled = enabled
        self.mean = torch.zeros((), device=device)
        self.std = torch.ones((), device=device)

    def update(self, returns: torch.Tensor, valid: torch.Tensor) -> None:
        """Fold in the returns of the valid samples (`valid`: the buffer's flags, any shape)."""
        if self.enabled:
            self.rms.update(returns.reshape(-1), valid.reshape(-1))
            self._publish()

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        return (values - self.mean) / self.std if self.enabled else values

    def denormalize(self, raw: torch.Tensor) -> torch.Tensor:
        return raw * self.std + self.mean if self.enabled else raw

    def _publish(self) -> None:
        self.mean.copy_(self.rms.mean)
        self.std.copy_(torch.sqrt(self.rms.var + 1e-8))

    def state_dict(self) -> dict:
        return self.rms.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state)
        self._publish()
