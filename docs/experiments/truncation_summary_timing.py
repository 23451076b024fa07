"""Experiment (session 41): with `truncation-summary.patch` applied, on a CUDA GPU, device us (queued,
as `benchmark_gae.py --sweep` times them) of HEAD's launch, the pre-pass and GAE kernel together, the
GAE kernel alone on the pre-pass's summary, the pre-pass alone on 1, 2, 4 and 8 warps, and a clone of
the truncation flags; then the summary launch's error against the float64 loop.

    git apply docs/experiments/truncation-summary.patch
    RL_GAE_SUMMARY_CHUNKS=2 python docs/experiments/truncation_summary_timing.py

Session 41 ran it on the H200 with RL_GAE_SUMMARY_CHUNKS 1 and 2 (docs/benchmarks.md, "Fewer bytes").
"""

import os
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(root, "scripts"))
sys.path.insert(0, root)

import benchmark_gae as bg  # noqa: E402

import kernels.triton_gae as tg  # noqa: E402  (with the patch applied)

SHAPES = ("16x1048576", "32x1048576", "4x131072", "16x65536", "16384x1024")  # time-major


class _Skip:
    """Stands in for the pre-pass, so that a summary launch runs the GAE kernel alone (on the summary
    the real pre-pass left: the inputs do not change)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def time_shape(spec: str) -> str:
    num_envs, num_steps = (int(v) for v in spec.split("x"))
    x = bg.make_inputs(num_envs, num_steps, True)
    nbytes = bg.BYTES_PER_ELEMENT * num_envs * num_steps
    calls = max(5, min(100, int(2e8 // nbytes)))
    t = (x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], None,
         x["advantages"], x["returns"])
    ptrs = [0 if a is None else a.data_ptr() for a in t]
    head = tg.GaeLaunch(t, graphs=False)
    summary = tg.GaeLaunch(t, graphs=False, summary=True)
    prepass = tg._truncation_summary_kernel

    def run_prepass(warps: int) -> None:
        prepass[summary.summary_grid](*summary.summary_args, BLOCK_N=summary.summary_block[0],
                                      BLOCK_T=summary.summary_block[1], CHUNKS=summary.summary_chunks,
                                      num_warps=warps)

    res = {"copy": bg.copy_time_us(nbytes, calls),
           "head": bg.queued_time_us(lambda: head(t, ptrs, 0.99, 0.95), calls),
           "both": bg.queued_time_us(lambda: summary(t, ptrs, 0.99, 0.95), calls)}
    tg._truncation_summary_kernel = _Skip()
    try:
        res["gae alone"] = bg.queued_time_us(lambda: summary(t, ptrs, 0.99, 0.95), calls)
    finally:
        tg._truncation_summary_kernel = prepass
    for warps in (1, 2, 4, 8):
        res[f"pre-pass {warps}w"] = bg.queued_time_us(lambda: run_prepass(warps), calls)  # noqa: B023
    res["flags clone"] = bg.queued_time_us(lambda: x["truncateds"].clone(), calls)
    expected = bg.reference_advantages(x, 0.99, 0.95)
    x["advantages"].fill_(float("nan"))
    summary(t, ptrs, 0.99, 0.95)
    error = bg.relative_error(x, expected)
    return f"{spec} time: " + " ".join(f"{k} {v:.2f}" for k, v in res.items()) + f" | err {error:.1e}"


if __name__ == "__main__":
    for shape in SHAPES:
        print(time_shape(shape), flush=True)
