"""Experiment (sessions 39-40): checks, on a CUDA GPU of compute capability 9.0+, the map exchange of
`cluster-look-back.patch` alone: a small Triton kernel of 512 or 4096 programs, launched in
thread-block clusters of RL_GAE_CLUSTER programs, in which each program hands its neighbours one map
per row through distributed shared memory and composes the maps of up to RL_GAE_CLUSTER_READS later
programs. Every result is compared with the composition done on the host.

    git apply docs/experiments/cluster-look-back.patch
    RL_GAE_CLUSTER=16 python docs/experiments/cluster_exchange_check.py

Session 39 ran it on the H200 with the first form of the exchange (one asm op): exact in every case.
Session 40 split the op in two (see `_cluster_exchange`), which changed this script: the exchange
words now lie past the kernel's own shared memory, and the maps come from first-column reductions,
as in the GAE kernel. In this form it ran on the H200 with clusters of 16 and of 8: every case exact.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels import triton_gae as g  # noqa: E402  (with the patch applied)


@triton.jit
def _exchange_kernel(out_ptr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_N)
    steps = tl.arange(0, BLOCK_T)
    # The maps as the GAE kernel has them: the first-column reductions of a tile whose steps span the
    # warps. (The exchange words are addressed from Triton's shared memory, which a kernel that uses
    # none does not declare.)
    tile = (pid * 100 + rows[:, None] + 0 * steps[None, :]).to(tl.float32)
    alpha = g._first_column(tile, BLOCK_T)
    beta = g._first_column(tile * 0.0 + 0.5, BLOCK_T)
    ca, cb = g._cluster_exchange(rows, alpha, beta, BLOCK_N)
    tl.store(out_ptr + pid * BLOCK_N * 2 + rows, ca)
    tl.store(out_ptr + pid * BLOCK_N * 2 + BLOCK_N + rows, cb)


# (programs, warps, rows a program): 4-row tiles as at 4x131072, 64-row ones on more rows than threads
CASES = ((512, 2, 4), (4096, 4, 4), (4096, 2, 4), (512, 2, 64), (4096, 2, 64))
BLOCK_T = 256


def main() -> None:
    if not g.CLUSTER:
        raise SystemExit("set RL_GAE_CLUSTER (16 or 8) with the patch applied")
    cluster, reads = g.CLUSTER, g.CLUSTER_READS
    for programs, warps, rows in CASES:
        out = torch.full((programs * 2 * rows,), float("nan"), device="cuda")
        compiled = _exchange_kernel.warmup(out, BLOCK_N=rows, BLOCK_T=BLOCK_T, num_warps=warps, grid=(programs,))
        compiled._init_handles()
        w, _, shared = compiled.packed_metadata
        if shared > g.XCH_OFFSET:
            raise SystemExit(f"the kernel's own {shared} bytes of shared memory reach RL_GAE_CLUSTER_OFFSET")
        # one launch of programs / cluster clusters (Triton's launcher makes clusters of num_ctas), with
        # shared memory for the exchange words
        compiled.run(programs // cluster, 1, 1, torch.cuda.current_stream().cuda_stream, compiled.function,
                     (w, cluster, g.XCH_OFFSET + g.XCH_BYTES), None, None, None, out, rows, BLOCK_T)
        torch.cuda.synchronize()
        got = out.view(programs, 2, rows).cpu()
        wrong = 0
        for pid in range(programs):
            for row in range(rows):
                ca, cb = 0.0, 1.0
                for k in range(1, min(pid % cluster, reads) + 1):
                    ca, cb = ca + cb * ((pid - k) * 100 + row), cb * 0.5
                wrong += abs(got[pid, 0, row].item() - ca) > 1e-3 * max(1.0, abs(ca)) or got[pid, 1, row].item() != cb
        print(f"{programs} programs, {warps} warps, {rows} rows: {wrong} of {programs * rows} rows wrong", flush=True)


if __name__ == "__main__":
    main()
