"""Adam's per-parameter state, for the update paths that take Adam's step themselves (the fused
Triton step of ppo.fused_update and the compiled whole step of ppo.update.compiled_step): they update the
optimizer's own tensors in place, so checkpoints and the plain path see one optimizer."""

from __future__ import annotations

import torch


def ensure_adam_state(optimizer: torch.optim.Adam) -> None:
    """Create Adam's per-parameter state as its first `step()` would (zero moments, step 0 on the
    parameter's device), where it does not exist yet."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def bind_adam_state(optimizer: torch.optim.Adam, params: list[torch.Tensor],
                    who: str) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """`(exp_avg, exp_avg_sq, steps)` for `params`, in their order, after checking that the optimizer
    is plain Adam over exactly these parameters (`who` names the caller in errors). `steps` is one
    tensor holding every parameter's step count; their state now holds views of it, so advancing
    `steps` advances them all. State that does not exist yet is created first (`ensure_adam_state`)."""
    ensure_adam_state(optimizer)
    (group,) = optimizer.param_groups
    if group["weight_decay"] or group["amsgrad"] or group["maximize"]:
        raise ValueError(f"{who} implements plain Adam (no weight decay, amsgrad or maximize)")
    if len(params) != len(group["params"]) or {id(p) for p in params} != {id(p) for p in group["params"]}:
        raise ValueError(f"{who}: the optimizer's parameters are not exactly the agent's")
    state = [optimizer.state[p] for p in params]
    device = params[0].device
    steps = torch.stack([s["step"].to(device, torch.float32) for s in state])
    if not torch.all(steps == steps[0]):
        raise ValueError(f"{who} needs every parameter at the same Adam step count")
    for index, s in enumerate(state):
        s["step"] = steps[index]
    return [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], steps
