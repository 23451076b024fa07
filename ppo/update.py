"""The PPO loss and update: clipped surrogate, (optionally clipped) value loss, entropy bonus;
epochs x shuffled minibatches, global-norm gradient clipping, Adam, optional target-KL stop."""

from __future__ import annotations

import torch
from torch import nn

from buffers import Minibatch, RolloutBuffer
from ppo import distributed
from ppo.agent import Agent
from ppo.config import PPOSettings

STAT_NAMES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "old_approx_kl")


def ppo_loss(agent: Agent, mb: Minibatch, settings: PPOSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """`(loss, stats)`; `stats` is a `[len(STAT_NAMES)]` tensor of detached diagnostics."""
    _, new_log_prob, entropy, new_value = agent.get_action_and_value(mb.observations, mb.actions)
    total_weight = mb.weights.sum().clamp(min=1)

    def mean(x: torch.Tensor) -> torch.Tensor:  # over valid samples: dummies have weight 0
        return (x * mb.weights).sum() / total_weight

    # A dummy step's ratio is masked before use: its stale log-prob must not make inf * 0 = NaN.
    log_ratio = torch.where(mb.weights > 0, new_log_prob - mb.log_probs, 0.0)
    ratio = log_ratio.exp()
    advantages = mb.advantages
    policy_loss = mean(torch.max(-advantages * ratio,
                                 -advantages * ratio.clamp(1 - settings.clip_coef, 1 + settings.clip_coef)))
    if settings.clip_vloss:
        clipped_value = mb.values + (new_value - mb.values).clamp(-settings.clip_coef, settings.clip_coef)
        value_loss = 0.5 * mean(torch.max((new_value - mb.returns).square(), (clipped_value - mb.returns).square()))
    else:
        value_loss = 0.5 * mean((new_value - mb.returns).square())
    entropy_mean = mean(entropy)
    loss = policy_loss - settings.ent_coef * entropy_mean + settings.vf_coef * value_loss
    with torch.no_grad():
        approx_kl = mean((ratio - 1) - log_ratio)  # the low-variance k3 estimator
        old_approx_kl = mean(-log_ratio)
        clipfrac = mean(((ratio - 1).abs() > settings.clip_coef).float())
        stats = torch.stack([policy_loss, value_loss, entropy_mean, approx_kl, clipfrac, old_approx_kl]).detach()
    return loss, stats


_compiled_loss = None


def _loss_function(settings: PPOSettings):
    """`ppo_loss`, or its torch.compile'd twin (built once per process; shapes are fixed)."""
    global _compiled_loss
    if not settings.compile:
        return ppo_loss
    if _compiled_loss is None:
        _compiled_loss = torch.compile(ppo_loss, dynamic=False)
    return _compiled_loss


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, buffer: RolloutBuffer, settings: PPOSettings,
               generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Run the epochs; returns device scalars: the mean of each stat over the minibatches run,
    `explained_variance`, and `epochs` (fewer than configured when target-KL stopped it)."""
    total = torch.zeros(len(STAT_NAMES), device=buffer.device)
    count = epochs = 0
    minibatches = buffer.minibatches(settings.num_minibatches, generator, settings.norm_adv, settings.update_epochs)
    loss_function = _loss_function(settings)
    parameters = list(agent.parameters())
    for index, mb in enumerate(minibatches):
        loss, stats = loss_function(agent, mb, settings)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(parameters)  # data parallel: every worker takes the same step
        nn.utils.clip_grad_norm_(parameters, settings.max_grad_norm)
        optimizer.step()
        total += stats
        count += 1
        if (index + 1) % settings.num_minibatches == 0:  # an epoch ends
            epochs += 1
            # target-KL: one host sync per epoch, only when asked for (workers agree on the mean KL)
            if settings.target_kl is not None and distributed.mean_over_workers(stats[3]).item() > settings.target_kl:
                break
    result = dict(zip(STAT_NAMES, total / max(count, 1), strict=True))
    result["explained_variance"] = explained_variance(buffer)
    result["epochs"] = torch.tensor(float(epochs))
    return result


def explained_variance(buffer: RolloutBuffer) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns) over the valid samples (NaN if returns are constant)."""
    valid = buffer.valid.reshape(-1).float()
    n = valid.sum().clamp(min=1)

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = (x * valid).sum() / n
        return ((x - mean).square() * valid).sum() / n

    returns, values = buffer.returns.reshape(-1), buffer.values.reshape(-1)
    var_returns = variance(returns)
    return torch.where(var_returns > 0, 1 - variance(returns - values) / var_returns, torch.nan)
