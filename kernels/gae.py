"""`compute_gae`: the public entry point. Validates arguments, then dispatches by device.

CUDA tensors run the Triton kernel; CPU tensors run the pure-torch reference, or the Triton
kernel under Triton's interpreter when `TRITON_INTERPRET=1` was set before import (that is how
CI tests the kernel without a GPU). Both decisions, and the argument checks, are made once per
call signature (see `_runs`): a training loop's repeated calls pay only for a lookup, the scalar
checks and the launch. The semantics are documented in `kernels/README.md`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch

from kernels.reference import gae_reference

try:  # Triton is optional on the CPU path (it is not installable everywhere).
    from kernels.gae_launch import INTERPRET as _INTERPRET
    from kernels.gae_launch import GaeLaunch
except ImportError:  # pragma: no cover - exercised only where triton is missing
    GaeLaunch, _INTERPRET = None, False

CORRECTNESS_CHECKS_ENV = "RL_TRITON_CORRECTNESS_WARNINGS"
FLAG_DTYPES = (torch.bool, torch.uint8, torch.float32, torch.float64)
# Read once, at import: a per-call environment lookup costs as much as a kernel launch's share.
_CORRECTNESS_CHECKS = os.environ.get(CORRECTNESS_CHECKS_ENV, "0") not in ("", "0")


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    *,
    gamma: float = 0.99,
    lam: float = 0.95,
    bootstrap_values: torch.Tensor | None = None,
    last_value: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over `[num_envs, seq_len]` rollouts.

    Args:
        rewards: `[N, T]` float, the reward of step t.
        values: `[N, T]` float32 (float64 on CPU), `V(s_t)`.
        terminateds: `[N, T]` bool/uint8/float, the episode ended in a terminal state at step t.
        truncateds: `[N, T]` bool/uint8/float, the episode was cut (time limit) at step t.
            Needs `bootstrap_values`. Mutually exclusive with `terminateds` at a step.
        gamma, lam: discount and GAE lambda, each in [0, 1].
        bootstrap_values: `[N, T]` same dtype as `values`, the true `V(s_{t+1})` at truncated
            steps and at the last column; zero elsewhere.
        last_value: `[N]`, `V(s_T)`: shorthand for `bootstrap_values[:, -1]` when there are no
            interior truncations. With neither this nor `bootstrap_values`, `V(s_T) = 0`.
        advantages, returns: optional `[N, T]` outputs (dtype of `values`, any strides), written
            in place. Neither may share a byte with an input, the other output or itself.

    Any strides work: a time-major `[T, N]` buffer passed as `buf.rewards.T` is read in place.
    Returns `(advantages, returns)`, with `A_T = 0` and `returns = advantages + values`.
    Raises `TypeError`/`ValueError` naming the offending argument.
    """
    if (advantages is None or returns is None) and isinstance(values, torch.Tensor):
        # empty_like keeps a time-major layout time-major. A `values` that is not a tensor fails
        # the checks below, which say so.
        advantages = torch.empty_like(values) if advantages is None else advantages
        returns = torch.empty_like(values) if returns is None else returns
    tensors = (rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns)
    signature, entry = _lookup(tensors)
    plain_scalars = type(gamma) is float and type(lam) is float and 0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0
    if entry is None or not plain_scalars:
        gamma, lam = _check_thoroughly(tensors, gamma, lam)
        if entry is None:
            entry = (_plan(tensors), _spans(tensors), set())
            if signature is not None:
                if len(_runs) >= _MAX_RUNS:
                    _runs.clear()
                _runs[signature] = entry
    run, spans, apart = entry
    if run is _nothing:  # no elements
        return advantages, returns
    # What the signature cannot say: whether an output overlaps an input or the other output (a
    # kernel reading values[t+1] after another program wrote there would be silently wrong). The
    # address ranges decide it for separate tensors, an exact check for views of one storage; a
    # training loop's buffers pass once, then are found among the addresses known to be apart.
    pointers = [0 if x is None else x.data_ptr() for x in tensors]
    addresses = tuple(pointers)
    if addresses not in apart:
        if _ranges_meet(pointers, spans):
            _check_outputs_apart(tensors)
        if len(apart) >= _MAX_RUNS:
            apart.clear()
        apart.add(addresses)
    if _CORRECTNESS_CHECKS:
        check_flags_and_bootstrap(terminateds, truncateds, bootstrap_values)
    run(tensors, pointers, gamma, lam)
    return advantages, returns


# What runs each validated call signature (every tensor's dtype, shape, strides and device, None
# for an absent one), each tensor's span in bytes, and the sets of addresses found apart with it.
# Those fix all that the checks of `_check_thoroughly` look at except the scalars and the
# addresses, which every call checks, so a call with a known signature skips them; they cost about
# as much as the kernel launch itself. For the Triton path the run is also the launch's plan
# (`GaeLaunch`), so a training loop plans once.
_runs: dict[tuple, tuple[Callable, list[int], set[tuple]]] = {}
_MAX_RUNS = 1024
NAMES = ("rewards", "values", "terminateds", "truncateds", "bootstrap_values", "last_value", "advantages", "returns")


def _spans(tensors: tuple) -> list[int]:
    """Bytes from each tensor's first element to the end of its last (0 for an absent one)."""
    return [0 if x is None else x.element_size() * (1 + sum(st * (n - 1) for n, st in _dims(x))) for x in tensors]


def _dims(x: torch.Tensor) -> zip:
    """`(size, stride)` of each dimension of `x`."""
    return zip(x.shape, x.stride(), strict=True)


def _ranges_meet(pointers: list[int], spans: list[int]) -> bool:
    """Whether either output's address range meets another tensor's."""
    adv, ret = pointers[6], pointers[7]
    adv_end, ret_end = adv + spans[6], ret + spans[7]
    if adv < ret_end and ret < adv_end:
        return True
    for at, span in zip(pointers[:6], spans[:6], strict=True):
        if span and ((at < adv_end and adv < at + span) or (at < ret_end and ret < at + span)):
            return True
    return False


def _check_outputs_apart(tensors: tuple) -> None:
    """Raise `ValueError` naming the first output that shares a byte with an input or the other
    output. Exact (every element's bytes), so it runs only where address ranges meet."""
    advantages = _bytes(tensors[6])
    for name, out in (("advantages", advantages), ("returns", _bytes(tensors[7]))):
        for other, x in zip(NAMES[:6], tensors[:6], strict=True):
            if x is not None and torch.isin(out, _bytes(x)).any():
                raise ValueError(
                    f"compute_gae: `{name}` must not share memory with an input; it overlaps `{other}`")
    if torch.isin(advantages, _bytes(tensors[7])).any():
        raise ValueError("compute_gae: `advantages` and `returns` must not share memory; they overlap")


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """The address of every byte of `x`'s elements, on the CPU (computed from its strides, not read)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in _dims(x):
        offsets = offsets[..., None] + torch.arange(size, dtype=torch.int64) * stride
    size = x.element_size()
    return (x.data_ptr() + offsets.reshape(-1, 1) * size + torch.arange(size, dtype=torch.int64)).reshape(-1)


def _lookup(tensors: tuple) -> tuple[tuple | None, tuple[Callable, list[int], set[tuple]] | None]:
    """`(signature, its entry in `_runs`)`: the entry is None for a signature not seen yet, and the
    signature is None when an argument is not a tensor (the checks then say which)."""
    try:
        signature = tuple([None if x is None else (x.dtype, x.shape, x.stride(), x.device) for x in tensors])
        return signature, _runs.get(signature)
    except (AttributeError, TypeError):  # no such attribute, or an unhashable stand-in
        return None, None


def _plan(tensors: tuple) -> Callable:
    """What runs validated `tensors`: the Triton kernel (CUDA, or the interpreter), the reference or nothing."""
    values = tensors[1]
    if values.numel() == 0:
        return _nothing
    if values.is_cuda or (_INTERPRET and values.dtype == torch.float32):
        if GaeLaunch is None:
            raise RuntimeError("compute_gae: CUDA tensors need Triton, which is not installed")
        return GaeLaunch(tensors)
    return _reference


def _reference(tensors: tuple, pointers: list[int], gamma: float, lam: float) -> None:
    gae_reference(*tensors[:6], gamma, lam, *tensors[6:])


def _nothing(tensors: tuple, pointers: list[int], gamma: float, lam: float) -> None:
    pass


def check_flags_and_bootstrap(
    terminateds: torch.Tensor, truncateds: torch.Tensor | None, bootstrap_values: torch.Tensor | None
) -> None:
    """Raise `ValueError` at the first step that is both terminated and truncated, or that has a
    nonzero bootstrap value away from a truncation and the last column. Syncs with the device."""
    terminated = terminateds != 0
    truncated = truncateds != 0 if truncateds is not None else torch.zeros_like(terminated)
    both = terminated & truncated
    if bool(both.any()):
        env, step = (int(i) for i in both.nonzero()[0])
        raise ValueError(f"compute_gae: env {env}, step {step} is both terminated and truncated")
    if bootstrap_values is not None:
        stray = (bootstrap_values != 0) & ~truncated
        stray[:, -1] = False
        if bool(stray.any()):
            env, step = (int(i) for i in stray.nonzero()[0])
            raise ValueError(
                f"compute_gae: `bootstrap_values` is nonzero ({float(bootstrap_values[env, step])}) at env {env}, "
                f"step {step}, which is neither truncated nor the last column"
            )


def _check_thoroughly(tensors: tuple, gamma: object, lam: object) -> tuple[float, float]:
    """Every check, run for a new signature or unusual scalars: say what the problem is, or return
    `gamma` and `lam` as floats when there is none (an int or numpy `gamma` takes this path)."""
    rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns = tensors
    _check_tensor("values", values)
    if values.device.type not in ("cpu", "cuda"):
        raise ValueError(f"compute_gae: runs on CPU and CUDA tensors; `values` is on {values.device}")
    if values.dim() != 2:
        raise ValueError(f"compute_gae: `values` must be 2-D [num_envs, seq_len], got shape {tuple(values.shape)}")
    shape, device, dtype = values.shape, values.device, values.dtype
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"compute_gae: `values` must be float32 (or float64 on CPU), got {dtype}")
    if dtype == torch.float64 and device.type != "cpu":
        raise TypeError(f"compute_gae: float64 is supported on the CPU path only; `values` is float64 on {device}")
    _check_like("rewards", rewards, shape, device, dtype)
    _check_like("terminateds", terminateds, shape, device, None)
    if truncateds is not None:
        _check_like("truncateds", truncateds, shape, device, None)
        if bootstrap_values is None:
            raise ValueError(
                "compute_gae: `truncateds` needs `bootstrap_values` (the true V(s_{t+1}) at truncated steps); "
                "without it the continuation value there would silently be 0"
            )
    if bootstrap_values is not None:
        if last_value is not None:
            raise ValueError(
                "compute_gae: pass either `last_value` or `bootstrap_values`, not both "
                "(`last_value` stands for `bootstrap_values[:, -1]`)"
            )
        _check_like("bootstrap_values", bootstrap_values, shape, device, dtype)
    if last_value is not None:
        _check_like("last_value", last_value, shape[:1], device, dtype)
    gamma = _check_unit_interval("gamma", gamma)
    lam = _check_unit_interval("lam", lam)
    for name, out in (("advantages", advantages), ("returns", returns)):
        if out is None:
            continue
        _check_like(name, out, shape, device, dtype)
        if 0 in out.stride() and out.numel() > 1:
            raise ValueError(f"compute_gae: `{name}` has a zero stride (an expanded view); it must own its elements")
        if not _elements_apart(out):
            raise ValueError(
                f"compute_gae: `{name}` overlaps itself (strides {out.stride()} for shape {tuple(out.shape)}); "
                "it must own its elements, as torch.empty_like(values) does"
            )
    return gamma, lam


def _elements_apart(x: torch.Tensor) -> bool:
    """Whether no two elements of `x` share memory, proved from its strides: each dimension of
    more than one element must step past everything the dimensions of smaller stride span. (A
    layout that interleaves its rows without overlapping fails this too, and is refused.)"""
    spanned = 0
    for stride, size in sorted((st, n) for n, st in _dims(x) if n > 1):
        if stride <= spanned:
            return False
        spanned += stride * (size - 1)
    return True


def _check_tensor(name: str, x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"compute_gae: `{name}` must be a torch.Tensor, got {type(x).__name__}")


def _check_like(name: str, x: object, shape: torch.Size, device: torch.device, dtype: torch.dtype | None) -> None:
    """`x` must have `shape` and `device`, and `dtype` (or a flag dtype when `dtype` is None)."""
    _check_tensor(name, x)
    if x.shape != shape:
        expected = "[num_envs]" if len(shape) == 1 else "[num_envs, seq_len]"
        raise ValueError(f"compute_gae: `{name}` must have shape {tuple(shape)} {expected}, got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"compute_gae: `{name}` is on {x.device} but `values` is on {device}")
    if dtype is None:
        if x.dtype not in FLAG_DTYPES:
            raise TypeError(f"compute_gae: `{name}` must be bool, uint8, float32 or float64, got {x.dtype}")
    elif x.dtype != dtype:
        raise TypeError(f"compute_gae: `{name}` must have the dtype of `values` ({dtype}), got {x.dtype}")


def _check_unit_interval(name: str, x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):  # numpy floats are floats
        raise TypeError(f"compute_gae: `{name}` must be a float in [0, 1], got {type(x).__name__}")
    if not (0.0 <= x <= 1.0) or math.isnan(x):
        raise ValueError(f"compute_gae: `{name}` must be in [0, 1], got {x}")
    return float(x)
