"""Experiment (sessions 41-42): with `truncation-summary.patch` applied, on a CUDA GPU, device us (queued,
as `benchmark_gae.py --sweep` times them) of HEAD's launch, a copy of the same bytes, a clone of the
truncation flags, the GAE kernel alone on the pre-pass's summary, and for each pre-pass configuration
the pre-pass alone and the whole summary launch (pre-pass and GAE kernel), with the summary launch's
error against the float64 loop. Two rounds, in one process.

    git apply docs/experiments/truncation-summary.patch
    python docs/experiments/truncation_summary_timing.py [SHAPE ...]

A configuration is VARIANT:CHUNKS:WARPS[:PHASES:UNROLL] (`GaeLaunch.run_summary`); SUMMARY_CONFIGS=a,b
chooses them.
"""

import os
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(root, "scripts"))
sys.path.insert(0, root)

import benchmark_gae as bg  # noqa: E402

import kernels.triton_gae as tg  # noqa: E402  (with the patch applied)

SHAPES = ("16x1048576", "4x131072", "16x65536", "32x1048576")  # time-major
CONFIGS = tuple(os.environ.get("SUMMARY_CONFIGS", "loop:4:1:8:8,loop:2:1:16:8,loop:8:2:8:8,loop:4:2:16:4,loop:16:4:8:8,"
                                                   "loop:4:4:32:8,sums:1:4,sums:2:4,sums:1:8").split(","))


def configure(launch: tg.GaeLaunch, config: str) -> None:
    variant, chunks, warps, *loop = config.split(":")
    launch.summary_variant, launch.summary_chunks, launch.summary_warps = variant, int(chunks), int(warps)
    if loop:
        launch.summary_phases, launch.summary_unroll = int(loop[0]), int(loop[1])


def time_shape(spec: str) -> list[str]:
    num_envs, num_steps = (int(v) for v in spec.split("x"))
    x = bg.make_inputs(num_envs, num_steps, True)
    nbytes = bg.BYTES_PER_ELEMENT * num_envs * num_steps
    calls = max(5, min(100, int(2e8 // nbytes)))
    t = (x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], None,
         x["advantages"], x["returns"])
    ptrs = [0 if a is None else a.data_ptr() for a in t]
    head = tg.GaeLaunch(t, graphs=False)
    summary = tg.GaeLaunch(t, graphs=False, summary=True)
    expected = bg.reference_advantages(x, 0.99, 0.95)
    res = {"copy": bg.copy_time_us(nbytes, calls),
           "head": bg.queued_time_us(lambda: head(t, ptrs, 0.99, 0.95), calls),
           "flags clone": bg.queued_time_us(lambda: x["truncateds"].clone(), calls)}
    lines = []
    for config in CONFIGS:
        configure(summary, config)
        both = bg.queued_time_us(lambda: summary(t, ptrs, 0.99, 0.95), calls)  # noqa: B023
        alone = bg.queued_time_us(summary.run_summary, calls)
        x["advantages"].fill_(float("nan"))
        summary(t, ptrs, 0.99, 0.95)
        error = bg.relative_error(x, expected)
        lines.append(f"  {config}: both {both:.2f} ({res['copy'] / both:.1%} of copy), pre-pass {alone:.2f}, "
                     f"err {error:.1e}")
    run_summary = summary.run_summary
    summary.run_summary = lambda: None  # the GAE kernel alone, on the summary the last pre-pass left
    try:
        res["gae alone"] = bg.queued_time_us(lambda: summary(t, ptrs, 0.99, 0.95), calls)
    finally:
        summary.run_summary = run_summary
    res["head % of copy"] = 100 * res["copy"] / res["head"]
    return [f"{spec} time: " + " ".join(f"{k} {v:.2f}" for k, v in res.items())] + lines


if __name__ == "__main__":
    for rnd in (1, 2):
        for shape in sys.argv[1:] or SHAPES:
            print(f"round {rnd}", "\n".join(time_shape(shape)), flush=True)
