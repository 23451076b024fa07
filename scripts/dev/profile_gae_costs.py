"""Where does the GPU time of a GAE call go? (CUDA only; a diagnostic, not a benchmark table.)

    python scripts/dev/profile_gae_costs.py --shapes 16384x1024 16x1048576

For each shape and layout, in one run, the GPU time (eager calls queued behind a GPU sleep) of:
  copy        a device-to-device copy of the same bytes (the floor)
  access      a Triton kernel with the tile, grid and memory traffic the plan picks (the five loads,
              the look-ahead load of values[t+1], the two stores) and no scan: what the access
              pattern alone costs
  +scan       the same kernel with a whole-tile reverse associative scan: what that scan adds (the
              kernel scans most time-major tiles as four quarters instead, see `gae_plan.uses_quads`, so
              there `ours` can come out below `+scan`)
  ours        `launch_gae` as training calls it: what the chunk join (the look-back) adds
  ours lam=0  `launch_gae` with lam = 0: every look-back stops at the next chunk, so the
              difference to `ours` is the cost of walking further back
On sm_90+ `launch_gae` is a programmatic dependent launch, which overlaps the previous kernel's tail
(about 1 us on an H200; kernels/README.md, "Launching"); the copy and the two diagnostic kernels
launch plainly, so `ours` has that edge over the columns before it.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl
from gae_cases import BYTES_PER_ELEMENT, GAMMA, LAM, make_inputs
from timing import copy_time_us, queued_time_us

from kernels.gae_kernel import _compose
from kernels.gae_launch import launch_gae
from kernels.gae_plan import plan


@triton.jit
def _traffic_kernel(rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, out_a_ptr, out_b_ptr,
                    N, T, stride_n, stride_t, SCAN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    # Every tensor shares one layout (make_inputs builds them so): one pair of strides serves all.
    row_blocks = tl.cdiv(N, BLOCK_N)
    rows = (tl.program_id(0) % row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    steps = (tl.program_id(0) // row_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    n, t = rows[:, None].to(tl.int64), steps[None, :].to(tl.int64)
    mask = (n < N) & (t < T)
    at = n * stride_n + t * stride_t
    x = tl.load(rewards_ptr + at, mask=mask, other=0.0) - tl.load(values_ptr + at, mask=mask, other=0.0)
    x += tl.load(values_ptr + at + stride_t, mask=mask & (t < T - 1), other=0.0)
    x += tl.load(bootstrap_ptr + at, mask=mask, other=0.0)
    done = tl.load(terminateds_ptr + at, mask=mask, other=0) != 0
    done = done | (tl.load(truncateds_ptr + at, mask=mask, other=0) != 0)
    beta = tl.where(done, 0.0, 0.94)
    if SCAN:
        x, beta = tl.associative_scan((x, beta), 1, _compose, reverse=True)  # the kernel's own operator
    tl.store(out_a_ptr + at, x, mask=mask)
    tl.store(out_b_ptr + at, x * beta, mask=mask)


def measure(num_envs: int, num_steps: int, time_major: bool) -> tuple[str, list[float]]:
    """The tile label and the GPU times of copy, access, +scan, ours, ours with lam = 0."""
    x = make_inputs(num_envs, num_steps, time_major)
    nbytes = BYTES_PER_ELEMENT * num_envs * num_steps
    calls = max(5, min(100, int(2e8 // nbytes)))
    block_n, block_t, num_chunks, _, warps = plan(num_envs, num_steps, time_major)
    grid = triton.cdiv(num_envs, block_n) * num_chunks
    times = [copy_time_us(nbytes, calls)]
    for scan in (False, True):
        times.append(queued_time_us(lambda scan=scan: _traffic_kernel[(grid,)](
            x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], x["advantages"],
            x["returns"], num_envs, num_steps, *x["values"].stride(), SCAN=scan, BLOCK_N=block_n, BLOCK_T=block_t,
            num_warps=warps), calls))
    for lam in (LAM, 0.0):
        times.append(queued_time_us(lambda lam=lam: launch_gae(
            x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], None, GAMMA, lam,
            x["advantages"], x["returns"]), calls))
    return f"{block_n}x{block_t}/{warps}", times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["16384x1024", "4096x4096", "16x1048576", "16x65536"])
    parser.add_argument("--layouts", nargs="+", default=["env", "time"], choices=["env", "time"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_gae_costs.py needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()}: GPU us per call; tile [block_n x block_t]/warps from plan()")
    print(f"{'N x T':>12} {'layout':>6} {'tile':>10} {'copy':>8} {'access':>8} {'+scan':>8} {'ours':>8} {'lam=0':>8}")
    for spec in args.shapes:
        num_envs, num_steps = (int(v) for v in spec.lower().split("x"))
        for layout in args.layouts:
            tile, times = measure(num_envs, num_steps, layout == "time")
            print(f"{spec:>12} {layout:>6} {tile:>10} " + " ".join(f"{t:8.2f}" for t in times), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
