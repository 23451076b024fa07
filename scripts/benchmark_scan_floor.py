"""What a single chain of tiles costs a production scan: `torch.cumsum` on CUDA against a copy.

A long GAE row is one chain of chunks joined by a look-back. `torch.cumsum` of a one-dimensional
float32 tensor runs CUB's single-pass scan, whose tiles are joined by the same kind of decoupled
look-back, tuned by NVIDIA. This times it beside a device-to-device copy of the same bytes (read
plus write, as `benchmark_gae.py` counts them), and our GAE kernel beside it at the issue's long-row
shapes, so the fraction of copy bandwidth a single chain reaches on this GPU is measured in the same run.
Episode ends cut GAE's chains, and so does gamma * lambda < 1 (at 0.99 * 0.95 the composed maps reach 0 in
float32 after 1,800-2,000 steps); `--unbroken` also times gamma = lambda = 1 with no episode ends.
The GAE rows launch the kernel, which on sm_90+ is a programmatic dependent launch (about 1 us
saved per call on the H200, which the copy and cumsum do not get; kernels/README.md, section 5).

    python scripts/benchmark_scan_floor.py --elements 4194304 16777216 46137344
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_gae as bench  # noqa: E402


def row(label: str, nbytes: int, copy_us: float, op_us: float) -> None:
    print(f"{label:>44} {nbytes / 1e6:8.1f} {copy_us:9.2f} {op_us:9.2f} {100 * copy_us / op_us:5.0f}%", flush=True)


def time_cumsum(n: int, calls: int) -> None:
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))  # poisoned: an element cumsum skips fails the check
    torch.cumsum(x, 0, out=out)
    expected = torch.cumsum(x.double(), 0)
    error = float((out.double() - expected).abs().max() / expected.abs().max().clamp_min(1.0))
    if not error < 1e-3:
        sys.exit(f"cumsum of {n} elements is wrong (relative error {error:.1e})")
    copy_us = bench.copy_time_us(8 * n, calls)
    row(f"torch.cumsum float32 (CUB), {n}", 8 * n, copy_us,
        bench.queued_time_us(lambda: torch.cumsum(x, 0, out=out), calls))


def time_gae(spec: str, layout: str, done_rate: float, calls: int, gamma_lam: float | None = None) -> None:
    """GAE beside a copy; `gamma_lam` sets both gamma and lambda (1.0: nothing decays along a row)."""
    num_envs, num_steps = (int(v) for v in spec.lower().split("x"))
    gamma, lam = (bench.GAMMA, bench.LAM) if gamma_lam is None else (gamma_lam, gamma_lam)
    x = bench.make_inputs(num_envs, num_steps, layout == "time", done_rate)
    bench.launch_tile(x, {}, gamma, lam)
    error = bench.relative_error(x, bench.reference_advantages(x, gamma, lam))  # outputs start as NaN
    if not error < 1e-4:
        sys.exit(f"GAE {spec} {layout} at done rate {done_rate} is wrong (relative error {error:.1e})")
    nbytes = bench.BYTES_PER_ELEMENT * num_envs * num_steps
    copy_us = bench.copy_time_us(nbytes, calls)
    label = f"GAE {spec} {layout}, done rate {done_rate:g}" + ("" if gamma_lam is None else f", γ=λ={gamma_lam:g}")
    row(label, nbytes, copy_us, bench.queued_time_us(lambda: bench.launch_tile(x, {}, gamma, lam), calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", nargs="+", type=int, default=[1 << 22, 1 << 24, 46137344],
                        help="cumsum lengths (46137344 float32 moves 369 MB, the bytes of GAE at 16x1048576)")
    parser.add_argument("--gae", nargs="+", default=["16x1048576", "4x131072"], help="GAE shapes timed beside it")
    parser.add_argument("--done-rates", nargs="+", type=float, default=[0.001, 0.0],
                        help="fractions of steps ending an episode in the GAE rollouts (0: none; the fade still cuts)")
    parser.add_argument("--unbroken", action="store_true",
                        help="also time GAE with gamma = lambda = 1 and no episode ends: nothing cuts a row's chain")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmark_scan_floor.py needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()}: device us; %copy = copy of the same bytes / the op")
    print(f"{'op':>44} {'MB':>8} {'copy us':>9} {'op us':>9} {'%copy':>6}")
    for n in args.elements:
        time_cumsum(n, args.calls)
        torch.cuda.empty_cache()
    for spec in args.gae:
        for layout in ("env", "time"):
            for done_rate in args.done_rates:
                time_gae(spec, layout, done_rate, args.calls)
                torch.cuda.empty_cache()
            if args.unbroken:
                time_gae(spec, layout, 0.0, args.calls, gamma_lam=1.0)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
