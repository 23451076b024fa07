"""Compile the fused PPO step's Triton kernels for a CUDA GPU on a machine without one, and print
their registers and stack (spills) per thread.

    python scripts/compile_kernels.py                    # sm_90 (H100/H200), every ppo.fused_precision value
    python scripts/compile_kernels.py --arch 80 --num-warps 8 --precisions tf32

Why: Triton's CPU interpreter, which the CPU test suite uses, runs a kernel's Python without its
compiler, so a kernel can pass every interpreted test and still not compile (a non-constexpr global,
a type the code generator refuses). This compiles the exact launches that `ppo.fused_update.FusedStep`
makes, through Triton's whole pipeline down to a cubin with its bundled ptxas: no GPU, no driver.
`tests/test_fused_update.py` runs it. Must run without TRITON_INTERPRET (which replaces the
compiler); this script clears it before importing triton.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from buffers import SampleTable  # noqa: E402
from ppo import fused_update  # noqa: E402
from ppo.agent import Agent  # noqa: E402
from ppo.config import PPOSettings  # noqa: E402
from ppo.update import STAT_NAMES, make_optimizer  # noqa: E402

CONFIGS = {  # name: (obs_dim, act_dim, hidden sizes, minibatch, settings); both branches of each constexpr flag
    "ant-default": (27, 8, (64, 64), 64, PPOSettings()),
    "odd-no-value-clip": (11, 3, (32, 48), 37, PPOSettings(clip_vloss=False, norm_adv="off")),
}
DTYPES = {torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32"}


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
                        help="the gradients kernel's warps (default: ppo.fused_update.NUM_WARPS per precision)")
    parser.add_argument("--precisions", nargs="+", choices=sorted(fused_update.NUM_WARPS),
                        default=sorted(fused_update.NUM_WARPS), help="ppo.fused_precision values to compile")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    args = parser.parse_args()
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
