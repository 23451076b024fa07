"""The copy floor under the same launch as our kernel: a Triton copy launched plainly and as a
programmatic dependent launch, beside torch's copy and compute_gae, back to back.

`benchmark_gae.py` measures %copy against torch's device-to-device copy, launched plainly. Since
session 38 the GAE kernel is a programmatic dependent launch on sm_90+ (kernels/README.md, section 5),
which hides the gap between one kernel and the next; torch's copy still pays it. This asks what a copy
given the same overlap takes, so that the kernel can be read against both floors:

    python scripts/benchmark_copy_pdl.py --shapes 4x131072 16x65536 1x1048576 16x1048576

Per shape: torch's copy of the call's 22 bytes per element, the Triton copy of the same bytes launched
plainly and programmatically (checked against the source), the time-major `compute_gae` call, and the
call's %copy against torch's copy and against the programmatic copy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_gae as bench  # noqa: E402

from kernels import triton_gae  # noqa: E402  (on sys.path through benchmark_gae)

BLOCK = 4096  # elements a program copies: 16 KB each way


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # as the GAE kernel does: wait for the previous kernel before touching memory
        triton_gae.gdc_wait()
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


def measure(spec: str, rounds: int) -> None:
    """One shape: `rounds` rows of torch's copy, the Triton copy plain and programmatic, the call."""
    num_envs, num_steps = (int(s) for s in spec.lower().split("x"))
    nbytes = bench.BYTES_PER_ELEMENT * num_envs * num_steps
    calls = max(5, min(100, int(2e8 // nbytes)))
    src = torch.randint(-(2**31), 2**31 - 1, (nbytes // 8,), dtype=torch.int32, device="cuda")  # half each way
    dst = torch.empty_like(src)
    grid = (triton.cdiv(src.numel(), BLOCK),)

    def copy(pdl: bool) -> None:
        _copy_kernel[grid](src, dst, src.numel(), BLOCK=BLOCK, PDL=pdl, num_warps=8, launch_pdl=pdl)

    for pdl in (False, True):
        dst.fill_(0)
        copy(pdl)
        if not torch.equal(src, dst):
            sys.exit(f"{spec}: the Triton copy (pdl={pdl}) is wrong")
    x = bench.make_inputs(num_envs, num_steps, True)
    for _ in range(rounds):
        torch_us = bench.copy_time_us(nbytes, calls)
        plain_us = bench.queued_time_us(lambda: copy(False), calls)
        pdl_us = bench.queued_time_us(lambda: copy(True), calls)
        gae_us = bench.queued_time_us(lambda: bench.run_gae(x), calls)
        print(f"{spec:>12} {torch_us:10.2f} {plain_us:7.2f} {pdl_us:8.2f} {gae_us:7.2f} "
              f"{100 * torch_us / gae_us:5.0f}% {100 * pdl_us / gae_us:5.0f}%", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["4x131072", "16x65536", "1x1048576", "16x1048576"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0) or triton_gae.gdc_wait is None:
        sys.exit("benchmark_copy_pdl.py needs a CUDA GPU of compute capability 9.0+ and Triton >= 3.5")
    print(f"# {torch.cuda.get_device_name()}: device us, back to back; time-major GAE")
    print(f"{'N x T':>12} {'torch copy':>10} {'copy':>7} {'copy pdl':>8} {'gae':>7} {'%torch':>6} {'%pdl':>6}")
    for spec in args.shapes:
        measure(spec, args.rounds)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
