"""What a single chain of tiles costs a production scan: `torch.cumsum` on CUDA against a copy.

A long GAE row is one chain of chunks joined by a look-back. `torch.cumsum` of a one-dimensional
float32 tensor runs CUB's single-pass scan, whose tiles are joined by the same kind of decoupled
look-back, tuned by NVIDIA. This times it beside a device-to-device copy of the same bytes (read
plus write, as `benchmark_gae.py` counts them), and our GAE kernel beside it at the issue's long-row
shapes, so the fraction of copy bandwidth a single chain reaches on this GPU is measured in the same run:

    python scripts/benchmark_scan_floor.py --elements 4194304 16777216 46137344
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_gae as bench  # noqa: E402


def copy_time_us(nbytes: int, calls: int) -> float:
    """A device-to-device copy moving `nbytes` (read plus write), as `benchmark_gae.py` times it."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return bench.queued_time_us(lambda: dst.copy_(src), calls)


def row(label: str, nbytes: int, copy_us: float, op_us: float) -> None:
    print(f"{label:>34} {nbytes / 1e6:8.1f} {copy_us:9.2f} {op_us:9.2f} {100 * copy_us / op_us:5.0f}%", flush=True)


def time_cumsum(n: int, calls: int) -> None:
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    torch.cumsum(x, 0, out=out)
    expected = torch.cumsum(x.double(), 0)
    error = float((out.double() - expected).abs().max() / expected.abs().max().clamp_min(1.0))
    if not error < 1e-3:
        sys.exit(f"cumsum of {n} elements is wrong (relative error {error:.1e})")
    copy_us = copy_time_us(8 * n, calls)
    row(f"torch.cumsum float32 (CUB), {n}", 8 * n, copy_us,
        bench.queued_time_us(lambda: torch.cumsum(x, 0, out=out), calls))


def time_gae(spec: str, layout: str, calls: int) -> None:
    num_envs, num_steps = (int(v) for v in spec.lower().split("x"))
    x = bench.make_inputs(num_envs, num_steps, layout == "time")
    nbytes = bench.BYTES_PER_ELEMENT * num_envs * num_steps
    copy_us = copy_time_us(nbytes, calls)
    row(f"GAE {spec} {layout}", nbytes, copy_us, bench.queued_time_us(lambda: bench.launch_tile(x, {}), calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", nargs="+", type=int, default=[1 << 22, 1 << 24, 46137344],
                        help="cumsum lengths (46137344 float32 moves 369 MB, the bytes of GAE at 16x1048576)")
    parser.add_argument("--gae", nargs="+", default=["16x1048576", "4x131072"], help="GAE shapes timed beside it")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmark_scan_floor.py needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()}: device us; %copy = copy of the same bytes / the op")
    print(f"{'op':>34} {'MB':>8} {'copy us':>9} {'op us':>9} {'%copy':>6}")
    for n in args.elements:
        time_cumsum(n, args.calls)
        torch.cuda.empty_cache()
    for spec in args.gae:
        for layout in ("env", "time"):
            time_gae(spec, layout, args.calls)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
