"""The PPO loss and update: clipped surrogate, (optionally clipped) value loss, entropy bonus;
epochs x shuffled minibatches, global-norm gradient clipping, Adam, optional target-KL stop.

`ppo_update` is the plain loop. `Updater` runs it, or, on one CUDA device, replays each epoch as a
CUDA graph: a minibatch step is ~150 tiny kernels, and launching them one by one from Python costs
far more than running them. With `ppo.fused_update`, each minibatch step is one Triton kernel
instead (`fused_ppo_update`, `ppo/update/fused.py`), eager or replayed the same way. With a
compiled loss on a CPU, the plain loop runs each step as one compiled function (`ppo/update/compiled_step.py`)."""

from __future__ import annotations

import logging
import os
import shutil
import sysconfig
from pathlib import Path

import torch
from torch import nn

from buffers import Minibatch, RolloutBuffer, SampleTable, normalized_advantages
from ppo import distributed
from ppo.agent import Agent
from ppo.config import PPOSettings
from ppo.update.compiled_step import CompiledStep, pairs_or_one, vector_width_option
from ppo.update.fused import FusedStep, fuses

# torch's CUDA build, on a machine without a CUDA runtime, warns from its C++ extension loader ("No CUDA
# runtime is found, using CUDA_HOME=...") when torch.compile first builds CPU code: a run's first lines
# are its own, and the CPU build it falls back to needs no CUDA.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

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
    # Per minibatch, as CleanRL (ppo.norm_adv=minibatch); per batch ("batch") the table already holds them so.
    advantages = normalized_advantages(mb.advantages, mb.weights) if settings.norm_adv == "minibatch" else mb.advantages
    policy_loss = mean(torch.max(-advantages * ratio,
                                 -advantages * ratio.clamp(1 - settings.clip_coef, 1 + settings.clip_coef)))
    # With ppo.normalize_values, in the units the critic learns in (rl_games' normalize_value): the
    # returns' running mean and std, updated just before this update, also for the old values.
    old_value, returns = mb.values, mb.returns
    if agent.value_normalizer is not None:
        new_value, old_value, returns = map(agent.value_normalizer.normalize, (new_value, old_value, returns))
    if settings.clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-settings.clip_coef, settings.clip_coef)
        value_loss = 0.5 * mean(torch.max((new_value - returns).square(), (clipped_value - returns).square()))
    else:
        value_loss = 0.5 * mean((new_value - returns).square())
    entropy_mean = mean(entropy)
    loss = policy_loss - settings.ent_coef * entropy_mean + settings.vf_coef * value_loss
    with torch.no_grad():
        approx_kl = mean((ratio - 1) - log_ratio)  # the low-variance k3 estimator
        old_approx_kl = mean(-log_ratio)
        clipfrac = mean(((ratio - 1).abs() > settings.clip_coef).float())
        stats = torch.stack([policy_loss, value_loss, entropy_mean, approx_kl, clipfrac, old_approx_kl]).detach()
    return loss, stats


_compiled_loss = None


# On a CPU the compile (~25 s on 2 cores with a cold inductor cache, seconds once cached) pays from
# ~150k steps: the whole compiled step trains Ant-v4 ~2x faster than eager on the 2-core machine.
# The margin allows for slower compilers, and keeps tests and smoke runs eager.
CPU_COMPILE_MIN_STEPS = 300_000


def compiles(settings: PPOSettings, device: torch.device, steps: int | None = None) -> bool:
    """Whether the update is torch.compile'd. `auto`: always on CUDA; on a CPU when at least
    `CPU_COMPILE_MIN_STEPS` `steps` are left to train and a C++ compiler is installed (the CPU backend
    builds C++), where the whole minibatch step is compiled (`compiles_whole_step`). Call it with
    `steps` once per run (ppo.trainer stores the answer in the settings), so every part of the run
    agrees."""
    if settings.compile != "auto":
        return bool(settings.compile)
    if device.type == "cuda":
        return True
    return steps is not None and steps >= CPU_COMPILE_MIN_STEPS and has_cxx_compiler()


def set_matmul_precision(settings: PPOSettings, device: torch.device) -> bool:
    """Apply `ppo.matmul_precision` to torch's float32 matrix products on CUDA (process-wide: the update and
    the policy's inference); returns whether they run in TF32. On a CPU they stay fp32."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = settings.matmul_precision == "tf32"
    return torch.backends.cuda.matmul.allow_tf32


def has_cxx_compiler() -> bool:
    """Whether torch.compile's CPU backend can build here: a C++ compiler on the PATH (`$CXX`, g++,
    c++ or clang++) and Python's C headers, which its generated code includes."""
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    headers = Path(sysconfig.get_path("include")) / "Python.h"
    return any(name and shutil.which(name) for name in names) and headers.is_file()


def compiles_whole_step(settings: PPOSettings, device: torch.device) -> bool:
    """Whether the plain loop runs each minibatch step as one compiled function (`CompiledStep`): where
    the loss is compiled on a CPU, in one process. There it is 2.7x faster than compiling the loss
    alone; on a GPU the update replays CUDA graphs, where it measured no faster,
    and data-parallel workers average their gradients between backward and Adam."""
    return compiles(settings, device) and device.type == "cpu" and not distributed.active()


def _loss_function(settings: PPOSettings, device: torch.device):
    """`ppo_loss`, or its torch.compile'd twin (built once per process; shapes are fixed)."""
    global _compiled_loss
    if not compiles(settings, device):
        return ppo_loss
    if _compiled_loss is None:
        # CUDA code has no CPU vector width; asking for it cost 45 s of the first update on a 16-core H100
        # host (Ant: 53.7 s with the option, 8.9 s without): inductor tries its ISAs with the C++ compiler.
        options = vector_width_option() if device.type == "cpu" else {}
        _compiled_loss = torch.compile(ppo_loss, dynamic=False, options=options)
    return _compiled_loss


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, buffer: RolloutBuffer, settings: PPOSettings,
               generator: torch.Generator, step: CompiledStep | None = None) -> dict[str, torch.Tensor]:
    """Run the epochs; returns device scalars: the mean of each stat over the minibatches run,
    `explained_variance`, and `epochs` (fewer than configured when target-KL stopped it). With
    `step`, the minibatches' gathers, losses, gradients, clipping and Adam steps run in that one
    compiled function, `step.minibatches_per_call` minibatches per call. The minibatches are
    `buffer.minibatches`': one permutation per epoch."""
    if step is not None and settings.num_minibatches % step.minibatches_per_call:
        raise ValueError(f"ppo_update: {settings.num_minibatches} minibatches per epoch do not split into calls of "
                         f"{step.minibatches_per_call} (the compiled step's minibatches_per_call)")
    total = torch.zeros(len(STAT_NAMES), device=buffer.device)
    count = epochs = 0
    table = buffer.sample_table(settings.norm_adv == "batch")
    loss_function = _loss_function(settings, buffer.device)
    parameters = list(agent.parameters())
    adaptive = settings.adaptive_lr_kl is not None
    for _ in range(settings.update_epochs):
        epoch_total = total.clone() if adaptive else None  # the epoch's KL, read off `total` after it
        order = buffer.shuffled_order(settings.num_minibatches, generator)
        if step is not None:  # `step.minibatches_per_call` minibatches per call, in order
            for rows in order.view(-1, step.minibatches_per_call, order.shape[1]):
                stats = step(table, rows, total)
        else:
            for rows in order:
                loss, stats = loss_function(agent, table.select(rows), settings)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                distributed.average_gradients(parameters)  # data parallel: every worker takes the same step
                nn.utils.clip_grad_norm_(parameters, settings.max_grad_norm)
                optimizer.step()
                total += stats
        count += settings.num_minibatches
        epochs += 1
        if adaptive:  # workers agree on the KL, so on the rate
            epoch_kl = (total[3] - epoch_total[3]) / settings.num_minibatches
            adapt_learning_rate(optimizer, distributed.mean_over_workers(epoch_kl), settings.adaptive_lr_kl)
        # target-KL: one host sync per epoch, only when asked for (workers agree on the mean KL)
        if settings.target_kl is not None and distributed.mean_over_workers(stats[3]).item() > settings.target_kl:
            break
    return update_result(total, count, epochs, buffer)


def fused_ppo_update(step: FusedStep, optimizer: torch.optim.Optimizer, buffer: RolloutBuffer,
                     settings: PPOSettings, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """`ppo_update` with every minibatch step one fused kernel (ppo.fused_update): the same
    permutations, epochs, learning-rate rules and results."""
    table = buffer.sample_table(settings.norm_adv == "batch")
    total = torch.zeros(len(STAT_NAMES), device=buffer.device)
    stats = torch.zeros(len(STAT_NAMES), device=buffer.device)
    epochs = 0
    for _ in range(settings.update_epochs):
        order = buffer.shuffled_order(settings.num_minibatches, generator)
        fused_epoch(step, optimizer, table, order, total, stats, settings)
        epochs += 1
        if settings.target_kl is not None and stats[3].item() > settings.target_kl:
            break
    return update_result(total, epochs * settings.num_minibatches, epochs, buffer)


def fused_epoch(step: FusedStep, optimizer: torch.optim.Optimizer, table: SampleTable, order: torch.Tensor,
                total: torch.Tensor, stats: torch.Tensor, settings: PPOSettings) -> None:
    """One epoch of fused steps over the minibatches `order` (`[num_minibatches, B]`), then the
    adaptive rate's rule on the epoch's mean KL, read off `total` (no kernel per step for it)."""
    kl_before = total[3].clone() if settings.adaptive_lr_kl is not None else None
    for rows in order:
        step(table.data, rows, total, stats)
    if kl_before is not None:
        adapt_learning_rate(optimizer, (total[3] - kl_before) / settings.num_minibatches, settings.adaptive_lr_kl)


def update_result(total: torch.Tensor, count: int, epochs: int, buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
    """What an update returns: each stat averaged over the `count` minibatches run (summed in
    `total`), `explained_variance`, and `epochs` (fewer than configured when target-KL stopped it)."""
    result = dict(zip(STAT_NAMES, total / max(count, 1), strict=True))
    result["explained_variance"] = explained_variance(buffer)
    result["epochs"] = torch.tensor(float(epochs))
    return result


def current_learning_rate(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The first group's rate as a detached tensor (a copy: a captured graph may change the original)."""
    lr = optimizer.param_groups[0]["lr"]
    return lr.detach().clone() if isinstance(lr, torch.Tensor) else torch.tensor(float(lr))


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


def make_optimizer(agent: Agent, settings: PPOSettings, device: torch.device, graphs: bool) -> torch.optim.Adam:
    """Adam (eps 1e-5, as CleanRL), fused into one kernel. For CUDA graphs it is `capturable` and its
    learning rate a device tensor, so annealing (`set_learning_rate`) reaches the captured step."""
    if graphs:
        lr = torch.tensor(settings.learning_rate, dtype=torch.float32, device=device)
        return torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=True)
    return torch.optim.Adam(agent.parameters(), lr=settings.learning_rate, eps=1e-5, fused=True)


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    """Set every group's learning rate: in place where it is the tensor of a capturable optimizer (a
    captured graph reads it), as a float otherwise (also when a checkpoint brought a tensor)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor) and group.get("capturable", False):
            group["lr"].fill_(learning_rate)
        else:
            group["lr"] = learning_rate


MIN_ADAPTIVE_LR, MAX_ADAPTIVE_LR = 1e-6, 1e-2  # rl_games' AdaptiveScheduler bounds


def adapt_learning_rate(optimizer: torch.optim.Optimizer, kl: torch.Tensor, threshold: float) -> None:
    """rl_games' adaptive rule: the rate / 1.5 when `kl` > 2 x `threshold`, x 1.5 when `kl` <
    `threshold` / 2, kept within [1e-6, 1e-2]. A capturable optimizer's tensor rate changes on the
    device (no host sync; a CUDA graph can capture it); a float rate reads `kl` on the host."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            lowered = (lr / 1.5).clamp(min=MIN_ADAPTIVE_LR)
            raised = (lr * 1.5).clamp(max=MAX_ADAPTIVE_LR)
            lr.copy_(torch.where(kl > 2 * threshold, lowered, torch.where(kl < threshold / 2, raised, lr)))
        else:
            value = float(kl)
            if value > 2 * threshold:
                group["lr"] = max(lr / 1.5, MIN_ADAPTIVE_LR)
            elif value < threshold / 2:
                group["lr"] = min(lr * 1.5, MAX_ADAPTIVE_LR)


class Updater:
    """`updater(buffer, generator)` runs the PPO update, with `ppo_update`'s math and results.

    With `graphs`, the first call runs `ppo_update` on a side stream (a real update that also warms
    up autograd, cuBLAS and Adam's state, as CUDA graph capture requires), then captures one epoch:
    every minibatch's gather, loss, backward, clipping and Adam step. Later calls refill the
    buffer's `SampleTable` (same address), draw each epoch's permutation as `ppo_update` does, copy
    it into the graph's input and replay.

    Inside the graph, gradients are set to None before each backward, as in the eager loop: backward
    then hands its fresh gradient tensors (from the graph's memory pool) to `.grad` instead of
    adding them into kept ones, one elementwise kernel per parameter fewer per step.
    """

    def __init__(self, agent: Agent, optimizer: torch.optim.Optimizer, settings: PPOSettings, graphs: bool = False):
        self.agent, self.optimizer, self.settings, self.graphs = agent, optimizer, settings, graphs
        self.graph: torch.cuda.CUDAGraph | None = None
        # Built at the first update (after any checkpoint restore): both bind the optimizer's state.
        self.fused_step: FusedStep | None = None
        self.compiled_step: CompiledStep | None = None
        self.fused: bool | None = None  # ppo.fused_update resolved (`fuses`) at the first update

    def _fuses(self, buffer: RolloutBuffer) -> bool:
        if self.fused is None:
            world_size = torch.distributed.get_world_size() if distributed.active() else 1
            minibatch_size = buffer.num_steps * buffer.num_envs // self.settings.num_minibatches
            self.fused = fuses(self.settings, self.agent, buffer.device, world_size, minibatch_size)
        return self.fused

    def __call__(self, buffer: RolloutBuffer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if not self.graphs:
            return self._eager_update(buffer, generator)
        if self.graph is None:
            return self._warm_up_and_capture(buffer, generator)
        return self._replay(buffer, generator)

    def _eager_update(self, buffer: RolloutBuffer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if not self._fuses(buffer):
            return ppo_update(self.agent, self.optimizer, buffer, self.settings, generator,
                              self._compiled_step(buffer.device))
        return fused_ppo_update(self._fused_step(), self.optimizer, buffer, self.settings, generator)

    def _compiled_step(self, device: torch.device) -> CompiledStep | None:
        if self.compiled_step is None and compiles_whole_step(self.settings, device):
            self.compiled_step = CompiledStep(self.agent, self.optimizer, self.settings, ppo_loss,
                                              pairs_or_one(self.settings.num_minibatches))
        return self.compiled_step

    def _fused_step(self) -> FusedStep:
        if self.fused_step is None:
            self.fused_step = FusedStep(self.agent, self.optimizer, self.settings)
        return self.fused_step

    def _warm_up_and_capture(self, buffer: RolloutBuffer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        settings, device = self.settings, buffer.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            result = self._eager_update(buffer, generator)
        torch.cuda.current_stream(device).wait_stream(side)
        for group in self.optimizer.param_groups:
            # A checkpoint of an eager run may have brought `capturable=False` and a float rate,
            # which would be baked into the graph.
            group["capturable"] = True
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)

        self.buffer = buffer
        table = buffer.sample_table(settings.norm_adv == "batch")
        self.order = buffer.shuffled_order(settings.num_minibatches, torch.Generator(device).manual_seed(0))
        self.total = torch.zeros(len(STAT_NAMES), device=device)
        self.last_stats = torch.zeros(len(STAT_NAMES), device=device)
        self.graph = torch.cuda.CUDAGraph()
        if self.fused:
            with torch.cuda.graph(self.graph):
                fused_epoch(self.fused_step, self.optimizer, table, self.order, self.total, self.last_stats, settings)
            return result
        self.epoch_kl = epoch_kl = torch.zeros((), device=device)  # kept: the graph reads and writes it
        loss_function = _loss_function(settings, device)
        parameters = list(self.agent.parameters())
        with torch.cuda.graph(self.graph):
            for index in range(settings.num_minibatches):
                loss, stats = loss_function(self.agent, table.select(self.order[index]), settings)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(parameters, settings.max_grad_norm)
                self.optimizer.step()
                self.total += stats
                if settings.adaptive_lr_kl is not None:
                    epoch_kl += stats[3]
            self.last_stats.copy_(stats)
            if settings.adaptive_lr_kl is not None:
                adapt_learning_rate(self.optimizer, epoch_kl / settings.num_minibatches, settings.adaptive_lr_kl)
                epoch_kl.zero_()
        return result

    def _replay(self, buffer: RolloutBuffer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if buffer is not self.buffer:
            raise ValueError("Updater: the CUDA graph was captured on another RolloutBuffer")
        settings = self.settings
        buffer.sample_table(settings.norm_adv == "batch")  # in place: the captured gathers read it
        self.total.zero_()
        epochs = 0
        for _ in range(settings.update_epochs):
            self.order.copy_(buffer.shuffled_order(settings.num_minibatches, generator))
            self.graph.replay()
            epochs += 1
            if settings.target_kl is not None and self.last_stats[3].item() > settings.target_kl:
                break
        return update_result(self.total, epochs * settings.num_minibatches, epochs, buffer)
