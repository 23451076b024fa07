"""Experiment (session 42): with `truncation-summary.patch` applied, the summary launch of time-major
tiles against the float64 loop, on random inputs of odd sizes and truncation rates from none to every
step, for every pre-pass variant. On the CPU it needs the interpreter:

    git apply docs/experiments/truncation-summary.patch
    TRITON_INTERPRET=1 python docs/experiments/truncation_summary_check.py
"""

import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import kernels.triton_gae as tg  # noqa: E402  (with the patch applied)
from kernels.reference import gae_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def one_case(num_envs: int, num_steps: int, rate: float, block: tuple, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    shape = (num_steps, num_envs)  # time-major storage, passed transposed as [N, T]
    rewards, values = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    truncated = torch.rand(shape, generator=g) < rate
    terminated = (torch.rand(shape, generator=g) < 0.01) & ~truncated
    bootstrap = torch.where(truncated, torch.randn(shape, generator=g), 0.0)
    bootstrap[-1] = torch.randn(num_envs, generator=g)  # the last column
    inputs = [x.to(DEVICE) for x in (rewards, values, terminated, truncated, bootstrap)]
    advantages = torch.full(shape, float("nan"), device=DEVICE)
    returns = torch.full(shape, float("nan"), device=DEVICE)
    t = tuple(x.T for x in inputs) + (None, advantages.T, returns.T)
    ptrs = [0 if a is None else a.data_ptr() for a in t]
    launch = tg.GaeLaunch(t, block=block, graphs=False, quads=True, summary=True)
    launch(t, ptrs, 0.99, 0.95)
    expected_adv = torch.empty(num_envs, num_steps, dtype=torch.float64)
    expected_ret = torch.empty_like(expected_adv)
    r, v, d, u, b = (x.T.cpu() for x in inputs)
    gae_reference(r.double(), v.double(), d, u, b.double(), None, 0.99, 0.95, expected_adv, expected_ret)
    got = advantages.T.cpu().double()
    if not torch.isfinite(got).all() or not torch.isfinite(returns).all():
        raise AssertionError(f"{num_envs}x{num_steps} rate {rate}: outputs not all written")
    scale = expected_adv.abs().max().clamp_min(1.0)
    ret_err = ((returns.T.cpu().double() - expected_ret).abs().max() / expected_ret.abs().max().clamp_min(1.0))
    return max(float((got - expected_adv).abs().max() / scale), float(ret_err))


def main() -> None:
    worst, runs = 0.0, 0
    shapes = ((16, 1024, (16, 64)), (19, 700, (16, 64)), (5, 257, (8, 32)), (16, 300, (16, 128)))
    rates = (0.0, 0.004, 0.02, 0.3, 1.0)
    variants = os.environ.get("VARIANTS", "sums,loop").split(",")
    for variant, (n, t, block), rate in itertools.product(variants, shapes, rates):
        os.environ["RL_GAE_SUMMARY_VARIANT"] = variant
        os.environ["RL_GAE_SUMMARY_CHUNKS"] = "2"
        os.environ["RL_GAE_SUMMARY_PHASES"] = "4"
        error = one_case(n, t, rate, block, seed=runs)
        runs += 1
        worst = max(worst, error)
        if error > 1e-5:
            raise AssertionError(f"{variant} {n}x{t} block {block} rate {rate}: relative error {error:.2e}")
    print(f"{runs} runs, largest relative error {worst:.1e}")


if __name__ == "__main__":
    main()
