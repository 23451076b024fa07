"""`ppo.fused_update`: each minibatch step of the PPO update as one Triton kernel
(`kernels/ppo_step.py`) instead of the ~50 kernels of the compiled loss, its backward, clipping and
Adam. Same math, same Adam state: the kernel updates the agent's parameters and the optimizer's
own moment tensors in place, so checkpoints, evaluation and the eager path see nothing different.

With TF32 matrix products (`ppo.fused_precision`, the default) a step takes ~39 us of device time
on an H200 against ~81 for the compiled loss's ~46 kernels; with fp32 products (`ieee`) ~129
(docs/benchmarks.md). It is opt-in (`ppo.fused_update=true`, or `auto`: wherever it can run): on
the H200 its Ant-v4 runs scored below the compiled path's, within seed noise so far.
"""

from __future__ import annotations

import os

import torch
import triton
from torch import nn

from kernels.ppo_step import ppo_minibatch_step_kernel
from ppo.adam_state import bind_adam_state
from ppo.agent import Agent
from ppo.config import ConfigError, PPOSettings

# Warps per program by `ppo.fused_precision`, measured on an H200 (docs/benchmarks.md, device us per
# step): tf32 39 at 4 warps, 36 at 8, 58 at 16; ieee 129 at 16, 310 at 8, 292 at 32 (with fp32 FMAs
# fewer warps spill the many live [64, 64] tiles to local memory). TF32 keeps 4 warps: at 8 one test
# shape (hidden 32 and 48, 37 samples) gave a value loss 39% off there, which 4 warps did not.
NUM_WARPS = {"tf32": 4, "tf32x3": 4, "ieee": 16}
# One program holds a whole minibatch's activations in registers: CleanRL's 64-sample minibatches
# fit easily; thousands of samples would not (an update of that shape is cheap anyway).
MAX_MINIBATCH = 256


def unsupported_reason(agent: Agent, settings: PPOSettings, device: torch.device, world_size: int = 1,
                       minibatch_size: int = 64) -> str | None:
    """Why the fused step cannot run this configuration, or None when it can."""
    if device.type != "cuda" and not _interpreted():
        return f"it runs on CUDA devices (this run's device is {device})"
    if minibatch_size > MAX_MINIBATCH:
        return (f"it takes minibatches of at most {MAX_MINIBATCH} samples (this run's: {minibatch_size}; "
                "fewer envs x steps or more ppo.num_minibatches)")
    if world_size > 1:
        return "it runs in a single process (gradients are not averaged across workers)"
    if agent.trunk is not None:
        return "it needs separate actor and critic networks (model.shared_trunk=false)"
    if agent.value_normalizer is not None and agent.value_normalizer.enabled:
        return "it does not normalise values (ppo.normalize_values=false)"
    for name, net in (("actor", agent.actor_mean), ("critic", agent.critic)):
        kinds = [type(module) for module in net]
        if kinds != [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]:
            return (f"it needs two tanh hidden layers (model.hidden_sizes of length 2, model.activation=tanh); "
                    f"the {name} is {net}")
    return None


def fuses(settings: PPOSettings, agent: Agent, device: torch.device, world_size: int, minibatch_size: int) -> bool:
    """Whether a run takes the fused step: `ppo.fused_update=auto` wherever it can run (on one CUDA
    device with the default model; elsewhere the compiled or eager step), `true` insists (a
    `ConfigError` naming what stops it), `false` never."""
    if settings.fused_update is False:
        return False
    reason = unsupported_reason(agent, settings, device, world_size, minibatch_size)
    if settings.fused_update is True and reason is not None:
        raise ConfigError(f"ppo.fused_update=true cannot run this configuration: {reason}")
    return reason is None and (settings.fused_update is True or device.type == "cuda")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class FusedStep:
    """Launches one fused minibatch step: `step(table, rows, total, stats)` updates the agent and the
    Adam state from the rows `rows` (int64 `[B]`) of the sample table `table`, adds the step's
    diagnostics (`ppo.update.STAT_NAMES`) into `total` and writes them into `stats`.

    It holds the addresses of the parameters and of the optimizer's moments (created here if the
    optimizer has not stepped yet), so a captured CUDA graph can replay it.
    """

    def __init__(self, agent: Agent, optimizer: torch.optim.Optimizer, settings: PPOSettings):
        actor, critic = agent.actor_mean, agent.critic
        self.params = [actor[0].weight, actor[0].bias, actor[2].weight, actor[2].bias, actor[4].weight,
                       actor[4].bias, agent.actor_log_std, critic[0].weight, critic[0].bias, critic[2].weight,
                       critic[2].bias, critic[4].weight, critic[4].bias]
        # All Adam step counters become views of self.steps, which the kernel advances together.
        self.exp_avg, self.exp_avg_sq, self.steps = bind_adam_state(optimizer, self.params, "the fused PPO step")
        (group,) = optimizer.param_groups
        self.group = group  # its "lr" is read at each call: a float (eager Adam) or a device tensor (capturable)
        self.lr = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        self.betas, self.eps = group["betas"], group["eps"]
        self.settings = settings
        # Triton's interpreter (the CPU tests) has only fp32 products, which is what "ieee" asks for;
        # "tf32x3" runs as itself there (its split is bit arithmetic, its products fp32).
        interpreted_tf32 = _interpreted() and settings.fused_precision == "tf32"
        self.precision = "ieee" if interpreted_tf32 else settings.fused_precision
        self.obs_dim, self.act_dim = actor[0].in_features, actor[4].out_features
        self.hidden = (actor[0].out_features, actor[2].out_features)
        if (critic[0].out_features, critic[2].out_features) != self.hidden:
            raise ValueError("the fused PPO step needs the actor's and critic's hidden sizes equal")

    def __call__(self, table: torch.Tensor, rows: torch.Tensor, total: torch.Tensor, stats: torch.Tensor) -> None:
        args, constants = self.launch_arguments(table, rows, total, stats)
        ppo_minibatch_step_kernel[(1,)](*args, **constants, num_warps=NUM_WARPS[self.precision])

    def launch_arguments(self, table: torch.Tensor, rows: torch.Tensor, total: torch.Tensor,
                         stats: torch.Tensor) -> tuple[list, dict]:
        """The kernel's runtime arguments and its compile-time constants for one step (the tests
        also compile exactly this launch for a CUDA target on a machine without a GPU)."""
        settings, (h1, h2) = self.settings, self.hidden
        lr = self.group["lr"]
        if not isinstance(lr, torch.Tensor):
            self.lr.fill_(lr)
            lr = self.lr
        batch = rows.shape[0]
        args = [table, table.stride(0), rows, batch, *self.params, *self.exp_avg, *self.exp_avg_sq,
                self.steps, len(self.params), lr, total, stats,
                settings.clip_coef, settings.vf_coef, settings.ent_coef, settings.max_grad_norm,
                self.betas[0], self.betas[1], self.eps]
        constants = dict(
            OBS=self.obs_dim, ACT=self.act_dim, H1=h1, H2=h2,
            BLOCK_B=_block(batch), OBS_P=_block(self.obs_dim), ACT_P=_block(self.act_dim),
            H1_P=_block(h1), H2_P=_block(h2), CLIP_VLOSS=settings.clip_vloss,
            NORM_ADV=settings.norm_adv == "minibatch", STEPS_P=_block(len(self.params)), DOT=self.precision,
        )
        return args, constants


def _block(n: int) -> int:
    """A tile dimension for `n`: a power of two, at least 16 (`tl.dot`'s minimum)."""
    return max(16, triton.next_power_of_2(n))
