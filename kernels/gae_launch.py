"""Running a planned GAE launch: straight into the compiled kernel, as a replayed CUDA graph when a
call repeats, with the look-back state reused from call to call.

A training loop calls `compute_gae` with the same buffers every iteration, and on a slow host an empty
Triton launch alone costs ~10 us, so the host side is built to add little to it (`kernels/README.md`,
"Launching"). `gae_plan` decides what to launch; `gae_kernel` is the device code.
"""

from __future__ import annotations

import functools
import operator
import os
import threading
import warnings

import torch
import triton

from kernels.gae_kernel import CONSTEXPR_NAMES, gae_kernel
from kernels.gae_plan import plan_launch

# Set before import, TRITON_INTERPRET=1 runs every kernel in Triton's interpreter (kernels.gae then sends
# CPU tensors here too).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class _StateBuffer:
    """One device buffer for the look-back, and the epoch of its last call."""

    def __init__(self, words: int, device: torch.device):
        self.tensor = torch.zeros(words, dtype=torch.int64, device=device)
        self.epoch = 0


# Look-back state by (device, stream). A call's words carry its epoch, so nothing is zeroed
# between calls. Kernels on one stream run in launch order, so a buffer is never used by two at
# once. The epoch stays below 2**29, so that it fits above a word's float and status (gae_kernel.STATUS_MAP):
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


# Compiled kernels by launch signature: the constexprs, warps, flag dtypes and every integer
# argument as is (but the epoch, which is never specialised). With all pointers
# 16-byte aligned that fixes everything Triton specialises the kernel on (pointer dtypes and
# alignment; each integer's divisibility by 16 or equality to 1), so a call with a known key skips
# Triton's generic launch path, which binds and re-specialises every argument (about 0.7 us each
# on a slow host). A new shape takes the generic path once.
_compiled: dict[tuple, object] = {}
_MAX_COMPILED = 1024
_knobs = getattr(triton, "knobs", None)  # Triton >= 3.4 (pyproject.toml asks 3.5); else the generic path


def _active(hook):
    """`hook`, or None when it would do nothing (Triton >= 3.5 installs empty hook chains)."""
    return None if hook is None or getattr(hook, "calls", None) == [] else hook


# CUDA graphs of repeated launches (`GaeLaunch._replay_or_capture`): on unless RL_TRITON_CUDA_GRAPHS=0,
# read once at import. Each launch keeps a few, one per set of data pointers and scalars it was
# called with twice in a row; a training loop's buffer needs one.
CUDA_GRAPHS_ENV = "RL_TRITON_CUDA_GRAPHS"
_CUDA_GRAPHS = os.environ.get(CUDA_GRAPHS_ENV, "1") not in ("", "0")
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


class GaeLaunch:
    """One launch of the kernel, planned from the tensors' metadata alone (`gae_plan.plan_launch`).
    `compute_gae` keeps one per validated signature (shapes, strides, dtypes, devices), so a training
    loop plans once and every later call only reads data pointers.

    `options` override the plan's choices (`plan_launch`'s arguments; tests and benchmark sweeps).
    `nvidia=True` plans as if for an NVIDIA GPU whatever the tensors' device (`scripts/dev/compile_kernels.py`
    compiles those launches on a machine without one). `graphs` (default: on CUDA, unless
    `RL_TRITON_CUDA_GRAPHS=0`): a call repeated with the same data pointers, `gamma` and `lam`, as a
    training loop's is, replays a CUDA graph of its launch instead of launching (`_replay_or_capture`).
    """

    def __init__(self, tensors: tuple, graphs: bool | None = None, nvidia: bool | None = None, **options):
        rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns = tensors
        num_envs, num_steps = values.shape
        self.device = values.device
        # Compiled for an NVIDIA GPU (not Triton's interpreter, not ROCm, whose torch also says "cuda"):
        # only such a kernel can run inline PTX.
        if nvidia is None:
            nvidia = self.device.type == "cuda" and not INTERPRET and torch.version.hip is None
        plan = plan_launch(tensors, self.device, nvidia, **options)
        self.grid, self.num_warps, self.maxnreg, self.pdl = plan.grid, plan.num_warps, plan.maxnreg, plan.pdl
        self.chunked, self.state_words, self.constexprs = plan.chunked, plan.state_words, plan.constexprs
        # Which of the call's eight tensors fills each of the kernel's first eight pointer slots:
        # absent optional tensors are stood in for by one the kernel will not read (their constexpr
        # mode says so), so every slot holds a valid pointer.
        self.slots = (0, 1, 2, 2 if truncateds is None else 3, 1 if bootstrap_values is None else 4,
                      1 if last_value is None else 5, 6, 7)
        truncated = truncateds if truncateds is not None else terminateds
        bootstrap = bootstrap_values if bootstrap_values is not None else values
        lv = last_value if last_value is not None else values
        self.ints = (num_envs, num_steps, plan.num_chunks, *rewards.stride(), *values.stride(), *terminateds.stride(),
                     *truncated.stride(), *bootstrap.stride(), lv.stride(0), *advantages.stride(), *returns.stride())
        # With all pointers 16-byte aligned, this key fixes everything Triton specialises the kernel
        # on (see `_compiled`).
        self.key = (self.device, self.num_warps, self.maxnreg, self.constexprs, terminateds.dtype, truncated.dtype,
                    self.ints)
        self.kernel = None  # the compiled kernel, once known
        # A chunked launch's graphs alternate two epochs over a look-back state of their own (see
        # `_capture`). That needs every word a walk can read rewritten by every call, which tests that
        # withhold start advantages (`inclusive_every > 1`) break: those launch eagerly.
        if graphs is None:
            graphs = _CUDA_GRAPHS
        graphs = graphs and self.device.type == "cuda" and _knobs is not None
        inclusive_every = self.constexprs[CONSTEXPR_NAMES.index("INCLUSIVE_EVERY")]
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

        On an H200 host a graph replay costs the host about 2.3 us against about 7 us for the direct
        launch. The replay reads the tensors' memory as it is now and
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
        constexpr_kwargs = dict(zip(CONSTEXPR_NAMES, self.constexprs, strict=True))
        if self.device.type != "cuda":  # Triton's CPU interpreter
            gae_kernel[(self.grid,)](*kernel_tensors, *self.ints, *floats, **constexpr_kwargs,
                                      num_warps=self.num_warps)
            return
        if self.maxnreg is not None:
            constexpr_kwargs["maxnreg"] = self.maxnreg
        if self.pdl:
            constexpr_kwargs["launch_pdl"] = True
        with torch.cuda.device(self.device):
            kernel = gae_kernel[(self.grid,)](*kernel_tensors, *self.ints, *floats, **constexpr_kwargs,
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
    `options` are `GaeLaunch`'s (tests and benchmark sweeps)."""
    tensors = (rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns)
    pointers = [0 if x is None else x.data_ptr() for x in tensors]
    GaeLaunch(tensors, **options)(tensors, pointers, gamma, lam)
