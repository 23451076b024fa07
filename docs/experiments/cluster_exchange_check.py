"""Experiment (session 39): checks, on a CUDA GPU of compute capability 9.0+, the map exchange of
`cluster-look-back.patch` alone: a small Triton kernel of 512 or 4096 programs, launched in
thread-block clusters of RL_GAE_CLUSTER programs, in which each program hands its neighbours one map
per row through distributed shared memory and composes the maps of up to RL_GAE_CLUSTER_READS later
programs. Every result is compared with the composition done on the host.

    git apply docs/experiments/cluster-look-back.patch
    RL_GAE_CLUSTER=16 RL_GAE_CLUSTER_PACK=1 python docs/experiments/cluster_exchange_check.py

Session 39 on the H200, with four rows a program: exact with RL_GAE_CLUSTER_PACK=1 at 512 programs on
two warps and 4096 on two and four. With a pack of 4 it is wrong, because those tensors hold fewer
than four rows per thread and Triton fills the missing operands with undef. The 64-row cases, four asm
instances per thread as in the GAE kernel, were added after the session's last device time and have
not run.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels import triton_gae as g  # noqa: E402  (with the patch applied)


@triton.jit
def _exchange_kernel(out_ptr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_N)
    alpha = (pid * 100 + rows).to(tl.float32)
    beta = tl.full([BLOCK_N], 0.5, tl.float32)
    ca, cb = g._cluster_exchange(rows, alpha, beta, BLOCK_N)
    tl.store(out_ptr + pid * BLOCK_N * 2 + rows, ca)
    tl.store(out_ptr + pid * BLOCK_N * 2 + BLOCK_N + rows, cb)


# (programs, warps, rows a program): four rows on two or four warps make one asm instance a thread,
# as in the runs that were exact; 64 rows on one warp make four (compiled for sm_90 with Triton 3.6),
# as the GAE kernel's 4-row and 16-row time-major tiles do
CASES = ((512, 2, 4), (4096, 4, 4), (4096, 2, 4), (512, 1, 64), (4096, 1, 64))


def main() -> None:
    if not g.CLUSTER:
        raise SystemExit("set RL_GAE_CLUSTER (16 or 8) with the patch applied")
    cluster, reads = g.CLUSTER, g.CLUSTER_READS
    for programs, warps, rows in CASES:
        out = torch.full((programs * 2 * rows,), float("nan"), device="cuda")
        compiled = _exchange_kernel.warmup(out, BLOCK_N=rows, num_warps=warps, grid=(programs,))
        compiled._init_handles()
        w, _, shared = compiled.packed_metadata
        # one launch of programs / cluster clusters (Triton's launcher makes clusters of num_ctas)
        compiled.run(programs // cluster, 1, 1, torch.cuda.current_stream().cuda_stream, compiled.function,
                     (w, cluster, shared), None, None, None, out, rows)
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
