"""Experiment (session 36, not adopted): a persistent Gluon GAE kernel that parks a waiting tile in
shared memory. Right on the H200, and 42-105% slower than the Triton kernel at 16x1M time-major
(docs/benchmarks.md, session 36, "A persistent Gluon kernel that parks its waiting tile").

    python docs/experiments/gluon_parked.py            # on a CUDA GPU: check against float64, then time
    python docs/experiments/gluon_parked.py --compile  # without one: compile for sm_90, print registers

Time-major rollouts of exactly 16 envs whose steps divide into the chunk length (128 or 256 steps),
bool flags, bootstrap values, float32. Each program takes chunks by ticket (an atomic counter, so it
waits only on chunks of lower tickets, held by running programs: no deadlock whatever the block
order). For each chunk it loads the tile, then finishes the chunk it parked the iteration before (its
look-back is one iteration late, so its neighbours have usually published by then; its tile comes
back from shared memory), then scans the new tile, publishes its map and parks it. The walk reads a
window of 2 x warps chunks x 16 rows, one word a thread, and composes it with a scan across the
window, so every warp takes the same branch.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import benchmark_gae as bench  # noqa: E402  (make_inputs, the float64 reference, the timers)

from kernels import triton_gae  # noqa: E402  (on sys.path through benchmark_gae)

BLOCK_N = 16


# The Triton kernel's map algebra and state words, called from Gluon (a Gluon kernel may call
# @triton.jit functions).
_then, _compose_rest, _quad_suffixes = triton_gae._then, triton_gae._compose_with_rest, triton_gae._quad_suffixes
_low_float, _bits, _tag, _map_tag = triton_gae._low_float, triton_gae._float_bits, triton_gae._tag, triton_gae._map_tag
_MAP, _START = gl.constexpr(triton_gae.STATUS_MAP), gl.constexpr(triton_gae.STATUS_START)


@gluon.jit
def scan_quads(a0, b0, a1, b1, a2, b2, a3, b3, AXIS: gl.constexpr):
    """Each step's map to the end of the tile, for the four quarters of a quad tile (the Triton
    kernel's `_quad_tile`: quarter j holds steps 4k + j, quads k along AXIS): the maps within each
    quad in registers, one reverse scan of the quads' maps that also carries what follows each quad,
    and that composed in. Also returns what follows each quad."""
    zero = gl.zeros_like(a0)
    a0, b0, a1, b1, a2, b2, a3, b3 = _quad_suffixes(a0, b0, a1, b1, a2, b2, a3, b3, zero, zero + 1.0)
    _, _, after_a, after_b = gl.associative_scan((a0, b0, zero, zero + 1.0), AXIS, _compose_rest, reverse=True)
    a0, b0 = _then(a0, b0, after_a, after_b)
    a1, b1 = _then(a1, b1, after_a, after_b)
    a2, b2 = _then(a2, b2, after_a, after_b)
    a3, b3 = _then(a3, b3, after_a, after_b)
    return a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b


@gluon.jit
def _park(park, q: gl.constexpr, alpha, beta, value):
    # quarter q's maps to the chunk's end and values, into shared memory until the carry is known
    park.index(3 * q).store(alpha)
    park.index(3 * q + 1).store(beta)
    park.index(3 * q + 2).store(value)


@gluon.jit
def _window_compose(a_l, b_l, k_l, a_r, b_r, k_r):
    # closer chunk (l) first: F_l(F_r(x)); known if the closer one is, and the farther one is or the
    # closer one already cuts the chain (beta 0)
    cut = b_l == 0.0
    return gl.where(cut, a_l, a_l + b_l * a_r), b_l * b_r, k_l & (k_r | cut.to(gl.int32))


@gluon.jit
def _quarter(r_ptr, v_ptr, d_ptr, u_ptr, b_ptr, step, n, T, stride_t, gamma, gamma_lam):
    offs = step * stride_t + n
    reward = gl.load(r_ptr + offs)
    value = gl.load(v_ptr + offs)
    is_last = (step == T - 1) & (n >= 0)
    next_value = gl.load(v_ptr + offs + stride_t, mask=~is_last, other=0.0)
    terminated = gl.load(d_ptr + offs) != 0
    truncated = gl.load(u_ptr + offs) != 0
    bootstrap = gl.load(b_ptr + offs)
    next_value = gl.where(truncated | is_last, bootstrap, next_value)
    next_value = gl.where(terminated, 0.0, next_value)
    delta = reward + gamma * next_value - value
    beta = gl.where(terminated | truncated, 0.0, gamma_lam)
    return delta, beta, value


@gluon.jit
def _window_words(state_ptr, j, num_chunks, ok, BLOCK_N: gl.constexpr, WINDOW: gl.constexpr, WL: gl.constexpr):
    # the words of chunks j .. j + WINDOW - 1 of every row, one a thread (none where not ok)
    wrows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, WL))
    wch = gl.arange(0, WINDOW, layout=gl.SliceLayout(1, WL))
    later = gl.expand_dims(j, 0) + gl.expand_dims(wch, 1)  # [WINDOW, BLOCK_N]
    at = gl.minimum(later, num_chunks - 1) * BLOCK_N + gl.expand_dims(wrows, 0)
    return gl.load(state_ptr + at, mask=ok & (later >= 0), other=0, volatile=True)


@gluon.jit
def _resolve(state_ptr, epoch, j, acc_a, acc_b, num_chunks, chunk_beta, word,
             BLOCK_N: gl.constexpr, WINDOW: gl.constexpr, WL: gl.constexpr):
    # `word`: the first round's words, read by the caller before its tile's loads
    wch = gl.arange(0, WINDOW, layout=gl.SliceLayout(1, WL))
    pending = gl.full([BLOCK_N], 1, gl.int32, gl.SliceLayout(0, WL))
    carry = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(0, WL))
    last = gl.expand_dims(wch, 1) == WINDOW - 1
    while gl.max(pending, axis=0) > 0:
        later = gl.expand_dims(j, 0) + gl.expand_dims(wch, 1)  # [WINDOW, BLOCK_N]
        inside = later < num_chunks
        ready = (word >> 34) == epoch
        status = (word >> 32) & 3
        a = gl.where(inside & ready, _low_float(word), 0.0)
        b = gl.where(inside, gl.where(ready, gl.where(status == _MAP, chunk_beta, 0.0), 1.0), 0.0)
        k = gl.where(inside, ready.to(gl.int32), 1)
        sa, sb, sk = gl.associative_scan((a, b, k), 0, _window_compose)
        wa = gl.sum(gl.where(last, sa, 0.0), axis=0)
        wb = gl.sum(gl.where(last, sb, 0.0), axis=0)
        wk = gl.sum(gl.where(last, sk, 0), axis=0)
        known = (wk != 0) & (pending != 0)
        done = known & (wb == 0.0)
        carry = gl.where(done, acc_a + acc_b * wa, carry)
        more = known & (wb != 0.0)
        acc_a = gl.where(more, acc_a + acc_b * wa, acc_a)
        acc_b = gl.where(more, acc_b * wb, acc_b)
        j = gl.where(more, j + WINDOW, j)
        pending = gl.where(done, 0, pending)
        word = _window_words(state_ptr, j, num_chunks, gl.max(pending, axis=0) > 0, BLOCK_N, WINDOW, WL)
    return carry


@gluon.jit
def _finish(park, state_ptr, adv_ptr, ret_ptr, chunk, carry, epoch, stride_t, n, kq,
            BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr, L: gl.constexpr):
    c = gl.expand_dims(gl.convert_layout(carry, gl.SliceLayout(1, L)), 1)
    base = chunk * BLOCK_T + 4 * kq
    for q in gl.static_range(4):
        a = park.index(3 * q).load(L)
        b = park.index(3 * q + 1).load(L)
        v = park.index(3 * q + 2).load(L)
        adv = a + b * c
        offs = (base + q) * stride_t + n
        gl.store(adv_ptr + offs, adv)
        gl.store(ret_ptr + offs, adv + v)
        if q == 0:
            first = (kq == 0) & (n >= 0)
            word = _bits(adv) | _tag(epoch, _START)
            gl.atomic_xchg(state_ptr + chunk * BLOCK_N + n + 0 * kq, word, mask=first, sem="relaxed")


@gluon.jit(do_not_specialize=["ticket_base", "epoch"])
def _parked_gae_kernel(r_ptr, v_ptr, d_ptr, u_ptr, b_ptr, adv_ptr, ret_ptr, state_ptr, counter_ptr,
                       T, num_chunks, stride_t, ticket_base, gamma, gamma_lam, chunk_beta, epoch,
                       BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr, WINDOW: gl.constexpr, WARPS: gl.constexpr):
    # WINDOW x BLOCK_N words, one a thread: WINDOW = 2 * WARPS
    NUM_QUADS: gl.constexpr = BLOCK_T // 4
    L: gl.constexpr = gl.BlockedLayout([4, NUM_QUADS // (8 * WARPS)], [4, 8], [1, WARPS], [0, 1])
    WL: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [WARPS, 1], [1, 0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0, 1])
    park = gl.allocate_shared_memory(gl.float32, [12, BLOCK_N, NUM_QUADS], SL)
    n = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L)), 1)
    kq = gl.expand_dims(gl.arange(0, NUM_QUADS, layout=gl.SliceLayout(0, L)), 0)

    ticket = gl.atomic_add(counter_ptr, 1) - ticket_base
    parked = ticket * 0
    p_chunk = ticket * 0
    p_j = gl.zeros([BLOCK_N], gl.int64, gl.SliceLayout(0, WL))
    identity_a = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(0, WL))
    identity_b = identity_a + 1.0
    while ticket < num_chunks:
        chunk = num_chunks - 1 - ticket
        next_ticket = gl.atomic_add(counter_ptr, 1) - ticket_base
        # the parked chunk's first look-back round, read before this tile's loads: the trips overlap
        first = _window_words(state_ptr, p_j, num_chunks, parked != 0, BLOCK_N, WINDOW, WL)
        base = chunk * BLOCK_T + 4 * kq
        d0, b0, v0 = _quarter(r_ptr, v_ptr, d_ptr, u_ptr, b_ptr, base, n, T, stride_t, gamma, gamma_lam)
        d1, b1, v1 = _quarter(r_ptr, v_ptr, d_ptr, u_ptr, b_ptr, base + 1, n, T, stride_t, gamma, gamma_lam)
        d2, b2, v2 = _quarter(r_ptr, v_ptr, d_ptr, u_ptr, b_ptr, base + 2, n, T, stride_t, gamma, gamma_lam)
        d3, b3, v3 = _quarter(r_ptr, v_ptr, d_ptr, u_ptr, b_ptr, base + 3, n, T, stride_t, gamma, gamma_lam)
        if parked != 0:
            carry = _resolve(state_ptr, epoch, p_j, identity_a, identity_b, num_chunks, chunk_beta, first,
                             BLOCK_N, WINDOW, WL)
            _finish(park, state_ptr, adv_ptr, ret_ptr, p_chunk, carry, epoch, stride_t, n, kq,
                    BLOCK_N, BLOCK_T, L)
        d0, b0, d1, b1, d2, b2, d3, b3, _, _ = scan_quads(d0, b0, d1, b1, d2, b2, d3, b3, 1)
        first = (kq == 0) & (n >= 0)
        gl.atomic_xchg(state_ptr + chunk * BLOCK_N + n + 0 * kq, _bits(d0) | _map_tag(epoch, b0), mask=first,
                       sem="relaxed")
        _park(park, 0, d0, b0, v0)
        _park(park, 1, d1, b1, v1)
        _park(park, 2, d2, b2, v2)
        _park(park, 3, d3, b3, v3)
        p_chunk = chunk
        p_j = gl.zeros([BLOCK_N], gl.int64, gl.SliceLayout(0, WL)) + chunk + 1
        parked = ticket * 0 + 1
        ticket = next_ticket
    if parked != 0:
        first = _window_words(state_ptr, p_j, num_chunks, parked != 0, BLOCK_N, WINDOW, WL)
        carry = _resolve(state_ptr, epoch, p_j, identity_a, identity_b, num_chunks, chunk_beta, first,
                         BLOCK_N, WINDOW, WL)
        _finish(park, state_ptr, adv_ptr, ret_ptr, p_chunk, carry, epoch, stride_t, n, kq, BLOCK_N, BLOCK_T, L)


class ParkedGae:
    """Host side: a look-back state and a ticket counter per instance, an epoch per call."""

    def __init__(self, num_steps: int, device, programs: int, block_t: int = 256, warps: int = 4,
                 maxnreg: int | None = None):
        self.block_t, self.warps, self.maxnreg = block_t, warps, maxnreg
        self.num_chunks = num_steps // block_t
        self.state = torch.zeros(self.num_chunks * BLOCK_N, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.programs = programs
        self.epoch = 0
        self.ticket_base = 0

    def __call__(self, rewards, values, terminateds, truncateds, bootstrap, advantages, returns, gamma, lam):
        # time-major views [N, T] of [T, 16] buffers: env stride 1, step stride 16
        T = rewards.shape[1]
        BLOCK_T = self.block_t
        assert rewards.shape[0] == BLOCK_N and T % BLOCK_T == 0 and rewards.stride() == (1, BLOCK_N)
        self.epoch += 1
        gamma_lam = gamma * lam
        chunk_beta = torch.tensor(gamma_lam, dtype=torch.float32)
        for _ in range(BLOCK_T.bit_length() - 1):  # squared in float32, as the Triton kernel does
            chunk_beta = chunk_beta * chunk_beta
        _parked_gae_kernel[(self.programs,)](
            rewards, values, terminateds, truncateds, bootstrap, advantages, returns, self.state, self.counter,
            T, self.num_chunks, BLOCK_N, self.ticket_base, gamma, gamma_lam, float(chunk_beta), self.epoch,
            BLOCK_N=BLOCK_N, BLOCK_T=BLOCK_T, WINDOW=2 * self.warps, WARPS=self.warps, num_warps=self.warps,
            **({"maxnreg": self.maxnreg} if self.maxnreg else {}))
        # every program takes tickets until one is past the end: num_chunks + programs in all
        self.ticket_base += self.num_chunks + self.programs


# --- checking and timing (a CUDA GPU), or compiling for sm_90 (none) ---


CONFIGS = [tuple(int(v) for v in c.split(",")) for c in os.environ.get(
    "CONFIGS", "128,4,528,0 256,8,264,0 256,4,396,168 256,4,264,0").split()]  # block_t, warps, programs, maxnreg


def run_parked(x, k, gamma, lam):
    k(x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"],
      x["advantages"], x["returns"], gamma, lam)


def parked_kernels(T):
    return {f"{bt}x{warps}w/{programs}#{regs}": functools.partial(run_parked, k=ParkedGae(
        T, "cuda", programs, bt, warps, regs or None)) for bt, warps, programs, regs in CONFIGS}


def check(T, done_rate, gamma, lam, kernels=parked_kernels):
    """Each of `kernels(T)` (name: fn(x, gamma, lam)) against the float64 loop, three calls each, on
    outputs poisoned with NaN first."""
    x = bench.make_inputs(16, T, True, done_rate)
    expected = bench.reference_advantages(x, gamma, lam)
    for name, run in kernels(T).items():
        for call in range(3):
            x["advantages"].fill_(float("nan"))
            x["returns"].fill_(float("nan"))
            t0 = time.time()
            run(x, gamma=gamma, lam=lam)
            torch.cuda.synchronize()
            err = bench.relative_error(x, expected)
            ret_err = (x["returns"] - x["advantages"] - x["values"]).abs().max().item()
            print(f"check 16x{T} done {done_rate} g=l={gamma},{lam} {name}: call {call} "
                  f"rel err {err:.2e} returns err {ret_err:.2e} nan {x['advantages'].isnan().sum().item()} "
                  f"({time.time() - t0:.2f} s)", flush=True)


def timing(T, rounds=2, kernels=parked_kernels):
    """Device us of each of `kernels(T)` beside a copy of the same bytes and the Triton kernel."""
    x = bench.make_inputs(16, T, True)
    nbytes = bench.BYTES_PER_ELEMENT * 16 * T
    calls = max(5, min(100, int(2e8 // nbytes)))
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    runs = kernels(T)
    for r in range(rounds):
        cells = [f"copy {bench.queued_time_us(lambda: dst.copy_(src), calls):.2f}"]
        cells.append(f"HEAD {bench.queued_time_us(lambda: bench.launch_tile(x, {}), calls):.2f}")
        for name, run in runs.items():
            us = bench.queued_time_us(lambda run=run: run(x, gamma=bench.GAMMA, lam=bench.LAM), calls)
            cells.append(f"{name} {us:.2f}")
        print(f"time 16x{T} round {r}: " + "  ".join(cells), flush=True)


def resource_usage(compiled) -> str:
    """Registers and stack per thread of a kernel compiled by `triton.compile`, from its cubin."""
    import re
    import subprocess

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return re.search(r"REG:\d+ STACK:\d+", usage).group(0)


def compile_only():
    """Compile the kernel for sm_90 with this machine's Triton (no GPU needed); print registers and stack."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    k = _parked_gae_kernel
    types = dict(r_ptr="*fp32", v_ptr="*fp32", d_ptr="*i1", u_ptr="*i1", b_ptr="*fp32", adv_ptr="*fp32",
                 ret_ptr="*fp32", state_ptr="*i64", counter_ptr="*i64", T="i32", num_chunks="i32", stride_t="i32",
                 ticket_base="i64", gamma="fp32", gamma_lam="fp32", chunk_beta="fp32", epoch="i32",
                 BLOCK_N="constexpr", BLOCK_T="constexpr", WINDOW="constexpr", WARPS="constexpr")
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(9)}
    for bt, warps, _, regs in CONFIGS:
        consts = {(k.arg_names.index(n),): v
                  for n, v in dict(BLOCK_N=BLOCK_N, BLOCK_T=bt, WINDOW=2 * warps, WARPS=warps).items()}
        c = triton.compile(GluonASTSource(k, types, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=warps, maxnreg=regs or None))
        print(f"{bt}x{warps}w#{regs}:", resource_usage(c))


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
        sys.exit()
    print(torch.cuda.get_device_name(), flush=True)
    check(65536, 0.05, bench.GAMMA, bench.LAM)
    check(65536, 0.0, 1.0, 1.0)
    check(1 << 20, 0.001, bench.GAMMA, bench.LAM)
    timing(1 << 20)
    timing(1 << 19)
    timing(65536)
