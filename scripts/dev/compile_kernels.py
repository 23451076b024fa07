"""Compile the fused PPO step's and the GAE kernel's Triton launches for a CUDA GPU on a machine
without one, and print their registers and stack (spills) per thread.

    python scripts/dev/compile_kernels.py                    # sm_90 (H100/H200), every ppo.fused_precision value
    python scripts/dev/compile_kernels.py --arch 80 --num-warps 8 --precisions tf32 --kernels ppo
    python scripts/dev/compile_kernels.py --kernels gae      # compute_gae's launches for GAE_SHAPES
    python scripts/dev/compile_kernels.py --kernels gae --gae 16x1048576:time:default@4 --dump /tmp/gae
        # a `benchmark_gae.py --sweep` configuration instead; its TTGIR, PTX and SASS written to /tmp/gae

Why: Triton's CPU interpreter, which the CPU test suite uses, runs a kernel's Python without its
compiler, so a kernel can pass every interpreted test and still not compile (a non-constexpr global,
a type the code generator refuses). This compiles the exact launches that `ppo.update.fused.FusedStep`
makes, through Triton's whole pipeline down to a cubin with its bundled ptxas: no GPU, no driver.
The GAE kernel's launches are planned as `compute_gae` plans them on an NVIDIA GPU, PTX publishing
included, which the interpreter cannot run at all. `tests/test_fused_update.py` and
`tests/test_gae_kernel.py` run it. Must run without TRITON_INTERPRET (which replaces the
compiler); this script clears it before importing triton.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from buffers import SampleTable  # noqa: E402
from kernels import gae_kernel, gae_plan  # noqa: E402
from kernels.gae_launch import GaeLaunch  # noqa: E402
from ppo.agent import Agent  # noqa: E402
from ppo.config import PPOSettings  # noqa: E402
from ppo.update import STAT_NAMES, make_optimizer  # noqa: E402
from ppo.update import fused as fused_update  # noqa: E402

CONFIGS = {  # name: (obs_dim, act_dim, hidden sizes, minibatch, settings); both branches of each constexpr flag
    "ant-default": (27, 8, (64, 64), 64, PPOSettings()),
    "odd-no-value-clip": (11, 3, (32, 48), 37, PPOSettings(clip_vloss=False, norm_adv="off")),
}
DTYPES = {torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32", torch.bool: "i1", torch.uint8: "u8"}
# (num_envs, num_steps, time_major): one shape for each kind of launch `gae_plan.plan` makes. Env-major:
# a whole row on 16 warps, several rows a tile, whole 1024-step rows, chunked rows on one wave and on many
# (the register cap). Time-major: one env a tile (small problems), 16-env tiles of whole rows, 32 x 64
# chunked tiles on four warps, 16-env chunked tiles on eight warps and on four, 4-env chunked tiles on two
# warps, five envs (8-row tiles on eight warps; odd strides: one-element loads) and three (one warp).
GAE_SHAPES = [(1, 2048, False), (4096, 128, False), (16384, 1024, False), (1, 1 << 20, False), (16, 1 << 20, False),
              (64, 256, True), (4096, 128, True), (16384, 1024, True), (16, 65536, True), (16, 1 << 20, True),
              (4, 131072, True), (5, 100000, True), (3, 200000, True)]


def signature(kernel: triton.JITFunction, args: list, constants: dict) -> tuple[dict, dict]:
    """Triton's type string for each argument, as a launch with these values would specialise it."""
    types, runtime = {}, iter(args)
    for name in kernel.arg_names:
        if name in constants:
            types[name] = "constexpr"
            continue
        value = next(runtime)
        if isinstance(value, torch.Tensor):
            types[name] = "*" + DTYPES[value.dtype]
        elif isinstance(value, bool):
            types[name] = "i1"
        elif isinstance(value, int):
            types[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            types[name] = "fp32"
        else:
            raise TypeError(f"argument {name}: no Triton type for {type(value).__name__}")
    positions = {(kernel.arg_names.index(name),): value for name, value in constants.items()}
    return types, positions


def fused_step_launches(obs_dim: int, act_dim: int, hidden: tuple[int, int], batch: int,
                        settings: PPOSettings) -> list[tuple]:
    """The launches `FusedStep` makes for one minibatch step, built from CPU tensors."""
    cpu = torch.device("cpu")
    agent = Agent(obs_dim, act_dim, hidden)
    optimizer = make_optimizer(agent, settings, cpu, graphs=False)
    step = fused_update.FusedStep(agent, optimizer, settings)
    table = SampleTable(batch, obs_dim, act_dim, cpu).data
    rows = torch.arange(batch)
    stats = torch.zeros(len(STAT_NAMES))
    return step.launches(table, rows, stats.clone(), stats)


def gae_launch(num_envs: int, num_steps: int, time_major: bool,
               options: dict | None = None, arch: int = 90) -> tuple[GaeLaunch, list, dict, dict]:
    """`(launch, args, constants, attributes)`: the launch `compute_gae` makes on an NVIDIA GPU of `arch` for
    bool flags and float32 everything else (bootstrap values, no last value), planned from meta
    tensors, with the arguments Triton would specialise as a launch does: integers equal to 1 as
    constants, pointers and integers divisible by 16 as such. `options`: `gae_plan.plan_launch`'s overrides."""
    shape = (num_steps, num_envs) if time_major else (num_envs, num_steps)

    def tensor(dtype: torch.dtype) -> torch.Tensor:
        x = torch.empty(shape, dtype=dtype, device="meta")
        return x.T if time_major else x

    rewards, values, bootstrap, advantages, returns = (tensor(torch.float32) for _ in range(5))
    tensors = (rewards, values, tensor(torch.bool), tensor(torch.bool), bootstrap, None, advantages, returns)
    options = {"pdl": arch >= 90, **(options or {})}  # as `gae_plan.uses_pdl` decides for a GPU of that arch
    launch = GaeLaunch(tensors, nvidia=True, graphs=False, **options)
    state = torch.empty(launch.state_words, dtype=torch.int64, device="meta")
    args = [*(tensors[i] for i in launch.slots), state, *launch.ints, 0.99, 0.99 * 0.95, 1]  # last: the epoch
    names = gae_kernel.gae_kernel.arg_names[:len(args)]  # then the constexprs
    constants = dict(zip(gae_kernel.CONSTEXPR_NAMES, launch.constexprs, strict=True))
    attributes = {}
    for position, (name, value) in enumerate(zip(names, args, strict=True)):
        if isinstance(value, torch.Tensor) or (isinstance(value, int) and value % 16 == 0 and name != "epoch"):
            attributes[(position,)] = [["tt.divisibility", 16]]
        elif isinstance(value, int) and value == 1 and name != "epoch":
            constants[name] = 1
    args = [value for name, value in zip(names, args, strict=True) if name not in constants]
    return launch, args, constants, attributes


def compile_gae(arch: int, launches: list[str] | None = None, dump: Path | None = None) -> None:
    """Compile and report the launches of GAE_SHAPES, or `launches` ('NxT:env|time[:CONFIG]', CONFIG a
    `benchmark_gae.py --sweep` configuration), writing each one's TTGIR, PTX and SASS under `dump`."""
    from gae_cases import parse_tile  # the sweep's configurations

    target = GPUTarget("cuda", arch, 32)
    modes = {gae_plan.PUBLISH_SUMMED: "summed", gae_plan.PUBLISH_ATOMIC: "atomic", gae_plan.PUBLISH_PTX: "ptx"}
    if launches is None:
        launches = [f"{n}x{t}:{'time' if time_major else 'env'}" for n, t, time_major in GAE_SHAPES]
    for spec in launches:
        shape, layout, *config = spec.split(":", 2)
        if layout not in ("env", "time"):
            raise SystemExit(f"--gae {spec!r}: the layout must be 'env' or 'time', got {layout!r}")
        num_envs, num_steps = (int(v) for v in shape.lower().split("x"))
        time_major = layout == "time"
        try:
            options = parse_tile(config[0]) if config else {}
        except ValueError as error:
            raise SystemExit(f"--gae {spec!r}: not a sweep configuration ({error})") from None
        launch, args, constants, attributes = gae_launch(num_envs, num_steps, time_major, options, arch)
        types, positions = signature(gae_kernel.gae_kernel, args, constants)
        options = {"num_warps": launch.num_warps}
        if launch.maxnreg is not None:
            options["maxnreg"] = launch.maxnreg
        if launch.pdl:
            options["launch_pdl"] = True
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(gae_kernel.gae_kernel, types, positions, attributes), target=target,
                                  options=options)
        tile = f"{constants['BLOCK_N']}x{constants['BLOCK_T']}"
        publish = f", publish {modes[constants['PUBLISH_COLUMN']]}" if constants["CHUNKED"] else ""
        cap = f", maxnreg {launch.maxnreg}" if launch.maxnreg is not None else ""
        label = f" {config[0]}" if config else ""
        print(f"gae_kernel [{num_envs}x{num_steps} {layout}-major{label}: {tile} tile, "
              f"{launch.grid} programs{publish}] sm_{arch}, {launch.num_warps} warps{cap}: compiled in "
              f"{time.perf_counter() - start:.1f} s; per thread {resource_usage(compiled.asm['cubin'])} bytes",
              flush=True)
        if dump is not None:
            from triton.tools.disasm import get_sass

            dump.mkdir(parents=True, exist_ok=True)
            stem = spec.replace(":", "_").replace("/", "w").replace("#", "r").replace("+", "p").replace("@", "a")
            (dump / f"{stem}.ttgir").write_text(compiled.asm["ttgir"])
            (dump / f"{stem}.ptx").write_text(compiled.asm["ptx"])  # to tell what ptxas moved
            (dump / f"{stem}.sass").write_text(get_sass(compiled.asm["cubin"]))


def resource_usage(cubin: bytes) -> str:
    """`REG:n STACK:n ...` of the cubin's kernel, from the cuobjdump that ships with Triton."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ppo_step_{os.getpid()}.cubin"
    path.write_bytes(cubin)
    try:
        out = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True).stdout
    finally:
        path.unlink()
    found = re.search(r"REG:\d+ STACK:\d+", out)
    return found.group(0) if found else "(cuobjdump gave no resource line)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    parser.add_argument("--num-warps", type=int, default=None,
                        help="the gradients kernel's warps (default: ppo.update.fused.NUM_WARPS per precision)")
    parser.add_argument("--precisions", nargs="+", choices=sorted(fused_update.NUM_WARPS),
                        default=sorted(fused_update.NUM_WARPS), help="ppo.fused_precision values to compile")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    parser.add_argument("--kernels", nargs="+", choices=["ppo", "gae"], default=["ppo", "gae"],
                        help="the fused PPO step's kernels, the GAE kernel's launches, or both")
    parser.add_argument("--gae", nargs="+", metavar="NxT:LAYOUT[:CONFIG]",
                        help="GAE launches to compile instead of GAE_SHAPES' (LAYOUT env or time; CONFIG as in "
                             "benchmark_gae.py --sweep, e.g. 'default@4#168')")
    parser.add_argument("--dump", type=Path, help="write each GAE launch's TTGIR, PTX and SASS into this folder")
    args = parser.parse_args()
    if "gae" in args.kernels:
        compile_gae(args.arch, args.gae, args.dump)
    if "ppo" not in args.kernels:
        return
    target = GPUTarget("cuda", args.arch, 32)
    for precision in args.precisions:
        for name in args.configs:
            obs_dim, act_dim, hidden, batch, settings = CONFIGS[name]
            settings = dataclasses.replace(settings, fused_precision=precision)
            for kernel, _, launch_args, constants, num_warps in fused_step_launches(obs_dim, act_dim, hidden, batch,
                                                                                   settings):
                if args.num_warps and kernel.fn.__name__ == "ppo_gradients_kernel":
                    num_warps = args.num_warps
                types, positions = signature(kernel, launch_args, constants)
                start = time.perf_counter()
                compiled = triton.compile(ASTSource(kernel, types, positions), target=target,
                                          options={"num_warps": num_warps})
                print(f"{kernel.fn.__name__} [{name}, {precision}] sm_{args.arch}, {num_warps} warps: compiled in "
                      f"{time.perf_counter() - start:.1f} s; per thread {resource_usage(compiled.asm['cubin'])} bytes")

if __name__ == "__main__":
    main()
