"""Experiment (session 40): `compute_gae` calls on a CUDA GPU of compute capability 9.0+, with
`cluster-look-back.patch` applied, each synced and compared with `benchmark_gae.py`'s float64 loop.
A fault (the single-op exchange of session 39) ends the process, so one shape a run.

    git apply docs/experiments/cluster-look-back.patch
    RL_GAE_CLUSTER=16 python docs/experiments/cluster_calls_check.py 4x131072 40

Time-major rollouts from `benchmark_gae.make_inputs`. Calls replay CUDA graphs from the second on,
as a training loop's do; `RL_TRITON_CUDA_GRAPHS=0` launches each. Session 40 ran the same loop on
the H200 from a script outside the repo (docs/benchmarks.md, "The cluster look-back, right and
slower"); this copy differs from it in its messages. With the patch as committed (the 64-row
refusal added), this copy ran there too: 20 calls at 4x131072 and 5 at 16x1M, none wrong.
"""

import os
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(root, "scripts"))
sys.path.insert(0, root)

import benchmark_gae as bench  # noqa: E402
import torch  # noqa: E402

from kernels import triton_gae as g  # noqa: E402  (with the patch applied)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: cluster_calls_check.py NxT CALLS")
    num_envs, num_steps = (int(v) for v in sys.argv[1].lower().split("x"))
    calls = int(sys.argv[2])
    x = bench.make_inputs(num_envs, num_steps, True)
    expected = bench.reference_advantages(x)
    print(f"{sys.argv[1]} clusters of {g.CLUSTER}, {g.CLUSTER_READS} reads", flush=True)
    wrong = 0
    for k in range(calls):
        x["advantages"].fill_(float("nan"))
        bench.run_gae(x)
        torch.cuda.synchronize()
        error = bench.reference_check(x, expected)
        if not error < 1e-3:  # NaN counts as wrong
            wrong += 1
            print(f"  call {k}: wrong, max error {error:.3g}", flush=True)
    print(f"  {calls} calls, {wrong} wrong", flush=True)


if __name__ == "__main__":
    main()
