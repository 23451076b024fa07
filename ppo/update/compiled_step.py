"""The whole minibatch step as one torch.compile'd function, for the plain update loop on a CPU:
the loss's gradient by `torch.func.grad`, global-norm clipping and Adam written out, in one graph.

On a CPU the step's cost is host work per op (the autograd engine, the optimizer's Python), not
arithmetic: compiling only the loss left an Ant-v4 minibatch step at ~550 us on the 2-core
machine, and the whole step compiled ~205-240 us. The math is
`nn.utils.clip_grad_norm_` then `torch.optim.Adam` (no weight decay, amsgrad or maximize), on the
optimizer's own state tensors, so checkpoints and the other update paths see one optimizer.
"""

from __future__ import annotations

import math
import types

import torch
from torch import nn

from buffers import Minibatch, SampleTable
from ppo.agent import Agent
from ppo.config import PPOSettings
from ppo.update.adam_state import bind_adam_state


def _own_copy(method):
    """`method` bound to a function with a code object of its own. torch.compile keeps compiled graphs,
    and the guards that choose between them, per code object; with a copy, this instance's graphs
    serve this instance alone, so another CompiledStep (other settings, another agent) can never be
    handed one of them, whichever guards are dropped (`_tensor_and_global_guards`)."""
    function = method.__func__
    code = function.__code__.replace()
    copy = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)
    return types.MethodType(copy, method.__self__)


def _tensor_and_global_guards(guards) -> list[bool]:
    """Keep the guards on tensors (dtype, shape, strides, device) and on global state (grad mode and
    the like); drop those on Python values and modules: ~900 checks per call, ~50 us of a ~370 us
    step on the 2-core machine. What they would check cannot change within one
    instance: its settings are frozen, its agent's structure is fixed once training starts, and
    the rate and the normalisers' statistics are tensors."""
    return [g.guard_type in ("TENSOR_MATCH", "GLOBAL_STATE", "SHAPE_ENV") for g in guards]


class _Loss(nn.Module):
    """The PPO loss as a module over the agent, so `torch.func.functional_call` can swap its parameters."""

    def __init__(self, agent: Agent, settings: PPOSettings, loss_fn):
        super().__init__()
        self.agent, self.settings, self.loss_fn = agent, settings, loss_fn

    def forward(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.loss_fn(self.agent, mb, self.settings)


def vector_width_option() -> dict[str, int]:
    """Inductor's `cpp.simdlen` option set to the vector width it picks anyway on this CPU (512 for
    AVX-512, 256 for AVX2, 0 where it does not vectorise; from the CPU, or ATEN_CPU_CAPABILITY), for
    every torch.compile of CPU code here. Named, the width enters the key of inductor's on-disk graph
    cache, which (torch 2.13) leaves it out: a graph compiled for AVX-512 and loaded where AVX2 code
    is generated (ATEN_CPU_CAPABILITY=avx2, or a cache shared with another machine) gave NaN from its
    first call, and the reverse corrupted the heap. Only the width is keyed: two
    512-bit machines, one with AMX and one without, would still share graphs."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return {"cpp.simdlen": pick_vec_isa().bit_width()}


def pairs_or_one(num_minibatches: int) -> int:
    """`minibatches_per_call` for an epoch of `num_minibatches`: two where they pair up (see CompiledStep)."""
    return 2 if num_minibatches % 2 == 0 else 1


class CompiledStep:
    """`step(table, rows, total) -> stats`: for each row of `rows` (`[minibatches_per_call, B]`
    sample indices into `table`), in order, one optimiser step of the agent on those samples (the
    loss's gradient, clipped to `ppo.max_grad_norm` in global norm, then Adam at the optimizer's
    current rate). Each step's detached diagnostics (`ppo.update.STAT_NAMES`) are added to `total`
    in place; the last step's are returned. Build it once per run (compiling is slow) and after
    any checkpoint restore: it binds the optimizer's state tensors.

    The gather of the rows and the running total are in the graph too: as eager ops around each
    call they cost ~10 ops of host time per step, a fifth of the compiled step itself. For the
    same reason one call takes `minibatches_per_call` steps: each call of a compiled function
    costs ~70 us of dispatch (torch.compile's guards and wrappers) however little it computes;
    two steps per call took ~45 us less per step on the 2-core machine, four only ~5 us less
    again at twice the compile time."""

    def __init__(self, agent: Agent, optimizer: torch.optim.Optimizer, settings: PPOSettings, loss_fn,
                 minibatches_per_call: int = 1):
        if minibatches_per_call < 1:
            raise ValueError(f"CompiledStep: minibatches_per_call must be at least 1, got {minibatches_per_call}")
        self.minibatches_per_call = minibatches_per_call
        names, self.params = zip(*agent.named_parameters(), strict=True)
        self.exp_avg, self.exp_avg_sq, self.steps = bind_adam_state(optimizer, list(self.params),
                                                                    "the compiled PPO step")
        (self.group,) = optimizer.param_groups  # "lr" is read at every step: annealing and adaptive rates move it
        self.betas, self.eps = self.group["betas"], self.group["eps"]
        self.max_grad_norm = settings.max_grad_norm
        self.loss = _Loss(agent, settings, loss_fn)
        self.names = [f"agent.{name}" for name in names]
        self.lr = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        # A tensor rate: a float would be baked into the graph and recompile whenever it changed.
        # cpp_wrapper: the graph's driver code (allocations, ~30 kernel and matrix-product calls) is
        # compiled C++ instead of Python; on the 2-core machine a step took 346-377 us against 407-427
        # with the Python driver, and it compiled no slower. use_decompose_tanh:
        # tanh(x) as 2 / (1 + exp(-2x)) - 1 (within ~1e-7 of tanh) instead of SLEEF's tanh, which took
        # ~47 us of the step for four 64x64 activations; the step measured 272-313 against 311-355 us.
        self._step = torch.compile(_own_copy(self._math), dynamic=False,
                                   options={"cpp_wrapper": True, "cpp.use_decompose_tanh": True,
                                            **vector_width_option(),
                                            "guard_filter_fn": _tensor_and_global_guards})

    def __call__(self, table: SampleTable, rows: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        if rows.dim() != 2 or rows.shape[0] != self.minibatches_per_call:
            raise ValueError(f"CompiledStep: rows must be [{self.minibatches_per_call}, minibatch size] sample "
                             f"indices, got shape {tuple(rows.shape)}")
        self.lr.fill_(float(self.group["lr"]))
        return self._step(table, rows, total, self.lr)

    def _math(self, table: SampleTable, rows: torch.Tensor, total: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
        for index in range(self.minibatches_per_call):  # unrolled into one graph
            stats = self._one_step(table, rows[index], total, lr)
        return stats

    def _one_step(self, table: SampleTable, rows: torch.Tensor, total: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
        mb = table.select(rows)
        def loss_of(values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
            # tie_weights=False: a shared trunk is one module object reached by several paths, so
            # swapping its parameters once swaps them for every path (and the tying logic fails
            # under torch.compile).
            return torch.func.functional_call(self.loss, dict(zip(self.names, values, strict=True)), (mb,),
                                              tie_weights=False)

        grads, stats = torch.func.grad(loss_of, has_aux=True)(tuple(p.detach() for p in self.params))
        # nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) where that is below 1.
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        beta1, beta2 = self.betas
        with torch.no_grad():
            self.steps.add_(1)
            step = self.steps[0]
            # beta**step written as exp(step * log(beta)): inductor's CPU code computes a scalar used by
            # many loops once only if it holds a "heavy" op such as exp; as `beta**step` it was
            # recomputed, two powf calls, in every 8-wide iteration of the Adam loops (~10% of the
            # step; ~27 us less per step measured). Equal to pow within float32 rounding.
            step_size = lr / (1 - torch.exp(step * math.log(beta1)))
            root_correction = (1 - torch.exp(step * math.log(beta2))).sqrt()
            for p, g, exp_avg, exp_avg_sq in zip(self.params, grads, self.exp_avg, self.exp_avg_sq, strict=True):
                g = g * scale
                exp_avg.lerp_(g, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                p.sub_(step_size * exp_avg / (exp_avg_sq.sqrt() / root_correction + self.eps))
            total.add_(stats)
        return stats
