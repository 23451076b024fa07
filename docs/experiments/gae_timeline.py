"""Where each program of one time-major GAE launch spends its time (session 34; needs a CUDA GPU).

Runs on a tree with `gae-timeline.patch` applied, which makes every program of a quad tile (time-major)
stamp `%globaltimer` and `%clock64` at five points: its start; its map published; its walk over; its
start advantage published; its stores issued. The stamps go to words after the look-back state, which
this reads back after the last of several back-to-back launches (eager: no CUDA graphs).

    git apply docs/experiments/gae-timeline.patch
    python docs/experiments/gae_timeline.py "4x131072::default#255" "4x131072:0.5:default#255" 16x1048576::default

Each argument is SHAPE:GAMMA_LAM:TILE (an empty GAMMA_LAM keeps gamma 0.99 and lambda 0.95; TILE is a
`benchmark_gae.py --sweep` label). Phase durations come from `%clock64` (a program stays on one SM);
starts and ends from `%globaltimer` (one clock for the GPU, in steps of 32 ns on the H200). The patch
also counts each walk's rounds and the chunks it composed.

The stamps and the counter change how ptxas allocates registers. Uncapped, it may give a look-back
round's reads one register, so that each waits for the previous one's use (the default 4x131072
launch does, with the counter), and the timeline then times another kernel than the plain one. Compare
the instrumented launch's SASS with the plain one's (`scripts/compile_kernels.py --gae ... --dump`), and
where they differ add a cap that does not bind (`default#255`): under a cap ptxas gave the two-chunk
window's reads registers of their own. Not the eight-chunk window's (`@8#255`, session 35): its
reads shared two registers until each was made to feed the first one's use, as in
`look-back-joined-reads.patch`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import benchmark_gae as bench  # noqa: E402

from kernels import triton_gae as tg  # noqa: E402

# Per program and row: 5 globaltimer stamps, the walk's rounds * 10**6 + the chunks it composed, 5 clock64
# stamps, 1 unused, the SM id.
SLOTS = 13


def percentiles(a: np.ndarray) -> str:
    return " ".join(f"{np.percentile(a, q):7.0f}" for q in (0, 10, 50, 90, 100))


def timeline(spec: str, gamma_lam: float | None, label: str, done_rate: float = 0.001) -> None:
    num_envs, num_steps = (int(v) for v in spec.split("x"))
    gamma, lam = (bench.GAMMA, bench.LAM) if gamma_lam is None else (gamma_lam, gamma_lam)
    x = bench.make_inputs(num_envs, num_steps, True, done_rate)
    expected = bench.reference_advantages(x, gamma, lam)
    options = dict(bench.parse_tile(label), graphs=False)
    for _ in range(3):
        bench.launch_tile(x, options, gamma, lam)
    x["advantages"].fill_(float("nan"))
    bench.launch_tile(x, options, gamma, lam)
    error = bench.relative_error(x, expected)
    device_us = bench.queued_time_us(lambda: bench.launch_tile(x, options, gamma, lam), 50)
    launch = tg.GaeLaunch((x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"],
                           None, x["advantages"], x["returns"]), **options)
    block_n, block_t, grid = launch.constexprs[4], launch.constexprs[5], launch.grid
    state = next(iter(tg._states.values())).tensor  # one stream, one buffer
    words = grid * block_n
    stamps = state[words: words + grid * SLOTS * block_n].view(grid, SLOTS, block_n)[:, :, 0].cpu().numpy()
    wall = stamps[:, 0:5] - stamps[:, 0].min()  # ns since the first program started
    clock = stamps[:, 6:11]
    ghz = np.median((clock[:, 4] - clock[:, 0]) / np.maximum(wall[:, 4] - wall[:, 0], 1))
    ns = clock / ghz
    walks = np.arange(grid) >= -(-num_envs // block_n)  # the last chunk's programs have no walk
    rounds, composed = stamps[:, 5] // 10**6, stamps[:, 5] % 10**6
    parameters = "default" if gamma_lam is None else gamma_lam
    print(f"\n## {spec} time-major, tile {label} ({block_n}x{block_t}/{launch.num_warps}), grid {grid}, "
          f"gamma = lambda = {parameters}: {device_us:.2f} us a call back to back (eager), "
          f"largest error {error:.1e}, {ghz:.2f} GHz, {len(set(stamps[:, 12].tolist()))} SMs")
    print(f"   the last launch: {wall[:, 4].max() / 1e3:.2f} us from the first program's start to the last one's end")
    print("   ns, percentiles 0 10 50 90 100:")
    print(f"   start, from the first                 {percentiles(wall[:, 0])}")
    print(f"   end, from the first start             {percentiles(wall[:, 4])}")
    print(f"   a program's life                      {percentiles(ns[:, 4] - ns[:, 0])}")
    print(f"   loads and scan, to its map published  {percentiles(ns[walks, 1] - ns[walks, 0])}")
    print(f"   walk                                  {percentiles(ns[walks, 2] - ns[walks, 1])}")
    print(f"   walk over to start published          {percentiles(ns[walks, 3] - ns[walks, 2])}")
    print(f"   start published to stores issued      {percentiles(ns[:, 4] - ns[:, 3])}")
    print(f"   walk rounds                           {percentiles(rounds[walks])}")
    print(f"   chunks composed                       {percentiles(composed[walks])}")
    for low, high in ((0, 1), (2, 2), (3, 4), (5, 10**6)):
        these = walks & (rounds >= low) & (rounds <= high)
        if these.any():
            walk, loads = np.median(ns[these, 2] - ns[these, 1]), np.median(ns[these, 1] - ns[these, 0])
            print(f"     {these.sum():5d} walks of {low}-{high} rounds: median walk {walk:6.0f}, "
                  f"median loads and scan {loads:6.0f}")
    tenths = np.array_split(np.arange(grid), 10)
    print("   by tenth of program ids, median start / end / walk:")
    print("   " + " | ".join(f"{np.median(wall[d, 0]):.0f}/{np.median(wall[d, 4]):.0f}/"
                           f"{np.median(ns[d, 2] - ns[d, 1]):.0f}" for d in tenths))
    print("   the five programs to end last: id, start, end; loads and scan, walk, to start, stores; rounds, composed")
    for p in np.argsort(wall[:, 4])[-5:]:
        print(f"     {p:5d} {wall[p, 0]:7.0f} {wall[p, 4]:7.0f}; {ns[p, 1] - ns[p, 0]:6.0f} {ns[p, 2] - ns[p, 1]:6.0f} "
              f"{ns[p, 3] - ns[p, 2]:6.0f} {ns[p, 4] - ns[p, 3]:6.0f}; {rounds[p]}, {composed[p]}")


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("gae_timeline.py needs a CUDA GPU")
    if not hasattr(tg, "_stamp"):
        sys.exit("apply docs/experiments/gae-timeline.patch first")
    for arg in sys.argv[1:] or ["4x131072::default#255"]:  # capped: see the docstring
        spec, gamma_lam, label = arg.split(":")
        timeline(spec, float(gamma_lam) if gamma_lam else None, label)


if __name__ == "__main__":
    main()
