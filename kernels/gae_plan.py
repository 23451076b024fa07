"""How a `compute_gae` call is cut into programs: the tile, grid and warps, and every other choice the
kernel is compiled with, decided once per call signature from the tensors' metadata alone.

`plan_launch` returns a `LaunchPlan`; `gae_launch.GaeLaunch` runs it. The numbers below come from
`scripts/benchmark_gae.py` sweeps on an H200 (device microseconds, with the shape that decided each);
`kernels/README.md` explains the tiles, and lists the alternatives that measured slower.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton

from kernels.gae_kernel import (
    BOOTSTRAP_LAST_VALUE,
    BOOTSTRAP_NONE,
    BOOTSTRAP_TENSOR,
    BOOTSTRAP_TENSOR_MASKED,
    BOOTSTRAP_TENSOR_SPARSE,
    PUBLISH_ATOMIC,
    PUBLISH_PTX,
    PUBLISH_SUMMED,
    gdc_wait,
)

# ---- The tuning table: each constant with the measurement that set it (H200, device us) ----------------
MAX_BLOCK_T = 1 << 16  # no tuning: the longest chunk; tests lower it per call to exercise the look-back
TINY_PROBLEM = 32768  # up to this many elements a call is launch-bound: one env row per program
TILE_ELEMENTS = 1024  # env-major and short time-major tiles: no other size beat 1024 by more than ~10%
WHOLE_ROW_STEPS = 2048  # env-major rows this short are one tile, 4 elements a thread: 5-21% faster than chunks
WHOLE_ROW_STEPS_MANY_ENVS, WHOLE_ROW_MANY_ENVS = 4096, 128  # fewer 4096-step rows ran faster as 4 chunks each
TIME_MAJOR_BLOCK_N = 8  # short time-major rows of 8+ envs: 8 x 128 on one warp keeps the scan in the warp
# From 1024 envs with rows past 128 steps: 32 envs x 64 steps on four warps (128-byte lines a step;
# 5-10% faster at 4M elements than 32 x 32 on one warp).
TIME_MAJOR_MANY_ENVS, TIME_MAJOR_MANY_ENVS_BLOCK_N, TIME_MAJOR_MANY_ENVS_ELEMENTS = 1024, 32, 2048
# From 8 envs and 128 steps: 16 x 256 tiles on eight warps, 10-36% faster than 8 x 128 on one warp.
WIDE_TILE_ELEMENTS, WIDE_TILE_BLOCK_N, WIDE_TILE_MIN_ENVS, WIDE_TILE_MIN_STEPS, WIDE_TILE_WARPS = 4096, 16, 8, 128, 8
# ... on four warps from 2048 programs: three programs an SM instead of two (16x1M 135 -> 127 us).
WIDE_TILE_MANY_PROGRAMS, WIDE_TILE_WARPS_MANY_PROGRAMS = 2048, 4
# 2 and 4-7 envs: 256-step tiles (8 rows on eight warps, else two): 1-43% faster than one-warp 128-step
# tiles (2x1M 18.5 against 28.6 us). 3 envs keep 4 x 128 on one warp: 12-byte steps take no vectors.
NARROW_TILE_ENVS, NARROW_TILE_STEPS, NARROW_TILE_WARPS, NARROW_TILE_WARPS_8_ENVS = (2, 4, 5, 6, 7), 256, 2, 8
# Read the next chunk's word as a program starts: 1.5-3% faster from 4096 programs (16384x1024 time-major),
# 1-1.5% slower on one wave; env-major from 8192 (3.6% slower at 4096 programs, 256x16384).
PROBE_MIN_PROGRAMS, PROBE_MIN_PROGRAMS_ENV_MAJOR = 4096, 8192
# Env-major tiles up to this long read bootstrap values only around truncations and the last column:
# 16x1M 95.3 -> 89.0-89.3 us, 16384x1024 88.7 -> 78.2; 4096-step rows 2-10% and time-major 16% slower.
SPARSE_BOOTSTRAP_MAX_STEPS = 1024
# Chunks publish from the tile's first column with Triton's atomics from this many programs (env-major
# 16x1M 101.2 against 104.4 us summed first), slower on one wave. Time-major tiles always do (16x1M 6%).
PUBLISH_COLUMN_MIN_PROGRAMS = 4096
# Env-major PTX publishing from this many programs: 48 registers, ten programs an SM (16x1M 99.1-99.3 against
# 101.6-101.8 us); on one wave the cap was slower (1x1M 8.8 against 8.3).
ENV_MAJOR_MAXNREG, ENV_MAJOR_MAXNREG_MIN_PROGRAMS = 48, 8192
# Later chunks a look-back round reads, by tile rows: 4 rows 7.5-7.7 us at 4x131072 with two (7.9-8.0 with one,
# 8.5-8.6 with four: ptxas reuses one register), 16 rows 9.8-9.9 at 16x65536 with four (10.3-10.6 with one).
LOOK_BACK_WINDOW = {2: 2, 4: 2, 8: 2, 16: 4}
# 16-row tiles on 4096+ programs read eight a round, capped at 168 registers so that ptxas sends the
# eight reads at once: 16x1M 106.0-106.3 against 107.9-108.8 us; smaller grids lost 1.5-28%.
WIDE_WINDOW, WIDE_WINDOW_BLOCK_N, WIDE_WINDOW_MIN_PROGRAMS, WIDE_WINDOW_MAXNREG = 8, 16, 4096, 168
MAX_ALIGN = 4  # the widest vector a thread moves: 16 bytes of float32
# ---------------------------------------------------------------------------------------------------------

# Programmatic dependent launches (`uses_pdl`): on where the GPU has them, unless RL_TRITON_PDL=0.
PDL_ENV = "RL_TRITON_PDL"
_PDL = os.environ.get(PDL_ENV, "1") not in ("", "0")


@functools.lru_cache(maxsize=512)
def plan(
    num_envs: int, num_steps: int, time_major: bool, max_block_t: int = MAX_BLOCK_T,
    block: tuple[int, int] | None = None, num_warps: int | None = None,
) -> tuple[int, int, int, int, int]:
    """`(BLOCK_N, BLOCK_T, num_chunks, grid, num_warps)` for a problem. More than one chunk means
    the rows are joined by the look-back. `block` and `num_warps` override the choice (tuning, tests)."""
    envs = triton.next_power_of_2(max(num_envs, 1))
    steps = triton.next_power_of_2(max(num_steps, 1))
    wide = many = narrow = False  # time-major tiles of 16 envs; of 32 envs from 1024 envs; of NARROW_TILE_ENVS
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
        if wide:  # four elements a thread, on at most eight warps; four warps on grids of many programs
            warps = WIDE_TILE_WARPS_MANY_PROGRAMS if grid >= WIDE_TILE_MANY_PROGRAMS else WIDE_TILE_WARPS
            num_warps = min(warps, max(1, elements // 128))
        elif narrow:
            warps = NARROW_TILE_WARPS_8_ENVS if block_n == TIME_MAJOR_BLOCK_N else NARROW_TILE_WARPS
            # No more threads than a tile shortened by `max_block_t` fills: a scan leaves wrong values in
            # threads that hold copies (see `uses_quads`).
            num_warps = min(warps, max(1, elements // 128))
        elif many:
            # Sixteen elements a thread: the quads' scan crosses warps, which costs less than the resident
            # warps gained (96 registers a thread instead of 166 on one warp).
            num_warps = max(1, elements // 512)
        elif time_major and block_n > 1:
            # One warp: with more, Triton lays warps along time and the scan crosses them through shared memory.
            num_warps = 1
        elif not time_major and num_chunks == 1:
            # Whole env-major rows: four elements a thread (up to 16 warps); chunked rows stay at four
            # warps, where the look-back's wait holds the whole program.
            num_warps = min(16, max(1, elements // 128))
        else:
            num_warps = 1 if elements <= 128 else 2 if elements <= 256 else 4
    return block_n, block_t, num_chunks, grid, num_warps


def uses_quads(time_major: bool, block_n: int, block_t: int, num_chunks: int, num_warps: int,
               prefer: bool | None = None) -> bool:
    """Whether a tile is scanned as four interleaved quarters (`gae_kernel._quad_tile`): time-major tiles
    of 32+ envs (24% faster), or of 2+ envs holding whole rows (14%), spread over several warps, or of at
    most 4 envs (4-11%); chunked one-warp 8-env tiles measured mixed and stay whole. `prefer` overrides
    that choice. Either way the quarters must fill the program's threads: Triton's scan leaves wrong
    values in lanes that hold copies (triton-lang/triton#2298), and every lane reads its results."""
    fills = block_t >= 4 and block_n * (block_t // 4) >= 32 * num_warps
    if prefer is not None:
        return prefer and fills
    several_envs = block_n > 1 and (num_chunks == 1 or num_warps > 1 or block_n <= 4)
    return fills and time_major and (block_n >= 32 or several_envs)


def reads_bootstrap_sparsely(flag_axis: int, block_t: int) -> bool:
    """Whether a tile reads `bootstrap_values` only where it counts (SPARSE_BOOTSTRAP_MAX_STEPS):
    env-major tiles, whose flag loads run along the steps, of at most that many steps."""
    return flag_axis == 1 and block_t <= SPARSE_BOOTSTRAP_MAX_STEPS


def look_back_layout_ok(block_n: int, num_warps: int) -> bool:
    """Whether the look-back may run on a chunked tile of `block_n` envs on `num_warps` warps.

    Every warp walks the look-back for its copy of the tile's rows, and warps read the state at
    different times, so their copies can disagree on which rows still wait. That is harmless while
    each warp decides alone: when every warp holds all the rows (up to 32) or none holds a row
    twice (a multiple of 32 per warp). In between, Triton reduces the rows' flags across warps
    through shared memory inside the walk's loop, a warp that leaves the loop early skips a barrier
    the others wait at, and the results are wrong (64 x 64 tiles on four warps, on an H200)."""
    return block_n <= 32 or block_n % (32 * num_warps) == 0


def publish_mode(time_major: bool, grid: int, nvidia: bool, column: bool | None = None,
                 ptx: bool | None = None) -> int:
    """How chunks publish (`PUBLISH_SUMMED`, `PUBLISH_ATOMIC` or `PUBLISH_PTX`; see
    PUBLISH_COLUMN_MIN_PROGRAMS): env-major rows in inline PTX where the kernel is compiled for an
    NVIDIA GPU (2-7% faster at every grid: it keeps the tile's layout, where Triton's atomic moves the
    tile through shared memory), time-major tiles with Triton's atomics (PTX measured mixed there).
    `column` and `ptx` override the choice."""
    if ptx and not nvidia:
        raise ValueError("publishing in inline PTX needs a kernel compiled for an NVIDIA GPU; "
                         "Triton's interpreter (and ROCm) cannot run PTX")
    ptx = nvidia and not time_major if ptx is None else ptx
    if column is None:
        column = time_major or ptx or grid >= PUBLISH_COLUMN_MIN_PROGRAMS
    return PUBLISH_SUMMED if not column else PUBLISH_PTX if ptx else PUBLISH_ATOMIC


def register_cap(time_major: bool, grid: int, publish: int, block_n: int, window: int, nvidia: bool) -> int | None:
    """The default `maxnreg` of a launch (ENV_MAJOR_MAXNREG, WIDE_WINDOW_MAXNREG), or None: no cap.
    `nvidia`: compiled for an NVIDIA GPU, the only target that takes the cap."""
    many_programs = grid >= ENV_MAJOR_MAXNREG_MIN_PROGRAMS
    if publish == PUBLISH_PTX and not time_major and many_programs:
        return ENV_MAJOR_MAXNREG
    if nvidia and block_n == WIDE_WINDOW_BLOCK_N and window == WIDE_WINDOW:
        return WIDE_WINDOW_MAXNREG
    return None


def uses_pdl(device: torch.device, nvidia: bool) -> bool:
    """Whether a launch on `device` is a programmatic dependent launch: CUDA launches the grid while the
    kernel before it on the stream is still finishing, and the kernel waits for that one (`gdc_wait`)
    before its first memory access. It saves the gap between two kernels, about 1 us on an H200, on
    launches but not on graph replays (kernels/README.md, "Launching"). NVIDIA GPUs of compute
    capability 9.0 and later (`griddepcontrol` is sm_90 PTX), with a Triton that has it, unless
    `RL_TRITON_PDL=0` (say, for a driver that cannot capture such a launch into a caller's CUDA graph).
    `nvidia`: compiled for an NVIDIA GPU."""
    if not nvidia or gdc_wait is None or device.type != "cuda" or not _PDL:
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def look_back_window(block_n: int, num_chunks: int, grid: int = 0) -> int:
    """How many later chunks a look-back round reads (a power of two): `LOOK_BACK_WINDOW` by the tile's
    rows (`WIDE_WINDOW` for 16-row tiles on grids of `grid >= WIDE_WINDOW_MIN_PROGRAMS` programs), one
    for other tiles, and never more chunks than the row has after the first."""
    window = LOOK_BACK_WINDOW.get(block_n, 1)
    if block_n == WIDE_WINDOW_BLOCK_N and grid >= WIDE_WINDOW_MIN_PROGRAMS:
        window = WIDE_WINDOW
    later_chunks = 1 << (max(num_chunks - 1, 1) - 1).bit_length()  # as a power of two, up
    return max(1, min(window, later_chunks))


def alignment(tensors: tuple, time_major: bool) -> tuple[int, int]:
    """`(ALIGN_AXIS, ALIGN)`: a power of two, up to `MAX_ALIGN`, that divides every 2-D tensor's stride
    along `ALIGN_AXIS` (time-major: between steps, 1; env-major: between rows, 0) and the problem's
    extent along the other, contiguous axis; `(-1, 1)` if none does. With it the kernel's loads and
    stores along the contiguous axis are `ALIGN`-element vectors (`gae_kernel._multiple`): 12x1M
    time-major took 305 us on one-element loads, 144 with vectors."""
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
    """The axis along which the flag loads are capped at 4 wide (`gae_kernel._flag_offsets`), or -1:
    the tile's contiguous axis, where both flag tensors have stride 1 and the tile spans at least 4
    elements. Not an env-major tile scanned as quarters: each quarter holds every fourth step of a
    row, so nothing in it is contiguous."""
    axis = 0 if time_major else 1
    if quads and not time_major:
        return -1
    if block[axis] >= 4 and terminateds.stride(axis) == 1 and truncateds.stride(axis) == 1:
        return axis
    return -1


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch fixes once: its grid and warps, a register cap (None: none), whether it is a
    programmatic dependent launch, the kernel's constexprs (in `gae_kernel.CONSTEXPR_NAMES`' order),
    and the look-back state it needs (`state_words` int64 words, 0 for rows of one chunk)."""

    grid: int
    num_warps: int
    num_chunks: int
    maxnreg: int | None
    pdl: bool
    state_words: int
    constexprs: tuple

    @property
    def chunked(self) -> bool:
        return self.num_chunks > 1


def plan_launch(
    tensors: tuple,
    device: torch.device,
    nvidia: bool,
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
    publish_column: bool | None = None,
    publish_ptx: bool | None = None,
    sparse_bootstrap: bool | None = None,
    pdl: bool | None = None,
) -> LaunchPlan:
    """The plan for validated `tensors` (`compute_gae`'s eight, in its order). `nvidia`: the kernel is
    compiled for an NVIDIA GPU (only such a kernel runs PTX or takes a register cap).

    Every other argument overrides one choice, for tests and `scripts/benchmark_gae.py --sweep`:
    `max_block_t` (a power of two) caps the chunk length; `block` (`(BLOCK_N, BLOCK_T)`), `num_warps`;
    `window` (chunks a look-back round reads); `quads` (the four-quarter scan, where `uses_quads`
    allows it); `maxnreg` (0: no cap); `probe` (read the next chunk's word early); `even=False` (keep
    the bounds masks where tiles divide the problem); `rest_scan` (the quads' scan also yields the map
    after each quad, instead of a gather); `publish_column`, `publish_ptx` (`publish_mode`);
    `sparse_bootstrap` (read `bootstrap_values` only where it counts); `pdl`. `inclusive_every > 1`
    makes most chunks withhold their start advantage, so that walks compose maps even under the
    interpreter, which runs programs one at a time. A chunked tile that `look_back_layout_ok` rejects
    raises `ValueError`."""
    rewards, values, terminateds, truncateds, bootstrap_values, last_value, advantages, returns = tensors
    num_envs, num_steps = values.shape
    truncated = truncateds if truncateds is not None else terminateds
    if bootstrap_values is not None:
        bootstrap_mode = BOOTSTRAP_TENSOR
    else:
        bootstrap_mode = BOOTSTRAP_NONE if last_value is None else BOOTSTRAP_LAST_VALUE
    stride_vn, stride_vt = values.stride()
    time_major = stride_vn == 1 and stride_vt != 1
    block_n, block_t, num_chunks, grid, num_warps = plan(num_envs, num_steps, time_major, max_block_t, block,
                                                         num_warps)
    chunked = num_chunks > 1
    if not chunked:  # no look-back: window 1 keeps one compiled kernel for them all
        window = 1
    elif window is None:
        window = look_back_window(block_n, num_chunks, grid)
    quads = uses_quads(time_major, block_n, block_t, num_chunks, num_warps, prefer=quads)
    flag_axis = flag_hint_axis(terminateds, truncated, time_major, (block_n, block_t), quads)
    if bootstrap_mode == BOOTSTRAP_TENSOR:
        if sparse_bootstrap is None:
            sparse_bootstrap = reads_bootstrap_sparsely(flag_axis, block_t)
        if sparse_bootstrap:
            bootstrap_mode = BOOTSTRAP_TENSOR_SPARSE if flag_axis == 1 else BOOTSTRAP_TENSOR_MASKED
    if chunked and not look_back_layout_ok(block_n, num_warps):
        raise ValueError(f"a chunked tile of {block_n} envs on {num_warps} warps: the look-back needs at most "
                         f"32 envs per tile or a multiple of {32 * num_warps} (see look_back_layout_ok)")
    if probe is None:
        probe = grid >= (PROBE_MIN_PROGRAMS if time_major else PROBE_MIN_PROGRAMS_ENV_MAJOR)
    divides = num_envs % block_n == 0 and num_steps % block_t == 0
    even = divides if even is None else even and divides
    # The quads' scan carries what follows each quad, but in chunked tiles of fewer than 32 envs on
    # eight or more warps, where a gather is faster (see `gae_kernel._quad_tile`).
    if rest_scan is None:
        rest_scan = num_warps < WIDE_TILE_WARPS or not chunked or block_n >= 32
    publish = publish_mode(time_major, grid, nvidia, publish_column, publish_ptx) if chunked else PUBLISH_SUMMED
    if maxnreg is None:
        maxnreg = register_cap(time_major, grid, publish, block_n, window, nvidia)
    if pdl is None:
        pdl = uses_pdl(device, nvidia)
    elif pdl and not nvidia:
        raise ValueError("a programmatic dependent launch needs a kernel compiled for an NVIDIA GPU")
    constexprs = (truncateds is not None, bootstrap_mode, chunked, flag_axis, block_n, block_t, window,
                  inclusive_every, quads, probe and chunked, even, rest_scan and quads,
                  *alignment(tensors, time_major), publish, bool(pdl))
    return LaunchPlan(grid, num_warps, num_chunks, maxnreg or None, bool(pdl), grid * block_n if chunked else 0,
                      constexprs)
