"""Experiment (session 39): the Triton kernel's 16-env time-major programs made persistent, each with
its next tile loading through TMA into shared memory while it scans, walks and stores the current one.

`gluon_ring.py` (same session) kept the next tiles loading during the walk, but its programs read
their tiles from shared memory through the walk, so a ring of stages held every tile in flight and an
SM fitted two programs. This kernel keeps what the Triton kernel has, three four-warp programs an SM
with their tile in registers (168 registers a thread), and adds one shared-memory stage per program:
as soon as a program has copied its tile into registers, TMA starts loading its next tile into the
stage, so the next tile's loads overlap this tile's scan, walk and stores instead of starting when
the program exits. The scan is the Triton kernel's (maps `(delta, beta)` of `A`, four quarters a
quad); `V(s_{t+1})` of a quad's last step, the next quad's first, comes from a fifth load: a TMA
descriptor over every fourth row of the values, from the fifth step on.

Tickets count from the end of time, so a walk reads only chunks of lower tickets. They are static
(`pid, pid + G, ...`) or taken from an atomic counter. Static tickets need every program resident,
so the grid is SMs x `per_sm`, and `per_sm` must fit the compiled kernel's registers and shared
memory (`--compile` prints them; 3 needs at most 168 registers and 75 KB).

    python docs/experiments/gluon_prefetch.py            # on a CUDA GPU: check against float64, then time
    python docs/experiments/gluon_prefetch.py --compile  # without one: compile for sm_90, print resources

Time-major rollouts of exactly 16 envs whose steps divide into 256, bool flags, bootstrap values,
float32.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gluon_parked as parked  # noqa: E402  (the map algebra, the checks and timers)
import gluon_tma as tmak  # noqa: E402  (the walk, the shared-memory layout)

BLOCK_N, BLOCK_T, _BN, _BT = tmak.BLOCK_N, tmak.BLOCK_T, tmak._BN, tmak._BT
_bits, _tag, _map_tag, _START = tmak._bits, tmak._tag, tmak._map_tag, tmak._START


@gluon.jit
def _issue(r_desc, v_desc, n_desc, d_desc, u_desc, b_desc, r_s, v_s, n_s, d_s, u_s, b_s, bar, chunk, pred):
    # one thread asks TMA for the tiles of `chunk`: rewards, values, the values of each quad's next
    # step, the two flags and the bootstrap values
    t0 = chunk * _BT
    mbarrier.expect(bar, _BT * _BN * 15, pred=pred)  # 3 float tiles, 2 of flags, a quarter float tile
    tma.async_copy_global_to_shared(r_desc, [t0, 0], bar, r_s, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [t0, 0], bar, v_s, pred=pred)
    tma.async_copy_global_to_shared(n_desc, [chunk * (_BT // 4), 0], bar, n_s, pred=pred)
    tma.async_copy_global_to_shared(d_desc, [t0, 0], bar, d_s, pred=pred)
    tma.async_copy_global_to_shared(u_desc, [t0, 0], bar, u_s, pred=pred)
    tma.async_copy_global_to_shared(b_desc, [t0, 0], bar, b_s, pred=pred)


@gluon.jit
def _step_map(r_q, v_q, next_v, d_q, u_q, b_q, step, T, gamma, gamma_lam):
    """A step's map of A, `A_t = delta_t + beta_t * A_{t+1}`, as the Triton kernel builds it."""
    terminated = d_q != 0
    truncated = u_q != 0
    next_v = gl.where(truncated | (step == T - 1), b_q, next_v)
    next_v = gl.where(terminated, 0.0, next_v)
    return r_q + gamma * next_v - v_q, gl.where(terminated | truncated, 0.0, gamma_lam)


@gluon.jit(do_not_specialize=["ticket_base", "epoch"])
def _prefetch_gae_kernel(r_desc, v_desc, n_desc, d_desc, u_desc, b_desc, adv_ptr, ret_ptr, state_ptr,
                         counter_ptr, T, num_chunks, ticket_base, gamma, gamma_lam, chunk_beta, epoch,
                         WINDOW: gl.constexpr, WARPS: gl.constexpr, WALK: gl.constexpr, TICKETS: gl.constexpr):
    """TICKETS 0: program `pid` takes tickets pid, pid + G, ...; 1: each program takes its next ticket
    from an atomic counter (read an iteration early), so the tiles go to programs as they free up."""
    NUM_QUADS: gl.constexpr = _BT // 4
    QW: gl.constexpr = 4 * _BN  # a quad's four steps, one row of the flat view
    L: gl.constexpr = gl.BlockedLayout([NUM_QUADS // (8 * WARPS), 4], [8, 4], [WARPS, 1], [1, 0])
    WL: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [WARPS, 1], [1, 0])
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    if TICKETS:
        ticket = (gl.atomic_add(counter_ptr, 1) - ticket_base).to(gl.int32)
    else:
        ticket = pid

    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    r_s = gl.allocate_shared_memory(gl.float32, [_BT, _BN], r_desc.layout)
    v_s = gl.allocate_shared_memory(gl.float32, [_BT, _BN], v_desc.layout)
    n_s = gl.allocate_shared_memory(gl.float32, [NUM_QUADS, _BN], n_desc.layout)
    d_s = gl.allocate_shared_memory(gl.uint8, [_BT, _BN], d_desc.layout)
    u_s = gl.allocate_shared_memory(gl.uint8, [_BT, _BN], u_desc.layout)
    b_s = gl.allocate_shared_memory(gl.float32, [_BT, _BN], b_desc.layout)
    r_f = r_s._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    v_f = v_s._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    d_f = d_s._reinterpret(gl.uint8, [NUM_QUADS, QW], FLAT)
    u_f = u_s._reinterpret(gl.uint8, [NUM_QUADS, QW], FLAT)
    b_f = b_s._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    mbarrier.init(bar, count=1)
    fence_async_shared()
    _issue(r_desc, v_desc, n_desc, d_desc, u_desc, b_desc, r_s, v_s, n_s, d_s, u_s, b_s, bar,
           num_chunks - 1 - ticket, ticket < num_chunks)

    kq = gl.expand_dims(gl.arange(0, NUM_QUADS, layout=gl.SliceLayout(1, L)), 1)
    n = gl.expand_dims(gl.arange(0, _BN, layout=gl.SliceLayout(0, L)), 0)
    first = (kq == 0) & (n >= 0)
    phase = 0
    while ticket < num_chunks:
        if TICKETS:
            next_ticket = (gl.atomic_add(counter_ptr, 1) - ticket_base).to(gl.int32)
        else:
            next_ticket = ticket + G
        chunk = num_chunks - 1 - ticket
        step = chunk * _BT + 4 * kq + 0 * n
        mbarrier.wait(bar, phase)
        phase ^= 1
        v0 = v_f.slice(0, _BN, dim=1).load(L)
        v1 = v_f.slice(_BN, _BN, dim=1).load(L)
        v2 = v_f.slice(2 * _BN, _BN, dim=1).load(L)
        v3 = v_f.slice(3 * _BN, _BN, dim=1).load(L)
        a0, b0 = _step_map(r_f.slice(0, _BN, dim=1).load(L), v0, v1, d_f.slice(0, _BN, dim=1).load(L),
                           u_f.slice(0, _BN, dim=1).load(L), b_f.slice(0, _BN, dim=1).load(L), step, T,
                           gamma, gamma_lam)
        a1, b1 = _step_map(r_f.slice(_BN, _BN, dim=1).load(L), v1, v2, d_f.slice(_BN, _BN, dim=1).load(L),
                           u_f.slice(_BN, _BN, dim=1).load(L), b_f.slice(_BN, _BN, dim=1).load(L), step + 1, T,
                           gamma, gamma_lam)
        a2, b2 = _step_map(r_f.slice(2 * _BN, _BN, dim=1).load(L), v2, v3, d_f.slice(2 * _BN, _BN, dim=1).load(L),
                           u_f.slice(2 * _BN, _BN, dim=1).load(L), b_f.slice(2 * _BN, _BN, dim=1).load(L),
                           step + 2, T, gamma, gamma_lam)
        a3, b3 = _step_map(r_f.slice(3 * _BN, _BN, dim=1).load(L), v3, n_s.load(L),
                           d_f.slice(3 * _BN, _BN, dim=1).load(L), u_f.slice(3 * _BN, _BN, dim=1).load(L),
                           b_f.slice(3 * _BN, _BN, dim=1).load(L), step + 3, T, gamma, gamma_lam)
        # every warp has its tile in registers: the stage is free for the next tile
        gl.thread_barrier()
        fence_async_shared()
        _issue(r_desc, v_desc, n_desc, d_desc, u_desc, b_desc, r_s, v_s, n_s, d_s, u_s, b_s, bar,
               num_chunks - 1 - next_ticket, next_ticket < num_chunks)

        a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b = parked.scan_quads(a0, b0, a1, b1, a2, b2, a3, b3, 0)
        own = state_ptr + chunk * _BN + n + 0 * kq
        if WALK:
            gl.atomic_xchg(own, _bits(a0) | _map_tag(epoch, b0), mask=first, sem="relaxed")
            carry = tmak._walk(state_ptr, epoch, chunk, num_chunks, chunk_beta, _BN, WINDOW, gl.SliceLayout(0, WL))
            c = gl.expand_dims(gl.convert_layout(carry, gl.SliceLayout(0, L)), 0)
            a0, a1, a2, a3 = a0 + b0 * c, a1 + b1 * c, a2 + b2 * c, a3 + b3 * c
            gl.atomic_xchg(own, _bits(a0) | _tag(epoch, _START), mask=first, sem="relaxed")
        offs = step * _BN + n
        gl.store(adv_ptr + offs, a0)
        gl.store(ret_ptr + offs, a0 + v0)
        gl.store(adv_ptr + offs + _BN, a1)
        gl.store(ret_ptr + offs + _BN, a1 + v1)
        gl.store(adv_ptr + offs + 2 * _BN, a2)
        gl.store(ret_ptr + offs + 2 * _BN, a2 + v2)
        gl.store(adv_ptr + offs + 3 * _BN, a3)
        gl.store(ret_ptr + offs + 3 * _BN, a3 + v3)
        ticket = next_ticket
    mbarrier.invalidate(bar)


class PrefetchGae:
    """Host side: descriptors, a look-back state, an epoch per call; a grid of SMs x `per_sm`."""

    def __init__(self, num_steps: int, device, warps: int = 4, per_sm: int = 3, walk: int = 1,
                 window: int = 8, maxnreg: int | None = 168, tickets: int = 0):
        self.warps, self.walk, self.window, self.maxnreg, self.tickets = warps, walk, window, maxnreg, tickets
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.ticket_base = 0
        self.num_chunks, self.programs, self.state = tmak.persistent_grid(num_steps, device, per_sm)
        self.epoch = 0

    def __call__(self, rewards, values, terminateds, truncateds, bootstrap, advantages, returns, gamma, lam):
        T, gamma_lam, chunk_beta = tmak.call_scalars(rewards, gamma, lam)
        self.epoch += 1
        d = tmak.tile_descriptor
        # every fourth step's values from the fifth on: row k is V at step 4k + 4, the step after quad k
        following = TensorDescriptor.from_tensor(values.T[4::4], [BLOCK_T // 4, BLOCK_N], tmak._layout(32))
        _prefetch_gae_kernel[(self.programs,)](
            d(rewards), d(values), following, d(terminateds), d(truncateds), d(bootstrap),
            advantages, returns, self.state, self.counter, T, self.num_chunks, self.ticket_base, gamma, gamma_lam,
            chunk_beta, self.epoch, WINDOW=self.window, WARPS=self.warps, WALK=self.walk,
            TICKETS=self.tickets, num_warps=self.warps, **({"maxnreg": self.maxnreg} if self.maxnreg else {}))
        if self.tickets:  # every program takes tickets until one is past the end
            self.ticket_base += self.num_chunks + self.programs


# warps, programs per SM, walk (0: none, wrong answers, a bound), look-back window, register cap (0: none),
# tickets (0: static, 1: an atomic counter)
CONFIGS = [tuple(int(v) for v in c.split(",")) for c in os.environ.get(
    "CONFIGS", "4,3,1,4,168,0 4,3,1,4,168,1 4,3,1,2,168,1 4,3,1,8,168,1 4,3,0,4,168,1 4,3,0,4,168,0").split()]


def prefetch_kernels(T, walking_only=False):
    return {f"{w}w{p}p{'a' if tk else ''} walk{walk}@{win}#{m}": functools.partial(
        tmak._run, k=PrefetchGae(T, "cuda", w, p, walk, win, m or None, tk))
        for w, p, walk, win, m, tk in CONFIGS if walk or not walking_only}


def compile_only():
    """Compile for sm_90 with this machine's Triton (no GPU needed); print registers and shared memory."""
    desc = tmak.descriptor_type
    types = dict(r_desc=desc("fp32", 32), v_desc=desc("fp32", 32), n_desc=desc("fp32", 32, BLOCK_T // 4),
                 d_desc=desc("u8", 8), u_desc=desc("u8", 8), b_desc=desc("fp32", 32),
                 adv_ptr="*fp32", ret_ptr="*fp32", state_ptr="*i64", counter_ptr="*i64", T="i32",
                 num_chunks="i32", ticket_base="i64", gamma="fp32", gamma_lam="fp32", chunk_beta="fp32",
                 epoch="i32", WINDOW="constexpr", WARPS="constexpr", WALK="constexpr", TICKETS="constexpr")
    for warps, per_sm, walk, window, regs, tickets in CONFIGS:
        consts = dict(WINDOW=window, WARPS=warps, WALK=walk, TICKETS=tickets)
        usage = tmak.compile_sm90(_prefetch_gae_kernel, types, ("adv_ptr", "ret_ptr", "state_ptr", "counter_ptr"),
                                  consts, warps, regs or None)
        print(f"{warps}w {per_sm}/SM walk {walk} @{window} #{regs} tickets {tickets}:", usage, flush=True)


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
        sys.exit()
    tmak.check_and_time(prefetch_kernels, timed=(1 << 20, 1 << 21, 65536))
