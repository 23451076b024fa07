"""Triton GAE: one kernel, a parallel associative scan over time, chunks joined by a look-back.

Each program owns a tile of `[BLOCK_N, BLOCK_T]` (envs x steps). Inside the tile a reverse
`tl.associative_scan` composes the affine maps `f_t(x) = delta_t + beta_t * x`. Rows longer than
one tile are cut into chunks, each its own program, so a handful of envs with a million steps
still fills the GPU. A chunk learns its carry (the advantage at the first step after it) by a
decoupled look-back over the chunks later in time, which publish their composed map as soon as
they have it and their exact start advantage once they know it.

The math and the look-back protocol are explained in `kernels/README.md`; arguments were validated
by `kernels.gae.compute_gae`. The host side launches through a cache of compiled kernels (see
`_launch`), because Triton's generic launch path costs about 0.7 us per argument on a slow host.
"""

from __future__ import annotations

import functools
import operator

import torch
import triton
import triton.language as tl

# Bootstrap modes (the `BOOTSTRAP` constexpr).
BOOTSTRAP_NONE, BOOTSTRAP_LAST_VALUE, BOOTSTRAP_TENSOR = 0, 1, 2

MAX_BLOCK_T = 1 << 16
# Tile sizes, from the sweeps in docs/benchmarks.md (H200): 1024 elements for env-major rows;
# time-major tiles keep 32 envs side by side (full 128-byte lines) and, with fewer envs, grow
# along time instead.
TILE_ELEMENTS = 1024
TIME_MAJOR_BLOCK_N = 32
TIME_MAJOR_FEW_ENVS_TILE = 4096
# Up to this many elements a call is launch-bound: one env row per program maximises parallelism.
TINY_PROBLEM = 32768


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
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Load one tile and scan it: returns the local (alpha, beta) maps, V(s_t), the mask and steps."""
    steps = chunk * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)  # [BLOCK_T]
    row_ok = rows < N
    mask = row_ok[:, None] & (steps < T)[None, :]  # [BLOCK_N, BLOCK_T]
    n = rows[:, None]
    t = steps[None, :]
    is_last = t == T - 1

    reward = tl.load(rewards_ptr + n * stride_rn + t * stride_rt, mask=mask, other=0.0)
    value = tl.load(values_ptr + n * stride_vn + t * stride_vt, mask=mask, other=0.0)
    # values[t+1]: the same cache lines as `value` (but one), so DRAM sees those bytes once.
    next_value = tl.load(values_ptr + n * stride_vn + (t + 1) * stride_vt,
                         mask=mask & ~is_last, other=0.0)
    terminated = tl.load(terminateds_ptr + n * stride_dn + t * stride_dt,
                         mask=mask, other=0) != 0
    done = terminated
    if BOOTSTRAP == 2:
        bootstrap = tl.load(bootstrap_ptr + n * stride_bn + t * stride_bt,
                            mask=mask, other=0.0)
        if HAS_TRUNCATEDS:
            truncated = tl.load(truncateds_ptr + n * stride_un + t * stride_ut,
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


@triton.jit
def _gae_kernel(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    advantages_ptr, returns_ptr, state_ptr,
    N, T, num_chunks,
    stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
    stride_un, stride_ut, stride_bn, stride_bt, stride_l,
    stride_an, stride_at, stride_gn, stride_gt,
    gamma, gamma_lam,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, CHUNKED: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    if CHUNKED:
        # Tickets hand out chunks from the end of time, so every chunk a program waits for
        # belongs to a program that started earlier: the look-back cannot deadlock.
        num_row_blocks = tl.cdiv(N, BLOCK_N)
        ticket = tl.atomic_add(state_ptr, 1).to(tl.int64)
        row_block = ticket % num_row_blocks
        chunk = num_chunks - 1 - ticket // num_row_blocks
    else:
        row_block = tl.program_id(0).to(tl.int64)
        chunk = 0
    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [BLOCK_N]
    alpha, beta, value, mask, t = _tile_scan(
        rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
        rows, chunk, N, T,
        stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
        stride_un, stride_ut, stride_bn, stride_bt, stride_l,
        gamma, gamma_lam, HAS_TRUNCATEDS, BOOTSTRAP, BLOCK_T)
    if CHUNKED:
        carry = _look_back(state_ptr, rows, rows < N, chunk, num_chunks, alpha, beta, BLOCK_N, BLOCK_T)
        alpha = alpha + beta * carry[:, None]
    n = rows[:, None]
    tl.store(advantages_ptr + n * stride_an + t * stride_at, alpha, mask=mask)
    tl.store(returns_ptr + n * stride_gn + t * stride_gt, alpha + value, mask=mask)


@functools.lru_cache(maxsize=512)
def plan(
    num_envs: int, num_steps: int, time_major: bool, max_block_t: int = MAX_BLOCK_T,
    block: tuple[int, int] | None = None, num_warps: int | None = None,
) -> tuple[int, int, int, int, int]:
    """`(BLOCK_N, BLOCK_T, num_chunks, grid, num_warps)` for a problem. More than one chunk means
    the rows are joined by the look-back. `block` and `num_warps` override the choice (tuning, tests)."""
    envs = triton.next_power_of_2(max(num_envs, 1))
    steps = triton.next_power_of_2(max(num_steps, 1))
    if block is not None:
        block_n, block_t = block
    elif not time_major:
        block_t = min(steps, TILE_ELEMENTS)
        block_n = TILE_ELEMENTS // block_t
    elif num_envs * num_steps <= TINY_PROBLEM:
        block_n, block_t = 1, min(steps, TILE_ELEMENTS)
    else:
        block_n = min(envs, TIME_MAJOR_BLOCK_N)
        block_t = (TILE_ELEMENTS if envs >= TIME_MAJOR_BLOCK_N else TIME_MAJOR_FEW_ENVS_TILE) // block_n
    block_n, block_t = min(block_n, envs), min(block_t, steps, max_block_t)
    num_chunks = triton.cdiv(max(num_steps, 1), block_t)
    grid = triton.cdiv(max(num_envs, 1), block_n) * num_chunks
    if num_warps is None:
        elements = block_n * block_t
        num_warps = 1 if elements <= 128 else 2 if elements <= 256 else 4
    return block_n, block_t, num_chunks, grid, num_warps


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
    block: tuple[int, int] | None = None,
    num_warps: int | None = None,
) -> None:
    """Run the kernel on validated `[N, T]` tensors, writing `advantages` and `returns`.

    `max_block_t` (a power of two) caps the chunk length: tests lower it to exercise the look-back
    at small sizes. `block` (`(BLOCK_N, BLOCK_T)`, powers of two) and `num_warps` are tuning knobs.
    """
    num_envs, num_steps = values.shape
    truncated = truncateds if truncateds is not None else terminateds
    if bootstrap_values is not None:
        bootstrap_mode, bootstrap = BOOTSTRAP_TENSOR, bootstrap_values
    else:
        bootstrap_mode = BOOTSTRAP_NONE if last_value is None else BOOTSTRAP_LAST_VALUE
        bootstrap = values
    stride_vn, stride_vt = values.stride()
    block_n, block_t, num_chunks, grid, warps = plan(
        num_envs, num_steps, stride_vn == 1 and stride_vt != 1, max_block_t, block, num_warps)
    chunked = num_chunks > 1
    if chunked:
        # [ticket, pad, aggregate words, inclusive words], one word per (padded row, chunk)
        state = torch.zeros(2 + 2 * grid * block_n, dtype=torch.int64, device=values.device)
    else:
        state = values  # unused
    lv = last_value if last_value is not None else values
    tensors = (rewards, values, terminateds, truncated, bootstrap, lv, advantages, returns, state)
    ints = (num_envs, num_steps, num_chunks, *rewards.stride(), stride_vn, stride_vt, *terminateds.stride(),
            *truncated.stride(), *bootstrap.stride(), lv.stride(0), *advantages.stride(), *returns.stride())
    constexprs = (truncateds is not None, bootstrap_mode, chunked, block_n, block_t)
    _launch(grid, warps, tensors, ints, (gamma, gamma * lam), constexprs)


# Compiled kernels by launch signature: the constexprs, warps, flag dtypes and every integer
# argument as is. With all pointers 16-byte aligned that fixes everything Triton specialises the
# kernel on (pointer dtypes and alignment; each integer's divisibility by 16 or equality to 1), so a
# call with a known key skips Triton's generic launch path, which binds and re-specialises every
# argument (about 0.7 us each on a slow host). A new shape takes the generic path once.
_compiled: dict[tuple, object] = {}
_MAX_COMPILED = 1024
_knobs = getattr(triton, "knobs", None)  # Triton >= 3.4; older versions always take the generic path
_CONSTEXPR_NAMES = ("HAS_TRUNCATEDS", "BOOTSTRAP", "CHUNKED", "BLOCK_N", "BLOCK_T")


def _launch(grid: int, num_warps: int, tensors: tuple, ints: tuple, floats: tuple, constexprs: tuple) -> None:
    pointers = [x.data_ptr() for x in tensors]
    device = tensors[1].device
    aligned = functools.reduce(operator.or_, pointers) % 16 == 0
    key = (device, num_warps, constexprs, tensors[2].dtype, tensors[3].dtype, ints)
    kernel = _compiled.get(key) if aligned else None
    if kernel is not None and _on_current_device(device):
        # The direct path: exactly what JITFunction.run does once it has found the compiled kernel.
        stream = triton.runtime.driver.active.get_current_stream(device.index)
        args = (*pointers, *ints, *floats, *constexprs)
        hooks = _knobs.runtime
        kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata((grid, 1, 1), stream, *args), hooks.launch_enter_hook,
                   hooks.launch_exit_hook, *args)
        return
    constexpr_kwargs = dict(zip(_CONSTEXPR_NAMES, constexprs, strict=True))
    if device.type != "cuda":  # Triton's CPU interpreter
        _gae_kernel[(grid,)](*tensors, *ints, *floats, **constexpr_kwargs, num_warps=num_warps)
        return
    with torch.cuda.device(device):
        kernel = _gae_kernel[(grid,)](*tensors, *ints, *floats, **constexpr_kwargs, num_warps=num_warps)
    if aligned and _knobs is not None and hasattr(kernel, "packed_metadata") and hasattr(kernel, "launch_metadata"):
        if len(_compiled) >= _MAX_COMPILED:
            _compiled.clear()
        _compiled[key] = kernel


_single_gpu: bool | None = None


def _on_current_device(device: torch.device) -> bool:
    """Whether `device` is the current CUDA device (always, on a one-GPU machine: no query needed)."""
    global _single_gpu
    if _single_gpu is None:
        _single_gpu = torch.cuda.device_count() == 1
    return _single_gpu or device.index == torch.cuda.current_device()
