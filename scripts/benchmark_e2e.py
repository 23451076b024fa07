"""End-to-end throughput, in one process run: the raw simulator, our training loop, a CleanRL-style loop.

    python scripts/benchmark_e2e.py                                # Ant-v4, default config, device auto
    python scripts/benchmark_e2e.py --device cuda --iterations 40 env=Hopper-v4 env.num_envs=256
    python scripts/benchmark_e2e.py --device cuda --worlds 1024,4096,16384 +experiment=mjwarp_ant

Trailing `key=value` arguments are Hydra overrides of configs/train.yaml, as for train.py.
With `env.backend=mjwarp` the raw rate is MuJoCo Warp's (ppo.envs.mjwarp, random actions, synchronised at
the end), `--worlds` measures each world count in turn, and the CleanRL-style loop (an envpool loop)
is skipped. Each run also reports the update's achieved TFLOP/s (its matrix products' FLOPs over
`time/update`) beside the GPU's dense peak for `ppo.matmul_precision` (fp32 or TF32).
1. raw: envpool stepping with random actions, same num_envs and threads, no learning; measured
   before and after ours (a shared GPU host's rate drifts by 20-30% between runs), and the ratio
   taken against their mean; threads pinned as training pins them (`env.pin_threads`), and the
   other way once more at the end, so neither setting's raw rate is hidden;
2. ours: `ppo.trainer.train()` as `python train.py` runs it; steady state = median `time/iteration`
   after the warm-up iterations, with the median time breakdown (env, inference, GAE, update);
3. CleanRL-style: scripts/cleanrl_reference.py with the same network, batch and minibatches, in two
   layouts: CleanRL's own default (1 env x `batch` steps, the setting of CleanRL's own script, which
   measured ~310 steps/s on a 16-core H200 host) and ours (`num_envs` x `num_steps`, which amortises
   the per-step host round trip over 64 envs and so makes the baseline ~4x faster). `--cleanrl` picks
   one or both.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from cleanrl_reference import cleanrl_style_sps
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ppo.config import ConfigError, EnvSettings, ModelSettings, resolve_device, settings_from_dict
from ppo.envs import envpool_threads, import_envpool, make_envs, observation_size, pins_threads, task_spaces
from ppo.trainer import train
from ppo.update import compiles

ROOT = Path(__file__).resolve().parents[1]


# Dense peak TFLOP/s from NVIDIA's datasheets, by `ppo.matmul_precision`: fp32 on CUDA cores ("ieee") and
# TF32 on tensor cores. The H200 has the H100 SXM's compute; the PCIe H100 less.
PEAK_TFLOPS = {"H100 PCIe": {"ieee": 51.2, "tf32": 378.0}, "H100": {"ieee": 66.9, "tf32": 494.7},
               "H200": {"ieee": 66.9, "tf32": 494.7}}


def peak_tflops(gpu: str, precision: str) -> float | None:
    """The datasheet's dense peak of `gpu` (torch's device name) at `precision`; None for a GPU not listed."""
    return next((peaks[precision] for name, peaks in PEAK_TFLOPS.items() if name in gpu), None)


def update_flop_per_sample(obs_dim: int, act_dim: int, model: ModelSettings) -> int:
    """The matrix products' FLOPs of one sample's forward and backward pass in the update: a layer of `i`
    inputs and `o` outputs costs 2io forward, 2io for its weights' gradient and 2io for its input's
    gradient (not for the observations'). Separate actor and critic, or one shared trunk and two heads."""
    def layers(sizes: list[int]) -> int:
        pairs = list(zip(sizes[:-1], sizes[1:], strict=False))
        return sum(6 * i * o for i, o in pairs)

    hidden, first = list(model.hidden_sizes), 2 * obs_dim * model.hidden_sizes[0]  # no input gradient there
    if model.shared_trunk:
        return layers([obs_dim, *hidden]) - first + layers([hidden[-1], act_dim]) + layers([hidden[-1], 1])
    return layers([obs_dim, *hidden, act_dim]) + layers([obs_dim, *hidden, 1]) - 2 * first


def raw_env_sps(env: EnvSettings, pinned: bool, steps: int, seed: int = 1) -> float:
    envpool = import_envpool()
    envs = envpool.make(env.id, env_type="gymnasium", num_envs=env.num_envs, seed=seed,
                        num_threads=envpool_threads(env), thread_affinity_offset=0 if pinned else -1)
    num_envs = env.num_envs
    envs.reset()
    low, high = envs.action_space.low, envs.action_space.high
    rng = np.random.default_rng(seed)
    actions = [rng.uniform(low, high, (num_envs, *low.shape)).astype(np.float32) for _ in range(16)]
    for i in range(20):
        envs.step(actions[i % 16])
    start = time.perf_counter()
    for i in range(steps):
        envs.step(actions[i % 16])
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


def raw_mjwarp_sps(env: EnvSettings, device: torch.device, steps: int, seed: int = 1) -> float:
    envs = make_envs(env, device, seed)  # MuJoCo Warp's worlds: one simulator on the device
    envs.reset(seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    low, high = envs.action_low, envs.action_high
    actions = [low + (high - low) * torch.rand(env.num_envs, envs.act_dim, generator=generator, device=device)
               for _ in range(16)]
    for i in range(5):
        envs.step(actions[i % 16])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i in range(steps):
        envs.step(actions[i % 16])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * env.num_envs / elapsed


def our_sps(settings, device: torch.device, warmup: int) -> tuple[float, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as run_dir:
        train(settings, run_dir, device)
        events = EventAccumulator(glob.glob(f"{run_dir}/events.out.tfevents.*")[0])
        events.Reload()
        done, planned = len(events.Scalars("time/iteration")), settings.total_timesteps // settings.batch_size
        if done < planned:  # stopped by a signal (a time limit's SIGTERM): a median of the warm-up is no rate
            sys.exit(f"error: the training run stopped after {done} of its {planned} iterations ({warmup} of them "
                     "warm-up), so there is no steady state to report")
        tags = ("time/iteration", "time/rollout", "time/env", "time/inference", "time/gae", "time/update")
        breakdown = {tag: statistics.median(e.value for e in events.Scalars(tag)[warmup:]) for tag in tags}
    return settings.batch_size / breakdown["time/iteration"], breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    parser.add_argument("--iterations", type=int, default=20, help="measured iterations (after warm-up)")
    parser.add_argument("--warmup", type=int, default=3, help="iterations run before timing (compiles, graph captures)")
    parser.add_argument("--cleanrl", choices=("both", "cleanrl-layout", "our-layout", "none"), default="both",
                        help="which CleanRL-style baselines to run (see above)")
    parser.add_argument("--skip-cleanrl", action="store_true", help="same as --cleanrl none")
    parser.add_argument("--worlds", help="env.backend=mjwarp: comma-separated world counts, each measured in turn")
    args, overrides = parser.parse_known_args()
    if args.worlds:
        for count in args.worlds.split(","):
            measure(args, [*overrides, f"env.num_envs={int(count)}"])
    else:
        measure(args, overrides)


def measure(args, overrides: list[str]) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        device = resolve_device(args.device, "--device")
    except ConfigError as error:
        sys.exit(f"error: {error}")
    if config["ppo"]["compile"] == "auto":
        # What `auto` means for the configured run (on a CPU it depends on the run's length), not for
        # the few iterations measured here.
        config["ppo"]["compile"] = compiles(settings_from_dict(config).ppo, device, config["total_timesteps"])
    config.update(device=str(device), log_every_s=1e9, checkpoint={"every": 0})
    batch = config["env"]["num_envs"] * config["ppo"]["num_steps"]
    config["total_timesteps"] = batch * (args.warmup + args.iterations)
    settings = settings_from_dict(config)
    env = settings.env

    cpu = platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "-"
    print(f"# {env.id}, {env.num_envs} envs x {settings.ppo.num_steps} steps, {settings.ppo.update_epochs} epochs x "
          f"{settings.ppo.num_minibatches} minibatches, ppo.compile={settings.ppo.compile}; device {device} ({gpu}); "
          f"{os.cpu_count()} CPUs ({cpu}); "
          f"torch {torch.__version__}; {time.strftime('%Y-%m-%d')}", flush=True)
    raw_steps = max(200, 20000 // env.num_envs)
    if env.backend == "mjwarp":
        raw_before = raw_mjwarp_sps(env, device, steps=max(20, raw_steps // 10))
        print(f"raw MuJoCo Warp, random actions: {raw_before:10,.0f} steps/s", flush=True)
        ours, breakdown = our_sps(settings, device, args.warmup)
        raw_after = raw_mjwarp_sps(env, device, steps=max(20, raw_steps // 10))
        raw = (raw_before + raw_after) / 2
        print(f"raw MuJoCo Warp again:           {raw_after:10,.0f} steps/s (mean {raw:,.0f})", flush=True)
        print(f"ours (steady state):             {ours:10,.0f} steps/s  = {ours / raw:5.1%} of raw (the mean)",
              flush=True)
        args.cleanrl, args.skip_cleanrl = "none", True  # its loop steps envpool
    else:
        pinned = pins_threads(env, device)  # raw steps the envs as training does (env.pin_threads)
        pinning = "pinned" if pinned else "unpinned"
        raw_before = raw_env_sps(env, pinned, steps=raw_steps)
        print(f"raw envpool, random actions:   {raw_before:10,.0f} steps/s ({envpool_threads(env)} threads, "
              f"{pinning})", flush=True)
        ours, breakdown = our_sps(settings, device, args.warmup)
        raw_after = raw_env_sps(env, pinned, steps=raw_steps)
        raw = (raw_before + raw_after) / 2
        print(f"raw envpool again, after ours: {raw_after:10,.0f} steps/s (mean {raw:,.0f})", flush=True)
        print(f"ours (steady state):           {ours:10,.0f} steps/s  = {ours / raw:5.1%} of raw (the mean)",
              flush=True)
        # The other setting's raw rate too: the ratio above must not gain from a slower raw loop.
        other = raw_env_sps(env, not pinned, steps=raw_steps)
        print(f"raw envpool, {'unpinned' if pinned else 'pinned'} threads:  {other:10,.0f} steps/s -> ours is "
              f"{ours / other:5.1%} of it", flush=True)
    per_iteration = breakdown["time/iteration"]
    # On a GPU simulator the rollout's steps are queued, not waited for: the host's env/inference split
    # says nothing there, so the simulation's share is what the raw rate takes for the same steps.
    parts = (("time/rollout", "time/gae", "time/update") if env.backend == "mjwarp"
             else ("time/env", "time/inference", "time/gae", "time/update"))
    for tag in parts:
        print(f"    {tag:16s} {breakdown[tag] * 1e3:9.2f} ms/iteration ({breakdown[tag] / per_iteration:6.2%})")
    observation_space, action_space = task_spaces(env)
    flop = (update_flop_per_sample(observation_size(observation_space), int(np.prod(action_space.shape)),
                                    settings.model) * settings.batch_size * settings.ppo.update_epochs)
    achieved = flop / breakdown["time/update"] / 1e12
    precision = settings.ppo.matmul_precision if device.type == "cuda" else "ieee"
    peak = peak_tflops(gpu, precision) if device.type == "cuda" else None
    against = (f" = {achieved / peak:5.1%} of the {gpu}'s dense {'TF32' if precision == 'tf32' else 'FP32'} peak "
               f"({peak:g})" if peak else "")
    print(f"    update: {flop / 1e9:,.1f} GFLOP of matrix products an iteration, {achieved:.2f} TFLOP/s{against} "
          f"(ppo.matmul_precision={settings.ppo.matmul_precision})", flush=True)
    if env.backend == "mjwarp":
        simulation = settings.batch_size / raw
        print(f"      of the rollout, simulation at the raw rate {simulation * 1e3:9.2f} ms/iteration "
              f"({simulation / per_iteration:6.2%}); the rest is inference, buffer writes and the task's torch code")
    layouts = {"cleanrl-layout": (1, settings.batch_size, max(2, args.iterations // 8)),
               "our-layout": (env.num_envs, settings.ppo.num_steps, max(1, args.iterations // 2))}
    chosen = "none" if args.skip_cleanrl else args.cleanrl
    for name, (num_envs, num_steps, iterations) in layouts.items():
        if chosen not in ("both", name):
            continue
        reference = cleanrl_style_sps(env.id, num_envs, num_steps, iterations, 1, device,
                                      settings.ppo.num_minibatches, settings.ppo.update_epochs)
        label = f"CleanRL-style, {num_envs} x {num_steps}:"
        print(f"{label:31s}{reference:10,.0f} steps/s  -> ours is {ours / reference:5.1f}x", flush=True)


if __name__ == "__main__":
    main()
