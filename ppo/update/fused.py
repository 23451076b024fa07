"""`ppo.fused_update`: each minibatch step of the PPO update as two Triton kernels
(`kernels/ppo_step.py`: the actor's and the critic's gradients on two SMs, then clipping and Adam,
one program per parameter tensor) instead of the ~46 kernels of the compiled loss, its backward,
clipping and Adam. Same math, same Adam state: the kernels update the agent's parameters and the
optimizer's own moment tensors in place, so checkpoints, evaluation and the eager path see nothing
different.

GPU time per step on an H200: ~29 us with `ppo.fused_precision=tf32x3`
(the default: three TF32 tensor-core products of split inputs, fp32-like, within the `ieee`
tolerances of tests/test_fused_update.py), ~16 us with `tf32` (one product, ~1e-3 relative
error), ~72 us with `ieee` (fp32 FMAs), against ~82 us for the compiled loss. `auto`, the default,
takes it wherever it can run.
"""

from __future__ import annotations

import os

import torch
import triton
from torch import nn

from kernels.ppo_step import ppo_adam_kernel, ppo_gradients_kernel
from ppo.agent import Agent
from ppo.config import ConfigError, PPOSettings
from ppo.update.adam_state import bind_adam_state

# Warps per gradients program by `ppo.fused_precision`, from an H200's GPU time per step: tf32 15.6 us
# at 4 warps, 17.5 at 8; tf32x3 28.8 at 4, while at 8 Triton 3.6 made illegal memory accesses in every
# test; ieee 72 at 16 (with fewer warps fp32 FMAs spill the live [64, 64] tiles).
NUM_WARPS = {"tf32": 4, "tf32x3": 4, "ieee": 16}
ADAM_WARPS = 4  # the second kernel: one program per parameter tensor, at most 4096 elements each here
# One program holds a whole minibatch's activations in registers: CleanRL's 64-sample minibatches
# fit easily; thousands of samples would not (an update of that shape is cheap anyway).
MAX_MINIBATCH = 256


def unsupported_reason(agent: Agent, settings: PPOSettings, device: torch.device, world_size: int = 1,
                       minibatch_size: int = 64) -> str | None:
    """Why the fused step cannot run this configuration, or None when it can."""
    if device.type != "cuda" and not _interpreted():
        return f"it runs on CUDA devices (this run's device is {device})"
    on_a_gpu = device.type == "cuda" and torch.cuda.is_available()
    capability = torch.cuda.get_device_capability(device) if on_a_gpu else None
    if capability is not None and capability < (8, 0) and settings.fused_precision != "ieee":
        major, minor = capability
        return (f"TF32 products need compute capability 8.0 or newer (this GPU's is {major}.{minor}; "
                "ppo.fused_precision=ieee runs there)")
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


def auto_fallback_note(settings: PPOSettings, agent: Agent, device: torch.device, world_size: int,
                       minibatch_size: int) -> str | None:
    """The line a run prints where `ppo.fused_update=auto` on a GPU takes another step (the
    compiled or eager one), saying why; None where it fuses or was not asked to."""
    if settings.fused_update != "auto" or device.type != "cuda":
        return None
    reason = unsupported_reason(agent, settings, device, world_size, minibatch_size)
    return None if reason is None else f"no fused update step (ppo.fused_update=auto): {reason}"


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
        self.grads = [torch.empty_like(p) for p in self.params]  # the first kernel's output, the second's input
        self.square_sums = torch.empty(2, dtype=torch.float32, device=self.params[0].device)  # actor's, critic's
        self.obs_dim, self.act_dim = actor[0].in_features, actor[4].out_features
        self.hidden = (actor[0].out_features, actor[2].out_features)
        if (critic[0].out_features, critic[2].out_features) != self.hidden:
            raise ValueError("the fused PPO step needs the actor's and critic's hidden sizes equal")

    def __call__(self, table: torch.Tensor, rows: torch.Tensor, total: torch.Tensor, stats: torch.Tensor) -> None:
        for kernel, grid, args, constants, num_warps in self.launches(table, rows, total, stats):
            kernel[grid](*args, **constants, num_warps=num_warps)

    def launches(self, table: torch.Tensor, rows: torch.Tensor, total: torch.Tensor,
                 stats: torch.Tensor) -> list[tuple[triton.JITFunction, tuple[int], list, dict, int]]:
        """The step's two kernel launches as `(kernel, grid, runtime arguments, compile-time constants,
        warps)`: the gradients (one program for the actor, one for the critic), then clipping and Adam
        (one program per parameter tensor). The tests also compile exactly these launches for a CUDA
        target on a machine without a GPU."""
        settings, (h1, h2) = self.settings, self.hidden
        lr = self.group["lr"]
        if not isinstance(lr, torch.Tensor):
            self.lr.fill_(lr)
            lr = self.lr
        batch = rows.shape[0]
        sizes = dict(OBS=self.obs_dim, ACT=self.act_dim, H1=h1, H2=h2, OBS_P=_block(self.obs_dim),
                     ACT_P=_block(self.act_dim), H1_P=_block(h1), H2_P=_block(h2))
        gradients = (
            ppo_gradients_kernel, (2,),
            [table, table.stride(0), rows, batch, *self.params, *self.grads, self.square_sums, total, stats,
             settings.clip_coef, settings.vf_coef, settings.ent_coef],
            dict(sizes, BLOCK_B=_block(batch), CLIP_VLOSS=settings.clip_vloss,
                 NORM_ADV=settings.norm_adv == "minibatch", DOT=self.precision),
            NUM_WARPS[self.precision],
        )
        adam = (
            ppo_adam_kernel, (len(self.params),),
            [*self.params, *self.exp_avg, *self.exp_avg_sq, *self.grads, self.square_sums, self.steps, lr,
             settings.max_grad_norm, self.betas[0], self.betas[1], self.eps],
            sizes,
            ADAM_WARPS,
        )
        return [gradients, adam]


def _block(n: int) -> int:
    """A tile dimension for `n`: a power of two, at least 16 (`tl.dot`'s minimum)."""
    return max(16, triton.next_power_of_2(n))
