"""The Triton GAE kernel: device code only (planned by `gae_plan`, launched by `gae_launch`).

Each program owns a tile of `[BLOCK_N, BLOCK_T]` (envs x steps). Inside the tile a reverse
`tl.associative_scan` composes the affine maps `f_t(x) = delta_t + beta_t * x` (time-major tiles
first compose each thread's four consecutive steps in registers: `_quad_tile`). Rows longer than
one tile are cut into chunks, each its own program, so a handful of envs with a million steps
still fills the GPU. A chunk learns its carry (the advantage at the first step after it) by a
decoupled look-back over the chunks later in time, which publish their composed map as soon as
they have it and their exact start advantage once they know it. `kernels/README.md` explains the
math and the look-back protocol; `kernels.gae.compute_gae` validated the arguments.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (`gae_plan.uses_pdl`); pyproject.toml asks for a Triton that has it (3.5)
    from triton.language.extra.cuda import gdc_wait
except ImportError:
    gdc_wait = None

# The kernel's compile-time parameters, in its signature's order (the launcher passes them by position).
CONSTEXPR_NAMES = ("HAS_TRUNCATEDS", "BOOTSTRAP", "CHUNKED", "FLAG_AXIS", "BLOCK_N", "BLOCK_T", "WINDOW",
                   "INCLUSIVE_EVERY", "QUADS", "PROBE", "EVEN", "REST_SCAN", "ALIGN_AXIS", "ALIGN", "PUBLISH_COLUMN",
                   "PDL")

# Bootstrap modes (BOOTSTRAP): none, `last_value`, or a tensor read at every step, in the runs of four
# steps that hold a truncation or the last column (SPARSE), or only at those steps (MASKED).
BOOTSTRAP_NONE, BOOTSTRAP_LAST_VALUE, BOOTSTRAP_TENSOR, BOOTSTRAP_TENSOR_SPARSE, BOOTSTRAP_TENSOR_MASKED = 0, 1, 2, 3, 4


@triton.jit
def _affine(alpha, beta, x):
    # alpha + beta * x, but alpha where beta is 0: a done step cuts its episode from the steps after it,
    # and a non-finite value there must stay there (0 * inf is NaN). Every composition goes through
    # this. The select follows the multiply-add, which stays one FMA: a select between the product and
    # the sum cost 33% on 16 x 1M time-major rows (H100).
    return tl.where(beta == 0.0, alpha, alpha + beta * x)


@triton.jit
def _compose(alpha_later, beta_later, alpha, beta):
    # Reverse scan: the accumulator is the map of the later steps, g = f_{t+1} o ... ;
    # the current step's map goes outside: f_t(g(x)) = alpha + beta * (alpha_g + beta_g * x).
    return _affine(alpha, beta, alpha_later), beta * beta_later


@triton.jit
def _compose_with_rest(alpha_later, beta_later, rest_alpha_later, rest_beta_later, alpha, beta, rest_alpha, rest_beta):
    # A run of steps as two maps: the whole run, and the run without its first step (the identity
    # for a single step). Followed by a later run, the first becomes the composition of both, the
    # second the current run's rest followed by the whole later run.
    return (_affine(alpha, beta, alpha_later), beta * beta_later,
            _affine(rest_alpha, rest_beta, alpha_later), rest_beta * beta_later)


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
# then it overwrites that word with its start advantage. One word a chunk: a walk reads a third of
# what three (alpha, beta, start advantage) would take, and a map is never half published.
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
    # does not do it: Triton 3.6 and 3.9 keep the larger contiguity they derive. Only set where the
    # flags' stride along that axis is 1 and the tile spans at least 4 elements along it
    # (`gae_plan.flag_hint_axis`).
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
            # off asks memory for nothing (gae_plan.SPARSE_BOOTSTRAP_MAX_STEPS).
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
    return _affine(alpha, beta, next_alpha), beta * next_beta


@triton.jit
def _quad_suffixes(a0, b0, a1, b1, a2, b2, a3, b3):
    """Each of four consecutive steps' maps composed with the rest of its quad (in registers)."""
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
    while every word so far was a ready map."""
    ready = going & ok & ((word >> 34) == epoch)
    status = (word >> 32) & 3
    has_inclusive = ready & (status == _START)
    has_aggregate = ready & (status != _START)
    later_beta = tl.where(status == _CUT, 0.0, chunk_beta)
    carry = tl.where(has_inclusive, _affine(acc_alpha, acc_beta, _low_float(word)), carry)
    acc_alpha = tl.where(has_aggregate, _affine(acc_alpha, acc_beta, _low_float(word)), acc_alpha)
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
            # row's end rereads its last chunk, unused: an unmasked load), so the reads can all go
            # out together; on 4-row tiles ptxas gives several of them one register, which is why
            # those read two a round (gae_plan.LOOK_BACK_WINDOW).
            # The window is one-dimensional on purpose: a 2-D [BLOCK_N, WINDOW] window with a scan
            # across it is smaller than the thread count for small tiles, and Triton's scan leaves the
            # replicated threads' copies wrong (triton-lang/triton#2298).
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
            tl.atomic_xchg(state_ptr + own, _float_bits(_affine(agg_alpha, agg_beta, carry)) | _tag(epoch, _START),
                           mask=row_ok, sem="relaxed")
    return carry


@triton.jit(do_not_specialize=["epoch"])
def gae_kernel(
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
        # Launched as a programmatic dependent launch (`gae_plan.uses_pdl`): this grid may start while the kernel
        # before it on the stream finishes. Wait here, before any memory access, until that kernel has
        # completed and its writes are visible: the launch's latency overlaps its tail, nothing else.
        gdc_wait()
    # What the host checked (`gae_plan.alignment`), in a form Triton's alignment analysis reads: it only knows
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
        # but its round trip sits before the tile's loads (3-17% slower).
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
            alpha = _affine(alpha, beta, carry[:, None])
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
    # Each step's map to the end of its quad, in registers.
    d0, b0, d1, b1, d2, b2, d3, b3 = _quad_suffixes(d0, b0, d1, b1, d2, b2, d3, b3)
    # What follows quad k: the map of quads k + 1 .. to the end of the tile (the identity after the last).
    if REST_SCAN:
        # One reverse scan carries it along with each quad's own map to the end (`_compose_with_rest`):
        # twice the values per step of the scan, but no gather, whose layout costs a trip through
        # shared memory for every quarter before the scan and after it (one-warp tiles 3-10% faster,
        # whole rows on eight warps 8-21%).
        zero_and_one = (zero, zero + 1.0)
        _, _, after_alpha, after_beta = tl.associative_scan((d0, b0) + zero_and_one, 1, _compose_with_rest,
                                                            reverse=True)
    else:
        # Scan the quads' maps, then read quad k + 1's result: 1-6% faster for chunked 16-env tiles on
        # eight warps, where Triton lays the gather's warps along envs, so the scan stays in each warp
        # and only the tile's quarters cross warps, where the scan above would carry four values.
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
        d0, d1, d2, d3 = (_affine(d0, b0, carry), _affine(d1, b1, carry), _affine(d2, b2, carry),
                          _affine(d3, b3, carry))
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

