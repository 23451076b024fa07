"""The GAE benchmarks' inputs, float64 reference and tile labels, shared by `scripts/benchmark_gae.py`
and the profiling scripts beside this file."""

from __future__ import annotations

import numpy as np
import torch

from kernels import compute_gae
from kernels.gae_launch import launch_gae

BYTES_PER_ELEMENT = 22  # what a call must move: 4 rewards, 4 values, 1 + 1 flags, 4 bootstrap, 4 + 4 outputs
GAMMA, LAM = 0.99, 0.95


def make_inputs(num_envs: int, num_steps: int, time_major: bool, done_rate: float = 0.001) -> dict[str, torch.Tensor]:
    """A random rollout on CUDA; `done_rate` of the steps end an episode (half terminated, half truncated)."""
    shape = (num_steps, num_envs) if time_major else (num_envs, num_steps)
    g = torch.Generator(device="cuda").manual_seed(0)

    def layout(x):
        return x.T if time_major else x

    done = torch.rand(shape, device="cuda", generator=g) < done_rate
    terminated = done & (torch.rand(shape, device="cuda", generator=g) < 0.5)
    truncated = done & ~terminated
    bootstrap = torch.where(truncated, torch.randn(shape, device="cuda", generator=g), 0.0)
    rollout = {
        "rewards": layout(torch.randn(shape, device="cuda", generator=g)),
        "values": layout(torch.randn(shape, device="cuda", generator=g)),
        "terminateds": layout(terminated),
        "truncateds": layout(truncated),
        "bootstrap_values": layout(bootstrap),
    }
    rollout["bootstrap_values"][:, -1] = torch.randn(num_envs, device="cuda", generator=g)
    rollout["advantages"] = layout(torch.full(shape, float("nan"), device="cuda"))
    rollout["returns"] = layout(torch.full(shape, float("nan"), device="cuda"))
    return rollout



def run_gae(x: dict[str, torch.Tensor]) -> None:
    """The full `compute_gae` call on `make_inputs`' tensors, writing x's outputs in place."""
    compute_gae(x["rewards"], x["values"], x["terminateds"], x["truncateds"], gamma=GAMMA, lam=LAM,
                bootstrap_values=x["bootstrap_values"], advantages=x["advantages"], returns=x["returns"])



def reference_check(x: dict[str, torch.Tensor], expected: np.ndarray | None = None, gamma: float = GAMMA,
                    lam: float = LAM) -> float:
    """Max |ours - float64 numpy loop| for rows of any length (used on the long-row shapes)."""
    if expected is None:
        expected = reference_advantages(x, gamma, lam)
    return float(np.abs(expected - x["advantages"].double().cpu().numpy()).max())


def relative_error(x: dict[str, torch.Tensor], expected: np.ndarray) -> float:
    """`reference_check` over the largest expected advantage where that exceeds 1: rollouts that
    nothing cuts (gamma = lambda = 1, no episode ends) sum to advantages in the hundreds."""
    return reference_check(x, expected) / max(1.0, float(np.abs(expected).max()))


def reference_advantages(x: dict[str, torch.Tensor], gamma: float = GAMMA, lam: float = LAM) -> np.ndarray:
    """GAE advantages `[N, T]` by a float64 numpy loop over time."""
    r, v, b = (x[k].double().cpu().numpy() for k in ("rewards", "values", "bootstrap_values"))
    term, trunc = x["terminateds"].cpu().numpy(), x["truncateds"].cpu().numpy()
    next_v = np.concatenate([v[:, 1:], b[:, -1:]], axis=1)
    next_v = np.where(trunc, b, next_v)
    next_v = np.where(term, 0.0, next_v)
    delta = np.ascontiguousarray((r + gamma * next_v - v).T)
    beta = np.ascontiguousarray(((~(term | trunc)) * (gamma * lam)).T)
    adv = np.empty_like(delta)
    acc = np.zeros(delta.shape[1])
    for t in range(delta.shape[0] - 1, -1, -1):
        acc = delta[t] + beta[t] * acc
        adv[t] = acc
    return adv.T



def launch_tile(x: dict[str, torch.Tensor], options: dict, gamma: float = GAMMA, lam: float = LAM) -> None:
    """One launch on `make_inputs`' tensors with `parse_tile`'s options, writing x's outputs."""
    launch_gae(x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], None,
               gamma, lam, x["advantages"], x["returns"], **options)


def parse_tile(label: str) -> dict:
    """'NxT/WARPS[@WINDOW][#REGS][:quads|:whole][+p][+m][+r|+g][+c|+s][+x|+a][+b|+d][+l|+e]' or 'default[...]'
    -> `launch_gae` options (`gae_plan.plan_launch`'s overrides).

    NxT/WARPS sets the tile and warps ('default' keeps the plan's); @WINDOW the look-back window
    (chunks read per round); #REGS caps the registers per thread (#0: no cap; without it, the plan's);
    :quads / :whole forces the four-quarter scan on or off; +p reads the next chunk's word early; +m
    keeps the bounds masks where tiles divide the problem; +r / +g: the quads' scan carries the map
    after each quad / a gather reads it; +c / +s: chunks publish from the tile's first column / from
    the tile summed to it; +x / +a: with atomics in inline PTX / Triton's; +b / +d: bootstrap values
    read only where they count / at every step; +l / +e: a programmatic dependent launch or not."""
    label, *extras = label.split("+")
    label, _, scan = label.partition(":")
    label, _, regs = label.partition("#")
    label, _, window = label.partition("@")
    options = {"window": int(window) if window else None, "maxnreg": int(regs) if regs else None}
    for extra in extras:
        if extra == "p":
            options["probe"] = True
        elif extra == "m":
            options["even"] = False
        elif extra in ("r", "g"):
            options["rest_scan"] = extra == "r"
        elif extra in ("c", "s"):
            options["publish_column"] = extra == "c"
        elif extra in ("x", "a"):
            options["publish_ptx"] = extra == "x"
        elif extra in ("b", "d"):
            options["sparse_bootstrap"] = extra == "b"
        elif extra in ("l", "e"):
            options["pdl"] = extra == "l"
        else:
            raise ValueError(f"tile {label!r}: unknown option '+{extra}' "
                             "(+p, +m, +r, +g, +c, +s, +x, +a, +b, +d, +l or +e)")
    if scan:
        if scan not in ("quads", "whole"):
            raise ValueError(f"tile {label!r}: scan must be 'quads' or 'whole', got {scan!r}")
        options["quads"] = scan == "quads"
    if label != "default":
        tile, warps = label.split("/")
        block_n, block_t = (int(v) for v in tile.split("x"))
        options.update(block=(block_n, block_t), num_warps=int(warps))
    return options

