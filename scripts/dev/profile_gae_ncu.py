"""Launch the GAE kernel a few times on one shape, for Nsight Compute to profile one launch.

The first launch compiles; profile a later one:

    ncu --clock-control none -k regex:gae_kernel --launch-skip 2 --launch-count 1 --set full \\
        --import-source yes -o report python3 scripts/dev/profile_gae_ncu.py 16384x1024 time
    ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv   # stalls per instruction

`TILE` takes `benchmark_gae.py --sweep`'s labels (default: the plan's tile).
"""

from __future__ import annotations

import argparse
import sys

import gae_cases as bench
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", help="NxT")
    parser.add_argument("layout", choices=["env", "time"])
    parser.add_argument("tile", nargs="?", default="default", help="a --sweep label, e.g. 32x32/1:quads+g")
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_gae_ncu.py needs a CUDA GPU")
    num_envs, num_steps = (int(v) for v in args.shape.lower().split("x"))
    x = bench.make_inputs(num_envs, num_steps, args.layout == "time")
    options = bench.parse_tile(args.tile)
    for _ in range(args.launches):
        bench.launch_tile(x, options)
    torch.cuda.synchronize()
    print(f"{args.shape} {args.layout} {args.tile}: {args.launches} launches", flush=True)


if __name__ == "__main__":
    main()
