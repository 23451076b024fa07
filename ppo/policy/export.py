"""A trained policy as one self-contained file: TorchScript or ONNX, for use without this project.

The exported module is the deterministic policy of `ppo.policy.load_policy`: raw observations in (one
input per part of a Dict observation, in the order the agent sees them; one, `observation`, otherwise),
each with a leading batch dimension; observation normalisation with the run's frozen statistics, the
actor's mean, and clipping to the task's action bounds; `action` `[N, act_dim]` out.
"""

from __future__ import annotations

import copy
import io
import os
from pathlib import Path

import torch
from torch import nn

from ppo.policy import Policy

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}


class DeployedPolicy(nn.Module):
    def __init__(self, policy: Policy):
        super().__init__()
        normalizer = policy.normalizer
        self.normalize, self.clip = normalizer.enabled, float(normalizer.clip)
        # As ObservationNormalizer computes it, so the outputs agree to rounding.
        self.register_buffer("mean", normalizer.rms.mean.float().detach().cpu().clone())
        self.register_buffer("var", normalizer.rms.var.float().detach().cpu().clone())
        self.register_buffer("low", policy.action_low.detach().cpu().clone())
        self.register_buffer("high", policy.action_high.detach().cpu().clone())
        self.actor = copy.deepcopy(policy.agent.actor_mean).cpu().eval()
        self.requires_grad_(False)  # a user's `.numpy()` on the actions must not need `.detach()`

    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        flat = [part.reshape(part.shape[0], -1) for part in parts]  # a scalar part is [N]: one column
        obs = torch.cat(flat, dim=1) if len(flat) > 1 else flat[0]
        if self.normalize:
            obs = ((obs - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)
        return torch.maximum(torch.minimum(self.actor(obs), self.high), self.low)


def input_names(policy: Policy) -> list[str]:
    return ["/".join(path) if path else "observation" for path, _ in policy._leaves]


def example_inputs(policy: Policy, batch: int = 2) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(batch, *shape) for _, shape in policy._leaves)


def export(policy: Policy, fmt: str, path: str | Path) -> Path:
    """Write `policy` to `path` in `fmt` (onnx or torchscript); the path written."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    path = Path(path)
    module, inputs = DeployedPolicy(policy), example_inputs(policy)
    with torch.no_grad():
        if fmt == "torchscript":
            buffer = io.BytesIO()
            torch.jit.save(torch.jit.trace(module, inputs), buffer)
            data = buffer.getvalue()
        else:
            names = input_names(policy)
            batch = torch.export.Dim("batch")
            program = torch.onnx.export(module, inputs, input_names=names, output_names=["action"],
                                        dynamic_shapes=(tuple({0: batch} for _ in names),), dynamo=True,
                                        verbose=False)
            data = program.model_proto.SerializeToString()
    write_atomically(path, data)
    return path


def write_atomically(path: Path, data: bytes) -> None:
    """`data` to `path` through a temporary file and a rename: a full disk fails as an OSError naming `path`
    (torch's own writers abort the process there) and leaves no torn file, nor loses one there before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        error.filename = str(path)
        raise


def describe(policy: Policy, path: Path) -> str:
    """What a user of the file needs to know, in one line."""
    parts = ", ".join(f"{name} [N, {', '.join(map(str, shape))}]"
                      for name, (_, shape) in zip(input_names(policy), policy._leaves, strict=True))
    low, high = policy.action_low.min().item(), policy.action_high.max().item()
    return (f"{path}: {policy.settings.env.id}'s deterministic policy; inputs {parts} (float32, raw observations as "
            f"the task returns them); output action [N, {policy.act_dim}] (clipped to [{low:g}, {high:g}])")
