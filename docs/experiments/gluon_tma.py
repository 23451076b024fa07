"""Experiment (session 37, not adopted): the time-major 16-env tile with its loads through TMA
instead of the SM's load path. Right on the H200; as fast as the Triton kernel without a walk,
9-47% slower with one (docs/benchmarks.md, session 37, "Tile loads through TMA").

Session 34 timed a walk's read of L2 at 1.7-3.5 us under full traffic, about what the loads already
in flight from the programs on the same SM take to arrive. If that read waits in the SM's own load
path behind those loads, tile loads that leave through the tensor memory accelerator (its own path
to L2) let it skip the queue; if it waits at L2, nothing changes. This kernel is the Triton kernel's
16x256 time-major tile (one chunk a program, chunks taken from the end of time, the same one-word
look-back state) with its loads changed: one thread asks TMA for the tile of each input into shared
memory, all against one mbarrier; the four quarters are then read from shared memory. Shared-memory
views cannot shift by one step, so it scans B_t = gamma V_t + gamma lam A_t, whose step maps need
no V(s_{t+1}) (see the kernel). `CONFIGS` picks warps, the walk (1: the Triton kernel's, 2:
`gluon_parked.py`'s window scan, 0: none, wrong answers, a bound) and a register cap.

    python docs/experiments/gluon_tma.py            # on a CUDA GPU: check against float64, then time
    python docs/experiments/gluon_tma.py --compile  # without one: compile for sm_90, print registers

Time-major rollouts of exactly 16 envs whose steps divide into 256, bool flags, bootstrap values,
float32.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gluon_parked as parked  # noqa: E402  (the look-back window, the map algebra, the bench helpers)

bench = parked.bench
BLOCK_N, BLOCK_T = 16, 256
_BN, _BT = gl.constexpr(BLOCK_N), gl.constexpr(BLOCK_T)  # the same, for kernels that read them as globals
_walk_word = parked.triton_gae._walk_word
_bits, _tag, _map_tag, _START = parked._bits, parked._tag, parked._map_tag, parked._START


@gluon.jit
def _continues(d_q, u_q, step, T):
    # where B_{t+1} counts: the step is neither terminated nor truncated nor the row's last
    return (d_q == 0) & (u_q == 0) & (step != T - 1)


@gluon.jit
def _quarter(r_q, v_q, d_q, u_q, b_q, step, T, gamma, gamma_lam):
    """A step's terms in the form that needs no V(s_{t+1}) (see `_tma_gae_kernel`): `e` (A_t without
    B_{t+1}) and the step's map of B."""
    terminated = d_q != 0
    ends = (u_q != 0) | (step == T - 1)  # V(s_{t+1}) is the bootstrap value
    e = r_q - v_q + gl.where(ends & ~terminated, gamma * b_q, 0.0)
    return e, gamma * v_q + gamma_lam * e, gl.where(_continues(d_q, u_q, step, T), gamma_lam, 0.0)


@gluon.jit
def _finish(e, later_b, v_f, d_f, u_f, q: gl.constexpr, step, T, offs, adv_ptr, ret_ptr,
            BLOCK_N: gl.constexpr, L: gl.constexpr):
    # the quarter's values and flags come back from shared memory rather than living in registers
    # through the walk
    cols = v_f.slice(q * BLOCK_N, BLOCK_N, dim=1)
    cont = _continues(d_f.slice(q * BLOCK_N, BLOCK_N, dim=1).load(L), u_f.slice(q * BLOCK_N, BLOCK_N, dim=1).load(L),
                      step + q, T)
    adv = e + gl.where(cont, later_b, 0.0)
    gl.store(adv_ptr + offs + q * BLOCK_N, adv)
    gl.store(ret_ptr + offs + q * BLOCK_N, adv + cols.load(L))


@gluon.jit
def _walk(state_ptr, epoch, chunk, num_chunks, chunk_beta, BLOCK_N: gl.constexpr, WINDOW: gl.constexpr,
          RL: gl.constexpr):
    """The Triton kernel's look-back walk (`kernels/triton_gae.py`, `_look_back`), a row a lane (RL):
    rounds of WINDOW later chunks' words, composed in time order until one holds a start value, a
    map cuts the chain or the row ends."""
    rows = gl.arange(0, BLOCK_N, layout=RL).to(gl.int64)
    carry = gl.zeros([BLOCK_N], gl.float32, RL)
    acc_a = gl.zeros([BLOCK_N], gl.float32, RL)
    acc_b = acc_a + 1.0
    j = gl.zeros([BLOCK_N], gl.int64, RL) + chunk + 1
    pending = j < num_chunks
    while gl.max(pending.to(gl.int32), axis=0) > 0:
        base = j
        live = pending
        going = pending
        for i in gl.static_range(WINDOW):
            later = base + i
            word = gl.load(state_ptr + gl.minimum(later, num_chunks - 1) * BLOCK_N + rows, volatile=True)
            ok = live & (later < num_chunks)
            carry, acc_a, acc_b, j, pending, going = _walk_word(word, ok, epoch, num_chunks, chunk_beta, carry, acc_a,
                                                                acc_b, j, pending, going)
    return carry


@gluon.jit(do_not_specialize=["epoch"])
def _tma_gae_kernel(r_desc, v_desc, d_desc, u_desc, b_desc, adv_ptr, ret_ptr, state_ptr,
                    T, num_chunks, gamma, gamma_lam, chunk_beta, epoch,
                    BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr, WINDOW: gl.constexpr,
                    WARPS: gl.constexpr, WALK: gl.constexpr):
    NUM_QUADS: gl.constexpr = BLOCK_T // 4
    QW: gl.constexpr = 4 * BLOCK_N  # a quad's four steps, one row of the flat view
    # [quads, envs]: a thread holds 4 envs of NUM_QUADS // (8 * WARPS) consecutive quads
    L: gl.constexpr = gl.BlockedLayout([NUM_QUADS // (8 * WARPS), 4], [8, 4], [WARPS, 1], [1, 0])
    WL: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [WARPS, 1], [1, 0])
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    chunk = num_chunks - 1 - gl.program_id(0)
    t0 = chunk * BLOCK_T

    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    r_s = gl.allocate_shared_memory(gl.float32, [BLOCK_T, BLOCK_N], r_desc.layout)
    v_s = gl.allocate_shared_memory(gl.float32, [BLOCK_T, BLOCK_N], v_desc.layout)
    d_s = gl.allocate_shared_memory(gl.uint8, [BLOCK_T, BLOCK_N], d_desc.layout)
    u_s = gl.allocate_shared_memory(gl.uint8, [BLOCK_T, BLOCK_N], u_desc.layout)
    b_s = gl.allocate_shared_memory(gl.float32, [BLOCK_T, BLOCK_N], b_desc.layout)
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, BLOCK_T * BLOCK_N * 14)  # bytes: three float tiles, two of flags
    tma.async_copy_global_to_shared(r_desc, [t0, 0], bar, r_s)
    tma.async_copy_global_to_shared(v_desc, [t0, 0], bar, v_s)
    tma.async_copy_global_to_shared(d_desc, [t0, 0], bar, d_s)
    tma.async_copy_global_to_shared(u_desc, [t0, 0], bar, u_s)
    tma.async_copy_global_to_shared(b_desc, [t0, 0], bar, b_s)

    kq = gl.expand_dims(gl.arange(0, NUM_QUADS, layout=gl.SliceLayout(1, L)), 1)
    n = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L)), 0)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)

    # flat views: row k holds quad k's four steps of all envs; quarter q is columns q*BLOCK_N..
    r_f = r_s._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    v_f = v_s._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    d_f = d_s._reinterpret(gl.uint8, [NUM_QUADS, QW], FLAT)
    u_f = u_s._reinterpret(gl.uint8, [NUM_QUADS, QW], FLAT)
    b_f = b_s._reinterpret(gl.float32, [NUM_QUADS, QW], FLAT)
    # V(s_{t+1}) of a quad's last step is the next quad's first, another thread's (shared-memory views
    # cannot shift by a row), so the scan runs on B_t = gamma * V_t + gamma * lam * A_t instead, whose
    # step map needs the step's own inputs only: with e_t = r_t - V_t (+ gamma * bootstrap where
    # V(s_{t+1}) is one), A_t = e_t + B_{t+1} where the episode continues (else e_t), and
    # B_t = (gamma * V_t + gamma * lam * e_t) + gamma * lam * B_{t+1} there (else the first term).
    step = t0 + 4 * kq + 0 * n
    e0, a0, b0 = _quarter(r_f.slice(0, BLOCK_N, dim=1).load(L), v_f.slice(0, BLOCK_N, dim=1).load(L),
                          d_f.slice(0, BLOCK_N, dim=1).load(L), u_f.slice(0, BLOCK_N, dim=1).load(L),
                          b_f.slice(0, BLOCK_N, dim=1).load(L), step, T, gamma, gamma_lam)
    e1, a1, b1 = _quarter(r_f.slice(BLOCK_N, BLOCK_N, dim=1).load(L), v_f.slice(BLOCK_N, BLOCK_N, dim=1).load(L),
                          d_f.slice(BLOCK_N, BLOCK_N, dim=1).load(L), u_f.slice(BLOCK_N, BLOCK_N, dim=1).load(L),
                          b_f.slice(BLOCK_N, BLOCK_N, dim=1).load(L), step + 1, T, gamma, gamma_lam)
    e2, a2, b2 = _quarter(r_f.slice(2 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          v_f.slice(2 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          d_f.slice(2 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          u_f.slice(2 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          b_f.slice(2 * BLOCK_N, BLOCK_N, dim=1).load(L), step + 2, T, gamma, gamma_lam)
    e3, a3, b3 = _quarter(r_f.slice(3 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          v_f.slice(3 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          d_f.slice(3 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          u_f.slice(3 * BLOCK_N, BLOCK_N, dim=1).load(L),
                          b_f.slice(3 * BLOCK_N, BLOCK_N, dim=1).load(L), step + 3, T, gamma, gamma_lam)

    # each step's map of B to the end of the tile, and what follows each quad
    a0, b0, a1, b1, a2, b2, a3, b3, after_a, after_b = parked.scan_quads(a0, b0, a1, b1, a2, b2, a3, b3, 0)

    first = (kq == 0) & (n >= 0)
    own = state_ptr + chunk * BLOCK_N + n + 0 * kq
    if WALK:  # the state holds B at a chunk's first step, and maps of B
        gl.atomic_xchg(own, _bits(a0) | _map_tag(epoch, b0), mask=first, sem="relaxed")
        if WALK == 1:  # the Triton kernel's walk, a row a lane
            carry = _walk(state_ptr, epoch, chunk, num_chunks, chunk_beta, BLOCK_N, WINDOW, gl.SliceLayout(0, WL))
            c = gl.expand_dims(gl.convert_layout(carry, gl.SliceLayout(0, L)), 0)
        else:  # session 36's: a window of chunks x rows, a word a thread, composed by a scan
            identity_a = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(0, WL))
            j = gl.zeros([BLOCK_N], gl.int64, gl.SliceLayout(0, WL)) + chunk + 1
            words = parked._window_words(state_ptr, j, num_chunks, True, BLOCK_N, WINDOW, WL)
            carry = parked._resolve(state_ptr, epoch, j, identity_a, identity_a + 1.0, num_chunks, chunk_beta, words,
                                    BLOCK_N, WINDOW, WL)
            c = gl.expand_dims(gl.convert_layout(carry, gl.SliceLayout(0, L)), 0)
        a0, a1, a2, a3, after_a = a0 + b0 * c, a1 + b1 * c, a2 + b2 * c, a3 + b3 * c, after_a + after_b * c
        gl.atomic_xchg(own, _bits(a0) | _tag(epoch, _START), mask=first, sem="relaxed")
    offs = step * BLOCK_N + n
    _finish(e0, a1, v_f, d_f, u_f, 0, step, T, offs, adv_ptr, ret_ptr, BLOCK_N, L)
    _finish(e1, a2, v_f, d_f, u_f, 1, step, T, offs, adv_ptr, ret_ptr, BLOCK_N, L)
    _finish(e2, a3, v_f, d_f, u_f, 2, step, T, offs, adv_ptr, ret_ptr, BLOCK_N, L)
    _finish(e3, after_a, v_f, d_f, u_f, 3, step, T, offs, adv_ptr, ret_ptr, BLOCK_N, L)


def _layout(bits: int):
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)


def tile_descriptor(x: torch.Tensor) -> TensorDescriptor:
    """A TMA descriptor of [BLOCK_T, 16] tiles over the [T, 16] buffer behind a time-major view."""
    buf = x.T  # [T, 16], contiguous
    if buf.dtype == torch.bool:
        buf = buf.view(torch.uint8)
    return TensorDescriptor.from_tensor(buf, [BLOCK_T, BLOCK_N], _layout(8 * buf.element_size()))


def descriptor_type(ty: str, bits: int, rows: int = BLOCK_T) -> str:
    """The signature type of a `tile_descriptor`-like argument, for `compile_sm90`."""
    return f"tensordesc<{ty}[{rows}, {BLOCK_N}],{_layout(bits)!r}>"


def persistent_grid(num_steps: int, device, per_sm: int) -> tuple[int, int, torch.Tensor]:
    """For the persistent experiments: the chunks of a row, the programs (SMs x `per_sm`, at most one a
    chunk; with static tickets every one must be resident, which `per_sm` must respect) and a zeroed
    look-back state of one word per chunk and row."""
    num_chunks = num_steps // BLOCK_T
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return num_chunks, min(num_chunks, sms * per_sm), torch.zeros(num_chunks * BLOCK_N, dtype=torch.int64,
                                                                  device=device)


def call_scalars(rewards: torch.Tensor, gamma: float, lam: float) -> tuple[int, float, float]:
    """Checks the one shape these experiments take; returns T, gamma * lam and its power over a chunk,
    squared in float32 as the Triton kernel does."""
    T = rewards.shape[1]
    if rewards.shape[0] != BLOCK_N or T % BLOCK_T or rewards.stride() != (1, BLOCK_N):
        raise ValueError(f"wants a time-major 16 x (multiple of {BLOCK_T}) view, got {tuple(rewards.shape)}")
    gamma_lam = gamma * lam
    chunk_beta = torch.tensor(gamma_lam, dtype=torch.float32)
    for _ in range(BLOCK_T.bit_length() - 1):
        chunk_beta = chunk_beta * chunk_beta
    return T, gamma_lam, float(chunk_beta)


def compile_sm90(kernel, types: dict, pointers: tuple, constants: dict, warps: int, maxnreg: int | None) -> str:
    """Compiles a Gluon kernel for sm_90 with this machine's Triton (no GPU needed), the named pointers
    taken as 16-byte aligned; returns its registers, stack and shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    attrs = {(kernel.arg_names.index(p),): [["tt.divisibility", 16]] for p in pointers}
    consts = {(kernel.arg_names.index(p),): v for p, v in constants.items()}
    c = triton.compile(GluonASTSource(kernel, types, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, maxnreg=maxnreg))
    return f"{parked.resource_usage(c)} shared memory {c.metadata.shared} bytes"


def check_and_time(kernels, timed=(1 << 20, 65536)) -> None:
    """On a CUDA GPU: `kernels(T)` (name: fn(x, gamma, lam)) checked against the float64 loop (those
    that walk; `walking_only`), then timed beside the copy and the Triton kernel."""
    print(torch.cuda.get_device_name(), flush=True)
    walking = functools.partial(kernels, walking_only=True)  # walk 0 gives wrong answers
    parked.check(65536, 0.05, bench.GAMMA, bench.LAM, walking)
    parked.check(65536, 0.0, 1.0, 1.0, walking)
    parked.check(1 << 20, 0.001, bench.GAMMA, bench.LAM, walking)
    for T in timed:
        parked.timing(T, kernels=kernels)


class TmaGae:
    """Host side: descriptors for the [T, 16] buffers behind time-major [16, T] views, a look-back
    state, an epoch per call."""

    def __init__(self, num_steps: int, device, warps: int = 4, walk: int = 1, maxnreg: int | None = None):
        self.warps, self.walk, self.maxnreg = warps, walk, maxnreg
        self.num_chunks = num_steps // BLOCK_T
        self.state = torch.zeros(self.num_chunks * BLOCK_N, dtype=torch.int64, device=device)
        self.epoch = 0

    def __call__(self, rewards, values, terminateds, truncateds, bootstrap, advantages, returns, gamma, lam):
        T, gamma_lam, chunk_beta = call_scalars(rewards, gamma, lam)
        self.epoch += 1
        d = tile_descriptor
        _tma_gae_kernel[(self.num_chunks,)](
            d(rewards), d(values), d(terminateds), d(truncateds), d(bootstrap),
            advantages, returns, self.state, T, self.num_chunks, gamma, gamma_lam, chunk_beta, self.epoch,
            BLOCK_N=BLOCK_N, BLOCK_T=BLOCK_T, WINDOW=8 if self.walk == 1 else 2 * self.warps, WARPS=self.warps,
            WALK=self.walk, num_warps=self.warps, **({"maxnreg": self.maxnreg} if self.maxnreg else {}))


CONFIGS = [tuple(int(v) for v in c.split(",")) for c in os.environ.get(
    "CONFIGS", "4,1,168 4,1,0 4,2,0 4,0,0 8,1,0 8,1,80 8,0,0").split()]  # warps, walk, maxnreg


def _run(x, k, gamma, lam):
    k(x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"],
      x["advantages"], x["returns"], gamma, lam)


def tma_kernels(T, walking_only=False):
    return {f"{w}w walk{walk}#{m}": functools.partial(_run, k=TmaGae(T, "cuda", w, walk, m or None))
            for w, walk, m in CONFIGS if walk or not walking_only}


def compile_only():
    """Compile for sm_90 with this machine's Triton (no GPU needed); print registers and stack."""
    desc = descriptor_type
    types = dict(r_desc=desc("fp32", 32), v_desc=desc("fp32", 32),
                 d_desc=desc("u8", 8), u_desc=desc("u8", 8), b_desc=desc("fp32", 32),
                 adv_ptr="*fp32", ret_ptr="*fp32", state_ptr="*i64", T="i32", num_chunks="i32",
                 gamma="fp32", gamma_lam="fp32", chunk_beta="fp32", epoch="i32",
                 BLOCK_N="constexpr", BLOCK_T="constexpr", WINDOW="constexpr",
                 WARPS="constexpr", WALK="constexpr")
    for warps, walk, regs in CONFIGS:
        consts = dict(BLOCK_N=BLOCK_N, BLOCK_T=BLOCK_T, WINDOW=8 if walk == 1 else 2 * warps, WARPS=warps, WALK=walk)
        usage = compile_sm90(_tma_gae_kernel, types, ("adv_ptr", "ret_ptr", "state_ptr"), consts, warps, regs or None)
        print(f"{warps}w walk {walk} #{regs}:", usage)


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
        sys.exit()
    check_and_time(tma_kernels)
