"""Where does the GPU time of one PPO update go? (CUDA only; diagnostics, not a benchmark table.)

    python scripts/dev/profile_update.py                 # Ant-v4 sizes, CleanRL's schedule
    python scripts/dev/profile_update.py --compile       # with ppo.compile
    python scripts/dev/profile_update.py --fused         # with ppo.fused_update (one kernel per step)

Builds an agent and a rollout buffer of random data at Ant-v4's sizes (27 observations, 8 actions,
64 envs x 32 steps), runs one update eagerly (the CUDA-graph warm-up), then profiles the next,
replayed one, and prints the kernels by total GPU time with their counts per minibatch step.
"""

from __future__ import annotations

import argparse
import sys

import torch

from buffers import RolloutBuffer
from ppo.agent import Agent, side_by_side_pays
from ppo.config import PPOSettings
from ppo.update import Updater, make_optimizer
from ppo.update import fused as fused_update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--fused", action="store_true", help="ppo.fused_update: one Triton kernel per minibatch step")
    parser.add_argument("--precision", choices=sorted(fused_update.NUM_WARPS), default="tf32",
                        help="with --fused: ppo.fused_precision")
    parser.add_argument("--num-warps", type=int, default=None,
                        help="with --fused: warps per program (default: ppo.update.fused.NUM_WARPS[precision])")
    parser.add_argument("--obs-dim", type=int, default=27)
    parser.add_argument("--act-dim", type=int, default=8)
    parser.add_argument("--rows", type=int, default=25, help="kernels to print")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_update.py needs a CUDA GPU")
    device = torch.device("cuda")
    if args.num_warps is not None:
        fused_update.NUM_WARPS[args.precision] = args.num_warps
    settings = PPOSettings(compile=args.compile, fused_update=args.fused, fused_precision=args.precision)
    minibatch_size = settings.num_steps * 64 // settings.num_minibatches
    side_by_side = args.compile and not args.fused and side_by_side_pays(device, minibatch_size)  # as train.py
    agent = Agent(args.obs_dim, args.act_dim, side_by_side=side_by_side).to(device)
    buffer = RolloutBuffer(settings.num_steps, 64, args.obs_dim, args.act_dim, device)
    for name in ("observations", "actions", "values", "advantages", "returns"):
        getattr(buffer, name).normal_()
    buffer.log_probs.normal_(-2.0)
    updater = Updater(agent, make_optimizer(agent, settings, device, True), settings, graphs=True)
    generator = torch.Generator(device).manual_seed(0)
    updater(buffer, generator)  # eager: warm-up and capture
    updater(buffer, generator)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    updater(buffer, generator)
    end.record()
    end.synchronize()
    steps = settings.update_epochs * settings.num_minibatches
    fused = f"fused ({args.precision}, {fused_update.NUM_WARPS[args.precision]} warps)" if args.fused else "not fused"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, compile={args.compile}, {fused}: one replayed "
          f"update = {steps} minibatch steps, {start.elapsed_time(end):.1f} ms wall")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        updater(buffer, generator)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        sys.exit("the profiler saw no kernels (CUPTI may not trace CUDA graph replays here)")

    def device_us(e) -> float:
        return e.device_time_total or e.self_device_time_total

    kernels.sort(key=device_us, reverse=True)
    total_us = sum(device_us(e) for e in kernels)
    launches = sum(e.count for e in kernels)
    # Per step: the update's whole GPU time over its minibatch steps (the permutations and the
    # table fill, a few kernels per update, included); not an average per kernel, which differs
    # once a step is one or two kernels.
    print(f"# GPU time {total_us / 1e3:.1f} ms in {launches} kernels ({launches / steps:.0f} per step): "
          f"{total_us / steps:.1f} us per minibatch step")
    print(f"{'kernel':70s} {'per step':>8s} {'us each':>8s} {'share':>6s}")
    for e in kernels[:args.rows]:
        print(f"{e.key[:70]:70s} {e.count / steps:8.1f} {device_us(e) / e.count:8.2f} {device_us(e) / total_us:6.1%}")


if __name__ == "__main__":
    main()
