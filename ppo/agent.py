"""The actor-critic: separate MLPs (tanh by default) for the Gaussian policy mean and the value, a learned
state-independent log-std, orthogonal initialisation (as in CleanRL's ppo_continuous_action). With
`shared_trunk` (rl_games' `separate: False`), one MLP body feeds two linear heads instead. With
`side_by_side`, the two separate MLPs run as one (the same math in fewer, batched matrix products).
With a `ValueNormalizer` (ppo.normalize_values), the critic's raw output is in normalised units and
`get_value` returns it denormalised: every caller sees plain values."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ppo.config import ACTIVATIONS, ModelSettings
from ppo.normalize import ValueNormalizer

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _layer(in_features: int, out_features: int, gain: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(in_features, out_features)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer




def _body(in_features: int, hidden_sizes: tuple[int, ...], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [_layer(in_features, size), getattr(nn, ACTIVATIONS[activation])()]
        in_features = size
    return nn.Sequential(*layers)


def _mlp(in_features: int, hidden_sizes: tuple[int, ...], out_features: int, out_gain: float,
         activation: str) -> nn.Sequential:
    return nn.Sequential(*_body(in_features, hidden_sizes, activation),
                         _layer(hidden_sizes[-1] if hidden_sizes else in_features, out_features, out_gain))


class Agent(nn.Module):
    """`get_value(obs) -> [B]`; `get_action_and_value(obs, action=None)` samples (or scores) actions;
    collection samples with `sample_action` and scores with `log_prob` later."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_sizes: tuple[int, ...] = (64, 64), init_log_std: float = 0.0,
                 activation: str = "tanh", value_normalizer: ValueNormalizer | None = None,
                 shared_trunk: bool = False, side_by_side: bool = False):
        super().__init__()
        self.value_normalizer = value_normalizer  # its statistics travel in checkpoints separately
        self.num_hidden = len(hidden_sizes)
        if shared_trunk:
            # `critic` and `actor_mean` stay callable networks (trunk, head); the trunk's parameters
            # appear once in parameters(), and get_action_and_value runs it once.
            self.trunk = _body(obs_dim, hidden_sizes, activation)
            features = hidden_sizes[-1]
            self.critic = nn.Sequential(self.trunk, _layer(features, 1, 1.0))
            self.actor_mean = nn.Sequential(self.trunk, _layer(features, act_dim, 0.01))
        else:
            self.trunk = None
            self.critic = _mlp(obs_dim, hidden_sizes, 1, 1.0, activation)
            self.actor_mean = _mlp(obs_dim, hidden_sizes, act_dim, 0.01, activation)
        self.actor_log_std = nn.Parameter(torch.full((1, act_dim), float(init_log_std)))
        self.set_side_by_side(side_by_side)

    def set_side_by_side(self, on: bool) -> None:
        """Run the two networks as one (`_side_by_side`) from now on, or not. Only separate networks
        with hidden layers have two bodies to run side by side; for others this is a no-op."""
        self.side_by_side = on and self.trunk is None and self.num_hidden > 0

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self._value(self.critic(obs))

    def _value(self, raw: torch.Tensor) -> torch.Tensor:
        """The critic's `[B, 1]` output as `[B]` values (denormalised with ppo.normalize_values)."""
        value = raw.squeeze(-1)
        return self.value_normalizer.denormalize(value) if self.value_normalizer is not None else value

    def _mean_and_raw_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.side_by_side:
            return self._side_by_side(obs)
        if self.trunk is None:
            return self.actor_mean(obs), self.critic(obs)
        features = self.trunk(obs)
        return self.actor_mean[1](features), self.critic[1](features)

    def _side_by_side(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`actor_mean(obs), critic(obs)` computed as one network: the first layer with both networks'
        weights concatenated, each later layer as one batched product of their stacked weights, the
        critic's one output row padded to the actor's width. The same parameters and math; on a GPU
        the minibatch step is launch-bound, and this halves its matrix products (on an H200: GPU
        time per compiled step 101 -> 81 us). On a CPU it is slower, eager or
        compiled (the stacking costs more than it saves there), and on a GPU its batched weight
        gradients are slower for large minibatches, so ppo.trainer uses it for the compiled loss
        where `side_by_side_pays`."""
        pairs = list(zip(self.actor_mean, self.critic, strict=True))
        first, *middle, (actor_out, critic_out) = [(a, c) for a, c in pairs if isinstance(a, nn.Linear)]
        activations = [a for a, _ in pairs if not isinstance(a, nn.Linear)]
        a, c = first
        h = activations[0](F.linear(obs, torch.cat([a.weight, c.weight]), torch.cat([a.bias, c.bias])))
        h = h.unflatten(-1, (2, a.out_features)).transpose(0, 1)  # [2 (actor, critic), B, hidden]
        for (a, c), activation in zip(middle, activations[1:], strict=True):
            h = activation(_stacked_linear(h, (a.weight, c.weight), (a.bias, c.bias)))
        pad = actor_out.out_features - critic_out.out_features
        out = _stacked_linear(h, (actor_out.weight, F.pad(critic_out.weight, (0, 0, 0, pad))),
                              (actor_out.bias, F.pad(critic_out.bias, (0, pad))))
        return out[0], out[1, :, :critic_out.out_features]

    def get_action_and_value(
        self, obs: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(action [B, A], log_prob [B], entropy [B], value [B])`; samples when `action` is None.

        The diagonal Gaussian is written out rather than built as a torch.distributions.Normal:
        fewer ops per minibatch step, and no argument validation (a host sync per call)."""
        mean, raw_value = self._mean_and_raw_value(obs)
        log_std = self.actor_log_std.expand_as(mean)
        if action is None:
            action = mean + log_std.exp() * torch.randn_like(mean)
        entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
        return action, self.log_prob(action, mean), entropy, self._value(raw_value)

    def sample_action(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(action [B, A], mean [B, A])`: the actor alone, for collection, which needs the action
        at once and the log-prob (`log_prob(action, mean)`) and value only later. The same random
        draws as `get_action_and_value(obs)`. (With a shared trunk the trunk then runs twice per
        step, here and in `get_value`: the price of keeping the critic off the simulator's path.)"""
        mean = self.actor_mean(obs)
        return mean + self.actor_log_std.expand_as(mean).exp() * torch.randn_like(mean), mean

    def log_prob(self, action: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """`[B]`: the log-density of `action` under the Gaussian of mean `mean`."""
        log_std = self.actor_log_std.expand_as(mean)
        return (-0.5 * ((action - mean) / log_std.exp()).square() - log_std - _LOG_SQRT_2PI).sum(-1)

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_mean(obs)


# The largest minibatch for which side by side pays. Its batched weight gradients get no split-K from
# cuBLAS: on an H100 (TF32) one [2, N, 348] x [2, N, 256] product took 0.046 ms against two plain ones'
# 0.044 at N = 4,096, 0.169 against 0.061 at 16,384 and 2.55 against 0.58 at 262,144, where Humanoid-v5's
# update on 65,536 worlds went from 111 to 52 ms an iteration with the networks apart.
SIDE_BY_SIDE_MAX_MINIBATCH = 4096


def side_by_side_pays(device: torch.device, minibatch_size: int) -> bool:
    """Whether the compiled loss should run the networks side by side (`Agent._side_by_side`): on
    CUDA, for minibatches of at most `SIDE_BY_SIDE_MAX_MINIBATCH` samples."""
    return device.type == "cuda" and minibatch_size <= SIDE_BY_SIDE_MAX_MINIBATCH


def _stacked_linear(h: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor],
                    biases: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Two linear layers at once: `h` is `[2, B, in]`, each weight `[out, in]`; returns `[2, B, out]`."""
    return torch.baddbmm(torch.stack(biases).unsqueeze(1), h, torch.stack(weights).transpose(1, 2))


def make_agent(obs_dim: int, act_dim: int, model: ModelSettings,
               value_normalizer: ValueNormalizer | None = None, side_by_side: bool = False) -> Agent:
    """The agent a run's `model.*` settings describe (training and evaluation build it here).
    `side_by_side`: run the two networks as one (`Agent._side_by_side`; see `side_by_side_pays`)."""
    return Agent(obs_dim, act_dim, model.hidden_sizes, model.init_log_std, model.activation, value_normalizer,
                 model.shared_trunk, side_by_side)
