"""The Triton kernel against the float64 reference on random rollouts.

Without a GPU the kernel runs under Triton's interpreter (conftest.py); with one, on CUDA.
Tolerance: float32 scans of up to 1000 steps with gamma * lam = 0.94 and unit-scale inputs stay
within ~3e-6 of float64 (measured); atol 1e-4 leaves 30x headroom and still catches any wrong
index, flag or carry (those are off by O(1)).
"""

import re
import subprocess
import sys

import pytest
import torch
import triton

from kernels import compute_gae, gae_kernel, gae_launch, gae_plan
from kernels.gae_launch import GaeLaunch, launch_gae
from kernels.gae_plan import look_back_layout_ok, look_back_window, plan, uses_quads
from tests.conftest import ROOT
from tests.rollouts import oracle, poison_one_step_per_row, poisoned_like, random_rollout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {"rtol": 1e-5, "atol": 1e-4}


def run_kernel(rollout, gamma=0.99, lam=0.95, launch_options=None, outputs=None, **overrides):
    """Kernel outputs written into NaN-poisoned tensors: `outputs` if given, else laid out like the inputs."""
    args = {**rollout, **overrides}
    advantages, returns = outputs or (poisoned_like(args["values"]), poisoned_like(args["values"]))
    if launch_options is None:
        compute_gae(**args, gamma=gamma, lam=lam, advantages=advantages, returns=returns)
    else:
        launch_gae(args["rewards"], args["values"], args["terminateds"], args.get("truncateds"),
                   args.get("bootstrap_values"), args.get("last_value"), gamma, lam,
                   advantages, returns, **launch_options)
    return advantages, returns


def assert_matches_oracle(rollout, gamma=0.99, lam=0.95, launch_options=None, outputs=None, **overrides):
    """The kernel's outputs, once checked against the float64 oracle."""
    advantages, returns = run_kernel(rollout, gamma, lam, launch_options, outputs, **overrides)
    expected_adv, expected_ret = oracle(rollout, gamma, lam, **overrides)
    assert not advantages.isnan().any() and not returns.isnan().any(), "an output element was not written"
    torch.testing.assert_close(advantages.cpu().double(), expected_adv, **TOL)
    torch.testing.assert_close(returns.cpu().double(), expected_ret, **TOL)
    return advantages, returns


@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("density", [0.0, 0.05, 1.0])
@pytest.mark.parametrize("num_envs", [1, 7, 64])
@pytest.mark.parametrize("num_steps", [1, 2, 3, 127, 1000])
def test_kernel_matches_reference(num_steps, num_envs, density, time_major):
    rollout = random_rollout(num_envs, num_steps, density=density, time_major=time_major, device=DEVICE,
                             seed=num_steps * 1000 + num_envs)
    assert_matches_oracle(rollout)


BOOTSTRAP_MODES = ["none", "last_value", "tensor", "tensor_with_truncateds"]


def bootstrap_overrides(rollout, bootstrap: str) -> dict:
    """The arguments that turn a rollout (which has truncations) into one of the bootstrap modes."""
    if bootstrap == "none":
        return {"truncateds": None, "bootstrap_values": None}
    if bootstrap == "last_value":
        return {"truncateds": None, "bootstrap_values": None, "last_value": rollout["bootstrap_values"][:, -1].clone()}
    if bootstrap == "tensor":
        boot = torch.zeros_like(rollout["bootstrap_values"])
        boot[:, -1] = rollout["bootstrap_values"][:, -1]
        return {"truncateds": None, "bootstrap_values": boot}
    return {}


@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.uint8, torch.float32])
@pytest.mark.parametrize("bootstrap", BOOTSTRAP_MODES)
def test_every_flag_dtype_and_bootstrap_mode(flag_dtype, bootstrap):
    rollout = random_rollout(7, 127, density=0.1, flag_dtype=flag_dtype, device=DEVICE, seed=5)
    assert_matches_oracle(rollout, **bootstrap_overrides(rollout, bootstrap))


def quad_options(num_envs: int, num_steps: int, time_major: bool, block: tuple[int, int], **options) -> dict:
    """Launch options that force the four-quarter scan, checked to be taken (not silently refused)."""
    block_n, block_t, num_chunks, _, warps = plan(num_envs, num_steps, time_major, block=block)
    assert uses_quads(time_major, block_n, block_t, num_chunks, warps, prefer=True), "the case must run quads"
    return {"block": block, "quads": True, **options}


@pytest.mark.parametrize("rest_scan", [False, True], ids=["gather", "rest_scan"])
@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("density", [0.0, 0.05, 1.0])
@pytest.mark.parametrize("num_envs,num_steps,block", [(9, 101, (8, 16)), (37, 127, (32, 16)), (7, 127, (8, 128)),
                                                      (37, 3, (32, 32)), (3, 64, (8, 32)), (33, 200, (32, 64))])
def test_quad_tiles_match_reference(num_envs, num_steps, block, density, time_major, rest_scan):
    # Steps 4k..4k+3 composed in registers, quads scanned, chunks joined: odd sizes, a row shorter
    # than one quad, rows that end inside a quad, chunked and whole rows; what follows each quad
    # read from its neighbour's scan result or carried by the scan itself.
    rollout = random_rollout(num_envs, num_steps, density=density, time_major=time_major, device=DEVICE,
                             seed=num_steps + block[0])
    options = quad_options(num_envs, num_steps, time_major, block, rest_scan=rest_scan)
    assert_matches_oracle(rollout, launch_options=options)


@pytest.mark.parametrize("rest_scan", [False, True], ids=["gather", "rest_scan"])
@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize("bootstrap", BOOTSTRAP_MODES)
def test_quad_tiles_with_every_bootstrap_mode_and_withheld_inclusives(bootstrap, flag_dtype, rest_scan):
    rollout = random_rollout(11, 77, density=0.05, flag_dtype=flag_dtype, time_major=True, device=DEVICE, seed=8)
    options = quad_options(11, 77, True, (8, 16), inclusive_every=3, rest_scan=rest_scan)
    assert_matches_oracle(rollout, launch_options=options, **bootstrap_overrides(rollout, bootstrap))


def test_quads_scan_what_follows_each_quad_but_in_chunked_tiles_of_few_envs_on_eight_warps():
    # The scan carries it in tiles of 32+ envs, in whole rows and on fewer than eight warps; a gather
    # reads it in chunked tiles of fewer than 32 envs on eight warps (16 x 256 on one wave).
    rest_scan_index = gae_kernel.CONSTEXPR_NAMES.index("REST_SCAN")
    gathers = 0
    for num_envs, num_steps in [(2048, 1024), (4096, 100), (4096, 128), (16, 4096), (16, 1 << 20), (128, 65536),
                                (16, 65536), (8, 65536)]:
        rollout = random_rollout(num_envs, num_steps, time_major=True)  # planned from metadata: never launched
        launch = GaeLaunch(launch_tensors(rollout))
        block_n = launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("BLOCK_N")]
        gather = launch.chunked and launch.num_warps >= 8 and block_n < 32
        assert launch.constexprs[rest_scan_index] is (not gather), (num_envs, num_steps)
        gathers += gather
    assert 0 < gathers < 8, "the shapes must take both"


@pytest.mark.parametrize("gamma,lam", [(0.0, 0.95), (1.0, 1.0), (0.99, 0.0), (0.5, 0.5)])
def test_extreme_discounts(gamma, lam):
    assert_matches_oracle(random_rollout(7, 127, device=DEVICE, seed=6), gamma=gamma, lam=lam)


# Both layouts for each shape but (37, 1000, 64), whose point is time-major: 16 chunks a row in 8-env
# tiles whose last row block is partly masked. Env-major it ran 37 x 16 one-row programs, 22 s each
# under the interpreter, for chunked rows that (1, 1000, 16) and (7, 127, *) already cover.
# Every density for each but (7, 127, 2) time-major: 448 one-row programs of 64 chunks, 13 s a density
# under the interpreter. Its 0.05 has walks both long and cut short; at 0 and 1 the same strided one-row
# tiles run in (7, 127, 16), and walks of 63 chunks in (1, 1000, 16).
@pytest.mark.parametrize("num_envs,num_steps,max_block_t,time_major,density",
                         [(n, t, b, major, d) for n, t, b in [(1, 1000, 16), (7, 127, 2), (7, 127, 16), (3, 33, 32)]
                          for major in (False, True) for d in (0.0, 0.05, 1.0)
                          if d == 0.05 or (n, t, b, major) != (7, 127, 2, True)]
                         + [(37, 1000, 64, True, d) for d in (0.0, 0.05, 1.0)],
                         ids=lambda v: {False: "env_major", True: "time_major"}.get(v) if isinstance(v, bool) else None)
def test_chunked_rows_match_reference(num_envs, num_steps, max_block_t, time_major, density):
    block_n, block_t, num_chunks, grid, _ = plan(num_envs, num_steps, time_major, max_block_t)
    assert num_chunks > 1, "the case must split rows into chunks joined by the look-back"
    rollout = random_rollout(num_envs, num_steps, density=density, time_major=time_major, device=DEVICE,
                             seed=num_steps + max_block_t)
    assert_matches_oracle(rollout, launch_options={"max_block_t": max_block_t})


@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
# Every density with the windows the plan uses, walks that stop at a chunk that published (every third)
# and walks that never meet one. The 32-chunk window (unrolled 32 times, the slowest case under the
# interpreter) at one density, on the long walk only: where every third chunk publishes, a walk reads at
# most three chunks and masks the rest of its window, as it does with the 4-chunk window.
@pytest.mark.parametrize("inclusive_every,window,density",
                         [(i, w, d) for i in (3, 1 << 20) for w in (1, 4) for d in (0.0, 0.05, 1.0)]
                         + [(1 << 20, 32, 0.05)])
def test_look_back_walks_compose_windows_of_aggregates(inclusive_every, window, density, time_major):
    # Most chunks withhold their start advantage, so the look-back must compose the maps of later
    # chunks, a window at a time, up to one that published it (every third chunk), a done flag, or
    # the row's end. Windows wider than the walk (32 > its 25 later chunks) and one-chunk windows both run.
    rollout = random_rollout(5, 101, density=density, time_major=time_major, device=DEVICE, seed=window + 11)
    assert_matches_oracle(rollout, launch_options={"max_block_t": 4, "window": window,
                                                   "inclusive_every": inclusive_every})


@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("quads", [False, True])
@pytest.mark.parametrize("inclusive_every", [1, 3])
@pytest.mark.parametrize("probe", [False, True])
@pytest.mark.parametrize("num_envs,num_steps", [(11, 67), (8, 64)])  # the second divides into tiles: no masks
def test_look_back_with_the_next_chunks_start_advantage_read_early(num_envs, num_steps, probe, inclusive_every,
                                                                   quads, time_major):
    # The probe's word is ready only where the next chunk published its start advantage (every
    # third chunk with inclusive_every=3): elsewhere the walk must still run.
    rollout = random_rollout(num_envs, num_steps, density=0.05, time_major=time_major, device=DEVICE,
                             seed=num_steps + probe)
    assert_matches_oracle(rollout, launch_options={"block": (4, 8), "probe": probe, "quads": quads,
                                                   "inclusive_every": inclusive_every})


@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("quads", [False, True])
@pytest.mark.parametrize("publish", [
    "summed", "atomic",
    pytest.param("ptx", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="PTX needs CUDA"))])
@pytest.mark.parametrize("inclusive_every", [1, 3])
def test_chunks_publish_from_the_tiles_first_column_or_the_tile_summed_to_it(publish, quads, inclusive_every,
                                                                           time_major):
    # Every way of publishing a chunk's map and start advantage, with walks that compose windows of
    # maps (every third chunk publishes its start advantage) and walks that stop at the next chunk.
    rollout = random_rollout(11, 67, density=0.05, time_major=time_major, device=DEVICE, seed=67 + inclusive_every)
    assert_matches_oracle(rollout, launch_options={"block": (4, 8), "window": 2, "quads": quads,
                                                   "publish_column": publish != "summed",
                                                   "publish_ptx": publish == "ptx",
                                                   "inclusive_every": inclusive_every})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PTX needs CUDA")
@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("num_envs,num_steps", [(1, 70001), (16, 65536), (5, 20000)])
def test_ptx_publishing_on_long_rows(num_envs, num_steps, time_major):
    # PTX publishing on the plan's own tiles of chunked rows (not the small forced ones above), with ragged
    # rows (70001, 5 envs); time-major too, where the plan itself keeps Triton's atomics.
    rollout = random_rollout(num_envs, num_steps, density=0.01, time_major=time_major, device="cuda", seed=num_envs)
    assert_matches_oracle(rollout, launch_options={"publish_ptx": True})


def test_how_chunks_publish_by_layout_grid_and_compiler():
    P = gae_plan
    column_at = gae_kernel.CONSTEXPR_NAMES.index("PUBLISH_COLUMN")
    # On the CPU (the interpreter): time-major tiles and env-major grids of several waves publish from
    # the first column, with Triton's atomics.
    for num_envs, num_steps, time_major, expected in [(4, 131072, True, P.PUBLISH_ATOMIC),
                                                      (16, 1 << 20, True, P.PUBLISH_ATOMIC),
                                                      (16, 1 << 20, False, P.PUBLISH_ATOMIC),
                                                      (1, 1 << 20, False, P.PUBLISH_SUMMED),
                                                      (16, 65536, False, P.PUBLISH_SUMMED),
                                                      (4096, 128, True, P.PUBLISH_SUMMED)]:  # one chunk a row
        rollout = random_rollout(num_envs, num_steps, time_major=time_major)  # planned from metadata: never launched
        launch = GaeLaunch(launch_tensors(rollout))
        assert launch.constexprs[column_at] == expected, (num_envs, num_steps, time_major)
        assert launch.maxnreg is None
    assert P.publish_mode(False, 4096, False) == P.PUBLISH_ATOMIC
    assert P.publish_mode(False, 4095, False) == P.PUBLISH_SUMMED
    # Compiled for an NVIDIA GPU: env-major rows publish in PTX on every grid, time-major tiles keep Triton's atomics.
    assert P.publish_mode(False, 1024, True) == P.publish_mode(False, 16384, True) == P.PUBLISH_PTX
    assert P.publish_mode(True, 1024, True) == P.PUBLISH_ATOMIC
    assert P.publish_mode(False, 16384, True, column=False) == P.PUBLISH_SUMMED
    assert P.publish_mode(True, 1024, True, ptx=True) == P.PUBLISH_PTX
    with pytest.raises(ValueError, match="cannot run PTX"):
        P.publish_mode(False, 1024, False, ptx=True)
    # The register cap: env-major PTX publishing on grids of many waves only.
    assert P.register_cap(False, 8192, P.PUBLISH_PTX, 1, 1, True) == P.ENV_MAJOR_MAXNREG
    assert P.register_cap(False, 8191, P.PUBLISH_PTX, 1, 1, True) is None
    assert P.register_cap(False, 16384, P.PUBLISH_ATOMIC, 1, 1, True) is None
    assert P.register_cap(True, 16384, P.PUBLISH_PTX, 1, 1, True) is None


def test_the_cuda_launches_compile_for_an_nvidia_gpu(tmp_path):
    # The interpreter runs the kernel's Python without Triton's compiler, and cannot run the inline PTX
    # that env-major chunks publish with on an NVIDIA GPU at all. This compiles the launches compute_gae
    # plans there, for sm_90 down to a cubin (no GPU needed), one per kind of tile (GAE_SHAPES).
    script = ROOT / "scripts" / "dev" / "compile_kernels.py"
    done = subprocess.run([sys.executable, str(script), "--kernels", "gae", "--dump", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("gae_kernel [")]
    assert len(lines) == 13 and all("compiled in" in line for line in lines), done.stdout
    ptx = [line for line in lines if "publish ptx" in line]
    assert len(ptx) == 2 and all("env-major" in line for line in ptx), done.stdout  # 1x1M and 16x1M
    env_capped, time_capped = sorted((line for line in lines if "maxnreg" in line), key=lambda line: "time" in line)
    assert "16x1048576 env-major" in env_capped and int(re.search(r"REG:(\d+)", env_capped).group(1)) <= 48, env_capped
    # The eight-chunk window of 16-row tiles on many waves, at its cap of 168 (WIDE_WINDOW).
    assert "16x1048576 time-major" in time_capped and "maxnreg 168" in time_capped, time_capped
    # No spills (a one-warp 8 x 128 tile for 5-7 envs would hold 255 registers and spill 200 bytes at
    # 5x100000).
    for line in lines:
        assert "STACK:0 " in line, line
    # Each is a programmatic dependent launch on sm_90 (`uses_pdl`): the wait for the kernel before it
    # (griddepcontrol.wait, ACQBULK in the SASS) comes before its first access to global memory.
    sass = sorted(tmp_path.glob("*.sass"))
    assert len(sass) == 13 and len(list(tmp_path.glob("*.ptx"))) == 13
    for path in sass:
        code = path.read_text()
        wait = code.find("ACQBULK")
        first_access = re.search(r"\b(LDG|STG|ATOMG|ATOM|RED|LD|ST)\.", code)
        assert 0 <= wait < first_access.start(), f"{path.name}: memory accessed before the wait"


def launch_tensors(rollout, outputs=None):
    """The eight tensors `GaeLaunch` plans from (no last value; outputs laid out like the values)."""
    advantages, returns = outputs or (rollout["values"], rollout["values"])
    return (rollout["rewards"], rollout["values"], rollout["terminateds"], rollout["truncateds"],
            rollout["bootstrap_values"], None, advantages, returns)


def test_tiles_that_divide_the_problem_run_unmasked_with_the_same_result():
    even_at = gae_kernel.CONSTEXPR_NAMES.index("EVEN")
    rollout = random_rollout(8, 64, density=0.05, time_major=True, device=DEVICE, seed=3)
    assert GaeLaunch(launch_tensors(rollout), block=(4, 8)).constexprs[even_at]
    assert not GaeLaunch(launch_tensors(rollout), block=(4, 8), even=False).constexprs[even_at]
    ragged = random_rollout(9, 64, time_major=True, device=DEVICE)
    assert not GaeLaunch(launch_tensors(ragged), block=(4, 8), even=True).constexprs[even_at], \
        "a ragged tile must keep its masks"
    # Each matches the float64 oracle, and the other (not bit for bit on a GPU: the two compiled
    # kernels may fuse multiply-adds differently).
    unmasked = assert_matches_oracle(rollout, launch_options={"block": (4, 8)})
    masked = assert_matches_oracle(rollout, launch_options={"block": (4, 8), "even": False})
    torch.testing.assert_close(unmasked[0], masked[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_warps,rest_scan", [(8, False), (4, True)], ids=["eight_warps_gather", "four_warps_rest"])
def test_wide_time_major_tiles_match_reference(num_warps, rest_scan):
    # 19 envs x 1800 steps (past the tiny path): 16-env tiles (one row block partly masked), chunked,
    # scanned as quarters; on eight warps what follows each quad is gathered, on four (the plan's
    # choice for grids of many programs) the scan carries it.
    rollout = random_rollout(19, 1800, density=0.05, time_major=True, device=DEVICE, seed=19)
    block_n, block_t, num_chunks, _, planned_warps = plan(19, 1800, True, 64)
    assert (block_n, planned_warps) == (gae_plan.WIDE_TILE_BLOCK_N, gae_plan.WIDE_TILE_WARPS) and num_chunks > 1
    assert uses_quads(True, block_n, block_t, num_chunks, num_warps)
    options = {"max_block_t": 64, "num_warps": num_warps}
    launch = GaeLaunch(launch_tensors(rollout), **options)
    assert launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("REST_SCAN")] is rest_scan
    assert_matches_oracle(rollout, launch_options=options)


def test_chunked_tiles_whose_rows_some_warps_hold_twice_are_refused():
    assert look_back_layout_ok(16, 8) and look_back_layout_ok(32, 2) and look_back_layout_ok(64, 2)
    assert look_back_layout_ok(1, 4) and not look_back_layout_ok(64, 4)
    tensors = launch_tensors(random_rollout(64, 64, time_major=True, device=DEVICE))
    with pytest.raises(ValueError, match="64 envs on 4 warps"):
        GaeLaunch(tensors, block=(64, 16), num_warps=4)
    GaeLaunch(tensors, block=(64, 64), num_warps=4)  # one chunk: no look-back, nothing to refuse


def test_look_back_window_reads_a_bounded_number_of_words():
    assert look_back_window(1, 1024) == 1 and look_back_window(32, 32) == 1  # one chunk a round
    assert look_back_window(8, 1024) == 2 and look_back_window(4, 1024) == 2 and look_back_window(2, 1024) == 2
    assert look_back_window(16, 1024) == 4
    assert look_back_window(16, 2) == 1 and look_back_window(16, 4) == 4  # no wider than the walk
    # 16-row tiles on grids of many waves read eight, and on NVIDIA GPUs take the register cap that
    # makes ptxas send the eight reads together.
    assert look_back_window(16, 4096, grid=4096) == 8 and look_back_window(16, 4096, grid=4095) == 4
    assert look_back_window(16, 4, grid=8192) == 4 and look_back_window(8, 4096, grid=8192) == 2
    assert gae_plan.register_cap(True, 4096, gae_plan.PUBLISH_ATOMIC, 16, 8, True) == gae_plan.WIDE_WINDOW_MAXNREG
    assert gae_plan.register_cap(True, 4096, gae_plan.PUBLISH_ATOMIC, 16, 4, True) is None
    assert gae_plan.register_cap(True, 4096, gae_plan.PUBLISH_ATOMIC, 16, 8, False) is None


@pytest.mark.parametrize("num_envs,num_steps,window,maxnreg", [
    (16, 1 << 20, 8, 168), (32, 1 << 20, 8, 168), (16, 1 << 19, 4, None), (4, 131072, 2, None)])
def test_the_plan_widens_the_window_of_16_row_tiles_on_many_waves(num_envs, num_steps, window, maxnreg):
    # Planned from time-major meta tensors as for an NVIDIA GPU: nothing is allocated or launched.
    def tensor(dtype):
        return torch.empty(num_steps, num_envs, dtype=dtype, device="meta").T

    tensors = (*(tensor(torch.float32) for _ in range(2)), tensor(torch.bool), tensor(torch.bool),
               tensor(torch.float32), None, tensor(torch.float32), tensor(torch.float32))
    launch = GaeLaunch(tensors, nvidia=True, graphs=False)
    assert launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("WINDOW")] == window
    assert launch.maxnreg == maxnreg
    assert GaeLaunch(tensors, nvidia=False, graphs=False).maxnreg is None  # the interpreter takes no cap


@pytest.mark.parametrize("num_envs,num_steps,time_major,sparse", [
    (16, 1 << 20, False, True),      # chunks of 1024 steps
    (16384, 1024, False, True),      # whole rows of 1024
    (4096, 128, False, True),        # whole rows of 128, 8 a tile
    (4096, 4096, False, False),      # whole rows of 4096: longer than SPARSE_BOOTSTRAP_MAX_STEPS
    (16, 1 << 20, True, False),      # time-major: never
    (4096, 128, True, False),
])
def test_env_major_tiles_read_bootstrap_values_only_where_they_count(num_envs, num_steps, time_major, sparse):
    # Planned from meta tensors: nothing is allocated or launched.
    def tensor(dtype):
        if time_major:
            return torch.empty(num_steps, num_envs, dtype=dtype, device="meta").T
        return torch.empty(num_envs, num_steps, dtype=dtype, device="meta")

    floats = [tensor(torch.float32) for _ in range(5)]
    tensors = (floats[0], floats[1], tensor(torch.bool), tensor(torch.bool), floats[2], None, floats[3], floats[4])
    mode_at = gae_kernel.CONSTEXPR_NAMES.index("BOOTSTRAP")
    expected = gae_kernel.BOOTSTRAP_TENSOR_SPARSE if sparse else gae_kernel.BOOTSTRAP_TENSOR
    assert GaeLaunch(tensors, graphs=False).constexprs[mode_at] == expected
    # Only a tensor of bootstrap values can be read sparsely; without one the mode stays.
    without = (*tensors[:4], None, torch.empty(num_envs, device="meta"), *tensors[6:])
    assert GaeLaunch(without, graphs=False).constexprs[mode_at] == gae_kernel.BOOTSTRAP_LAST_VALUE
    if time_major:  # asked for, time-major tiles read at the counted steps alone (their flags run along envs)
        launch = GaeLaunch(tensors, graphs=False, sparse_bootstrap=True)
        assert launch.constexprs[mode_at] == gae_kernel.BOOTSTRAP_TENSOR_MASKED


@pytest.mark.parametrize("sparse", [False, True], ids=["every_step", "sparse"])
@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("num_envs,num_steps,max_block_t", [(5, 127, 65536), (3, 1000, 16), (9, 6, 65536),
                                                            (16, 300, 64)])
def test_bootstrap_values_count_only_at_truncations_and_the_last_column(num_envs, num_steps, max_block_t,
                                                                        time_major, sparse):
    # Read sparsely or at every step, bootstrap_values must count exactly at truncated steps and in
    # the last column: NaN everywhere else (which breaks the contract, so the call runs unchecked)
    # must not reach an output, and every counted value must (the oracle uses the clean tensor).
    rollout = random_rollout(num_envs, num_steps, density=0.2, time_major=time_major, device=DEVICE,
                             seed=num_steps + max_block_t)
    counted = rollout["truncateds"].clone()
    counted[:, -1] = True
    poisoned = rollout["bootstrap_values"].clone()  # the same layout as the other inputs
    poisoned[~counted] = float("nan")
    options = {"max_block_t": max_block_t, "sparse_bootstrap": sparse}
    advantages, returns = run_kernel(rollout, launch_options=options, bootstrap_values=poisoned)
    expected_adv, expected_ret = oracle(rollout, 0.99, 0.95)
    torch.testing.assert_close(advantages.cpu().double(), expected_adv, **TOL)
    torch.testing.assert_close(returns.cpu().double(), expected_ret, **TOL)


# One-env tiles (1, 2) mask no env rows, so 5 envs show what 37 would (at 51 chunks a row, 37 envs
# took 47 s under the interpreter); the wider tiles keep 37 envs, whose last tile is partly masked.
@pytest.mark.parametrize("block,num_envs", [((4, 8), 37), ((32, 4), 37), ((1, 2), 5)])
def test_tiles_with_several_envs_and_chunks(block, num_envs):
    rollout = random_rollout(num_envs, 101, density=0.03, time_major=True, device=DEVICE, seed=12)
    assert_matches_oracle(rollout, launch_options={"block": block})


def test_chunked_rows_with_last_value_and_no_truncations():
    rollout = random_rollout(5, 200, density=0.02, device=DEVICE, seed=7)
    last = rollout["bootstrap_values"][:, -1].clone()
    assert_matches_oracle(rollout, launch_options={"max_block_t": 16},
                          truncateds=None, bootstrap_values=None, last_value=last)


PLAN_SHAPES = [(n, t) for n in (1, 2, 3, 5, 7, 8, 16, 37, 64, 1000, 1024, 4096, 16384, 1 << 16)
               for t in (1, 3, 33, 127, 128, 1000, 2048, 4096, 65536, 100_000, 1 << 20)]


@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
def test_every_plan_covers_each_element_once_with_tiles_the_kernel_can_run(time_major):
    # Invariants of every plan, not its tuning: power-of-two tiles no larger than the padded problem,
    # chunks that cover each row with none empty, one program per tile, at most 4096 elements a tile
    # (registers), no thread holding a copy of an element (Triton's scan leaves copies wrong), and a
    # look-back layout that is safe wherever rows are chunked.
    for num_envs, num_steps in PLAN_SHAPES:
        block_n, block_t, num_chunks, grid, num_warps = plan(num_envs, num_steps, time_major)
        shape = (num_envs, num_steps, time_major)
        assert block_n & (block_n - 1) == 0 and block_t & (block_t - 1) == 0, shape
        assert block_n <= triton.next_power_of_2(num_envs) and block_t <= triton.next_power_of_2(num_steps), shape
        assert (num_chunks - 1) * block_t < num_steps <= num_chunks * block_t, shape
        assert grid == triton.cdiv(num_envs, block_n) * num_chunks, shape
        assert block_n * block_t <= 4096 and num_warps in (1, 2, 4, 8, 16), shape
        assert 32 * num_warps <= max(32, block_n * block_t), shape
        assert num_chunks == 1 or look_back_layout_ok(block_n, num_warps), shape
        if uses_quads(time_major, block_n, block_t, num_chunks, num_warps):
            assert block_n * (block_t // 4) >= 32 * num_warps, shape  # the quarters fill the threads
    # The rules the tuning table states: env-major rows this short are whole tiles; tiny time-major
    # problems take one env row a program; no chunk is longer than max_block_t.
    assert all(plan(n, t, False)[2] == 1 for n, t in PLAN_SHAPES if t <= gae_plan.WHOLE_ROW_STEPS)
    assert all(plan(n, t, True)[0] == 1 for n, t in PLAN_SHAPES if n * t <= gae_plan.TINY_PROBLEM)
    assert all(plan(n, t, time_major, 64)[1] <= 64 for n, t in PLAN_SHAPES)


def test_narrow_time_major_rows_scan_quads():
    # Chunked tiles of 2-7 envs (long rows: shorter ones are tiny problems), all as quads.
    for num_envs in range(2, 8):
        block_n, block_t, num_chunks, _, num_warps = plan(num_envs, 100_000, True)
        assert num_chunks > 1 and uses_quads(True, block_n, block_t, num_chunks, num_warps), num_envs
    # A forced chunked one-warp 8-row tile scans whole:
    assert not uses_quads(True, 8, 128, 782, 1)
    # chunked 3-env tiles (one padded row, steps 3 apart: no vector alignment) take them, and are right
    rollout = random_rollout(3, 300, density=0.05, time_major=True, device=DEVICE, seed=5)
    launch = GaeLaunch(launch_tensors(rollout), block=(4, 32))
    assert launch.chunked and launch.num_warps == 1
    assert launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("QUADS")]
    assert_matches_oracle(rollout, launch_options={"block": (4, 32)})


@pytest.mark.parametrize("num_envs,num_steps,warps", [(2, 16500, 2), (5, 6600, 8)], ids=["two_envs", "five_envs"])
def test_narrow_rollouts_match_reference_on_the_planned_tiles(num_envs, num_steps, warps):
    # Just past the tiny path: the plan's own narrow tiles (2 x 256 on two warps, reading two chunks a
    # round; 8 x 256 on eight, three rows of them padding), chunked, as quads.
    rollout = random_rollout(num_envs, num_steps, density=0.01, time_major=True, device=DEVICE, seed=num_envs)
    launch = GaeLaunch(launch_tensors(rollout))
    assert launch.chunked and launch.num_warps == warps
    assert launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("BLOCK_T")] == 256
    assert launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("QUADS")]
    assert launch.constexprs[gae_kernel.CONSTEXPR_NAMES.index("WINDOW")] == 2
    assert_matches_oracle(rollout)


def test_outputs_are_allocated_in_the_layout_of_values():
    rollout = random_rollout(8, 16, time_major=True, device=DEVICE)
    advantages, returns = compute_gae(**rollout)
    assert advantages.stride() == rollout["values"].stride() == returns.stride()
    expected_adv, _ = oracle(rollout, 0.99, 0.95)
    torch.testing.assert_close(advantages.cpu().double(), expected_adv, **TOL)


def test_mixed_layouts_and_strided_views():
    # Inputs in different layouts, and views that skip elements: every stride is honoured.
    g = torch.Generator().manual_seed(8)
    rewards = torch.randn(40, 9, generator=g)[::2].T.to(DEVICE)  # [9, 20], strides (1, 18)
    values = torch.randn(9, 20, generator=g).to(DEVICE)
    term = (torch.rand(20, 9, generator=g) < 0.1).T.to(DEVICE)
    rollout = {"rewards": rewards, "values": values, "terminateds": term}
    advantages = torch.full((9, 40), float("nan"), device=DEVICE)[:, ::2]
    returns = torch.full((20, 9), float("nan"), device=DEVICE).T
    compute_gae(**rollout, advantages=advantages, returns=returns)
    expected_adv, expected_ret = oracle(rollout, 0.99, 0.95)
    torch.testing.assert_close(advantages.cpu().double(), expected_adv, **TOL)
    torch.testing.assert_close(returns.cpu().double(), expected_ret, **TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: long rows are too slow for the interpreter")
@pytest.mark.parametrize("density", [0.0, 0.001])
@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
def test_long_rows_on_gpu(density, time_major):
    rollout = random_rollout(4, 131072 + 17, density=density, time_major=time_major, device="cuda", seed=9)
    assert_matches_oracle(rollout)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_many_envs_on_gpu():
    rollout = random_rollout(3000, 1001, density=0.01, time_major=True, device="cuda", seed=10)
    assert_matches_oracle(rollout)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_replays_correctly():
    rollout = random_rollout(16, 5000, density=0.01, device="cuda", seed=11)
    advantages, returns = poisoned_like(rollout["values"]), poisoned_like(rollout["values"])
    compute_gae(**rollout, advantages=advantages, returns=returns)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compute_gae(**rollout, advantages=advantages, returns=returns)
    advantages.fill_(float("nan"))
    returns.fill_(float("nan"))
    for _ in range(3):  # the look-back state is reset on every replay
        graph.replay()
    torch.cuda.synchronize()
    expected_adv, expected_ret = oracle(rollout, 0.99, 0.95)
    torch.testing.assert_close(advantages.cpu().double(), expected_adv, **TOL)
    torch.testing.assert_close(returns.cpu().double(), expected_ret, **TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled-kernel cache is CUDA-only")
def test_repeated_calls_reuse_the_compiled_kernel_correctly():
    # The first call compiles through Triton, later calls with the same specialisation launch the
    # cached kernel directly: new data, other sizes and misaligned views must all come out right.
    for seed, (num_envs, num_steps) in enumerate([(5, 300), (5, 300), (9, 301), (33, 77)]):
        assert_matches_oracle(random_rollout(num_envs, num_steps, device="cuda", seed=seed))
    assert gae_launch._compiled, "the direct-launch cache was never filled"
    storage = random_rollout(5, 301, device="cuda", seed=20)
    shifted = {k: v[:, 1:] for k, v in storage.items()}  # data pointers 4 bytes past alignment
    assert_matches_oracle(shifted)
    assert_matches_oracle(shifted)


def run_of(rollout, outputs):
    """What `compute_gae` keeps for this call's signature (a `GaeLaunch` on the Triton path)."""
    from kernels import gae

    _, entry = gae._lookup(launch_tensors(rollout, outputs))
    return entry and entry[0]


def refill(rollout, outputs, seed):
    """New rewards and values in the same memory, and NaN-poisoned outputs: a replay must read the
    tensors as they are now and write every element."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    for name in ("rewards", "values"):
        rollout[name].copy_(torch.randn(rollout[name].shape, device="cuda", generator=g))
    for out in outputs:
        out.fill_(float("nan"))


needs_cuda_graphs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs")


@needs_cuda_graphs
@pytest.mark.parametrize("num_envs,num_steps,time_major,chunked", [
    (1, 2048, False, False), (64, 256, True, False), (7, 127, False, False),
    (3, 5000, False, True), (16, 3000, True, True), (5, 70_000, True, True)])
def test_repeated_calls_replay_a_cuda_graph_of_the_launch(num_envs, num_steps, time_major, chunked):
    # The launch is kept per signature across tests, and freed tensors' addresses come back: count
    # this test's graphs by their keys, and its replays from its first call on.
    rollout = random_rollout(num_envs, num_steps, density=0.05, time_major=time_major, device="cuda", seed=60)
    outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    assert_matches_oracle(rollout, outputs=outputs)
    launch = run_of(rollout, outputs)
    assert launch.chunked == chunked
    replays = launch.replays
    # Five more calls, the first captured: a chunked launch's two graphs, which alternate epochs over
    # one look-back state, each replay at least twice, so each finds the other's words there.
    for call in range(5):
        refill(rollout, outputs, seed=call)
        assert_matches_oracle(rollout, outputs=outputs)
    assert launch.replays >= replays + 4, "the repeated call was not replayed"
    assert len(launch.graphs[graph_key(rollout, outputs)].graphs) == (2 if chunked else 1)
    # Other scalars are other kernel arguments: a graph of their own.
    for call in range(3):
        refill(rollout, outputs, seed=10 + call)
        assert_matches_oracle(rollout, gamma=0.9, lam=0.5, outputs=outputs)
    assert graph_key(rollout, outputs, 0.9, 0.5) in launch.graphs
    # Other outputs (other pointers) with the same signature: their own graph, the right numbers.
    other = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    for _ in range(3):
        other[0].fill_(float("nan"))
        assert_matches_oracle(rollout, outputs=other)
    assert graph_key(rollout, other) in launch.graphs


def graph_key(rollout, outputs, gamma=0.99, lam=0.95):
    """The key of the graphs a call replays: its tensors' data pointers and its scalars, and for a
    chunked launch the current stream (its graphs' look-back state is that stream's)."""
    key = (*[0 if x is None else x.data_ptr() for x in launch_tensors(rollout, outputs)], gamma, lam)
    if run_of(rollout, outputs).chunked:
        key += (torch.cuda.current_stream().cuda_stream,)
    return key


@needs_cuda_graphs
@pytest.mark.parametrize("time_major", [False, True])
def test_replayed_chunked_calls_walk_unbroken_chains(time_major):
    # No episode ends and gamma * lambda = 0.995 (3e-7 after 3000 steps, far from float32's 0):
    # nothing cuts a chain or fades it to 0, so every chunk's walk runs until a later chunk's start
    # advantage is ready. (At 0.999 float32 rounding alone exceeds TOL, eager or replayed.)
    rollout = random_rollout(6, 3000, density=0.0, time_major=time_major, device="cuda", seed=63)
    outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    for call in range(5):
        refill(rollout, outputs, seed=40 + call)
        assert_matches_oracle(rollout, gamma=1.0, lam=0.995, outputs=outputs)
    launch = run_of(rollout, outputs)
    assert launch.chunked and graph_key(rollout, outputs, 1.0, 0.995) in launch.graphs


@needs_cuda_graphs
def test_replays_run_on_the_current_stream():
    rollout = random_rollout(64, 256, density=0.05, time_major=True, device="cuda", seed=61)
    outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    assert_matches_oracle(rollout, outputs=outputs)
    launch = run_of(rollout, outputs)
    replays = launch.replays
    assert_matches_oracle(rollout, outputs=outputs)  # captured and replayed on the default stream
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in range(3):
            # New data queued on this stream behind a sleep: a replay on another stream would run
            # before it lands, and its outputs would be the previous data's.
            torch.cuda._sleep(1_000_000)
            refill(rollout, outputs, seed=20 + call)
            assert_matches_oracle(rollout, outputs=outputs)
    assert launch.replays == replays + 4


@needs_cuda_graphs
def test_chunked_replays_on_two_streams_keep_their_own_look_back_state():
    # Each stream's calls repeat, so each stream replays graphs of its own; queued behind sleeps,
    # the two streams' replays overlap on the GPU, and a shared look-back buffer would mix them.
    rollout = random_rollout(4, 6000, density=0.01, time_major=True, device="cuda", seed=64)
    outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    other = {k: v.clone() for k, v in rollout.items()}
    other_outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    launch = run_of(rollout, outputs)
    replays = launch.replays if launch is not None else 0
    for call in range(4):
        for i, (stream, (r, out)) in enumerate(zip(streams, ((rollout, outputs), (other, other_outputs)), strict=True)):
            with torch.cuda.stream(stream):
                for _ in range(2):  # twice in a row on this stream: captured, then replayed
                    torch.cuda._sleep(200_000)
                    refill(r, out, seed=50 + 2 * call + i)  # other data on each stream
                    compute_gae(**r, advantages=out[0], returns=out[1])
    torch.cuda.synchronize()
    launch = run_of(rollout, outputs)  # one launch: both rollouts have its signature
    assert launch.chunked and launch.replays >= replays + 6
    for r, out in ((rollout, outputs), (other, other_outputs)):
        expected_adv, expected_ret = oracle(r, 0.99, 0.95)
        torch.testing.assert_close(out[0].cpu().double(), expected_adv, **TOL)
        torch.testing.assert_close(out[1].cpu().double(), expected_ret, **TOL)


@needs_cuda_graphs
def test_a_callers_capture_takes_the_launch_not_a_replay():
    rollout = random_rollout(1, 2048, density=0.05, device="cuda", seed=62)
    outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    for _ in range(3):
        run_kernel(rollout, outputs=outputs)
    launch = run_of(rollout, outputs)
    replays = launch.replays
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compute_gae(**rollout, advantages=outputs[0], returns=outputs[1])
    assert launch.replays == replays
    refill(rollout, outputs, seed=30)
    graph.replay()
    torch.cuda.synchronize()
    expected_adv, expected_ret = oracle(rollout, 0.99, 0.95)
    torch.testing.assert_close(outputs[0].cpu().double(), expected_adv, **TOL)
    torch.testing.assert_close(outputs[1].cpu().double(), expected_ret, **TOL)


def test_which_launches_replay_graphs(monkeypatch):
    unchunked = launch_tensors(random_rollout(7, 127, device=DEVICE))
    chunked = launch_tensors(random_rollout(4, 3000, device=DEVICE))
    assert GaeLaunch(chunked).chunked and not GaeLaunch(unchunked).chunked
    # Withheld start advantages outlive a call, so their launches cannot alternate two epochs.
    assert GaeLaunch(chunked, inclusive_every=3).graphs is None
    assert GaeLaunch(unchunked, graphs=False).graphs is None
    monkeypatch.setattr(gae_launch, "_CUDA_GRAPHS", False)  # RL_TRITON_CUDA_GRAPHS=0
    assert GaeLaunch(unchunked).graphs is None and GaeLaunch(chunked).graphs is None
    monkeypatch.setattr(gae_launch, "_CUDA_GRAPHS", True)
    # Only CUDA launches replay graphs; the interpreter launches every call.
    assert (GaeLaunch(unchunked).graphs is not None) == (DEVICE == "cuda")
    assert (GaeLaunch(chunked).graphs is not None) == (DEVICE == "cuda")


def test_programmatic_dependent_launch_only_where_the_gpu_has_it(monkeypatch):
    tensors = launch_tensors(random_rollout(4, 3000, device=DEVICE))
    pdl_at = gae_kernel.CONSTEXPR_NAMES.index("PDL")
    # Not in the interpreter, nor for a kernel planned for an NVIDIA GPU without one to ask.
    assert not gae_plan.uses_pdl(torch.device("cpu"), nvidia=False)
    assert not gae_plan.uses_pdl(torch.device("cpu"), nvidia=True)
    with pytest.raises(ValueError, match="programmatic dependent launch needs a kernel compiled for an NVIDIA GPU"):
        GaeLaunch(tensors, nvidia=False, pdl=True, graphs=False)
    assert GaeLaunch(tensors, nvidia=True, pdl=True, graphs=False).constexprs[pdl_at] is True
    launch = GaeLaunch(tensors, graphs=False)
    hopper = DEVICE == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
    assert launch.pdl == launch.constexprs[pdl_at] == (hopper and gae_kernel.gdc_wait is not None)
    monkeypatch.setattr(gae_plan, "_PDL", False)  # RL_TRITON_PDL=0
    assert GaeLaunch(tensors, graphs=False).pdl is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_envs,num_steps,time_major", [(4, 131072, True), (64, 256, True), (3, 5000, False)])
def test_a_launch_right_after_the_kernels_that_write_its_inputs_reads_what_they_wrote(num_envs, num_steps, time_major,
                                                                                     monkeypatch):
    # A programmatic dependent launch (sm_90 and later) may start while the kernel before it is still
    # finishing; the kernel must wait for that kernel's writes before its first load or store. Graphs
    # off and every signature planned afresh: each call is such a launch (a replay is not).
    from kernels import gae

    monkeypatch.setattr(gae_launch, "_CUDA_GRAPHS", False)
    monkeypatch.setattr(gae, "_runs", {})
    rollout = random_rollout(num_envs, num_steps, density=0.01, time_major=time_major, device="cuda", seed=70)
    outputs = (poisoned_like(rollout["values"]), poisoned_like(rollout["values"]))
    assert_matches_oracle(rollout, outputs=outputs)
    for call in range(4):
        g = torch.Generator(device="cuda").manual_seed(80 + call)
        new_rewards = torch.randn(rollout["rewards"].shape, device="cuda", generator=g)
        new_values = torch.randn(rollout["values"].shape, device="cuda", generator=g)
        torch.cuda._sleep(1_000_000)  # the host gets ahead: what follows runs back to back on the GPU
        for out in outputs:
            out.fill_(float("nan"))
        rollout["rewards"].copy_(new_rewards)
        rollout["values"].copy_(new_values)  # the kernel just before the launch writes its values
        compute_gae(**rollout, advantages=outputs[0], returns=outputs[1])
        expected_adv, expected_ret = oracle(rollout, 0.99, 0.95)
        torch.testing.assert_close(outputs[0].cpu().double(), expected_adv, **TOL)
        torch.testing.assert_close(outputs[1].cpu().double(), expected_ret, **TOL)
    launch = run_of(rollout, outputs)
    hopper = torch.cuda.get_device_capability() >= (9, 0) and gae_kernel.gdc_wait is not None
    assert launch.graphs is None and launch.pdl == hopper


def test_look_back_state_is_reused_across_calls_and_shapes():
    # The state buffer is not zeroed between calls: each call's words carry its epoch. Calls of
    # different shapes on one buffer must all be right.
    gae_launch._states.clear()
    for seed, (num_envs, num_steps, max_block_t) in enumerate([(7, 127, 16), (3, 33, 8), (7, 127, 16), (2, 300, 32)]):
        rollout = random_rollout(num_envs, num_steps, density=0.05, device=DEVICE, seed=40 + seed)
        assert_matches_oracle(rollout, launch_options={"max_block_t": max_block_t})
    (state,) = gae_launch._states.values()
    assert state.epoch >= 4, "every chunked call should have used the one buffer"


def test_look_back_state_starts_afresh_before_its_epoch_overflows(monkeypatch):
    gae_launch._states.clear()
    monkeypatch.setattr(gae_launch, "_EPOCH_LIMIT", 2)
    buffers = []  # the buffer objects themselves: ids of freed ones could be reused
    for seed in range(4):  # a new buffer every second call
        rollout = random_rollout(7, 127, density=0.05, device=DEVICE, seed=50 + seed)
        assert_matches_oracle(rollout, launch_options={"max_block_t": 16})
        for state in gae_launch._states.values():
            if not any(state.tensor is seen for seen in buffers):
                buffers.append(state.tensor)
    assert len(buffers) >= 2


def test_look_back_words_hold_the_largest_epoch():
    # A word keeps its epoch above its float and two status bits (from bit 34): the last epoch a buffer
    # reaches before it starts afresh must still fit, and still tell this call's words from older ones.
    gae_launch._states.clear()
    assert_matches_oracle(random_rollout(7, 127, density=0.05, device=DEVICE, seed=60),
                          launch_options={"max_block_t": 16})
    (state,) = gae_launch._states.values()
    state.epoch = gae_launch._EPOCH_LIMIT - 1
    assert_matches_oracle(random_rollout(7, 127, density=0.05, device=DEVICE, seed=61),
                          launch_options={"max_block_t": 16})
    assert state.epoch == gae_launch._EPOCH_LIMIT
    words = state.tensor.cpu()
    assert (words >= 0).all(), "an epoch reached the sign bit"
    written = words[(words >> 34) == gae_launch._EPOCH_LIMIT]
    # 7 rows x 8 chunks: every word a chunk publishes, its start advantage last
    assert len(written) == 7 * 8 and ((written >> 32) & 3 == gae_kernel.STATUS_START).all()


@pytest.mark.parametrize("time_major", [False, True])
def test_flag_loads_are_hinted_only_where_flags_are_contiguous(time_major):
    axis = 0 if time_major else 1
    contiguous = random_rollout(8, 64, time_major=time_major, device=DEVICE)
    flags = contiguous["terminateds"]
    assert gae_plan.flag_hint_axis(flags, flags, time_major, (128, 8) if time_major else (1, 1024)) == axis
    # a tile narrower than 4 along the contiguous axis, or flags in the other layout: no hint
    assert gae_plan.flag_hint_axis(flags, flags, time_major, (2, 2)) == -1
    other_layout = flags.T.contiguous().T if not time_major else flags.contiguous()
    assert gae_plan.flag_hint_axis(other_layout, flags, time_major, (128, 8)) == -1
    assert gae_plan.flag_hint_axis(flags, other_layout, time_major, (128, 8)) == -1
    # quarters of an env-major tile hold every fourth step: not contiguous; time-major quarters keep the hint
    tile = (128, 8) if time_major else (1, 1024)
    assert gae_plan.flag_hint_axis(flags, flags, time_major, tile, quads=True) == (0 if time_major else -1)


def test_alignment_is_the_largest_power_of_two_dividing_the_strided_axis_and_the_contiguous_extent():
    def of(num_envs, num_steps, time_major, outputs=None):
        rollout = random_rollout(num_envs, num_steps, time_major=time_major, device=DEVICE)
        return gae_plan.alignment(launch_tensors(rollout, outputs), time_major)

    assert of(12, 50, True) == (1, 4)  # steps 12 envs apart: 16-byte vectors
    assert of(6, 50, True) == (1, 2)
    assert of(7, 50, True) == (-1, 1)
    assert of(64, 50, True) == (-1, 1)  # divisible by 16: Triton knows without the hint
    assert of(40, 50, True) == (1, gae_plan.MAX_ALIGN)
    assert of(3, 1000, False) == (0, 4)  # rows 1000 steps apart
    assert of(3, 1001, False) == (-1, 1)
    # every tensor counts: outputs whose steps are 18 apart leave 2
    outputs = [torch.empty(50, 18, device=DEVICE)[:, :12].T for _ in range(2)]
    assert of(12, 50, True, outputs) == (1, 2)
    # neither layout contiguous: nothing to vectorise
    rollout = random_rollout(4, 8, device=DEVICE)
    strided = {k: torch.empty(4, 16, dtype=v.dtype, device=DEVICE)[:, ::2] for k, v in rollout.items()}
    assert gae_plan.alignment(launch_tensors(strided), False) == (-1, 1)


@pytest.mark.parametrize("density", [0.05, 1.0])
@pytest.mark.parametrize("num_envs,num_steps,time_major,block", [
    (12, 200, True, (16, 32)),  # ragged row tile, 4-aligned steps, chunked
    (6, 90, True, (8, 16)),  # 2-aligned
    (12, 70, True, (4, 32)),  # tiles of 4 envs, chunked and ragged in time
    (5, 100, False, (2, 32)),  # env-major rows 100 steps apart, ragged in time
])
def test_aligned_but_not_16_divisible_strides_match_reference(num_envs, num_steps, time_major, block, density):
    rollout = random_rollout(num_envs, num_steps, density=density, time_major=time_major, device=DEVICE, seed=12)
    assert gae_plan.alignment(launch_tensors(rollout), time_major)[1] > 1
    assert_matches_oracle(rollout, launch_options={"block": block})
    # outputs in a wider buffer: a smaller alignment, and the outputs' own strides honoured
    width = num_envs + 2 if time_major else num_steps + 2
    shape = (num_steps, width) if time_major else (num_envs, width)

    def wide():
        x = torch.full(shape, float("nan"), device=DEVICE)
        return x[:, :num_envs].T if time_major else x[:, :num_steps]

    outputs = (wide(), wide())
    assert gae_plan.alignment(launch_tensors(rollout, outputs), time_major)[1] == 2
    assert_matches_oracle(rollout, launch_options={"block": block}, outputs=outputs)


NON_FINITE_LAUNCHES = {
    "planned": None,
    "chunked_walks": {"max_block_t": 4, "window": 4, "inclusive_every": 1 << 20},
    "chunked_published_column": {"block": (4, 8), "window": 2, "publish_column": True, "inclusive_every": 3},
    "quads_gather": {"block": (8, 16), "quads": True, "rest_scan": False, "inclusive_every": 3},
    "quads_rest_scan": {"block": (8, 16), "quads": True, "rest_scan": True, "probe": True},
}


@pytest.mark.parametrize("time_major", [False, True], ids=["env_major", "time_major"])
@pytest.mark.parametrize("launch", list(NON_FINITE_LAUNCHES))
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_a_non_finite_number_stays_in_its_own_episode_on_every_path(launch, time_major):
    # Inside a tile's scan, in a quad's registers, across chunks through the look-back and the carry:
    # a done step cuts the chain by a select wherever maps compose (0 * inf would be NaN).
    options = NON_FINITE_LAUNCHES[launch]
    if options and options.get("quads") and not time_major:
        pytest.skip("quads are time-major tiles")
    clean = random_rollout(11, 77, density=0.05, time_major=time_major, device=DEVICE, seed=77)
    expected_adv, expected_ret = oracle(clean, 0.99, 0.95)
    poisoned = {k: v.clone() for k, v in clean.items()}
    affected = poison_one_step_per_row(poisoned, seed=3)
    assert affected.any(dim=1).sum() >= 8
    adv, ret = (x.cpu().double() for x in run_kernel(poisoned, launch_options=options))
    assert not torch.isfinite(adv[affected]).any()
    torch.testing.assert_close(adv[~affected], expected_adv[~affected], **TOL)
    torch.testing.assert_close(ret[~affected], expected_ret[~affected], **TOL)
