"""Experiment (session 39): a persistent Gluon GAE kernel whose next tiles load through TMA into a
ring of shared-memory stages while it walks.

Sessions 34-37 located what 16x1M time-major loses to the copy: a program waits 1.7-3.5 us in its
look-back walk with its tile in registers, and nothing else on its SM loads in the meantime.
Two earlier persistent designs did not keep the next tile in flight during that wait (session 33 held
it in registers, and lost occupancy; session 36's `gluon_parked.py` parked the waiting tile instead,
so each tile's loads were still waited for in turn). Here each program takes the tiles
`pid, pid + G, pid + 2G, ...` (tickets from the end of time, so a walk only reads chunks of lower
tickets) and keeps the loads of the next STAGES - 1 of them in flight through TMA, against one
mbarrier a stage, while it scans, walks, finishes and stores the current one. The tile, the scan of
`B_t = gamma V_t + gamma lam A_t` (no `V(s_{t+1})` needed, as shared-memory views cannot shift by a
step), the one-word look-back state and the walk are `gluon_tma.py`'s (session 37).

Tickets are assigned statically, so every program of the grid must be resident at once (a walk may
wait on any lower ticket): `RingGae` sizes the grid as SMs x programs per SM, and the shared memory a
program needs bounds the latter.

    python docs/experiments/gluon_ring.py            # on a CUDA GPU: check against float64, then time
    python docs/experiments/gluon_ring.py --compile  # without one: compile for sm_90, print registers

Time-major rollouts of exactly 16 envs whose steps divide into 256, bool flags, bootstrap values,
float32.
"""

from __future__ import annotations

import functools
import os
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gluon_parked as parked  # noqa: E402  (the map algebra, the checks and timers)
import gluon_tma as tmak  # noqa: E402  (the tile's terms, the walk, descriptors)

BLOCK_N, BLOCK_T, _BN, _BT = tmak.BLOCK_N, tmak.BLOCK_T, tmak._BN, tmak._BT
_bits, _tag, _map_tag, _START = tmak._bits, tmak._tag, tmak._map_tag, tmak._START


@gluon.jit
def _issue(r_desc, v_desc, d_desc, u_desc, b_desc, r_s, v_s, d_s, u_s, b_s, bars, stage, chunk, pred,
           SPARSE: gl.constexpr):
    # one thread asks TMA for the input tiles of `chunk` into ring stage `stage`: three of floats and
    # two of flags, or (SPARSE) no bootstrap values, which the steps that use them read themselves
    bar = bars.index(stage)
    t0 = chunk * _BT
    mbarrier.expect(bar, _BT * _BN * (10 if SPARSE else 14), pred=pred)
    tma.async_copy_global_to_shared(r_desc, [t0, 0], bar, r_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [t0, 0], bar, v_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(d_desc, [t0, 0], bar, d_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(u_desc, [t0, 0], bar, u_s.index(stage), pred=pred)
    if not SPARSE:
        tma.async_copy_global_to_shared(b_desc, [t0, 0], bar, b_s.index(stage), pred=pred)


@gluon.jit
def _quarters(r_f, v_f, d_f, u_f, b_f, b_ptr, q: gl.constexpr, step, n, T, gamma, gamma_lam, L: gl.constexpr,
              SPARSE: gl.constexpr):
    d_q = d_f.slice(q * _BN, _BN, dim=1).load(L)
    u_q = u_f.slice(q * _BN, _BN, dim=1).load(L)
    if SPARSE:  # the bootstrap value counts where V(s_{t+1}) is one: truncated steps and the row's last
        wanted = ((u_q != 0) | (step + q == T - 1)) & (d_q == 0)
        b_q = gl.load(b_ptr + (step + q) * _BN + n, mask=wanted, other=0.0)
    else:
        b_q = b_f.slice(q * _BN, _BN, dim=1).load(L)
    return tmak._quarter(r_f.slice(q * _BN, _BN, dim=1).load(L), v_f.slice(q * _BN, _BN, dim=1).load(L),
                         d_q, u_q, b_q, step + q, T, gamma, gamma_lam)


@gluon.jit
def _scan_tile(r_s, v_s, d_s, u_s, b_s, b_ptr, stage, chunk, T, gamma, gamma_lam, kq, n, L: gl.constexpr,
               SPARSE: gl.constexpr):
    """The tile in ring stage `stage`, scanned: each step's `e` and map of B to the chunk's end (as
    `gluon_tma.py`), what follows each quad, and the stage's flat views for the finish."""
    NUM_QUADS: gl.constexpr = _BT // 4
    QW: gl.constexpr = 4 * _BN  # a quad's four steps, one row of the flat view
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    r_f = r_s.index(stage)._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    v_f = v_s.index(stage)._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    d_f = d_s.index(stage)._reinterpret(gl.uint8, [NUM_QUADS, QW], FLAT)
    u_f = u_s.index(stage)._reinterpret(gl.uint8, [NUM_QUADS, QW], FLAT)
    b_f = b_s.index(stage)._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    step = chunk * _BT + 4 * kq + 0 * n
    e0, a0, b0 = _quarters(r_f, v_f, d_f, u_f, b_f, b_ptr, 0, step, n, T, gamma, gamma_lam, L, SPARSE)
    e1, a1, b1 = _quarters(r_f, v_f, d_f, u_f, b_f, b_ptr, 1, step, n, T, gamma, gamma_lam, L, SPARSE)
    e2, a2, b2 = _quarters(r_f, v_f, d_f, u_f, b_f, b_ptr, 2, step, n, T, gamma, gamma_lam, L, SPARSE)
    e3, a3, b3 = _quarters(r_f, v_f, d_f, u_f, b_f, b_ptr, 3, step, n, T, gamma, gamma_lam, L, SPARSE)
    a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b = parked.scan_quads(a0, b0, a1, b1, a2, b2, a3, b3, 0)
    return e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f


@gluon.jit
def _complete_tile(e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f,
                   carry, own, first, epoch, T, n, adv_ptr, ret_ptr, L: gl.constexpr, PUBLISH: gl.constexpr):
    # the carry applied, the chunk's start value published (PUBLISH), the advantages and returns stored
    c = gl.expand_dims(gl.convert_layout(carry, gl.SliceLayout(0, L)), 0)
    a0, a1, a2, a3, after_a = a0 + b0 * c, a1 + b1 * c, a2 + b2 * c, a3 + b3 * c, after_a + after_b * c
    if PUBLISH:
        gl.atomic_xchg(own, _bits(a0) | _tag(epoch, _START), mask=first, sem="relaxed")
    offs = step * _BN + n
    tmak._finish(e0, a1, v_f, d_f, u_f, 0, step, T, offs, adv_ptr, ret_ptr, _BN, L)
    tmak._finish(e1, a2, v_f, d_f, u_f, 1, step, T, offs, adv_ptr, ret_ptr, _BN, L)
    tmak._finish(e2, a3, v_f, d_f, u_f, 2, step, T, offs, adv_ptr, ret_ptr, _BN, L)
    tmak._finish(e3, after_a, v_f, d_f, u_f, 3, step, T, offs, adv_ptr, ret_ptr, _BN, L)


@gluon.jit
def _deferred_tile(r_s, v_s, d_s, u_s, b_s, b_ptr, state_ptr, stage, chunk, words, T, num_chunks, gamma, gamma_lam,
                   chunk_beta, epoch, kq, n, first, adv_ptr, ret_ptr, L: gl.constexpr, WL: gl.constexpr,
                   WINDOW: gl.constexpr, SPARSE: gl.constexpr):
    # WALK 2: a chunk scanned and published an iteration ago, finished now (its walk's first round,
    # `words`, was read before this iteration's tile), scanned again from its stage
    j = gl.zeros([_BN], gl.int64, gl.SliceLayout(0, WL)) + chunk + 1
    identity_a = gl.zeros([_BN], gl.float32, gl.SliceLayout(0, WL))
    carry = parked._resolve(state_ptr, epoch, j, identity_a, identity_a + 1.0, num_chunks, chunk_beta, words,
                            _BN, WINDOW, WL)
    e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f = _scan_tile(
        r_s, v_s, d_s, u_s, b_s, b_ptr, stage, chunk, T, gamma, gamma_lam, kq, n, L, SPARSE)
    own = state_ptr + chunk * _BN + n + 0 * kq
    _complete_tile(e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f,
                   carry, own, first, epoch, T, n, adv_ptr, ret_ptr, L, True)


@gluon.jit(do_not_specialize=["epoch"])
def _ring_gae_kernel(r_desc, v_desc, d_desc, u_desc, b_desc, b_ptr, adv_ptr, ret_ptr, state_ptr,
                     T, num_chunks, gamma, gamma_lam, chunk_beta, epoch,
                     WINDOW: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr, WALK: gl.constexpr,
                     SPARSE: gl.constexpr):
    """WALK 0: no look-back (wrong answers, a bound); 1: each tile walks as soon as it has published
    its map; 2: each tile is finished an iteration later, after the next tile has published (see
    `_deferred_tile`), so its stage is held one iteration more."""
    NUM_QUADS: gl.constexpr = _BT // 4
    L: gl.constexpr = gl.BlockedLayout([NUM_QUADS // (8 * WARPS), 4], [8, 4], [WARPS, 1], [1, 0])
    WL: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [WARPS, 1], [1, 0])
    HELD: gl.constexpr = 2 if WALK == 2 else 1  # stages not free to load into: the tiles being worked on
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    num_tiles = (num_chunks - pid + G - 1) // G

    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    r_s = gl.allocate_shared_memory(gl.float32, [STAGES, _BT, _BN], r_desc.layout)
    v_s = gl.allocate_shared_memory(gl.float32, [STAGES, _BT, _BN], v_desc.layout)
    d_s = gl.allocate_shared_memory(gl.uint8, [STAGES, _BT, _BN], d_desc.layout)
    u_s = gl.allocate_shared_memory(gl.uint8, [STAGES, _BT, _BN], u_desc.layout)
    if SPARSE:
        b_s = r_s  # not loaded
    else:
        b_s = gl.allocate_shared_memory(gl.float32, [STAGES, _BT, _BN], b_desc.layout)
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    fence_async_shared()
    for s in gl.static_range(STAGES - HELD):  # the first tiles' loads
        _issue(r_desc, v_desc, d_desc, u_desc, b_desc, r_s, v_s, d_s, u_s, b_s, bars, s,
               num_chunks - 1 - (pid + s * G), s < num_tiles, SPARSE)

    kq = gl.expand_dims(gl.arange(0, NUM_QUADS, layout=gl.SliceLayout(1, L)), 1)
    n = gl.expand_dims(gl.arange(0, _BN, layout=gl.SliceLayout(0, L)), 0)
    first = (kq == 0) & (n >= 0)
    wj = gl.zeros([_BN], gl.int64, gl.SliceLayout(0, WL))
    for i in range(num_tiles):
        # the stage of tile i + STAGES - HELD held tile i - HELD, which every warp finished reading
        # last iteration: wait for all of them, then hand it to TMA
        gl.thread_barrier()
        fence_async_shared()
        ahead = i + STAGES - HELD
        _issue(r_desc, v_desc, d_desc, u_desc, b_desc, r_s, v_s, d_s, u_s, b_s, bars, ahead % STAGES,
               num_chunks - 1 - (pid + ahead * G), ahead < num_tiles, SPARSE)

        stage = i % STAGES
        chunk = num_chunks - 1 - (pid + i * G)
        if WALK == 2:  # the previous tile's first round, on its way during this tile's scan
            words = parked._window_words(state_ptr, wj + chunk + G + 1, num_chunks, i > 0, _BN, WINDOW, WL)
        mbarrier.wait(bars.index(stage), (i // STAGES) & 1)
        e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f = _scan_tile(
            r_s, v_s, d_s, u_s, b_s, b_ptr, stage, chunk, T, gamma, gamma_lam, kq, n, L, SPARSE)
        own = state_ptr + chunk * _BN + n + 0 * kq
        if WALK == 0:
            _complete_tile(e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f,
                           gl.zeros([_BN], gl.float32, gl.SliceLayout(0, WL)), own, first, epoch, T, n,
                           adv_ptr, ret_ptr, L, False)
        elif WALK == 1:
            gl.atomic_xchg(own, _bits(a0) | _map_tag(epoch, b0), mask=first, sem="relaxed")
            carry = tmak._walk(state_ptr, epoch, chunk, num_chunks, chunk_beta, _BN, 8, gl.SliceLayout(0, WL))
            _complete_tile(e0, e1, e2, e3, a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b, step, v_f, d_f, u_f,
                           carry, own, first, epoch, T, n, adv_ptr, ret_ptr, L, True)
        else:
            gl.atomic_xchg(own, _bits(a0) | _map_tag(epoch, b0), mask=first, sem="relaxed")
            if i > 0:
                _deferred_tile(r_s, v_s, d_s, u_s, b_s, b_ptr, state_ptr, (i - 1) % STAGES, chunk + G, words,
                               T, num_chunks, gamma, gamma_lam, chunk_beta, epoch, kq, n, first, adv_ptr, ret_ptr,
                               L, WL, WINDOW, SPARSE)
    if WALK == 2:
        if num_tiles > 0:  # the last tile
            last = num_chunks - 1 - (pid + (num_tiles - 1) * G)
            words = parked._window_words(state_ptr, wj + last + 1, num_chunks, True, _BN, WINDOW, WL)
            _deferred_tile(r_s, v_s, d_s, u_s, b_s, b_ptr, state_ptr, (num_tiles - 1) % STAGES, last, words,
                           T, num_chunks, gamma, gamma_lam, chunk_beta, epoch, kq, n, first, adv_ptr, ret_ptr,
                           L, WL, WINDOW, SPARSE)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))


class RingGae:
    """Host side: descriptors, a look-back state, an epoch per call; a grid of SMs x `per_sm`."""

    def __init__(self, num_steps: int, device, warps: int = 4, stages: int = 2, per_sm: int = 2,
                 walk: int = 1, sparse: int = 0, maxnreg: int | None = None):
        self.warps, self.stages, self.walk, self.sparse, self.maxnreg = warps, stages, walk, sparse, maxnreg
        self.num_chunks, self.programs, self.state = tmak.persistent_grid(num_steps, device, per_sm)
        self.epoch = 0

    def __call__(self, rewards, values, terminateds, truncateds, bootstrap, advantages, returns, gamma, lam):
        T, gamma_lam, chunk_beta = tmak.call_scalars(rewards, gamma, lam)
        self.epoch += 1
        d = tmak.tile_descriptor
        _ring_gae_kernel[(self.programs,)](
            d(rewards), d(values), d(terminateds), d(truncateds), d(bootstrap), bootstrap,
            advantages, returns, self.state, T, self.num_chunks, gamma, gamma_lam, chunk_beta, self.epoch,
            WINDOW=2 * self.warps, WARPS=self.warps, STAGES=self.stages, WALK=self.walk, SPARSE=self.sparse,
            num_warps=self.warps,
            **({"maxnreg": self.maxnreg} if self.maxnreg else {}))


# warps, stages, programs per SM, walk (0: none, wrong answers, a bound), bootstrap values read at
# the steps that use them (1) or loaded with the tile (0), register cap (0: none)
CONFIGS = [tuple(int(v) for v in c.split(",")) for c in os.environ.get(
    "CONFIGS", "4,2,2,1,1,0 4,3,1,2,1,0 4,4,1,2,1,0 4,4,1,2,1,232 8,4,1,2,1,0 4,3,1,2,0,0 8,3,1,2,0,0 "
    "4,2,2,0,1,0 8,4,1,0,1,0").split()]


def ring_kernels(T, walking_only=False):
    return {f"{w}w{st}s{p}p{'sp' if sp else ''} walk{walk}#{m}": functools.partial(
        tmak._run, k=RingGae(T, "cuda", w, st, p, walk, sp, m or None))
        for w, st, p, walk, sp, m in CONFIGS if walk or not walking_only}


def compile_only():
    """Compile for sm_90 with this machine's Triton (no GPU needed); print registers and shared memory."""
    desc = tmak.descriptor_type
    types = dict(r_desc=desc("fp32", 32), v_desc=desc("fp32", 32),
                 d_desc=desc("u8", 8), u_desc=desc("u8", 8), b_desc=desc("fp32", 32),
                 b_ptr="*fp32", adv_ptr="*fp32", ret_ptr="*fp32", state_ptr="*i64", T="i32", num_chunks="i32",
                 gamma="fp32", gamma_lam="fp32", chunk_beta="fp32", epoch="i32",
                 WINDOW="constexpr", WARPS="constexpr", STAGES="constexpr", WALK="constexpr", SPARSE="constexpr")
    for warps, stages, per_sm, walk, sparse, regs in CONFIGS:
        consts = dict(WINDOW=2 * warps, WARPS=warps, STAGES=stages, WALK=walk, SPARSE=sparse)
        usage = tmak.compile_sm90(_ring_gae_kernel, types, ("b_ptr", "adv_ptr", "ret_ptr", "state_ptr"), consts,
                                  warps, regs or None)
        print(f"{warps}w {stages} stages {per_sm}/SM walk {walk} sparse {sparse} #{regs}:", usage, flush=True)


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
        sys.exit()
    tmak.check_and_time(ring_kernels, timed=(1 << 20, 1 << 21, 65536))
