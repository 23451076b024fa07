"""One PPO minibatch step, the whole of it, as two Triton kernels: gather the minibatch's rows, run
the actor and critic MLPs forward, the clipped-surrogate and value losses and their backward pass
by hand (`ppo_gradients_kernel`), then global-norm gradient clipping and Adam (`ppo_adam_kernel`).

Why: CleanRL's schedule takes 320 optimiser steps on 64-sample minibatches per 2,048 samples. Each
step is tiny (~5 MFLOP), so its cost is the count of kernels it launches: ~46 even after
torch.compile and CUDA graphs, ~26 ms of GPU time per update on an H200.
A step's latency, not the GPU's throughput, is what counts, and a chain of dependent matrix
products on one SM decides it. So the gradients kernel runs two programs, the actor's chain (eight
products) and the critic's (five) side by side on two SMs, each holding its activations in
registers; they meet only in the gradient norm, which is why clipping and Adam are a second kernel
(one program per parameter tensor, reading both halves' sums of squares). On an H200: ~29 us per
step with `tf32x3` products (fp32-like), ~16 with `tf32`, ~72 with `ieee`; as one program per step
the same math took ~74, ~50 and ~167.

Scope: the default model only (`ppo.update.fused.unsupported_reason` says exactly which): separate actor
and critic MLPs with two tanh hidden layers, a state-independent log-std, Adam without weight
decay, one process. The math is `ppo.update.ppo_loss` followed by `loss.backward()`,
`clip_grad_norm_` and `torch.optim.Adam.step()`, including torch's gradient at ties of `max` (split
in half) and at the bounds of `clamp` (passed); `tests/test_fused_update.py` checks it against
them.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

LOG_SQRT_2PI = tl.constexpr(0.5 * math.log(2 * math.pi))  # a kernel may read only constexpr globals


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): exact limits at +-inf, ~1e-7 absolute error near 0 (fp32).
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _offsets_t(n_in, n_out, IN_P: tl.constexpr, OUT_P: tl.constexpr):
    """Offsets and mask of an `nn.Linear` weight (`[n_out, n_in]`, row-major) seen transposed, as
    an `[IN_P, OUT_P]` tile: `x @ tile` is the layer."""
    i = tl.arange(0, IN_P)[:, None]
    o = tl.arange(0, OUT_P)[None, :]
    return o * n_in + i, (i < n_in) & (o < n_out)


@triton.jit
def _tf32_split(x):
    """`x` as `hi + lo`, `hi` with fp32's lowest 13 mantissa bits cleared (exactly a TF32 number) and
    `lo` the rest (exact in fp32, ~2^-11 of `x`, itself read by TF32 to ~2^-11 of its own size)."""
    hi = (x.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    # "tf32": tensor cores, the inputs read to 10 mantissa bits (~1e-3 relative error per product, as
    # JAX's default float32 matmul on these GPUs); 4.6x faster per step on an H200 than "ieee", fp32
    # FMAs as torch's default matmul.
    # "tf32x3": three TF32 products of split inputs, hi*lo + lo*hi + hi*hi (lo*lo, ~2^-22, dropped),
    # smallest first: ~1e-6 relative error, fp32's order, on tensor cores. Triton's own "tf32x3"
    # made illegal memory accesses in this kernel on an H200 (triton 3.6), so the split is ours.
    if PRECISION == "tf32x3":
        a_hi, a_lo = _tf32_split(a)
        b_hi, b_lo = _tf32_split(b)
        acc = tl.dot(a_hi, b_lo, input_precision="tf32")
        acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
        return tl.dot(a_hi, b_hi, acc, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _adam(param_ptr, m_ptr, v_ptr, offsets, mask, grad, lr_over_bc1, beta1, beta2, eps, bc2_sqrt):
    """torch.optim.Adam's update of one tensor (no weight decay, no amsgrad), in place."""
    param = tl.load(param_ptr + offsets, mask=mask, other=0.0)
    m = tl.load(m_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_ptr + offsets, mask=mask, other=0.0)
    m = m + (1.0 - beta1) * (grad - m)  # torch's lerp form of beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1.0 - beta2) * grad * grad
    param = param - lr_over_bc1 * m / (tl.sqrt(v) / bc2_sqrt + eps)
    tl.store(param_ptr + offsets, param, mask=mask)
    tl.store(m_ptr + offsets, m, mask=mask)
    tl.store(v_ptr + offsets, v, mask=mask)


@triton.jit
def _max_grad_split(first, second):
    """The share of `max(first, second)`'s gradient that goes to `first`, as torch: 1, 0, or half
    at a tie."""
    return tl.where(first > second, 1.0, tl.where(first == second, 0.5, 0.0))


@triton.jit
def _square_sum(g):
    """Sum of squares of a 2-D tile (padding entries are exact zeros, so they add nothing)."""
    return tl.sum(tl.sum(g * g, axis=1), axis=0)


@triton.jit
def _store_tile(ptr, offsets, mask, value):
    tl.store(ptr + offsets, value, mask=mask)


@triton.jit
def _minibatch(table_ptr, table_stride, order_ptr, batch, OBS: tl.constexpr, BLOCK_B: tl.constexpr,
               OBS_P: tl.constexpr, WEIGHT_COL: tl.constexpr):
    """The minibatch's `batch` rows of the sample table, named by `order_ptr`: each row's address,
    the observations `[BLOCK_B, OBS_P]` and the sample weights (0: a dummy step, or padding)."""
    rows = tl.arange(0, BLOCK_B)
    in_batch = rows < batch
    row_ptr = table_ptr + tl.load(order_ptr + rows, mask=in_batch, other=0).to(tl.int64) * table_stride
    obs_cols = tl.arange(0, OBS_P)
    x = tl.load(row_ptr[:, None] + obs_cols[None, :], mask=in_batch[:, None] & (obs_cols < OBS)[None, :], other=0.0)
    weight = tl.load(row_ptr + WEIGHT_COL, mask=in_batch, other=0.0)
    return row_ptr, in_batch, x, weight


@triton.jit
def _actor_gradients(
    row_ptr, in_batch, x, weight, aw1, ab1, aw2, ab2, aw3, ab3, als, clip_coef, ent_coef,
    OBS: tl.constexpr, ACT: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, OBS_P: tl.constexpr,
    ACT_P: tl.constexpr, H1_P: tl.constexpr, H2_P: tl.constexpr, NORM_ADV: tl.constexpr, DOT: tl.constexpr,
):
    """The actor's forward pass, the clipped-surrogate loss and entropy bonus, and their gradients
    (weights as `[in, out]` tiles), with the step's policy diagnostics in `ppo.update.STAT_NAMES`
    slots (the value loss's slot 0)."""
    act_cols = tl.arange(0, ACT_P)
    is_act = act_cols < ACT
    action = tl.load(row_ptr[:, None] + OBS + act_cols[None, :], mask=in_batch[:, None] & is_act[None, :], other=0.0)
    old_log_prob = tl.load(row_ptr + OBS + ACT, mask=in_batch, other=0.0)
    advantage = tl.load(row_ptr + OBS + ACT + 2, mask=in_batch, other=0.0)
    weight_sum = tl.sum(weight, axis=0)
    total_weight = tl.maximum(weight_sum, 1.0)

    # ---- forward
    off_w1, mask_w1 = _offsets_t(OBS, H1, OBS_P, H1_P)
    off_w2, mask_w2 = _offsets_t(H1, H2, H1_P, H2_P)
    off_w3, mask_w3 = _offsets_t(H2, ACT, H2_P, ACT_P)
    h1_cols = tl.arange(0, H1_P)
    h2_cols = tl.arange(0, H2_P)
    w1 = tl.load(aw1 + off_w1, mask=mask_w1, other=0.0)
    w2 = tl.load(aw2 + off_w2, mask=mask_w2, other=0.0)
    w3 = tl.load(aw3 + off_w3, mask=mask_w3, other=0.0)
    h1 = _tanh(_dot(x, w1, DOT) + tl.load(ab1 + h1_cols, mask=h1_cols < H1, other=0.0)[None, :])
    h2 = _tanh(_dot(h1, w2, DOT) + tl.load(ab2 + h2_cols, mask=h2_cols < H2, other=0.0)[None, :])
    mean = _dot(h2, w3, DOT) + tl.load(ab3 + act_cols, mask=is_act, other=0.0)[None, :]
    log_std = tl.load(als + act_cols, mask=is_act, other=0.0)
    z = tl.where(is_act[None, :], (action - mean) * tl.exp(-log_std)[None, :], 0.0)
    log_prob = tl.sum(tl.where(is_act[None, :], -0.5 * z * z - log_std[None, :] - LOG_SQRT_2PI, 0.0), axis=1)
    entropy = tl.sum(tl.where(is_act, 0.5 + LOG_SQRT_2PI + log_std, 0.0), axis=0)  # the same for every sample

    # ---- the clipped surrogate (a weighted mean over valid samples, as ppo_loss)
    share = weight / total_weight  # d mean(x) / d x
    log_ratio = tl.where(weight > 0, log_prob - old_log_prob, 0.0)
    ratio = tl.exp(log_ratio)
    if NORM_ADV:  # buffers.normalized_advantages: Bessel's std over valid samples, 0 on dummies
        count = tl.maximum(weight_sum, 2.0)
        adv_mean = tl.sum(advantage * weight, axis=0) / count
        centred = (advantage - adv_mean) * weight
        adv_std = tl.sqrt(tl.sum(centred * centred, axis=0) / (count - 1.0))
        advantage = (advantage - adv_mean) / (adv_std + 1e-8) * weight
    low = 1.0 - clip_coef
    high = 1.0 + clip_coef
    surrogate = -advantage * ratio
    clipped_surrogate = -advantage * tl.minimum(tl.maximum(ratio, low), high)
    policy_loss = tl.sum(tl.maximum(surrogate, clipped_surrogate) * weight, axis=0) / total_weight
    to_first = _max_grad_split(surrogate, clipped_surrogate)
    ratio_in_range = tl.where((ratio >= low) & (ratio <= high), 1.0, 0.0)
    d_ratio = share * -advantage * (to_first + (1.0 - to_first) * ratio_in_range)
    d_log_prob = tl.where(weight > 0, d_ratio * ratio, 0.0)

    # ---- backward (d log_prob / d mean = z / std; d / d log_std = z^2 - 1)
    d_mean = d_log_prob[:, None] * z * tl.exp(-log_std)[None, :]  # 0 off the action columns, where z is
    g_ls = tl.sum(d_log_prob[:, None] * (z * z - 1.0), axis=0) - ent_coef * weight_sum / total_weight
    g_ls = tl.where(is_act, g_ls, 0.0)
    g_w3 = _dot(tl.trans(h2), d_mean, DOT)
    g_b3 = tl.sum(d_mean, axis=0)
    d_pre2 = _dot(d_mean, tl.trans(w3), DOT) * (1.0 - h2 * h2)
    g_w2 = _dot(tl.trans(h1), d_pre2, DOT)
    g_b2 = tl.sum(d_pre2, axis=0)
    d_pre1 = _dot(d_pre2, tl.trans(w2), DOT) * (1.0 - h1 * h1)
    g_w1 = _dot(tl.trans(x), d_pre1, DOT)
    g_b1 = tl.sum(d_pre1, axis=0)

    # ---- diagnostics, in STAT_NAMES slots
    approx_kl = tl.sum(((ratio - 1.0) - log_ratio) * weight, axis=0) / total_weight
    clipfrac = tl.sum(tl.where(tl.abs(ratio - 1.0) > clip_coef, 1.0, 0.0) * weight, axis=0) / total_weight
    old_approx_kl = tl.sum(-log_ratio * weight, axis=0) / total_weight
    entropy_mean = entropy * weight_sum / total_weight
    slot = tl.arange(0, 8)
    stats = tl.where(slot == 0, policy_loss, tl.where(slot == 2, entropy_mean, tl.where(slot == 3, approx_kl,
            tl.where(slot == 4, clipfrac, tl.where(slot == 5, old_approx_kl, 0.0)))))
    return g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, g_ls, stats


@triton.jit
def _critic_gradients(
    row_ptr, in_batch, x, weight, cw1, cb1, cw2, cb2, cw3, cb3, clip_coef, vf_coef,
    OBS: tl.constexpr, ACT: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, OBS_P: tl.constexpr,
    H1_P: tl.constexpr, H2_P: tl.constexpr, CLIP_VLOSS: tl.constexpr, DOT: tl.constexpr,
):
    """The critic's forward pass, the (clipped) value loss and its gradients (weights as `[in, out]`
    tiles, the output layer's as a vector), with the value loss in its `STAT_NAMES` slot."""
    old_value = tl.load(row_ptr + OBS + ACT + 1, mask=in_batch, other=0.0)
    returns = tl.load(row_ptr + OBS + ACT + 3, mask=in_batch, other=0.0)
    total_weight = tl.maximum(tl.sum(weight, axis=0), 1.0)
    share = weight / total_weight

    off_w1, mask_w1 = _offsets_t(OBS, H1, OBS_P, H1_P)
    off_w2, mask_w2 = _offsets_t(H1, H2, H1_P, H2_P)
    h1_cols = tl.arange(0, H1_P)
    h2_cols = tl.arange(0, H2_P)
    w1 = tl.load(cw1 + off_w1, mask=mask_w1, other=0.0)
    w2 = tl.load(cw2 + off_w2, mask=mask_w2, other=0.0)
    w3 = tl.load(cw3 + h2_cols, mask=h2_cols < H2, other=0.0)
    h1 = _tanh(_dot(x, w1, DOT) + tl.load(cb1 + h1_cols, mask=h1_cols < H1, other=0.0)[None, :])
    h2 = _tanh(_dot(h1, w2, DOT) + tl.load(cb2 + h2_cols, mask=h2_cols < H2, other=0.0)[None, :])
    value = tl.sum(h2 * w3[None, :], axis=1) + tl.load(cb3)

    error = value - returns
    if CLIP_VLOSS:
        step = value - old_value
        clipped_error = old_value + tl.minimum(tl.maximum(step, -clip_coef), clip_coef) - returns
        squared, clipped_squared = error * error, clipped_error * clipped_error
        value_loss = 0.5 * tl.sum(tl.maximum(squared, clipped_squared) * weight, axis=0) / total_weight
        to_first = _max_grad_split(squared, clipped_squared)
        step_in_range = tl.where((step >= -clip_coef) & (step <= clip_coef), 1.0, 0.0)
        d_value = share * (to_first * error + (1.0 - to_first) * clipped_error * step_in_range)
    else:
        value_loss = 0.5 * tl.sum(error * error * weight, axis=0) / total_weight
        d_value = share * error
    d_value = vf_coef * d_value

    g_w3 = tl.sum(d_value[:, None] * h2, axis=0)
    g_b3 = tl.sum(d_value, axis=0)
    d_pre2 = d_value[:, None] * w3[None, :] * (1.0 - h2 * h2)
    g_w2 = _dot(tl.trans(h1), d_pre2, DOT)
    g_b2 = tl.sum(d_pre2, axis=0)
    d_pre1 = _dot(d_pre2, tl.trans(w2), DOT) * (1.0 - h1 * h1)
    g_w1 = _dot(tl.trans(x), d_pre1, DOT)
    g_b1 = tl.sum(d_pre1, axis=0)
    slot = tl.arange(0, 8)
    return g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, tl.where(slot == 1, value_loss, 0.0)


@triton.jit
def _record_stats(stats_ptr, total_ptr, stats, SLOTS: tl.constexpr):
    """Writes the step's diagnostics in the slots `SLOTS` (a bit mask of STAT_NAMES indices) and
    adds them to the update's running total."""
    slot = tl.arange(0, 8)
    mine = ((tl.full([8], SLOTS, tl.int32) >> slot) & 1) == 1
    tl.store(stats_ptr + slot, stats, mask=mine)
    tl.store(total_ptr + slot, tl.load(total_ptr + slot, mask=mine, other=0.0) + stats, mask=mine)


ACTOR_SLOTS = tl.constexpr(0b111101)  # STAT_NAMES but value_loss
CRITIC_SLOTS = tl.constexpr(0b000010)


@triton.jit
def ppo_gradients_kernel(
    table_ptr, table_stride, order_ptr, batch,
    # actor: W1 [H1, OBS], b1, W2 [H2, H1], b2, W3 [ACT, H2], b3, log-std [ACT]; critic: W1, b1, W2, b2, W3 [1, H2], b3
    aw1, ab1, aw2, ab2, aw3, ab3, als, cw1, cb1, cw2, cb2, cw3, cb3,
    g_aw1, g_ab1, g_aw2, g_ab2, g_aw3, g_ab3, g_als, g_cw1, g_cb1, g_cw2, g_cb2, g_cw3, g_cb3,
    square_sums_ptr, total_ptr, stats_ptr, clip_coef, vf_coef, ent_coef,
    OBS: tl.constexpr, ACT: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr,
    BLOCK_B: tl.constexpr, OBS_P: tl.constexpr, ACT_P: tl.constexpr, H1_P: tl.constexpr, H2_P: tl.constexpr,
    CLIP_VLOSS: tl.constexpr, NORM_ADV: tl.constexpr, DOT: tl.constexpr,
):
    """First half of a step, two programs: program 0 the actor's gradients, program 1 the critic's
    (independent until clipping: each chain of dependent matrix products runs on its own SM). Each
    writes its gradients (`g_*`, shaped as the parameters), its sum of squared gradients
    (`square_sums_ptr[pid]`) and its diagnostics."""
    row_ptr, in_batch, x, weight = _minibatch(table_ptr, table_stride, order_ptr, batch, OBS, BLOCK_B, OBS_P,
                                              OBS + ACT + 4)
    off_w1, mask_w1 = _offsets_t(OBS, H1, OBS_P, H1_P)
    off_w2, mask_w2 = _offsets_t(H1, H2, H1_P, H2_P)
    h1_cols = tl.arange(0, H1_P)
    h2_cols = tl.arange(0, H2_P)
    if tl.program_id(0) == 0:
        ga_w1, ga_b1, ga_w2, ga_b2, ga_w3, ga_b3, ga_ls, ga_stats = _actor_gradients(
            row_ptr, in_batch, x, weight, aw1, ab1, aw2, ab2, aw3, ab3, als, clip_coef, ent_coef,
            OBS, ACT, H1, H2, OBS_P, ACT_P, H1_P, H2_P, NORM_ADV, DOT)
        off_w3, mask_w3 = _offsets_t(H2, ACT, H2_P, ACT_P)
        act_cols = tl.arange(0, ACT_P)
        _store_tile(g_aw1, off_w1, mask_w1, ga_w1)
        _store_tile(g_ab1, h1_cols, h1_cols < H1, ga_b1)
        _store_tile(g_aw2, off_w2, mask_w2, ga_w2)
        _store_tile(g_ab2, h2_cols, h2_cols < H2, ga_b2)
        _store_tile(g_aw3, off_w3, mask_w3, ga_w3)
        _store_tile(g_ab3, act_cols, act_cols < ACT, ga_b3)
        _store_tile(g_als, act_cols, act_cols < ACT, ga_ls)
        tl.store(square_sums_ptr, _square_sum(ga_w1) + tl.sum(ga_b1 * ga_b1, axis=0) + _square_sum(ga_w2)
                 + tl.sum(ga_b2 * ga_b2, axis=0) + _square_sum(ga_w3) + tl.sum(ga_b3 * ga_b3, axis=0)
                 + tl.sum(ga_ls * ga_ls, axis=0))
        _record_stats(stats_ptr, total_ptr, ga_stats, ACTOR_SLOTS)
    else:
        gc_w1, gc_b1, gc_w2, gc_b2, gc_w3, gc_b3, gc_stats = _critic_gradients(
            row_ptr, in_batch, x, weight, cw1, cb1, cw2, cb2, cw3, cb3, clip_coef, vf_coef,
            OBS, ACT, H1, H2, OBS_P, H1_P, H2_P, CLIP_VLOSS, DOT)
        _store_tile(g_cw1, off_w1, mask_w1, gc_w1)
        _store_tile(g_cb1, h1_cols, h1_cols < H1, gc_b1)
        _store_tile(g_cw2, off_w2, mask_w2, gc_w2)
        _store_tile(g_cb2, h2_cols, h2_cols < H2, gc_b2)
        _store_tile(g_cw3, h2_cols, h2_cols < H2, gc_w3)
        tl.store(g_cb3, gc_b3)
        tl.store(square_sums_ptr + 1, _square_sum(gc_w1) + tl.sum(gc_b1 * gc_b1, axis=0) + _square_sum(gc_w2)
                 + tl.sum(gc_b2 * gc_b2, axis=0) + tl.sum(gc_w3 * gc_w3, axis=0) + gc_b3 * gc_b3)
        _record_stats(stats_ptr, total_ptr, gc_stats, CRITIC_SLOTS)


@triton.jit
def _adam_if(pid, index: tl.constexpr, param_ptr, m_ptr, v_ptr, g_ptr, numel, scale, lr_over_bc1, beta1, beta2,
             eps, bc2_sqrt, BLOCK: tl.constexpr):
    if pid == index:
        offsets = tl.arange(0, BLOCK)
        mask = offsets < numel
        grad = tl.load(g_ptr + offsets, mask=mask, other=0.0) * scale
        _adam(param_ptr, m_ptr, v_ptr, offsets, mask, grad, lr_over_bc1, beta1, beta2, eps, bc2_sqrt)


@triton.jit
def ppo_adam_kernel(
    aw1, ab1, aw2, ab2, aw3, ab3, als, cw1, cb1, cw2, cb2, cw3, cb3,
    m_aw1, m_ab1, m_aw2, m_ab2, m_aw3, m_ab3, m_als, m_cw1, m_cb1, m_cw2, m_cb2, m_cw3, m_cb3,
    v_aw1, v_ab1, v_aw2, v_ab2, v_aw3, v_ab3, v_als, v_cw1, v_cb1, v_cw2, v_cb2, v_cw3, v_cb3,
    g_aw1, g_ab1, g_aw2, g_ab2, g_aw3, g_ab3, g_als, g_cw1, g_cb1, g_cw2, g_cb2, g_cw3, g_cb3,
    square_sums_ptr, steps_ptr, lr_ptr, max_grad_norm, beta1, beta2, eps,
    OBS: tl.constexpr, ACT: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr,
    OBS_P: tl.constexpr, ACT_P: tl.constexpr, H1_P: tl.constexpr, H2_P: tl.constexpr,
):
    """Second half of a step, one program per parameter tensor (13): `clip_grad_norm_` by both
    halves' sums of squares, then `torch.optim.Adam.step()` on that tensor and its step count."""
    pid = tl.program_id(0)
    # Each program reads its own step count (one per tensor, advanced here), so no program sees
    # another's write. The thirteen branches below are one per tensor because a Triton program
    # cannot pick a pointer out of a list by its id.
    square_sum = tl.load(square_sums_ptr) + tl.load(square_sums_ptr + 1)
    scale = tl.minimum(max_grad_norm / (tl.sqrt(square_sum) + 1e-6), 1.0)
    step_count = tl.load(steps_ptr + pid) + 1.0
    tl.store(steps_ptr + pid, step_count)
    lr_over_bc1 = tl.load(lr_ptr) / (1.0 - tl.exp(step_count * tl.log(beta1)))
    bc2_sqrt = tl.sqrt(1.0 - tl.exp(step_count * tl.log(beta2)))
    _adam_if(pid, 0, aw1, m_aw1, v_aw1, g_aw1, H1 * OBS, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt,
             H1_P * OBS_P)
    _adam_if(pid, 1, ab1, m_ab1, v_ab1, g_ab1, H1, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, H1_P)
    _adam_if(pid, 2, aw2, m_aw2, v_aw2, g_aw2, H2 * H1, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt,
             H2_P * H1_P)
    _adam_if(pid, 3, ab2, m_ab2, v_ab2, g_ab2, H2, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, H2_P)
    _adam_if(pid, 4, aw3, m_aw3, v_aw3, g_aw3, ACT * H2, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt,
             ACT_P * H2_P)
    _adam_if(pid, 5, ab3, m_ab3, v_ab3, g_ab3, ACT, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, ACT_P)
    _adam_if(pid, 6, als, m_als, v_als, g_als, ACT, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, ACT_P)
    _adam_if(pid, 7, cw1, m_cw1, v_cw1, g_cw1, H1 * OBS, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt,
             H1_P * OBS_P)
    _adam_if(pid, 8, cb1, m_cb1, v_cb1, g_cb1, H1, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, H1_P)
    _adam_if(pid, 9, cw2, m_cw2, v_cw2, g_cw2, H2 * H1, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt,
             H2_P * H1_P)
    _adam_if(pid, 10, cb2, m_cb2, v_cb2, g_cb2, H2, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, H2_P)
    _adam_if(pid, 11, cw3, m_cw3, v_cw3, g_cw3, H2, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, H2_P)
    _adam_if(pid, 12, cb3, m_cb3, v_cb3, g_cb3, 1, scale, lr_over_bc1, beta1, beta2, eps, bc2_sqrt, 2)
