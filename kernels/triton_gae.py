"""Triton GAE: one kernel, a parallel associative scan over time, chunked rows joined in one pass.

Each program owns a tile of `[BLOCK_N, BLOCK_T]` (envs x steps). Inside the tile a reverse
`tl.associative_scan` composes the affine maps `f_t(x) = delta_t + beta_t * x`. Rows longer than
`BLOCK_T` are split into chunks that run in parallel; a chunk learns its carry (the advantage at
the first step after it) by a decoupled look-back over the chunks later in time, which publish
their composed map as soon as they have it and their exact start advantage once they know it.
The math and the protocol are explained in `kernels/README.md`; the arguments were validated by
`kernels.gae.compute_gae`.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Bootstrap modes (the `BOOTSTRAP` constexpr).
BOOTSTRAP_NONE, BOOTSTRAP_LAST_VALUE, BOOTSTRAP_TENSOR = 0, 1, 2

# Elements per program. Big enough to amortise the per-program scan and look-back, small enough
# to keep every value in registers without spilling.
TILE_ELEMENTS = 4096
NUM_WARPS = 4
MAX_BLOCK_T = 4096
# Time-major tiles keep at least this many envs side by side so each load is a full 128-byte line.
MIN_BLOCK_N_TIME_MAJOR = 32


@triton.jit
def _compose(alpha_later, beta_later, alpha, beta):
    # Reverse scan: the accumulator is the map of the later steps, f_{t+1} o ... ;
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
def _gae_kernel(
    rewards_ptr, values_ptr, terminateds_ptr, truncateds_ptr, bootstrap_ptr, last_value_ptr,
    advantages_ptr, returns_ptr,
    state_ptr,  # chunked path only: int64 [ticket, pad, aggregates..., inclusives...], zeroed
    N, T, num_chunks,
    stride_rn, stride_rt, stride_vn, stride_vt, stride_dn, stride_dt,
    stride_un, stride_ut, stride_bn, stride_bt, stride_l,
    stride_an, stride_at, stride_gn, stride_gt,
    gamma, gamma_lam,
    HAS_TRUNCATEDS: tl.constexpr, BOOTSTRAP: tl.constexpr, CHUNKED: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    num_row_blocks = tl.cdiv(N, BLOCK_N)
    if CHUNKED:
        # Tickets hand out chunks from the end of time, so every chunk a program waits for
        # belongs to a program that started earlier: the look-back cannot deadlock.
        ticket = tl.atomic_add(state_ptr, 1)
        aggregate_ptr = state_ptr + 2
        inclusive_ptr = aggregate_ptr + num_row_blocks * BLOCK_N * num_chunks
        row_block = ticket % num_row_blocks
        chunk = num_chunks - 1 - ticket // num_row_blocks
    else:
        row_block = tl.program_id(0).to(tl.int64)
        chunk = 0

    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [BLOCK_N]
    steps = chunk * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)  # [BLOCK_T]
    row_ok = rows < N
    mask = row_ok[:, None] & (steps < T)[None, :]  # [BLOCK_N, BLOCK_T]
    n = rows[:, None]
    t = steps[None, :]
    is_last = t == T - 1

    reward = tl.load(rewards_ptr + n * stride_rn + t * stride_rt, mask=mask, other=0.0)
    value = tl.load(values_ptr + n * stride_vn + t * stride_vt, mask=mask, other=0.0)
    # values[t+1]: mostly the same cache lines as `value`, so DRAM sees the bytes once.
    next_value = tl.load(values_ptr + n * stride_vn + (t + 1) * stride_vt,
                         mask=mask & ~is_last, other=0.0)
    terminated = tl.load(terminateds_ptr + n * stride_dn + t * stride_dt, mask=mask, other=0) != 0
    done = terminated
    if BOOTSTRAP == 2:
        bootstrap = tl.load(bootstrap_ptr + n * stride_bn + t * stride_bt, mask=mask, other=0.0)
        if HAS_TRUNCATEDS:
            truncated = tl.load(truncateds_ptr + n * stride_un + t * stride_ut, mask=mask, other=0) != 0
            done = done | truncated
            next_value = tl.where(truncated | is_last, bootstrap, next_value)
        else:
            next_value = tl.where(is_last, bootstrap, next_value)
    elif BOOTSTRAP == 1:
        last_value = tl.load(last_value_ptr + rows * stride_l, mask=row_ok, other=0.0)  # [BLOCK_N]
        next_value = tl.where(is_last, last_value[:, None], next_value)
    # `where`, not (1 - terminated) * V: the value after a terminal step may be anything, even inf.
    next_value = tl.where(terminated, 0.0, next_value)

    delta = reward + gamma * next_value - value  # [BLOCK_N, BLOCK_T]
    beta = tl.where(done | ~mask, 0.0, gamma_lam)  # padding must not carry anything across
    alpha, beta = tl.associative_scan((delta, beta), 1, _compose, reverse=True)

    if CHUNKED:
        # This chunk's composed map F(x) = agg_alpha + agg_beta * x sits at its first column.
        first = (tl.arange(0, BLOCK_T) == 0)[None, :]
        agg_alpha = tl.sum(tl.where(first, alpha, 0.0), axis=1)  # [BLOCK_N]
        agg_beta = tl.sum(tl.where(first, beta, 0.0), axis=1)
        state = row_block * BLOCK_N * num_chunks + tl.arange(0, BLOCK_N).to(tl.int64) * num_chunks
        if chunk == num_chunks - 1:
            carry = tl.zeros([BLOCK_N], dtype=tl.float32)  # A_T = 0
        else:
            # Publish the map (beta's sign bit doubles as the "ready" flag: beta >= 0 always).
            tl.atomic_xchg(aggregate_ptr + state + chunk, _pack(agg_alpha, _float_bits(agg_beta) | 0x80000000),
                           mask=row_ok, sem="relaxed")
            # Walk later chunks: compose their maps until one knows its start advantage,
            # a done flag cuts the chain (beta == 0), or the row ends.
            acc_alpha = tl.zeros([BLOCK_N], dtype=tl.float32)
            acc_beta = tl.full([BLOCK_N], 1.0, dtype=tl.float32)
            carry = tl.zeros([BLOCK_N], dtype=tl.float32)
            pending = row_ok
            j = tl.full([BLOCK_N], 0, dtype=tl.int64) + chunk + 1
            while tl.max(pending.to(tl.int32), axis=0) > 0:
                inclusive = tl.load(inclusive_ptr + state + j, mask=pending, other=0, volatile=True)
                aggregate = tl.load(aggregate_ptr + state + j, mask=pending, other=0, volatile=True)
                has_inclusive = pending & (inclusive != 0)
                has_aggregate = pending & ~has_inclusive & (aggregate != 0)
                carry = tl.where(has_inclusive, acc_alpha + acc_beta * _unpack_low(inclusive), carry)
                acc_alpha = tl.where(has_aggregate, acc_alpha + acc_beta * _unpack_low(aggregate), acc_alpha)
                acc_beta = tl.where(has_aggregate, acc_beta * _unpack_high(aggregate), acc_beta)
                j = tl.where(has_aggregate, j + 1, j)
                resolved = has_aggregate & ((acc_beta == 0.0) | (j == num_chunks))
                carry = tl.where(resolved, acc_alpha, carry)
                pending = pending & ~has_inclusive & ~resolved
        alpha = alpha + beta * carry[:, None]
        tl.atomic_xchg(inclusive_ptr + state + chunk, _pack(agg_alpha + agg_beta * carry, 1),
                       mask=row_ok, sem="relaxed")

    tl.store(advantages_ptr + n * stride_an + t * stride_at, alpha, mask=mask)
    tl.store(returns_ptr + n * stride_gn + t * stride_gt, alpha + value, mask=mask)


@functools.lru_cache(maxsize=256)
def tile_shape(
    num_envs: int, num_steps: int, time_major: bool, max_block_t: int = MAX_BLOCK_T, tile_elements: int = TILE_ELEMENTS
) -> tuple[int, int]:
    """`(BLOCK_N, BLOCK_T)` for a problem: whole rows per tile where they fit, chunks beyond.

    Time-major tiles keep enough envs side by side for full cache lines; env-major tiles prefer
    long rows (each row is contiguous there).
    """
    envs = triton.next_power_of_2(max(num_envs, 1))
    steps = triton.next_power_of_2(max(num_steps, 1))
    if time_major:
        block_n = min(envs, max(MIN_BLOCK_N_TIME_MAJOR, tile_elements // steps))
        block_t = min(steps, max_block_t, max(tile_elements // block_n, 1))
    else:
        block_t = min(steps, max_block_t, tile_elements)
        block_n = min(envs, max(tile_elements // block_t, 1))
    return block_n, block_t


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
    tile_elements: int = TILE_ELEMENTS,
    num_warps: int = NUM_WARPS,
) -> None:
    """Run the kernel on validated `[N, T]` tensors, writing `advantages` and `returns`.

    `max_block_t` (a power of two) caps the chunk length; tests lower it to exercise the
    chunked path at small sizes. `tile_elements` and `num_warps` are tuning knobs.
    """
    num_envs, num_steps = rewards.shape
    stride_n, stride_t = values.stride()
    block_n, block_t = tile_shape(num_envs, num_steps, stride_t != 1 and stride_n == 1, max_block_t, tile_elements)
    num_chunks = triton.cdiv(num_steps, block_t)
    num_row_blocks = triton.cdiv(num_envs, block_n)
    chunked = num_chunks > 1
    if chunked:
        state = torch.zeros(2 + 2 * num_row_blocks * block_n * num_chunks, dtype=torch.int64, device=values.device)
    else:
        state = values  # unused: CHUNKED is a constexpr
    if bootstrap_values is not None:
        mode, bootstrap = BOOTSTRAP_TENSOR, bootstrap_values
    else:
        mode = BOOTSTRAP_NONE if last_value is None else BOOTSTRAP_LAST_VALUE
        bootstrap = values
    truncated = truncateds if truncateds is not None else terminateds
    lv, stride_l = (last_value, last_value.stride(0)) if last_value is not None else (values, 0)
    _gae_kernel[(num_row_blocks * num_chunks,)](
        rewards, values, terminateds, truncated, bootstrap, lv,
        advantages, returns, state,
        num_envs, num_steps, num_chunks,
        *rewards.stride(), stride_n, stride_t, *terminateds.stride(),
        *truncated.stride(), *bootstrap.stride(), stride_l,
        *advantages.stride(), *returns.stride(),
        gamma, gamma * lam,
        HAS_TRUNCATEDS=truncateds is not None, BOOTSTRAP=mode, CHUNKED=chunked,
        BLOCK_N=block_n, BLOCK_T=block_t, num_warps=num_warps,
    )
