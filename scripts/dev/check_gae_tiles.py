"""Run GAE tile configurations many times on CUDA, NaN-poisoned, against a float64 loop; count wrong calls.

A race in the look-back shows up in some calls and not others, so one check per configuration (what
`benchmark_gae.py --sweep` does) can miss it. Configurations use the sweep's labels:

    python scripts/dev/check_gae_tiles.py --shapes 16x65536 16384x1024 --layouts time --configs default 32x64/2:quads+p
"""

from __future__ import annotations

import argparse
import sys

import gae_cases as bench
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", required=True, help="NxT shapes")
    parser.add_argument("--layouts", nargs="+", default=["env", "time"], choices=["env", "time"])
    parser.add_argument("--configs", nargs="+", default=["default"], help="tiles, as in benchmark_gae.py --sweep")
    parser.add_argument("--calls", type=int, default=25, help="calls per configuration")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_gae_tiles.py needs a CUDA GPU")
    wrong_configs = 0
    for spec in args.shapes:
        num_envs, num_steps = (int(v) for v in spec.lower().split("x"))
        for layout in args.layouts:
            x = bench.make_inputs(num_envs, num_steps, layout == "time")
            expected = torch.as_tensor(bench.reference_advantages(x), device="cuda", dtype=torch.float32)
            for label in args.configs:
                options = bench.parse_tile(label)
                wrong_calls, worst = 0, 0.0
                for _ in range(args.calls):
                    x["advantages"].fill_(float("nan"))
                    bench.launch_tile(x, options)
                    error = torch.nan_to_num((x["advantages"] - expected).abs(), nan=float("inf"))
                    worst = max(worst, float(error.max()))
                    if not float(error.max()) < 1e-3:
                        if wrong_calls == 0:
                            where = (error >= 1e-3).nonzero()
                            print(f"  first wrong call: {len(where)} elements, the first at (env, step) "
                                  f"{tuple(where[0].tolist())}", flush=True)
                        wrong_calls += 1
                wrong_configs += wrong_calls > 0
                print(f"{spec} {layout} {label}: {wrong_calls}/{args.calls} calls wrong, largest error {worst:.2e}",
                      flush=True)
            del x
            torch.cuda.empty_cache()
    sys.exit(1 if wrong_configs else 0)


if __name__ == "__main__":
    main()
