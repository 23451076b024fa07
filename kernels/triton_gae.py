"""Triton GAE: one kernel, a parallel associative scan over time, chunks joined by a look-back.

Each program owns a tile of `[BLOCK_N, BLOCK_T]` (envs x steps). Inside the tile a reverse
`tl.associative_scan` composes the affine maps `f_t(x) = delta_t + beta_t * x` (time-major tiles
first compose each thread's four consecutive steps in registers: `_quad_tile`). Rows longer than
one tile are cut into chunks, each its own program, so a handful of envs with a million steps
still fills the GPU. A chunk learns its carry (the advantage at the first step after it) by a
decoupled look-back over the chunks later in time, which publish their composed map as soon as
they have it and their exact start advantage once they know it.

The math and the look-back protocol are explained in `kernels/README.md`; arguments were validated
by `kernels.gae.compute_gae`. The host side launches through a cache of compiled kernels (see
`GaeLaunch`), because Triton's generic launch path costs about 0.7 us per argument on a slow host,
and replays a CUDA graph of a call that repeats (`GaeLaunch._replay_or_capture`).
"""

from __future__ import annotations

import functools
import math
import operator
import os
import threading
import warnings

import torch
import triton
import triton.language as tl

try:  # programmatic dependent launch (`uses_pdl`); pyproject.toml asks for a Triton that has it (3.5)
    from triton.language.extra.cuda import gdc_wait
except ImportError:
    gdc_wait = None

# Set before import, TRITON_INTERPRET=1 runs every kernel in Triton's interpreter (kernels.gae then sends
# CPU tensors here too).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Bootstrap modes (the `BOOTSTRAP` constexpr). A tensor is read at every step, or (SPARSE) only in
# the runs of four steps that hold a truncation or the last column, or (MASKED) only at those steps
# (see SPARSE_BOOTSTRAP_MAX_STEPS).
BOOTSTRAP_NONE, BOOTSTRAP_LAST_VALUE, BOOTSTRAP_TENSOR, BOOTSTRAP_TENSOR_SPARSE, BOOTSTRAP_TENSOR_MASKED = 0, 1, 2, 3, 4

MAX_BLOCK_T = 1 << 16
# Tile sizes, from the sweeps in docs/benchmarks.md (H200): 1024 elements per tile. Env-major
# tiles take whole rows up to 2048 steps, and up to 4096 from 128 envs (no chunk join; four
# elements per thread, up to 16 warps; with fewer rows, 4096-step rows ran faster as four chunks
# in parallel), and cut longer rows into 1024-step chunks. Time-major tiles: from 1024 envs up,
# with rows longer than 128 steps, 32 envs x 64 steps on four warps (128-byte lines; 5-10% faster
# at 4M elements than 32 x 32 on one warp once the quads' scan carried what follows each quad,
# equal at 1024x1024; session 19);
# otherwise, from 8 envs and 128 steps up, 4096-element tiles of 16 envs (8 if there are
# only 8), four elements per thread, on eight warps, or on four from 2048 programs up (see
# WIDE_TILE_MANY_PROGRAMS). They were 10-36% faster than 8 x 128 on one warp at every such
# shape measured in session 18, slower at 1024+ envs with long rows; with 5-7 envs, session 20
# measured them 25% faster at 6x65536, equal at 7x65536 and 30% slower at 5x100000, whose odd step
# stride leaves one-element loads. Fewer envs: 256-step tiles on two or eight warps (NARROW_TILE_STEPS),
# but 3 envs, 4 x 128 on one warp. Shorter rows: 8 x 128 steps on one warp.
TILE_ELEMENTS = 1024
WHOLE_ROW_STEPS, WHOLE_ROW_STEPS_MANY_ENVS, WHOLE_ROW_MANY_ENVS = 2048, 4096, 128
TIME_MAJOR_BLOCK_N = 8
TIME_MAJOR_MANY_ENVS, TIME_MAJOR_MANY_ENVS_BLOCK_N, TIME_MAJOR_MANY_ENVS_ELEMENTS = 1024, 32, 2048
WIDE_TILE_ELEMENTS, WIDE_TILE_BLOCK_N, WIDE_TILE_MIN_ENVS, WIDE_TILE_MIN_STEPS, WIDE_TILE_WARPS = 4096, 16, 8, 128, 8
# From this many programs (several waves), the wide tiles run on four warps instead: 167 registers a
# thread hold three programs per SM instead of two, and a program waiting in the look-back then idles
# a third of its SM instead of half (16x1M time-major 135 -> 127 us, 32x1M 275-281 -> 251-256,
# 128x65536 71 -> 69; slower on grids of about one wave: 16x65536 9.8 -> 10.8; sessions 20-21).
WIDE_TILE_MANY_PROGRAMS, WIDE_TILE_WARPS_MANY_PROGRAMS = 2048, 4
# Rollouts of 2, 4 and 5-7 envs (`narrow` in `plan`; their rows are long, or the call would be tiny):
# tiles of 256 steps, 8 envs (5-7) on eight warps, 4 or 2 envs on two. Against the one-warp 8 x 128 and
# 4 x 128 tiles they replaced (session 27, two rounds in one call each): 5-7 envs 2-43% faster at
# every shape measured (6x65536 8.8 us against 12.7, 5x100000 11.2-11.4 against 13.2-13.3, 7x1M 107.7
# against 116.3; the 8 x 128 tile held 255 registers and spilled); 4 envs 1-10% (4x131072 7.26-7.40
# against 7.33-7.49, 4x16384 4.6-4.7 against 5.1-5.2), 2 envs 34-35% (2x1M 18.5 against 28.6).
# Three envs keep the one-warp 4 x 128 tile: their steps are 12 bytes apart, no vectors, and the
# two-warp tile ran 6-16% slower.
# (One env a tile, a strided `[1, T]` view, was not measured: it keeps 1 x 128 on one warp.)
NARROW_TILE_ENVS, NARROW_TILE_STEPS, NARROW_TILE_WARPS, NARROW_TILE_WARPS_8_ENVS = (2, 4, 5, 6, 7), 256, 2, 8
# Up to this many elements a call is launch-bound: one env row per program maximises parallelism.
TINY_PROBLEM = 32768


@triton.jit
def _compose(alpha_later, beta_later, alpha, beta):
    # Reverse scan: the accumulator is the map of the later steps, g = f_{t+1} o ... ;
    # the current step's map goes outside: f_t(g(x)) = alpha + beta * (alpha_g + beta_g * x).
    return alpha + beta * alpha_later, beta * beta_later


@triton.jit
def _compose_with_rest(alpha_later, beta_later, rest_alpha_later, rest_beta_later, alpha, beta, rest_alpha, rest_beta):
    # A run of steps as two maps: the whole run, and the run without its first step (the identity
    # for a single step). Followed by a later run, the first becomes the composition of both, the
    # second the current run's rest followed by the whole later run.
    return (alpha + beta * alpha_later, beta * beta_later,
            rest_alpha + rest_beta * alpha_later, rest_beta * beta_later)


@triton.jit
def _float_bits(x):
    return x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF


@triton.jit
def _low_float(word):
    return (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


# A chunk's state word, one per (chunk, row): a float in bits 0-31, what the float is in bits 32-33 (a
# STATUS_*), and the call's epoch from bit 34. A chunk first publishes its map, F(x) = alpha + beta * x,
# as a word of `alpha` whose status says which beta goes with it: the whole chunk's product of
# `gamma * lam` over its steps, or 0 where a done flag cuts it (a chunk's beta can be nothing else);
# then it overwrites that word with its start advantage. One word a chunk, not three (alpha, beta,
# start advantage): a walk reads a third of the words, and a map is never half published.
STATUS_MAP, STATUS_CUT, STATUS_START = 1, 2, 3
_MAP, _CUT, _START = tl.constexpr(STATUS_MAP), tl.constexpr(STATUS_CUT), tl.constexpr(STATUS_START)


@triton.jit
def _tag(epoch, status):
    # The high half of a word: the epoch above the status (a constexpr, or an int64 tensor).
    return (epoch.to(tl.int64) << 34) | (status << 32)


@triton.jit
def _map_tag(epoch, beta):
    # The high half of a word that holds a map's alpha, for each element of `beta`.
    return tl.where(beta == 0.0, _tag(epoch, _CUT), _tag(epoch, _MAP))


@triton.jit
def _chunk_beta(gamma_lam, STEPS: tl.constexpr):
    # The beta of a chunk of STEPS steps (a power of two) that no done flag cuts: gamma * lam to the
    # power STEPS, by squaring. (The tile's own product of its steps' betas differs from this by a few
    # float32 roundings, as any two orders of the product do.)
    beta = gamma_lam
    for i in tl.static_range(1, 17):
        if (1 << i) <= STEPS:
            beta = beta * beta
    return beta


@triton.jit
def _first_column(x, BLOCK_T: tl.constexpr):
    # [BLOCK_N, BLOCK_T] -> [BLOCK_N]: the earliest step of each row of the tile.
    return tl.sum(tl.where((tl.arange(0, BLOCK_T) == 0)[None, :], x, 0.0), axis=1)


# How a chunk publishes its map and start advantage (the PUBLISH_COLUMN constexpr): from its tile summed
# to the first column; from that column with Triton's atomics; from it with atomics in inline PTX.
PUBLISH_SUMMED, PUBLISH_ATOMIC, PUBLISH_PTX = 0, 1, 2
_PTX = tl.constexpr(PUBLISH_PTX)  # what kernels may read of it (Triton reads only constexpr globals)


@triton.jit
def _publish_first_column(ptr, own, row_ok, x, tag, BLOCK_T: tl.constexpr, PTX: tl.constexpr):
    # The words at `ptr + own` (one a row) become the tile's earliest step of each row, tagged,
    # published by the threads that hold that column. No reduction of the tile to a column first:
    # its trips across lanes, and warps, sat between the scan and the publication of every chunk.
    first = (tl.arange(0, BLOCK_T) == 0)[None, :]
    at = own[:, None] + 0 * tl.arange(0, BLOCK_T)[None, :]
    mask = row_ok[:, None] & first
    if PTX:
        # Triton gives an atomic on 64-bit words its own layout, one element a thread, and moves the
        # tile there through shared memory (a barrier each time: three a chunk). An elementwise
        # inline-asm op keeps the tile's layout; the threads that do not hold the column skip the
        # exchange on a predicate. (The interpreter cannot run PTX: CPU launches never take this.)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p atom.relaxed.gpu.global.exch.b64 $0, [$1], $2; }",
            "=l,l,l,r", [(ptr + at).to(tl.int64), _float_bits(x) | tag, mask.to(tl.int32)],
            dtype=tl.int64, is_pure=False, pack=1)
    else:
        tl.atomic_xchg(ptr + at, _float_bits(x) | tag, mask=mask, sem="relaxed")


@triton.jit
def _publishes_start(chunk, num_chunks, INCLUSIVE_EVERY: tl.constexpr):
    # Whether this chunk publishes its start advantage. Tests raise INCLUSIVE_EVERY to withhold most:
    # the interpreter runs programs one at a time, so otherwise every walk would end at its neighbour
    # and the windows' composition of aggregates would never run on the CPU. (The last chunk publishes
    # no aggregate: it always publishes this.)
    return (chunk % INCLUSIVE_EVERY == 0) | (chunk == num_chunks - 1)


@triton.jit
def _publish_start(state_ptr, epoch, rows, row_ok, chunk, num_chunks, advantage, BLOCK_N: tl.constexpr,
                   BLOCK_T: tl.constexpr, INCLUSIVE_EVERY: tl.constexpr, PUBLISH_COLUMN: tl.constexpr):
    """Publish this chunk's start advantages, the first column of its tile's `advantage` (carry
    applied), as `_look_back` does with PUBLISH_SUMMED."""
    words = tl.num_programs(0) * BLOCK_N
    own = chunk * (words // num_chunks) + rows
    if _publishes_start(chunk, num_chunks, INCLUSIVE_EVERY):
        _publish_first_column(state_ptr, own, row_ok, advantage, _tag(epoch, _START), BLOCK_T,
                              PUBLISH_COLUMN == _PTX)


@triton.jit
def _flag_offsets(offsets, FLAG_AXIS: tl.constexpr):
    # Triton gives every load of a tile's shape the widest vector any of them allows: one-byte flags
    # along their contiguous axis would make it 8 or 16 elements per thread, while stores stay at
    # four floats (16 bytes), so every result went through shared memory to meet the stores' layout.
    # Writing the offsets as runs of four caps what the compiler can prove contiguous at 4, and every
    # tensor shares one layout (the compiler folds the arithmetic away). A `tl.max_contiguous` hint
    # did not do it: Triton 3.6 and 3.9 keep the larger contiguity they derive (docs/benchmarks.md,
    # session 19). Only set where the flags' stride along that axis is 1 and the tile spans at least
    # 4 elements along it (see `flag_hint_axis`).
    if FLAG_AXIS >= 0:
        offsets = (offsets // 4) * 4 + offsets % 4
    return offsets


@triton.jit
def _any_in_runs_of_four(x):
    # `x` or-ed over each run of four along the steps (axis 1), as one value per run: a load under
    # this mask stays one 16-byte vector load, where a mask that varies inside a run splits it into
    # four predicated scalar loads.
    a: tl.constexpr = x.shape[0]
    b: tl.constexpr = x.shape[1]
    runs = tl.max(tl.reshape(x.to(tl.int8), [a, b // 4, 4]), axis=2)
    runs = tl.reshape(tl.broadcast_to(runs[:, :, None], [a, b // 4, 4]), [a, b])
    return tl.max_constancy(runs != 0, [1, 4])


@triton.jit
def _multiple(x, ALIGN: tl.constexpr):
    # `x`, known by the host to be a multiple of ALIGN: the product tells the compiler so (it folds
    # the arithmetic into a mask of the low bits).
    return (x // ALIGN) * ALIGN


@triton.jit
def _multiples(extent, rewards, values, terminateds, truncateds, bootstrap, advantages, returns, ALIGN: tl.constexpr):
    # `_multiple` of the contiguous axis's extent and of every tensor's stride along the other axis.
    return (_multiple(extent, ALIGN), _multiple(rewards, ALIGN), _multiple(values, ALIGN),
            _multiple(terminateds, ALIGN), _multiple(truncateds, ALIGN), _multiple(bootstrap, ALIGN),
            _multiple(advantages, ALIGN), _multiple(returns, ALIGN))


@triton.jit
def _step_terms(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    rows, steps, N, T,
    stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
    stride_un, stride_ut, stride_bn, stride_bt, stride_l,
    gamma, gamma_lam,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, FLAG_AXIS: tl.constexpr, EVEN: tl.constexpr,
):
    """Load the given steps of the given rows: each step's map `f_t(x) = delta_t + beta_t * x`,
    V(s_t), the mask and the steps, all `[len(rows), len(steps)]`."""
    if EVEN:  # tiles divide the problem: a mask the compiler folds away (loads and stores unmasked)
        row_ok = rows == rows
        mask = row_ok[:, None] & (steps == steps)[None, :]
    else:
        row_ok = rows < N
        mask = row_ok[:, None] & (steps < T)[None, :]
    n = rows[:, None]
    t = steps[None, :]
    is_last = t == T - 1

    reward = tl.load(rewards_ptr + n * stride_rn + t * stride_rt, mask=mask, other=0.0)
    value = tl.load(values_ptr + n * stride_vn + t * stride_vt, mask=mask, other=0.0)
    # values[t+1]: the same cache lines as `value` (but one), so DRAM sees those bytes once.
    next_value = tl.load(values_ptr + n * stride_vn + (t + 1) * stride_vt,
                         mask=mask & ~is_last, other=0.0)
    terminated = tl.load(terminateds_ptr + _flag_offsets(n * stride_dn + t * stride_dt, FLAG_AXIS),
                         mask=mask, other=0) != 0
    done = terminated
    if BOOTSTRAP >= 2:
        if BOOTSTRAP == 2:
            bootstrap = tl.load(bootstrap_ptr + n * stride_bn + t * stride_bt, mask=mask, other=0.0)
        wanted = is_last  # where bootstrap_values counts: truncated steps and the last column
        if HAS_TRUNCATEDS:
            truncated = tl.load(truncateds_ptr + _flag_offsets(n * stride_un + t * stride_ut, FLAG_AXIS),
                                mask=mask, other=0) != 0
            done = done | truncated
            wanted = truncated | wanted
        if BOOTSTRAP >= 3:
            # Read only where it counts (4: MASKED), or in the runs of four steps that hold such a
            # step (3: SPARSE, one mask value per 16-byte vector): a warp whose lanes are all masked
            # off asks memory for nothing (see SPARSE_BOOTSTRAP_MAX_STEPS).
            wanted = tl.broadcast_to(wanted, mask.shape)
            read = _any_in_runs_of_four(wanted) if BOOTSTRAP == 3 else wanted
            bootstrap = tl.load(bootstrap_ptr + n * stride_bn + t * stride_bt, mask=mask & read, other=0.0)
        next_value = tl.where(wanted, bootstrap, next_value)
    elif BOOTSTRAP == 1:
        last_value = tl.load(last_value_ptr + rows * stride_l, mask=row_ok, other=0.0)  # [BLOCK_N]
        next_value = tl.where(is_last, last_value[:, None], next_value)
    # `where`, not (1 - terminated) * V: the value after a terminal step may be anything, even inf.
    next_value = tl.where(terminated, 0.0, next_value)

    delta = reward + gamma * next_value - value
    beta = tl.where(done | ~mask, 0.0, gamma_lam)  # padding must not carry anything across
    return delta, beta, value, mask, t


@triton.jit
def _then(alpha, beta, next_alpha, next_beta):
    # The map f o g of a step f = (alpha, beta) followed by g = (next_alpha, next_beta).
    return alpha + beta * next_alpha, beta * next_beta


@triton.jit
def _quad_suffixes(a0, b0, a1, b1, a2, b2, a3, b3, next_alpha, next_beta):
    """Each of four consecutive steps' maps composed with everything after it (in registers)."""
    a3, b3 = _then(a3, b3, next_alpha, next_beta)
    a2, b2 = _then(a2, b2, a3, b3)
    a1, b1 = _then(a1, b1, a2, b2)
    a0, b0 = _then(a0, b0, a1, b1)
    return a0, b0, a1, b1, a2, b2, a3, b3


@triton.jit
def _probe(state_ptr, rows, row_ok, chunk, num_chunks, BLOCK_N: tl.constexpr, READ: tl.constexpr):
    """The next chunk's word for each row, read as the program starts so that its trip to L2 overlaps
    the tile's loads instead of following the scan; the walk uses it if it is already a start
    advantage. 0 (a word of no epoch: not ready) for the last chunk, and everywhere unless READ."""
    if READ:
        words = tl.num_programs(0) * BLOCK_N
        at = (chunk + 1) * (words // num_chunks) + rows
        mask = row_ok & (chunk + 1 + 0 * rows < num_chunks)  # [BLOCK_N], not a scalar: the interpreter wants that
        return tl.load(state_ptr + at, mask=mask, other=0, volatile=True)
    else:
        return tl.zeros([BLOCK_N], dtype=tl.int64)


@triton.jit
def _walk_word(word, ok, epoch, num_chunks, chunk_beta, carry, acc_alpha, acc_beta, j, pending, going):
    """One step of a walk (`_look_back`). `word`: each row's word of its next unread chunk `j`; `ok`:
    where that read counts (the row is live this round, the chunk inside the row). A start advantage
    gives the carry; a map is composed into the accumulated map `(acc_alpha, acc_beta)`, and the
    carry is known once that map cuts (beta 0) or the row ends. A row stays `going` this round only
    while every word so far was a ready map. Elementwise, so that the Gluon experiment in
    docs/experiments walks the same way."""
    ready = going & ok & ((word >> 34) == epoch)
    status = (word >> 32) & 3
    has_inclusive = ready & (status == _START)
    has_aggregate = ready & (status != _START)
    later_beta = tl.where(status == _CUT, 0.0, chunk_beta)
    carry = tl.where(has_inclusive, acc_alpha + acc_beta * _low_float(word), carry)
    acc_alpha = tl.where(has_aggregate, acc_alpha + acc_beta * _low_float(word), acc_alpha)
    acc_beta = tl.where(has_aggregate, acc_beta * later_beta, acc_beta)
    j = tl.where(has_aggregate, j + 1, j)
    resolved = has_aggregate & ((acc_beta == 0.0) | (j == num_chunks))
    carry = tl.where(resolved, acc_alpha, carry)
    pending = pending & ~has_inclusive & ~resolved
    going = going & has_aggregate & ~resolved  # a gap ends the round: reread from there
    return carry, acc_alpha, acc_beta, j, pending, going


@triton.jit
def _look_back(state_ptr, epoch, rows, row_ok, chunk, num_chunks, alpha, beta, probe, chunk_beta,
               BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, WINDOW: tl.constexpr, INCLUSIVE_EVERY: tl.constexpr,
               PUBLISH_COLUMN: tl.constexpr):
    """The carry of this chunk: the advantage at the first step after it, from the chunks later in time.

    Publishes this chunk's composed map first and its start advantage last (see kernels/README.md);
    unless PUBLISH_COLUMN is PUBLISH_SUMMED, straight from the tile's first column
    (`_publish_first_column`), and the start advantage is left to the caller (`_publish_start`),
    which has the carried tile. `chunk_beta`: the beta of a chunk that no done flag cuts
    (`_chunk_beta`).
    State: one word per (chunk, padded row), `num_programs * BLOCK_N` in all, chunk-major so that a
    tile's rows publish to neighbouring words: a float in its low half, and in its high half what
    the float is (a map's alpha, a cut map's alpha, a start advantage) and the call's epoch (see
    STATUS_MAP). A word is ready when it carries this call's epoch, so the buffer is reused across
    calls without zeroing.

    Each round reads the words of `WINDOW` later chunks at once and composes the ready ones in order,
    so a walk over `k` chunks costs about `k / WINDOW` trips to L2 instead of `k`.
    """
    words = tl.num_programs(0) * BLOCK_N
    padded_rows = words // num_chunks
    own = chunk * padded_rows + rows  # this chunk's words
    if not PUBLISH_COLUMN:
        agg_alpha = _first_column(alpha, BLOCK_T)  # this chunk's map F(x) = agg_alpha + agg_beta * x
        agg_beta = _first_column(beta, BLOCK_T)
    # `probe`: the next chunk's word, read before this chunk's scan (`_probe`); where it is already a
    # start advantage the walk is skipped. (The map is published all the same: whether a row waits can
    # differ between the warps that hold copies of it, which read the word at different times, and
    # a branch that some warps take and others do not must not hold a barrier.)
    probed = (probe >> 34) == epoch
    probed = probed & (((probe >> 32) & 3) == _START)
    carry = tl.where(probed, _low_float(probe), 0.0)  # the last chunk's carry: A_T = 0
    pending = row_ok & ~probed
    if chunk < num_chunks - 1:
        if PUBLISH_COLUMN:
            _publish_first_column(state_ptr, own, row_ok, alpha, _map_tag(epoch, beta), BLOCK_T,
                                  PUBLISH_COLUMN == _PTX)
        else:
            tl.atomic_xchg(state_ptr + own, _float_bits(agg_alpha) | _map_tag(epoch, agg_beta),
                           mask=row_ok, sem="relaxed")
        # Walk later chunks: compose their maps until one knows its start advantage, a done flag
        # cuts the chain (beta == 0), or the row ends. `j` is each row's next unread chunk.
        acc_alpha = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_beta = tl.full([BLOCK_N], 1.0, dtype=tl.float32)
        j = tl.full([BLOCK_N], 0, dtype=tl.int64) + chunk + 1
        while tl.max(pending.to(tl.int32), axis=0) > 0:
            # One round reads the words of up to WINDOW later chunks, then composes them in time
            # order. The addresses do not depend on what earlier reads returned (a read past the
            # row's end rereads its last chunk, unused: an unmasked load; against masked reads it
            # measured faster env-major and at 16384x1024 and 4x131072 time-major, 0-6% slower at
            # 16x1M, 128x65536, 2x1M, 4x1M and 5x100000 time-major; session 28), so the reads could
            # all go out together. ptxas does not always issue them so: on 4-row tiles it gives
            # several reads one register, each waiting for the previous one's use (seen in the SASS,
            # sessions 28-29; hence their window of two), and for 16-env tiles with three words a
            # chunk it issued the second chunk's reads after the first's had been used (session 22).
            # Forcing one trip, by making every use depend on every read, measured 11-15% slower on
            # long time-major rows then, and with one word 1-2% slower on 16-row tiles (session 30).
            # The window is one-dimensional on purpose. A 2-D [BLOCK_N, WINDOW] window with a scan
            # across it is smaller than the thread count for small tiles, and Triton's scan leaves the
            # replicated threads' copies wrong (triton-lang/triton#2298; wrong advantages on the H200).
            # One that fills the threads, a (chunk, row) each, is right but measured 1-12% slower
            # time-major and 1.3-1.8x env-major: its scan crosses warps every round (session 22).
            base = j
            live = pending
            going = pending  # rows whose reads so far this round were all ready maps
            for i in tl.static_range(WINDOW):
                later = base + i
                ok = live & (later < num_chunks)
                word = tl.load(state_ptr + tl.minimum(later, num_chunks - 1) * padded_rows + rows, volatile=True)
                carry, acc_alpha, acc_beta, j, pending, going = _walk_word(
                    word, ok, epoch, num_chunks, chunk_beta, carry, acc_alpha, acc_beta, j, pending, going)
    if not PUBLISH_COLUMN:
        if _publishes_start(chunk, num_chunks, INCLUSIVE_EVERY):
            tl.atomic_xchg(state_ptr + own, _float_bits(agg_alpha + agg_beta * carry) | _tag(epoch, _START),
                           mask=row_ok, sem="relaxed")
    return carry


@triton.jit(do_not_specialize=["epoch"])
def _gae_kernel(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    advantages_ptr, returns_ptr, state_ptr,
    N, T, num_chunks,
    stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
    stride_un, stride_ut, stride_bn, stride_bt, stride_l,
    stride_an, stride_at, stride_gn, stride_gt,
    gamma, gamma_lam, epoch,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, CHUNKED: tl.constexpr, FLAG_AXIS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, WINDOW: tl.constexpr, INCLUSIVE_EVERY: tl.constexpr,
    QUADS: tl.constexpr, PROBE: tl.constexpr, EVEN: tl.constexpr, REST_SCAN: tl.constexpr,
    ALIGN_AXIS: tl.constexpr, ALIGN: tl.constexpr, PUBLISH_COLUMN: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        # Launched as a programmatic dependent launch (`uses_pdl`): this grid may start while the kernel
        # before it on the stream finishes. Wait here, before any memory access, until that kernel has
        # completed and its writes are visible: the launch's latency overlaps its tail, nothing else.
        gdc_wait()
    # What the host checked (`alignment`), in a form Triton's alignment analysis reads: it only knows
    # integers divisible by 16, so time-major rollouts of 4, 8 or 12 envs (a step stride of 4, 8 or
    # 12) ran on one-element loads and stores instead of 16-byte vectors.
    if ALIGN_AXIS == 1:  # time-major: the strides between steps, and the env count (the row masks)
        N, stride_rt, stride_vt, stride_dt, stride_ut, stride_bt, stride_at, stride_gt = _multiples(
            N, stride_rt, stride_vt, stride_dt, stride_ut, stride_bt, stride_at, stride_gt, ALIGN)
    elif ALIGN_AXIS == 0:  # env-major: the strides between rows, and the step count (the step masks)
        T, stride_rn, stride_vn, stride_dn, stride_un, stride_bn, stride_an, stride_gn = _multiples(
            T, stride_rn, stride_vn, stride_dn, stride_un, stride_bn, stride_an, stride_gn, ALIGN)
    row_block = tl.program_id(0).to(tl.int64)
    chunk = 0
    if CHUNKED:
        # Programs take chunks from the end of time backwards, so a program waits only on chunks
        # of lower program ids. CUDA starts a grid's blocks in increasing index order (CUB's
        # single-pass scans, behind torch.cumsum, rely on that too), so those have all started and
        # the look-back cannot deadlock. A ticket from an atomic counter would not need that order,
        # but its round trip sat before the tile's loads: 3-17% slower (docs/benchmarks.md).
        num_row_blocks = tl.cdiv(N, BLOCK_N)
        chunk = num_chunks - 1 - row_block // num_row_blocks
        row_block = row_block % num_row_blocks
    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [BLOCK_N]
    if QUADS:
        _quad_tile(rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
                   advantages_ptr, returns_ptr, state_ptr, rows, chunk, N, T, num_chunks,
                   stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
                   stride_un, stride_ut, stride_bn, stride_bt, stride_l,
                   stride_an, stride_at, stride_gn, stride_gt, gamma, gamma_lam, epoch,
                   HAS_TRUNCATEDS, BOOTSTRAP, CHUNKED, FLAG_AXIS, BLOCK_N, BLOCK_T, WINDOW, INCLUSIVE_EVERY,
                   PROBE, EVEN, REST_SCAN, PUBLISH_COLUMN)
    else:
        steps = chunk * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)  # [BLOCK_T]
        probe = _probe(state_ptr, rows, rows < N, chunk, num_chunks, BLOCK_N, CHUNKED & PROBE)
        delta, beta, value, mask, t = _step_terms(
            rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
            rows, steps, N, T,
            stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
            stride_un, stride_ut, stride_bn, stride_bt, stride_l,
            gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, FLAG_AXIS, EVEN)
        # Each step's map to the end of the tile: alpha is the advantage if nothing followed the tile.
        alpha, beta = tl.associative_scan((delta, beta), 1, _compose, reverse=True)
        if CHUNKED:
            carry = _look_back(state_ptr, epoch, rows, rows < N, chunk, num_chunks, alpha, beta, probe,
                               _chunk_beta(gamma_lam, BLOCK_T), BLOCK_N, BLOCK_T, WINDOW, INCLUSIVE_EVERY,
                               PUBLISH_COLUMN)
            alpha = alpha + beta * carry[:, None]
            if PUBLISH_COLUMN:
                _publish_start(state_ptr, epoch, rows, rows < N, chunk, num_chunks, alpha, BLOCK_N, BLOCK_T,
                               INCLUSIVE_EVERY, PUBLISH_COLUMN)
        n = rows[:, None]
        tl.store(advantages_ptr + n * stride_an + t * stride_at, alpha, mask=mask)
        tl.store(returns_ptr + n * stride_gn + t * stride_gt, alpha + value, mask=mask)


@triton.jit
def _quad_tile(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    advantages_ptr, returns_ptr, state_ptr, rows, chunk, N, T, num_chunks,
    stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
    stride_un, stride_ut, stride_bn, stride_bt, stride_l,
    stride_an, stride_at, stride_gn, stride_gt, gamma, gamma_lam, epoch,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, CHUNKED: tl.constexpr, FLAG_AXIS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, WINDOW: tl.constexpr, INCLUSIVE_EVERY: tl.constexpr,
    PROBE: tl.constexpr, EVEN: tl.constexpr, REST_SCAN: tl.constexpr, PUBLISH_COLUMN: tl.constexpr,
):
    """A time-major tile as four interleaved quarters: quarter j holds steps 4k + j, k < BLOCK_T / 4.

    All four quarters share one layout, so a thread holds the four consecutive steps 4k..4k+3 of its
    envs and composes them in registers; only the quads' maps are scanned across lanes (about a third
    of the shuffles of a whole-tile scan, where lanes hold consecutive steps: 176 against 544 per
    warp for a 32x32 tile, compiled for sm_90)."""
    NUM_QUADS: tl.constexpr = BLOCK_T // 4
    base = chunk * BLOCK_T + 4 * tl.arange(0, NUM_QUADS).to(tl.int64)  # [NUM_QUADS]
    probe = _probe(state_ptr, rows, rows < N, chunk, num_chunks, BLOCK_N, CHUNKED & PROBE)
    # Four explicit quarters: a Triton function cannot loop over a list of tensors.
    d0, b0, v0, m0, t0 = _step_terms(rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr,
                                     last_value_ptr, rows, base, N, T, stride_rn, stride_rt, stride_vn, stride_vt,
                                     stride_dn, stride_dt, stride_un, stride_ut, stride_bn, stride_bt, stride_l,
                                     gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, FLAG_AXIS, EVEN)
    d1, b1, v1, m1, t1 = _step_terms(rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr,
                                     last_value_ptr, rows, base + 1, N, T, stride_rn, stride_rt, stride_vn, stride_vt,
                                     stride_dn, stride_dt, stride_un, stride_ut, stride_bn, stride_bt, stride_l,
                                     gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, FLAG_AXIS, EVEN)
    d2, b2, v2, m2, t2 = _step_terms(rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr,
                                     last_value_ptr, rows, base + 2, N, T, stride_rn, stride_rt, stride_vn, stride_vt,
                                     stride_dn, stride_dt, stride_un, stride_ut, stride_bn, stride_bt, stride_l,
                                     gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, FLAG_AXIS, EVEN)
    d3, b3, v3, m3, t3 = _step_terms(rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr,
                                     last_value_ptr, rows, base + 3, N, T, stride_rn, stride_rt, stride_vn, stride_vt,
                                     stride_dn, stride_dt, stride_un, stride_ut, stride_bn, stride_bt, stride_l,
                                     gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, FLAG_AXIS, EVEN)
    zero = tl.zeros([BLOCK_N, NUM_QUADS], dtype=tl.float32)
    # Each step's map to the end of its quad (the identity after it), in registers.
    d0, b0, d1, b1, d2, b2, d3, b3 = _quad_suffixes(d0, b0, d1, b1, d2, b2, d3, b3, zero, zero + 1.0)
    # What follows quad k: the map of quads k + 1 .. to the end of the tile (the identity after the last).
    if REST_SCAN:
        # One reverse scan carries it along with each quad's own map to the end (`_compose_with_rest`):
        # twice the values per step of the scan, but no gather, whose layout cost a trip through
        # shared memory for every quarter before the scan and after it (one-warp tiles 3-10% faster,
        # whole rows on eight warps 8-21%; docs/benchmarks.md, session 19).
        zero_and_one = (zero, zero + 1.0)
        _, _, after_alpha, after_beta = tl.associative_scan((d0, b0) + zero_and_one, 1, _compose_with_rest,
                                                            reverse=True)
    else:
        # Scan the quads' maps, then read quad k + 1's result. For chunked 16-env tiles on eight warps
        # this measured 1-6% faster: Triton lays the gather's warps along envs, so the scan stays in
        # each warp and only the tile's quarters cross warps, where the scan above would carry four
        # values. (32 x 32 tiles on two warps ran 4% faster with the scan above.)
        quad_alpha, quad_beta = tl.associative_scan((d0, b0), 1, _compose, reverse=True)
        k = tl.arange(0, NUM_QUADS)[None, :] + tl.zeros([BLOCK_N, NUM_QUADS], dtype=tl.int32)
        later = tl.minimum(k + 1, NUM_QUADS - 1)
        after_alpha = tl.where(k < NUM_QUADS - 1, tl.gather(quad_alpha, later, axis=1), 0.0)
        after_beta = tl.where(k < NUM_QUADS - 1, tl.gather(quad_beta, later, axis=1), 1.0)
    d0, b0 = _then(d0, b0, after_alpha, after_beta)
    d1, b1 = _then(d1, b1, after_alpha, after_beta)
    d2, b2 = _then(d2, b2, after_alpha, after_beta)
    d3, b3 = _then(d3, b3, after_alpha, after_beta)
    if CHUNKED:
        carry = _look_back(state_ptr, epoch, rows, rows < N, chunk, num_chunks, d0, b0, probe,
                           _chunk_beta(gamma_lam, BLOCK_T), BLOCK_N, NUM_QUADS, WINDOW, INCLUSIVE_EVERY,
                           PUBLISH_COLUMN)[:, None]
        d0, d1, d2, d3 = d0 + b0 * carry, d1 + b1 * carry, d2 + b2 * carry, d3 + b3 * carry
        if PUBLISH_COLUMN:
            _publish_start(state_ptr, epoch, rows, rows < N, chunk, num_chunks, d0, BLOCK_N, NUM_QUADS,
                           INCLUSIVE_EVERY, PUBLISH_COLUMN)
    n = rows[:, None]
    tl.store(advantages_ptr + n * stride_an + t0 * stride_at, d0, mask=m0)
    tl.store(advantages_ptr + n * stride_an + t1 * stride_at, d1, mask=m1)
    tl.store(advantages_ptr + n * stride_an + t2 * stride_at, d2, mask=m2)
    tl.store(advantages_ptr + n * stride_an + t3 * stride_at, d3, mask=m3)
    tl.store(returns_ptr + n * stride_gn + t0 * stride_gt, d0 + v0, mask=m0)
    tl.store(returns_ptr + n * stride_gn + t1 * stride_gt, d1 + v1, mask=m1)
    tl.store(returns_ptr + n * stride_gn + t2 * stride_gt, d2 + v2, mask=m2)
    tl.store(returns_ptr + n * stride_gn + t3 * stride_gt, d3 + v3, mask=m3)


@functools.lru_cache(maxsize=512)
def plan(
    num_envs: int, num_steps: int, time_major: bool, max_block_t: int = MAX_BLOCK_T,
    block: tuple[int, int] | None = None, num_warps: int | None = None,
) -> tuple[int, int, int, int, int]:
    """`(BLOCK_N, BLOCK_T, num_chunks, grid, num_warps)` for a problem. More than one chunk means
    the rows are joined by the look-back. `block` and `num_warps` override the choice (tuning, tests)."""
    envs = triton.next_power_of_2(max(num_envs, 1))
    steps = triton.next_power_of_2(max(num_steps, 1))
    # time-major tiles of 16 envs on several warps; of 32 envs from 1024 envs; of NARROW_TILE_ENVS
    wide = many = narrow = False
    if block is not None:
        block_n, block_t = block
    elif not time_major:
        whole_rows = steps <= (WHOLE_ROW_STEPS_MANY_ENVS if num_envs >= WHOLE_ROW_MANY_ENVS else WHOLE_ROW_STEPS)
        block_t = steps if whole_rows else TILE_ELEMENTS
        block_n = max(1, TILE_ELEMENTS // block_t)
    elif num_envs * num_steps <= TINY_PROBLEM:
        block_n, block_t = 1, min(steps, TILE_ELEMENTS)
    else:
        long_rows = num_steps > TILE_ELEMENTS // TIME_MAJOR_BLOCK_N
        many = num_envs >= TIME_MAJOR_MANY_ENVS and long_rows
        wide = not many and num_envs >= WIDE_TILE_MIN_ENVS and num_steps >= WIDE_TILE_MIN_STEPS
        if wide:
            block_n = min(WIDE_TILE_BLOCK_N, envs)
            block_t = WIDE_TILE_ELEMENTS // block_n
        elif many:
            block_n = TIME_MAJOR_MANY_ENVS_BLOCK_N
            block_t = TIME_MAJOR_MANY_ENVS_ELEMENTS // block_n
        elif num_envs in NARROW_TILE_ENVS:
            narrow = True
            block_n, block_t = min(TIME_MAJOR_BLOCK_N, envs), NARROW_TILE_STEPS
        else:
            block_n = TIME_MAJOR_BLOCK_N
            block_t = TILE_ELEMENTS // block_n
    block_n, block_t = min(block_n, envs), min(block_t, steps, max_block_t)
    num_chunks = triton.cdiv(max(num_steps, 1), block_t)
    grid = triton.cdiv(max(num_envs, 1), block_n) * num_chunks
    if num_warps is None:
        elements = block_n * block_t
        if wide:
            # Four elements per thread, as for whole env-major rows, on at most eight warps; four
            # warps on grids of many programs (see WIDE_TILE_MANY_PROGRAMS).
            warps = WIDE_TILE_WARPS_MANY_PROGRAMS if grid >= WIDE_TILE_MANY_PROGRAMS else WIDE_TILE_WARPS
            num_warps = min(warps, max(1, elements // 128))
        elif narrow:
            warps = NARROW_TILE_WARPS_8_ENVS if block_n == TIME_MAJOR_BLOCK_N else NARROW_TILE_WARPS
            # No more threads than a tile shortened by `max_block_t` fills (tests): a scan leaves
            # wrong values in threads that hold copies (see `uses_quads`).
            num_warps = min(warps, max(1, elements // 128))
        elif many:
            # Sixteen elements per thread (four warps for 32 x 64): the quads' scan crosses warps, which
            # costs less than the resident warps gained (96 registers a thread instead of 166 on one warp).
            num_warps = max(1, elements // 512)
        elif time_major and block_n > 1:
            # One warp: with more, Triton lays warps along time and the scan crosses them
            # through shared memory; with one, the time axis stays inside the warp.
            num_warps = 1
        elif not time_major and num_chunks == 1:
            # Whole env-major rows: four elements per thread (up to 16 warps) measured 5-21% faster
            # than four warps per 1024 elements; chunked rows stay at four, where the look-back's
            # wait holds the whole program.
            num_warps = min(16, max(1, elements // 128))
        else:
            num_warps = 1 if elements <= 128 else 2 if elements <= 256 else 4
    return block_n, block_t, num_chunks, grid, num_warps


class GaeLaunch:
    """One launch of the kernel, planned from the tensors' metadata alone: tile, grid, warps,
    strides, constexprs. `compute_gae` keeps one per validated signature (shapes, strides, dtypes,
    devices), so a training loop plans once and every later call only reads data pointers.

    `max_block_t` (a power of two) caps the chunk length: tests lower it to exercise the look-back
    at small sizes. `block` (`(BLOCK_N, BLOCK_T)`, powers of two), `num_warps`, `window` (later
    chunks a look-back round reads), `quads` (scan as four interleaved quarters, where
    `uses_quads` allows it), `maxnreg` (a cap on registers per thread, CUDA only: more resident
    programs per SM, at the price of spills; by default `register_cap`'s, 0 for none), `probe` (read
    the next chunk's start advantage as a chunked program starts; by default from `PROBE_MIN_PROGRAMS`
    programs), `even=False` (keep the bounds masks where the tiles divide the problem; a ragged
    problem always keeps them) and
    `rest_scan` (the quads' scan also yields the map after each quad instead of a gather; by default
    but in chunked tiles of fewer than 32 envs on eight or more warps), `publish_column` (a
    chunk publishes its map and start advantage from its tile's first column, without reducing the
    tile to it) and `publish_ptx` (it does so with atomics in inline PTX; both: `publish_mode`) are
    tuning knobs. `nvidia=True` plans as if for an NVIDIA GPU whatever the tensors' device
    (`scripts/compile_kernels.py` compiles those launches on a machine without one).
    `inclusive_every > 1` is for tests only: most chunks then withhold their start advantage, so
    look-backs compose aggregates (see `_look_back`). `sparse_bootstrap` (read `bootstrap_values`
    only around truncations and the last column: in runs of four steps where the flags' loads run
    along the steps, at those steps alone elsewhere; by default `reads_bootstrap_sparsely`'s
    choice) is a tuning knob too. `pdl` (by default `uses_pdl`'s choice) launches the grid as a
    programmatic dependent launch. A chunked tile that
    `look_back_layout_ok` rejects raises `ValueError`.

    `graphs` (default: on CUDA, unless `RL_TRITON_CUDA_GRAPHS=0`): a call repeated with the same
    data pointers, `gamma` and `lam`, as a training loop's is, replays a CUDA graph of its launch
    instead of launching (`_replay_or_capture`).
    """

    def __init__(
        self,
        tensors: tuple,
        max_block_t: int = MAX_BLOCK_T,
        block: tuple[int, int] | None = None,
        num_warps: int | None = None,
        window: int | None = None,
        inclusive_every: int = 1,
        quads: bool | None = None,
        maxnreg: int | None = None,
        probe: bool | None = None,
        even: bool | None = None,
        rest_scan: bool | None = None,
        graphs: bool | None = None,
        publish_column: bool | None = None,
        publish_ptx: bool | None = None,
        nvidia: bool | None = None,
        sparse_bootstrap: bool | None = None,
        pdl: bool | None = None,
    ):
        rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns = tensors
        num_envs, num_steps = values.shape
        self.device = values.device
        # Which of the call's eight tensors fills each of the kernel's first eight pointer slots:
        # absent optional tensors are stood in for by one the kernel will not read (their constexpr
        # mode says so), so every slot holds a valid pointer.
        self.slots = (0, 1, 2, 2 if truncateds is None else 3, 1 if bootstrap_values is None else 4,
                      1 if last_value is None else 5, 6, 7)
        truncated = truncateds if truncateds is not None else terminateds
        if bootstrap_values is not None:
            bootstrap_mode, bootstrap = BOOTSTRAP_TENSOR, bootstrap_values
        else:
            bootstrap_mode = BOOTSTRAP_NONE if last_value is None else BOOTSTRAP_LAST_VALUE
            bootstrap = values
        stride_vn, stride_vt = values.stride()
        time_major = stride_vn == 1 and stride_vt != 1
        # Compiled for an NVIDIA GPU (not Triton's interpreter, not ROCm, whose torch also says "cuda"):
        # only such a kernel can run inline PTX.
        if nvidia is None:
            nvidia = self.device.type == "cuda" and not INTERPRET and torch.version.hip is None
        block_n, block_t, num_chunks, self.grid, self.num_warps = plan(
            num_envs, num_steps, time_major, max_block_t, block, num_warps)
        self.chunked = num_chunks > 1
        self.state_words = self.grid * block_n
        lv = last_value if last_value is not None else values
        self.ints = (num_envs, num_steps, num_chunks, *rewards.stride(), stride_vn, stride_vt, *terminateds.stride(),
                     *truncated.stride(), *bootstrap.stride(), lv.stride(0), *advantages.stride(), *returns.stride())
        # Unchunked tiles have no look-back: window 1 keeps one compiled kernel for them.
        if not self.chunked:
            window = 1
        elif window is None:
            window = look_back_window(block_n, num_chunks, self.grid)
        quads = uses_quads(time_major, block_n, block_t, num_chunks, self.num_warps, prefer=quads)
        flag_axis = flag_hint_axis(terminateds, truncated, time_major, (block_n, block_t), quads)
        if bootstrap_mode == BOOTSTRAP_TENSOR:
            if sparse_bootstrap is None:
                sparse_bootstrap = reads_bootstrap_sparsely(flag_axis, block_t)
            if sparse_bootstrap:
                bootstrap_mode = BOOTSTRAP_TENSOR_SPARSE if flag_axis == 1 else BOOTSTRAP_TENSOR_MASKED
        if self.chunked and not look_back_layout_ok(block_n, self.num_warps):
            raise ValueError(f"a chunked tile of {block_n} envs on {self.num_warps} warps: the look-back needs at most "
                             f"32 envs per tile or a multiple of {32 * self.num_warps} (see look_back_layout_ok)")
        if probe is None:
            probe = self.grid >= (PROBE_MIN_PROGRAMS if time_major else PROBE_MIN_PROGRAMS_ENV_MAJOR)
        divides = num_envs % block_n == 0 and num_steps % block_t == 0
        even = divides if even is None else even and divides
        # The quads' scan carries what follows each quad, but in chunked tiles of fewer than 32 envs on
        # eight or more warps, where a gather measured faster (see `_quad_tile`).
        if rest_scan is None:
            rest_scan = self.num_warps < WIDE_TILE_WARPS or not self.chunked or block_n >= 32
        publish = (publish_mode(time_major, self.grid, nvidia, publish_column, publish_ptx) if self.chunked
                   else PUBLISH_SUMMED)
        if maxnreg is None:
            maxnreg = register_cap(time_major, self.grid, publish, block_n, window, nvidia)
        if pdl is None:
            pdl = uses_pdl(self.device, nvidia)
        elif pdl and not nvidia:
            raise ValueError("a programmatic dependent launch needs a kernel compiled for an NVIDIA GPU")
        self.pdl = bool(pdl)
        self.constexprs = (truncateds is not None, bootstrap_mode, self.chunked, flag_axis, block_n, block_t, window,
                           inclusive_every, quads, probe and self.chunked, even, rest_scan and quads,
                           *alignment(tensors, time_major), publish, self.pdl)
        # With all pointers 16-byte aligned, this key fixes everything Triton specialises the kernel
        # on (see `_compiled`).
        self.maxnreg = maxnreg or None
        self.key = (self.device, self.num_warps, self.maxnreg, self.constexprs, terminateds.dtype, truncated.dtype,
                    self.ints)
        self.kernel = None  # the compiled kernel, once known
        # A chunked launch's graphs alternate two epochs over a look-back state of their own (see
        # `_capture`). That needs every word a walk can read rewritten by every call, which tests that
        # withhold start advantages (`inclusive_every > 1`) break: those launch eagerly.
        if graphs is None:
            graphs = _CUDA_GRAPHS
        graphs = graphs and self.device.type == "cuda" and _knobs is not None
        self.graphs = {} if graphs and (not self.chunked or inclusive_every == 1) else None
        self.last_call = None  # the key of the previous call: a repeated one is captured
        self.replays = 0

    def __call__(self, tensors: tuple, pointers: list[int], gamma: float, lam: float) -> None:
        """Launch on `tensors` (the eight of the signature this launch was planned for), whose
        `data_ptr()`s are `pointers` (0 for an absent tensor)."""
        if self.graphs is not None and self._replay_or_capture(tensors, pointers, gamma, lam):
            return
        kernel_pointers = [pointers[i] for i in self.slots]
        if not self.chunked:
            kernel_pointers.append(kernel_pointers[1])  # the look-back state: unused
            self._launch(tensors, kernel_pointers, None, (gamma, gamma * lam, 1))
            return
        # The look-back state is reused from call to call (see `_look_back_state`); the bookkeeping
        # and the launch stay together so that epochs follow the order of launches on the stream.
        with _state_lock:
            state, epoch = _look_back_state(self.device, self.state_words)
            kernel_pointers.append(state.data_ptr())
            self._launch(tensors, kernel_pointers, state, (gamma, gamma * lam, epoch))

    def _replay_or_capture(self, tensors: tuple, pointers: list[int], gamma: float, lam: float) -> bool:
        """Replay the CUDA graph of this exact call (same pointers and scalars: the same kernel
        arguments), capturing it on the call's second occurrence in a row; False: launch eagerly.

        On the H200 host a graph replay costs the host about 2.3 us against about 7 us for the direct
        launch (docs/benchmarks.md, session 23). The replay reads the tensors' memory as it is now and
        runs on the current stream, as the launch would. Not under a capture of the caller's own
        (the launch is captured there instead), not while a Triton launch hook watches launches,
        and not for a tensor on another device than the current one."""
        key = (*pointers, gamma, lam)
        if self.chunked:  # a replay's look-back state is used on the stream it was made for
            key += (triton.runtime.driver.active.get_current_stream(self.device.index),)
        graphs = self.graphs.get(key)
        if graphs is None and key != self.last_call:
            self.last_call = key
            return False
        if (torch.cuda.is_current_stream_capturing() or not _on_current_device(self.device)
                or _active(_knobs.runtime.launch_enter_hook) is not None
                or _active(_knobs.runtime.launch_exit_hook) is not None):
            return False
        if graphs is None:
            graphs = self._capture(tensors, pointers, gamma, lam)
            if graphs is None:
                return False
            if len(self.graphs) >= _MAX_GRAPHS:
                self.graphs.clear()
            self.graphs[key] = graphs
        graphs.replay()
        self.replays += 1
        return True

    def _capture(self, tensors: tuple, pointers: list[int], gamma: float, lam: float) -> _Graphs | None:
        """CUDA graphs of this call's launch (captured, not run), or None where the launch does not
        take the direct path or the capture fails; then graphs are off for this launch.

        A launch without a look-back is one graph. A chunked one is two, over a look-back state of
        their own, zeroed here, and replayed in turn on the current stream: one publishes its words
        with epoch 1, the other with epoch 2. Every call rewrites every word a walk can read, so a
        replay finds only the other epoch's words until this call's are written, as an eager call
        finds the previous call's epoch: nothing is zeroed per call, and no graph replays with itself
        (CUDA orders a graph's launches), or with its twin, on two streams at once (the key has the
        stream)."""
        kernel_pointers = [pointers[i] for i in self.slots]
        if (self.kernel or _compiled.get(self.key)) is None or functools.reduce(operator.or_, kernel_pointers) % 16:
            return None  # not yet compiled, or misaligned: Triton's generic path, not captured
        # (torch's allocations are 512-byte aligned: the state does not change that.)
        state = torch.zeros(self.state_words, dtype=torch.int64, device=self.device) if self.chunked else None
        kernel_pointers.append(pointers[1] if state is None else state.data_ptr())  # pointers[1]: unused
        graphs = []
        try:
            with _capture_lock, torch.cuda.stream(_capture_stream(self.device)):
                for epoch in (1, 2) if self.chunked else (1,):
                    graph = torch.cuda.CUDAGraph()
                    # Thread-local: other threads' CUDA calls (an env's, a logger's) do not break it.
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        self._launch(tensors, kernel_pointers, state, (gamma, gamma * lam, epoch))
                    finally:
                        graph.capture_end()
                    graphs.append(graph)
        except RuntimeError as error:
            warnings.warn(f"compute_gae: capturing a CUDA graph of the launch failed ({error}); "
                          "this signature launches eagerly from now on", RuntimeWarning, stacklevel=4)
            self.graphs = None
            return None
        return _Graphs(graphs, state)

    def _launch(self, tensors: tuple, pointers: list[int], state: torch.Tensor | None, floats: tuple) -> None:
        aligned = functools.reduce(operator.or_, pointers) % 16 == 0
        kernel = None
        if aligned:
            kernel = self.kernel = self.kernel or _compiled.get(self.key)
        if kernel is not None and _on_current_device(self.device):
            # The direct path: what JITFunction.run does once it has found the compiled kernel.
            stream = triton.runtime.driver.active.get_current_stream(self.device.index)
            args = (*pointers, *self.ints, *floats, *self.constexprs)
            enter_hook, exit_hook = _active(_knobs.runtime.launch_enter_hook), _active(_knobs.runtime.launch_exit_hook)
            # Launch metadata only feeds the enter hook (profilers); building it costs microseconds.
            metadata = kernel.launch_metadata((self.grid, 1, 1), stream, *args) if enter_hook is not None else None
            kernel.run(self.grid, 1, 1, stream, kernel.function, kernel.packed_metadata, metadata, enter_hook,
                       exit_hook, *args)
            return
        kernel_tensors = [tensors[i] for i in self.slots]
        kernel_tensors.append(state if state is not None else tensors[1])
        constexpr_kwargs = dict(zip(_CONSTEXPR_NAMES, self.constexprs, strict=True))
        if self.device.type != "cuda":  # Triton's CPU interpreter
            _gae_kernel[(self.grid,)](*kernel_tensors, *self.ints, *floats, **constexpr_kwargs,
                                      num_warps=self.num_warps)
            return
        if self.maxnreg is not None:
            constexpr_kwargs["maxnreg"] = self.maxnreg
        if self.pdl:
            constexpr_kwargs["launch_pdl"] = True
        with torch.cuda.device(self.device):
            kernel = _gae_kernel[(self.grid,)](*kernel_tensors, *self.ints, *floats, **constexpr_kwargs,
                                               num_warps=self.num_warps)
        if aligned and _knobs is not None and hasattr(kernel, "packed_metadata") and hasattr(kernel, "launch_metadata"):
            if len(_compiled) >= _MAX_COMPILED:
                _compiled.clear()
            _compiled[self.key] = kernel


def launch_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None,
    bootstrap_values: torch.Tensor | None,
    last_value: torch.Tensor | None,
    gamma: float,
    lam: float,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    **options,
) -> None:
    """Plan and run one launch on validated `[N, T]` tensors, writing `advantages` and `returns`.
    `options` are `GaeLaunch`'s tuning knobs (tests and benchmark sweeps)."""
    tensors = (rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns)
    pointers = [0 if x is None else x.data_ptr() for x in tensors]
    GaeLaunch(tensors, **options)(tensors, pointers, gamma, lam)


def uses_quads(time_major: bool, block_n: int, block_t: int, num_chunks: int, num_warps: int,
               prefer: bool | None = None) -> bool:
    """Whether a tile is scanned as four interleaved quarters (`_quad_tile`). By default, from the
    H200 measurements in docs/benchmarks.md: 24% faster for 32-env time-major tiles (16384x1024,
    4096x4096, 1024x1024) and 14% for unchunked 8x128 ones (4096x128), 7% slower for chunked 8x128
    tiles of long rows (16x1M); the 16-env tiles on eight warps were measured with them (session 18).
    Once the quads' scan carried what follows each quad and narrow rollouts' loads became vectors
    (session 20), chunked one-warp tiles of 2 and 4 envs ran 4-11% faster with them too (4x131072,
    4x1M, 3x200000, 2x262144), but 8-env ones (5-7 envs) mixed: 12% faster at 6x65536, 9-16% slower
    at 5x100000 and 7x65536. So: time-major tiles of 32+ envs, or of 2+ envs holding whole rows,
    spread over several warps, or at most 4 envs. `prefer` overrides that choice. Either way the
    quarters must fill the program's threads: Triton's scan leaves wrong values in lanes that hold
    copies (triton-lang/triton#2298), and the quarters' scan results are read by every lane."""
    fills = block_t >= 4 and block_n * (block_t // 4) >= 32 * num_warps
    if prefer is not None:
        return prefer and fills
    several_envs = block_n > 1 and (num_chunks == 1 or num_warps > 1 or block_n <= 4)
    return fills and time_major and (block_n >= 32 or several_envs)


# From this many programs up (several waves of them), a chunk reads the next chunk's word as it starts
# (`_probe`): 1.5-3% faster at 16384x1024 time-major and 16x1M env-major, and 1-1.5% slower on one-wave
# grids such as 1x1M (docs/benchmarks.md, session 18). Env-major grids, from twice as many: with one word
# a chunk, the probe made 256x16384 env-major (4096 programs) 3.6% slower (27.5-27.7 us against
# 26.5-26.7), while time-major grids of 4096 programs still gained (2x1M 17.7-17.8 against 18.3-18.5,
# 16x1M 109.3-109.6 against 110.3-110.4; session 29).
PROBE_MIN_PROGRAMS, PROBE_MIN_PROGRAMS_ENV_MAJOR = 4096, 8192


# bootstrap_values counts only at truncated steps and in the last column, so env-major tiles of up
# to SPARSE_BOOTSTRAP_MAX_STEPS steps read it only in the runs of four steps that hold one of those
# (BOOTSTRAP_TENSOR_SPARSE): where episodes end rarely, 4 of the 22 bytes an element moves are never
# fetched. The price is a second trip to memory in a warp whose runs do hold one, after its flags
# arrive. Measured on the H200 (session 31, 0.1% of steps ending an episode, half of them
# truncated; device us, against reading every step): 16x1M 95.3 -> 89.0-89.3, 16384x1024 88.7 ->
# 78.2, 4096x128 4.1-4.2 -> 4.0; 1x1M, 4x131072 and 16x65536 within 1%. With 5% of steps ending,
# 16x1M 95.2 -> 93.0 and 16384x1024 88.9 -> 81.6. It lost on whole rows of 4096 steps (4096x4096:
# 2% slower, 9.5% with 5% ending) and time-major, where a program's one trip to memory is a larger
# part of its life: 16x1M 106.6 -> 123.6-124.3 (128.0 against 101.2 with 5% ending), 16384x1024 1%
# slower, 16x65536 3-4% and 4096x128 1-5% faster, the rest within 1%. Hence env-major tiles of at most
# 1024 steps only. Time-major tiles read at the counted steps alone when asked (BOOTSTRAP_TENSOR_MASKED;
# their flags run along envs): on one-wave grids 2-6% faster (session 32: 16x65536 10.05 -> 9.45,
# 4096x128 4.56 -> 4.35, 4x131072 7.8 -> 7.6), but 2-22% slower from 2048 programs up (16x1M
# 106.4 -> 130.5, 128x65536 63.4 -> 67.2), at 5x100000 (one-element loads: 11.7 -> 14.3) and at
# 64x256; a rule for one-wave aligned grids alone would move no target, so the plan never asks.
SPARSE_BOOTSTRAP_MAX_STEPS = 1024


def reads_bootstrap_sparsely(flag_axis: int, block_t: int) -> bool:
    """Whether a tile reads `bootstrap_values` only where it counts (see SPARSE_BOOTSTRAP_MAX_STEPS):
    env-major tiles, whose flag loads run along the steps, of at most that many steps."""
    return flag_axis == 1 and block_t <= SPARSE_BOOTSTRAP_MAX_STEPS


def look_back_layout_ok(block_n: int, num_warps: int) -> bool:
    """Whether the look-back may run on a chunked tile of `block_n` envs on `num_warps` warps.

    Every warp walks the look-back for its copy of the tile's rows, and warps read the state at
    different times, so their copies can disagree on which rows still wait. That is harmless while
    each warp decides alone: when every warp holds all the rows (up to 32) or none holds a row
    twice (a multiple of 32 per warp). In between, Triton reduces the rows' flags across warps
    through shared memory inside the walk's loop, a warp that leaves the loop early skips a barrier
    the others wait at, and the results are wrong (64 x 64 tiles on four warps, measured on the H200)."""
    return block_n <= 32 or block_n % (32 * num_warps) == 0


# Chunks publish from their tile's first column (`_publish_first_column`) instead of the tile summed to
# it: time-major tiles with Triton's atomics, env-major rows with atomics in inline PTX where the kernel
# is compiled for an NVIDIA GPU, else with Triton's from this many programs up. Time-major, against the summed
# tile (session 25, two rounds in one call): 16x1M 119.3 us against 127.1, 32x1M 242.6 against 251.8,
# 128x65536 65.8 against 69.5, 4x131072 7.38-7.54 against 7.61-7.73, the rest equal. Env-major,
# Triton's atomics were faster from 16384 programs (16x1M 101.2 against 104.4) and slower on one-wave
# grids (1x1M 9.0-9.1 against 8.8); in PTX, which keeps the tile's layout, they are faster at every
# grid measured (session 26: 1x1M 8.32 against 8.84-8.90 summed, 16x65536 8.46 against 8.88-8.91,
# 256x16384 27.0-27.1 against 28.6-28.8; 16x1M with ENV_MAJOR_MAXNREG 99.1-99.3 against 100.8-100.9
# with Triton's). Time-major tiles measured mixed in PTX (4x131072 7.7-7.9 against 7.4-7.6, 128x65536
# 64.0-65.2 against 65.7-66.3) and keep Triton's.
PUBLISH_COLUMN_MIN_PROGRAMS = 4096


def publish_mode(time_major: bool, grid: int, nvidia: bool, column: bool | None = None,
                 ptx: bool | None = None) -> int:
    """How chunks publish (`PUBLISH_SUMMED`, `PUBLISH_ATOMIC` or `PUBLISH_PTX`; see
    PUBLISH_COLUMN_MIN_PROGRAMS). `nvidia`: the kernel is compiled for an NVIDIA GPU (only such a
    kernel can run PTX). `column` and `ptx` override the choice."""
    if ptx and not nvidia:
        raise ValueError("publishing in inline PTX needs a kernel compiled for an NVIDIA GPU; "
                         "Triton's interpreter (and ROCm) cannot run PTX")
    ptx = nvidia and not time_major if ptx is None else ptx
    if column is None:
        column = time_major or ptx or grid >= PUBLISH_COLUMN_MIN_PROGRAMS
    return PUBLISH_SUMMED if not column else PUBLISH_PTX if ptx else PUBLISH_ATOMIC


# Chunked env-major grids of this many programs up cap the kernel at this many registers a thread: with
# PTX publishing Triton 3.6 gives it 64, eight programs of four warps per SM; at 48 ten fit, without
# spills (16x1M 99.1-99.3 us against 101.6-101.8, 8x1M 52.3-52.5 against 53.0-53.3; on one-wave grids
# the cap was slower, 1x1M 8.8 against 8.3; session 26).
ENV_MAJOR_MAXNREG, ENV_MAJOR_MAXNREG_MIN_PROGRAMS = 48, 8192


def register_cap(time_major: bool, grid: int, publish: int, block_n: int, window: int, nvidia: bool) -> int | None:
    """The default `maxnreg` of a launch (see ENV_MAJOR_MAXNREG and WIDE_WINDOW_MAXNREG), or None: no
    cap. `nvidia`: compiled for an NVIDIA GPU, the only target that takes the cap."""
    many_programs = grid >= ENV_MAJOR_MAXNREG_MIN_PROGRAMS
    if publish == PUBLISH_PTX and not time_major and many_programs:
        return ENV_MAJOR_MAXNREG
    if nvidia and block_n == WIDE_WINDOW_BLOCK_N and window == WIDE_WINDOW:
        return WIDE_WINDOW_MAXNREG
    return None


def uses_pdl(device: torch.device, nvidia: bool) -> bool:
    """Whether a launch on `device` is a programmatic dependent launch (the `PDL` constexpr and
    Triton's `launch_pdl`): CUDA launches the grid while the kernel before it on the stream is still
    finishing, and the kernel waits for that one (`gdc_wait`) before its first memory access. What
    it saves is the time between two kernels, about 1 us on the H200, on launches but not on graph
    replays (kernels/README.md, section 5; docs/benchmarks.md, session 38). NVIDIA GPUs of compute
    capability 9.0 and later (`griddepcontrol` is sm_90 PTX), with a Triton that has it, unless
    `RL_TRITON_PDL=0` (say, for a driver that cannot capture such a launch into a CUDA graph of the
    caller's). `nvidia`: compiled for an NVIDIA GPU."""
    if not nvidia or gdc_wait is None or device.type != "cuda" or not _PDL:
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


# Look-back window (later chunks a round reads) by tile height, from the window sweeps in
# docs/benchmarks.md (H200); other heights (env-major tiles of one row, 32-row tiles) read one chunk a
# round. With three words a chunk (sessions 19-27), 4- and 8-row time-major tiles gained 4-11% from
# reading 16 words a round, 16-row tiles 2-5% from two chunks, and 2-row tiles read two (2x1M 18.7-18.9
# us against 24.6-24.7 at eight). With one word a chunk (session 29): 4-row tiles 7.5-7.7 us at 4x131072
# reading two chunks, 8.5-8.6 at four (ptxas reuses one register for several of a round's reads, so
# they go to L2 one after another) and 7.9-8.0 at one; 16-row tiles 9.8-9.9 us at 16x65536 reading
# four, 10.0-10.1 at two and 10.3-10.6 at one, and 12.1 at eight (uncapped: 16x1M 110.3-110.7 against
# 108.7-109.0 at four; session 30; capped, see WIDE_WINDOW). Four on 4-row tiles with the reads made to
# go out together measured 1-2% faster at 4x131072 and 2-4% slower at 4x1M (session 30;
# docs/experiments/README.md), so it is not done.
LOOK_BACK_WINDOW = {2: 2, 4: 2, 8: 2, 16: 4}

# 16-row tiles on grids of WIDE_WINDOW_MIN_PROGRAMS programs up read eight chunks a round, capped at
# WIDE_WINDOW_MAXNREG registers (`register_cap`). The cap is what makes the wider window pay: under it
# ptxas issues the round's eight reads into eight registers, one trip to L2 (159 registers, compiled
# for sm_90 with Triton 3.6); without it, it takes 167 and issues them four at a time. At the issue's
# gamma and lambda a 16x256 chunk's walk reads up to seven chunks, one round instead of two. Against four
# chunks (session 30, H200, same calls): 16x1M 106.0-106.3 us against 107.9-108.8, 32x1M 217.6-219.2
# against 222.3-222.8, 64x262144 112.7-113.0 against 114.7-115.0; on smaller grids it lost, 1.5-2% at 2048
# programs (16x524288, 128x65536) and 28% at 16x262144 (1024 programs on eight warps).
WIDE_WINDOW, WIDE_WINDOW_BLOCK_N, WIDE_WINDOW_MIN_PROGRAMS, WIDE_WINDOW_MAXNREG = 8, 16, 4096, 168


def look_back_window(block_n: int, num_chunks: int, grid: int = 0) -> int:
    """How many later chunks a look-back round reads (a power of two): `LOOK_BACK_WINDOW` by the tile's
    rows (`WIDE_WINDOW` for 16-row tiles on grids of `grid >= WIDE_WINDOW_MIN_PROGRAMS` programs), one
    for other tiles, and never more chunks than the row has after the first."""
    window = LOOK_BACK_WINDOW.get(block_n, 1)
    if block_n == WIDE_WINDOW_BLOCK_N and grid >= WIDE_WINDOW_MIN_PROGRAMS:
        window = WIDE_WINDOW
    later_chunks = 1 << (max(num_chunks - 1, 1) - 1).bit_length()  # as a power of two, up
    return max(1, min(window, later_chunks))


# The widest vector a thread moves: 16 bytes of float32.
MAX_ALIGN = 4


def alignment(tensors: tuple, time_major: bool) -> tuple[int, int]:
    """`(ALIGN_AXIS, ALIGN)`: a power of two, up to `MAX_ALIGN`, that divides every 2-D tensor's stride
    along `ALIGN_AXIS` (time-major: between steps, 1; env-major: between rows, 0) and the problem's
    extent along the other, contiguous axis; `(-1, 1)` if none does. With it the kernel's loads and
    stores along the contiguous axis are `ALIGN`-element vectors (`_multiple`): 4x131072 time-major,
    whose steps are 4 envs apart, had one-element loads only."""
    values = tensors[1]
    num_envs, num_steps = values.shape
    if time_major:
        axis, extent = 1, num_envs
    elif values.stride(1) == 1:
        axis, extent = 0, num_steps
    else:
        return -1, 1
    multiple = math.gcd(extent, *(x.stride(axis) for x in tensors if x is not None and x.dim() == 2))
    align = min(MAX_ALIGN, multiple & -multiple)  # the largest power of two that divides them all
    # Triton specialises integers divisible by 16 itself: leave those kernels as they were.
    return (axis, align) if align > 1 and multiple % 16 else (-1, 1)


def flag_hint_axis(terminateds: torch.Tensor, truncateds: torch.Tensor, time_major: bool,
                   block: tuple[int, int], quads: bool = False) -> int:
    """The axis along which the flag loads are capped at 4 wide (`_flag_offsets`), or -1: the tile's
    contiguous axis, where both flag tensors have stride 1 and the tile spans at least 4 elements.
    Not an env-major tile scanned as quarters: each quarter holds every fourth step of a row, so
    nothing in it is contiguous."""
    axis = 0 if time_major else 1
    if quads and not time_major:
        return -1
    if block[axis] >= 4 and terminateds.stride(axis) == 1 and truncateds.stride(axis) == 1:
        return axis
    return -1


class _StateBuffer:
    """One device buffer for the look-back, and the epoch of its last call."""

    def __init__(self, words: int, device: torch.device):
        self.tensor = torch.zeros(words, dtype=torch.int64, device=device)
        self.epoch = 0


# Look-back state by (device, stream). A call's words carry its epoch, so nothing is zeroed
# between calls. Kernels on one stream run in launch order, so a buffer is never used by two at
# once. The epoch stays below 2**29, so that it fits above a word's float and status (see STATUS_MAP):
# past that a fresh buffer starts.
_states: dict[tuple, _StateBuffer] = {}
_state_lock = threading.Lock()
_EPOCH_LIMIT = 2**29 - 1


def _look_back_state(device: torch.device, words: int) -> tuple[torch.Tensor, int]:
    """`(buffer, epoch)` for one chunked launch on the current stream."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            # A CUDA graph replays its arguments as captured: a fixed epoch would see the previous
            # replay's words as ready. A zeroed buffer per call is captured as a memset instead.
            return torch.zeros(words, dtype=torch.int64, device=device), 1
        key = (device.index, triton.runtime.driver.active.get_current_stream(device.index))
    else:  # the interpreter runs one program at a time
        key = (None, None)
    state = _states.get(key)
    if state is None or state.tensor.numel() < words or state.epoch >= _EPOCH_LIMIT:
        state = _states[key] = _StateBuffer(words, device)
    state.epoch += 1
    return state.tensor, state.epoch


# Compiled kernels by launch signature: the constexprs, warps, flag dtypes and every integer
# argument as is (but the epoch, which is never specialised). With all pointers
# 16-byte aligned that fixes everything Triton specialises the kernel on (pointer dtypes and
# alignment; each integer's divisibility by 16 or equality to 1), so a call with a known key skips
# Triton's generic launch path, which binds and re-specialises every argument (about 0.7 us each
# on a slow host). A new shape takes the generic path once.
_compiled: dict[tuple, object] = {}
_MAX_COMPILED = 1024
_knobs = getattr(triton, "knobs", None)  # Triton >= 3.4 (pyproject.toml asks 3.5); else the generic path
_CONSTEXPR_NAMES = ("HAS_TRUNCATEDS", "BOOTSTRAP", "CHUNKED", "FLAG_AXIS", "BLOCK_N", "BLOCK_T", "WINDOW",
                    "INCLUSIVE_EVERY", "QUADS", "PROBE", "EVEN", "REST_SCAN", "ALIGN_AXIS", "ALIGN", "PUBLISH_COLUMN",
                    "PDL")


def _active(hook):
    """`hook`, or None when it would do nothing (Triton >= 3.5 installs empty hook chains)."""
    return None if hook is None or getattr(hook, "calls", None) == [] else hook


# CUDA graphs of repeated launches (`GaeLaunch._replay_or_capture`): on unless RL_TRITON_CUDA_GRAPHS=0,
# read once at import. Each launch keeps a few, one per set of data pointers and scalars it was
# called with twice in a row; a training loop's buffer needs one.
CUDA_GRAPHS_ENV = "RL_TRITON_CUDA_GRAPHS"
_CUDA_GRAPHS = os.environ.get(CUDA_GRAPHS_ENV, "1") not in ("", "0")
# Programmatic dependent launches (`uses_pdl`): on where the GPU has them, unless RL_TRITON_PDL=0.
PDL_ENV = "RL_TRITON_PDL"
_PDL = os.environ.get(PDL_ENV, "1") not in ("", "0")
_MAX_GRAPHS = 8
_capture_streams: dict[torch.device, torch.cuda.Stream] = {}
_capture_lock = threading.Lock()  # one capture at a time on a device's capture stream


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """A stream of our own to capture on: capture needs one other than the default stream."""
    stream = _capture_streams.get(device)
    if stream is None:
        stream = _capture_streams[device] = torch.cuda.Stream(device)
    return stream


class _Graphs:
    """The CUDA graphs of one repeated call, replayed in turn, and the look-back state they share
    (None without a look-back), which they keep alive."""

    __slots__ = ("graphs", "state", "turn")

    def __init__(self, graphs: list, state: torch.Tensor | None):
        self.graphs, self.state, self.turn = graphs, state, 0

    def replay(self) -> None:
        self.graphs[self.turn].replay()
        self.turn = (self.turn + 1) % len(self.graphs)


_single_gpu: bool | None = None


def _on_current_device(device: torch.device) -> bool:
    """Whether `device` is the current CUDA device (always, on a one-GPU machine: no query needed)."""
    global _single_gpu
    if _single_gpu is None:
        _single_gpu = torch.cuda.device_count() == 1
    return _single_gpu or device.index == torch.cuda.current_device()
