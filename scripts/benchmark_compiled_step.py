"""The compiled CPU minibatch step alone (`ppo/compiled_step.py`): Ant-v4 sizes (27 observations,
8 actions, 64x64 tanh MLPs), minibatches of 64 from a 2,048-sample table, one torch thread.

    python scripts/benchmark_compiled_step.py                                  # 1 and 2 minibatches per call
    python scripts/benchmark_compiled_step.py --per-call 2 --checkouts . /tmp/old_checkout

Every variant (checkout x minibatches per call) is built and compiled in this one process, then
timed in alternating rounds of 320 steps (one update of the default config): the 2-core machine's
speed swings by up to 1.5x between runs, so only comparisons inside one run count. Prints each
variant's compile time (a warm inductor cache makes it seconds; set TORCHINDUCTOR_CACHE_DIR to an
empty directory for a cold one) and its median and range of us per minibatch step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ppo", "buffers", "kernels")


def load_step(checkout: Path, per_call: int, seed: int = 0):
    """A `step(round_index)` closure over a fresh agent and CompiledStep built from `checkout`'s code."""
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]  # import this checkout's modules, not the last one's
    sys.path.insert(0, str(checkout))
    try:
        from buffers.rollout import SampleTable
        from ppo.agent import Agent
        from ppo.compiled_step import CompiledStep
        from ppo.config import PPOSettings
        from ppo.update import make_optimizer, ppo_loss
    finally:
        sys.path.pop(0)
    settings = PPOSettings(compile=True)
    torch.manual_seed(seed)
    agent = Agent(27, 8)
    optimizer = make_optimizer(agent, settings, torch.device("cpu"), graphs=False)
    options = {"minibatches_per_call": per_call} if per_call != 1 else {}  # older checkouts take one
    step = CompiledStep(agent, optimizer, settings, ppo_loss, **options)
    table = SampleTable(2048, 27, 8, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    table.data.copy_(torch.randn(table.data.shape, generator=generator) * 0.5)
    table.data[:, -1] = 1.0  # every sample valid
    calls = 32 // per_call
    order = torch.randperm(2048, generator=generator).view(calls, per_call, 64)
    takes_pairs = hasattr(step, "minibatches_per_call")
    total = torch.zeros(6)

    def run(index: int) -> None:
        rows = order[index % calls]
        step(table, rows if takes_pairs else rows[0], total)

    return run, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs="+", type=Path, default=[ROOT],
                        help="repository roots whose CompiledStep to time (default: this one)")
    parser.add_argument("--per-call", nargs="+", type=int, default=[1, 2], help="minibatches per compiled call")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as train.py
    variants = {}
    for checkout in args.checkouts:
        for per_call in args.per_call:
            if 32 % per_call:
                parser.error(f"--per-call {per_call} does not divide the 32 minibatches of an epoch")
            run, calls = load_step(checkout.resolve(), per_call)
            start = time.perf_counter()
            run(0)
            compile_s = time.perf_counter() - start
            for index in range(1, 2 * calls):
                run(index)
            name = f"{checkout} x{per_call}"
            variants[name] = (run, calls, compile_s, [])
            print(f"{name}: compiled in {compile_s:.1f} s", flush=True)
    for _ in range(args.rounds):
        for run, calls, _, times in variants.values():
            start = time.perf_counter()
            for index in range(10 * calls):
                run(index)
            times.append((time.perf_counter() - start) / 320 * 1e6)
    print(f"\nus per minibatch step, median (range) over {args.rounds} alternating rounds of 320 steps:")
    for name, (_, _, compile_s, times) in variants.items():
        spread = f"{min(times):.0f}-{max(times):.0f}"
        print(f"  {name}: {statistics.median(times):.0f} ({spread}); compile {compile_s:.1f} s")


if __name__ == "__main__":
    main()
