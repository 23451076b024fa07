"""Triton GAE: one kernel, a parallel associative scan over time, in three modes.

Each program owns a tile of `[BLOCK_N, BLOCK_T]` (envs x steps). Inside the tile a reverse
`tl.associative_scan` composes the affine maps `f_t(x) = delta_t + beta_t * x`. Rows longer than
one tile are cut into chunks, joined in one of two ways:

- LOOP: each program walks its rows' chunks from the end of time back, carrying the advantage in
  registers. Used when there are enough rows to fill the GPU.
- LOOKBACK: every chunk is its own program. A chunk learns its carry (the advantage at the first
  step after it) by a decoupled look-back over the chunks later in time, which publish their
  composed map as soon as they have it and their exact start advantage once they know it. Used
  for few, long rows: a handful of envs with a million steps still fills the GPU.

The math and the look-back protocol are explained in `kernels/README.md`; arguments were validated
by `kernels.gae.compute_gae`. The host side launches through a cache of compiled kernels (see
`_launch`), because Triton's generic launch path costs about 0.7 us per argument.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Bootstrap modes (the `BOOTSTRAP` constexpr).
BOOTSTRAP_NONE, BOOTSTRAP_LAST_VALUE, BOOTSTRAP_TENSOR = 0, 1, 2
# How rows longer than one tile are joined (the `MODE` constexpr).
SINGLE, LOOP, LOOKBACK = 0, 1, 2
# Memory layouts shared by every [N, T] tensor (the `LAYOUT` constexpr): stride_t == 1 for all,
# stride_n == 1 for all, or neither. Known at compile time, contiguity gives wide, coalesced loads.
GENERAL, ENV_MAJOR, TIME_MAJOR = 0, 1, 2

MAX_BLOCK_T = 1 << 16
# Time-major tiles keep at least this many envs side by side, so each load is a full cache line.
MIN_BLOCK_N_TIME_MAJOR = 32
# A problem whose rows fit in a tile of this size runs as one tile per row block (no chunk joins).
MAX_SINGLE_TILE = 8192

_INT_ARGS = ["N", "T", "num_chunks",
             "stride_rn", "stride_rt", "stride_vn", "stride_vt", "stride_dn", "stride_dt", "stride_un", "stride_ut",
             "stride_bn", "stride_bt", "stride_l", "stride_an", "stride_at", "stride_gn", "stride_gt"]


@triton.jit
def _compose(alpha_later, beta_later, alpha, beta):
    # Reverse scan: the accumulator is the map of the later steps, g = f_{t+1} o ... ;
    # the current step's map goes outside: f_t(g(x)) = alpha + beta * (alpha_g + beta_g * x).
    return alpha + beta * alpha_later, beta * beta_later


@triton.jit
def _float_bits(x):
    return x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF


@triton.jit
def _pack(low_float, high_bits):
    # One int64 word holds a float and its flag, so a reader sees both or neither.
    return _float_bits(low_float) | (high_bits << 32)


@triton.jit
def _unpack_low(word):
    return (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _unpack_high(word):
    return ((word >> 32) & 0x7FFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _offsets(n, t, stride_n, stride_t, LAYOUT: tl.constexpr, ALIGNED: tl.constexpr):
    if ALIGNED:  # every non-unit stride is a multiple of 16 elements: rows start on wide boundaries
        stride_n = tl.multiple_of(stride_n, 16)
        stride_t = tl.multiple_of(stride_t, 16)
    if LAYOUT == 1:
        return n * stride_n + t
    elif LAYOUT == 2:
        return n + t * stride_t
    else:
        return n * stride_n + t * stride_t


@triton.jit
def _first_column(x, BLOCK_T: tl.constexpr):
    # [BLOCK_N, BLOCK_T] -> [BLOCK_N]: the earliest step of each row of the tile.
    return tl.sum(tl.where((tl.arange(0, BLOCK_T) == 0)[None, :], x, 0.0), axis=1)


@triton.jit
def _tile_scan(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    rows, chunk, N, T,
    stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
    stride_un, stride_ut, stride_bn, stride_bt, stride_l,
    gamma, gamma_lam,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, LAYOUT: tl.constexpr, ALIGNED: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Load one tile and scan it: returns the local (alpha, beta) maps, V(s_t), the mask and steps."""
    steps = chunk * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)  # [BLOCK_T]
    row_ok = rows < N
    mask = row_ok[:, None] & (steps < T)[None, :]  # [BLOCK_N, BLOCK_T]
    n = rows[:, None]
    t = steps[None, :]
    is_last = t == T - 1

    reward = tl.load(rewards_ptr + _offsets(n, t, stride_rn, stride_rt, LAYOUT, ALIGNED), mask=mask, other=0.0)
    value_offsets = _offsets(n, t, stride_vn, stride_vt, LAYOUT, ALIGNED)
    value = tl.load(values_ptr + value_offsets, mask=mask, other=0.0)
    # values[t+1]: the same cache lines as `value` (but one), so DRAM sees those bytes once.
    next_value = tl.load(values_ptr + _offsets(n, t + 1, stride_vn, stride_vt, LAYOUT, ALIGNED),
                         mask=mask & ~is_last, other=0.0)
    terminated = tl.load(terminateds_ptr + _offsets(n, t, stride_dn, stride_dt, LAYOUT, ALIGNED),
                         mask=mask, other=0) != 0
    done = terminated
    if BOOTSTRAP == 2:
        bootstrap = tl.load(bootstrap_ptr + _offsets(n, t, stride_bn, stride_bt, LAYOUT, ALIGNED),
                            mask=mask, other=0.0)
        if HAS_TRUNCATEDS:
            truncated = tl.load(truncateds_ptr + _offsets(n, t, stride_un, stride_ut, LAYOUT, ALIGNED),
                                mask=mask, other=0) != 0
            done = done | truncated
            next_value = tl.where(truncated | is_last, bootstrap, next_value)
        else:
            next_value = tl.where(is_last, bootstrap, next_value)
    elif BOOTSTRAP == 1:
        last_value = tl.load(last_value_ptr + rows * stride_l, mask=row_ok, other=0.0)  # [BLOCK_N]
        next_value = tl.where(is_last, last_value[:, None], next_value)
    # `where`, not (1 - terminated) * V: the value after a terminal step may be anything, even inf.
    next_value = tl.where(terminated, 0.0, next_value)

    delta = reward + gamma * next_value - value
    beta = tl.where(done | ~mask, 0.0, gamma_lam)  # padding must not carry anything across
    alpha, beta = tl.associative_scan((delta, beta), 1, _compose, reverse=True)
    return alpha, beta, value, mask, t


@triton.jit
def _look_back(state_ptr, rows, row_ok, chunk, num_chunks, alpha, beta, BLOCK_N: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """The carry of this chunk: the advantage at the first step after it, from the chunks later in time.

    Publishes this chunk's composed map first and its start advantage last (see kernels/README.md).
    State words: [ticket, pad, aggregates [N_pad, num_chunks], inclusives [N_pad, num_chunks]].
    """
    aggregate_ptr = state_ptr + 2
    inclusive_ptr = aggregate_ptr + tl.num_programs(0) * BLOCK_N
    word = rows * num_chunks  # [BLOCK_N]
    agg_alpha = _first_column(alpha, BLOCK_T)  # this chunk's map F(x) = agg_alpha + agg_beta * x
    agg_beta = _first_column(beta, BLOCK_T)
    carry = tl.zeros([BLOCK_N], dtype=tl.float32)  # the last chunk's carry: A_T = 0
    if chunk < num_chunks - 1:
        # Beta's sign bit doubles as the "ready" flag (beta >= 0 always), so one word says it all.
        tl.atomic_xchg(aggregate_ptr + word + chunk, _pack(agg_alpha, _float_bits(agg_beta) | 0x80000000),
                       mask=row_ok, sem="relaxed")
        # Walk later chunks: compose their maps until one knows its start advantage, a done flag
        # cuts the chain (beta == 0), or the row ends.
        acc_alpha = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_beta = tl.full([BLOCK_N], 1.0, dtype=tl.float32)
        pending = row_ok
        j = tl.full([BLOCK_N], 0, dtype=tl.int64) + chunk + 1
        while tl.max(pending.to(tl.int32), axis=0) > 0:
            inclusive = tl.load(inclusive_ptr + word + j, mask=pending, other=0, volatile=True)
            aggregate = tl.load(aggregate_ptr + word + j, mask=pending, other=0, volatile=True)
            has_inclusive = pending & (inclusive != 0)
            has_aggregate = pending & ~has_inclusive & (aggregate != 0)
            carry = tl.where(has_inclusive, acc_alpha + acc_beta * _unpack_low(inclusive), carry)
            acc_alpha = tl.where(has_aggregate, acc_alpha + acc_beta * _unpack_low(aggregate), acc_alpha)
            acc_beta = tl.where(has_aggregate, acc_beta * _unpack_high(aggregate), acc_beta)
            j = tl.where(has_aggregate, j + 1, j)
            resolved = has_aggregate & ((acc_beta == 0.0) | (j == num_chunks))
            carry = tl.where(resolved, acc_alpha, carry)
            pending = pending & ~has_inclusive & ~resolved
    tl.atomic_xchg(inclusive_ptr + word + chunk, _pack(agg_alpha + agg_beta * carry, 1), mask=row_ok, sem="relaxed")
    return carry


@triton.jit(do_not_specialize=_INT_ARGS)
def _gae_kernel(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    advantages_ptr, returns_ptr, state_ptr,
    N: tl.int64, T: tl.int64, num_chunks: tl.int64,
    stride_rn: tl.int64, stride_rt: tl.int64, stride_vn: tl.int64, stride_vt: tl.int64,
    stride_dn: tl.int64, stride_dt: tl.int64, stride_un: tl.int64, stride_ut: tl.int64,
    stride_bn: tl.int64, stride_bt: tl.int64, stride_l: tl.int64,
    stride_an: tl.int64, stride_at: tl.int64, stride_gn: tl.int64, stride_gt: tl.int64,
    gamma: tl.float32, gamma_lam: tl.float32,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, MODE: tl.constexpr, LAYOUT: tl.constexpr,
    ALIGNED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    num_row_blocks = tl.cdiv(N, BLOCK_N)
    if MODE == 2:
        # Tickets hand out chunks from the end of time, so every chunk a program waits for
        # belongs to a program that started earlier: the look-back cannot deadlock.
        ticket = tl.atomic_add(state_ptr, 1)
        row_block = ticket % num_row_blocks
        first_chunk = num_chunks - 1 - ticket // num_row_blocks
    else:
        row_block = tl.program_id(0).to(tl.int64)
        first_chunk = num_chunks - 1
    if MODE == 1:
        chunks_here = num_chunks
    else:
        chunks_here = 1
    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [BLOCK_N]
    carry = tl.zeros([BLOCK_N], dtype=tl.float32)  # A_T = 0
    for i in range(0, chunks_here):  # LOOP: from the last chunk back; otherwise one chunk
        chunk = first_chunk - i
        alpha, beta, value, mask, t = _tile_scan(
            rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
            rows, chunk, N, T,
            stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
            stride_un, stride_ut, stride_bn, stride_bt, stride_l,
            gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, LAYOUT, ALIGNED, BLOCK_T)
        if MODE == 2:
            carry = _look_back(state_ptr, rows, rows < N, chunk, num_chunks, alpha, beta, BLOCK_N, BLOCK_T)
        advantage = alpha + beta * carry[:, None]
        n = rows[:, None]
        tl.store(advantages_ptr + _offsets(n, t, stride_an, stride_at, LAYOUT, ALIGNED), advantage, mask=mask)
        tl.store(returns_ptr + _offsets(n, t, stride_gn, stride_gt, LAYOUT, ALIGNED), advantage + value, mask=mask)
        if MODE == 1:
            carry = _first_column(advantage, BLOCK_T)


@functools.lru_cache(maxsize=512)
def plan(
    num_envs: int, num_steps: int, layout: int, max_block_t: int = MAX_BLOCK_T,
    tile_elements: int | None = None, num_warps: int | None = None, mode: int | None = None,
    loop_min_programs: int = 264,
) -> tuple[int, int, int, int, int, int]:
    """`(mode, BLOCK_N, BLOCK_T, num_chunks, grid, num_warps)` for a problem.

    Whole rows per tile where a tile of `MAX_SINGLE_TILE` holds them; otherwise chunks, joined by
    LOOP when there are at least `loop_min_programs` row blocks to keep the GPU busy, else by
    LOOKBACK. `tile_elements`, `num_warps` and `mode` override the choice (tuning, tests).
    """
    envs = triton.next_power_of_2(max(num_envs, 1))
    steps = triton.next_power_of_2(max(num_steps, 1))
    time_major = layout == TIME_MAJOR
    min_block_n = min(envs, MIN_BLOCK_N_TIME_MAJOR if time_major else 1)
    if tile_elements is None:
        whole_rows = steps * min_block_n
        tile_elements = whole_rows if whole_rows <= MAX_SINGLE_TILE else (4096 if time_major else 1024)
    if time_major:
        block_n = min(envs, max(MIN_BLOCK_N_TIME_MAJOR, tile_elements // steps))
        block_t = min(steps, max_block_t, max(tile_elements // block_n, 1))
    else:
        block_t = min(steps, max_block_t, tile_elements)
        block_n = min(envs, max(tile_elements // block_t, 1))
    num_chunks = triton.cdiv(max(num_steps, 1), block_t)
    row_blocks = triton.cdiv(max(num_envs, 1), block_n)
    if mode is None:
        mode = SINGLE if num_chunks == 1 else LOOP if row_blocks >= loop_min_programs else LOOKBACK
    elif num_chunks == 1:
        mode = SINGLE
    grid = row_blocks * num_chunks if mode == LOOKBACK else row_blocks
    if num_warps is None:
        elements = block_n * block_t
        num_warps = 1 if elements <= 256 else 2 if elements <= 512 else 4 if elements <= 4096 else 8
    return mode, block_n, block_t, num_chunks, grid, num_warps


def _layout(strides: list[tuple[int, int]]) -> tuple[int, bool]:
    """The LAYOUT shared by every [N, T] tensor, and whether all their other strides are 16-aligned."""
    env_major = time_major = aligned_n = aligned_t = True
    for stride_n, stride_t in strides:
        env_major &= stride_t == 1
        time_major &= stride_n == 1
        aligned_n &= stride_n % 16 == 0
        aligned_t &= stride_t % 16 == 0
    if env_major:
        return ENV_MAJOR, aligned_n
    if time_major:
        return TIME_MAJOR, aligned_t
    return GENERAL, aligned_n and aligned_t


# Compiled kernels by everything Triton specialises them on. Integer arguments are typed int64 and
# not specialised, and floats are typed fp32, so that is: the constexprs, the flag dtypes and
# the 16-byte alignment of each pointer. Calls with a known key skip Triton's generic launch path.
_compiled: dict[tuple, object] = {}
_knobs = getattr(triton, "knobs", None)  # Triton >= 3.4; older versions always take the generic path


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
    max_block_t: int = MAX_BLOCK_T,
    tile_elements: int | None = None,
    num_warps: int | None = None,
    mode: int | None = None,
) -> None:
    """Run the kernel on validated `[N, T]` tensors, writing `advantages` and `returns`.

    `max_block_t` (a power of two) caps the chunk length, `mode` forces LOOP or LOOKBACK: tests use
    both to exercise chunk joins at small sizes. `tile_elements` and `num_warps` are tuning knobs.
    """
    num_envs, num_steps = values.shape
    truncated = truncateds if truncateds is not None else terminateds
    if bootstrap_values is not None:
        bootstrap_mode, bootstrap = BOOTSTRAP_TENSOR, bootstrap_values
    else:
        bootstrap_mode = BOOTSTRAP_NONE if last_value is None else BOOTSTRAP_LAST_VALUE
        bootstrap = values
    matrices = (rewards, values, terminateds, truncated, bootstrap, advantages, returns)
    strides = [x.stride() for x in matrices]
    layout, aligned = _layout(strides)
    mode, block_n, block_t, num_chunks, grid, warps = plan(
        num_envs, num_steps, layout, max_block_t, tile_elements, num_warps, mode, _loop_min_programs(values.device))
    if mode == LOOKBACK:
        # [ticket, pad, aggregate words, inclusive words], one word per (padded row, chunk)
        state = torch.zeros(2 + 2 * grid * block_n, dtype=torch.int64, device=values.device)
    else:
        state = values  # unused
    lv = last_value if last_value is not None else values
    tensors = (*matrices[:5], lv, advantages, returns, state)
    (srn, srt), (svn, svt), (sdn, sdt), (sun, sut), (sbn, sbt), (san, sat), (sgn, sgt) = strides
    ints = (num_envs, num_steps, num_chunks, srn, srt, svn, svt, sdn, sdt, sun, sut, sbn, sbt, lv.stride(0),
            san, sat, sgn, sgt)
    constexprs = (truncateds is not None, bootstrap_mode, mode, layout, aligned, block_n, block_t)
    _launch(grid, warps, tensors, ints, (gamma, gamma * lam), constexprs, terminateds.dtype, truncated.dtype)


@functools.lru_cache(maxsize=16)
def _loop_min_programs(device: torch.device) -> int:
    """LOOP needs about two row blocks per multiprocessor to keep the memory system busy."""
    if device.type != "cuda":
        return 264
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def _launch(grid, num_warps, tensors, ints, floats, constexprs, *dtypes) -> None:
    pointers = [x.data_ptr() for x in tensors]
    device = tensors[1].device
    alignment = 0
    for pointer in pointers:
        alignment = alignment << 1 | (pointer % 16 == 0)
    key = (device, num_warps, constexprs, dtypes, alignment)
    kernel = _compiled.get(key)
    if kernel is not None and _knobs.runtime.launch_enter_hook is None and _on_current_device(device):
        # The direct path: what Triton's launcher does once it has found the compiled kernel.
        stream = triton.runtime.driver.active.get_current_stream(device.index)
        kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None,
                   *pointers, *ints, *floats, *constexprs)
        return
    names = ("HAS_TRUNCATEDS", "BOOTSTRAP", "MODE", "LAYOUT", "ALIGNED", "BLOCK_N", "BLOCK_T")
    if device.type != "cuda":  # Triton's CPU interpreter
        _gae_kernel[(grid,)](*tensors, *ints, *floats, **dict(zip(names, constexprs)), num_warps=num_warps)
        return
    with torch.cuda.device(device):
        kernel = _gae_kernel[(grid,)](*tensors, *ints, *floats, **dict(zip(names, constexprs)), num_warps=num_warps)
    if _knobs is not None and hasattr(kernel, "packed_metadata"):
        _compiled[key] = kernel


_single_gpu: bool | None = None


def _on_current_device(device: torch.device) -> bool:
    """Whether `device` is the current CUDA device (always, on a one-GPU machine: no query needed)."""
    global _single_gpu
    if _single_gpu is None:
        _single_gpu = torch.cuda.device_count() == 1
    return _single_gpu or device.index == torch.cuda.current_device()
