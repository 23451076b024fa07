"""What `video.every` costs the training loop: the same run with and without videos, alternated.

    python scripts/benchmark_video.py                                  # Ant-v4 defaults, CPU
    python scripts/benchmark_video.py --rounds 3 --every 5 env=Hopper-v4

Each round trains `--iterations` iterations without videos, then the same with `video.every=--every`
(the recorder renders beside the loop throughout), in one process; the ratio of the median seconds per
iteration (after the first, which compiles) is printed per round and over all rounds. Trailing
`key=value` arguments are Hydra overrides of configs/train.yaml, as for train.py.
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

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ppo.config import resolve_device, settings_from_dict
from ppo.trainer import train

ROOT = Path(__file__).resolve().parents[1]


def iteration_seconds(overrides: list[str], iterations: int) -> tuple[list[float], int]:
    """Seconds of each iteration after the first, and how many videos the run wrote."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    config = OmegaConf.to_container(cfg, resolve=True)
    batch = config["env"]["num_envs"] * config["ppo"]["num_steps"]
    config.update(total_timesteps=batch * iterations, log_every_s=1e9, checkpoint={"every": 0})
    settings = settings_from_dict(config)
    with tempfile.TemporaryDirectory() as run_dir:
        train(settings, run_dir, resolve_device(settings.device))
        events = EventAccumulator(glob.glob(f"{run_dir}/events.out.tfevents.*[0-9]")[0])
        events.Reload()
        videos = len(glob.glob(f"{run_dir}/videos/*.mp4"))
        return [e.value for e in events.Scalars("time/iteration")][1:], videos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=80, help="iterations per run (default: 80)")
    parser.add_argument("--every", type=int, default=5, help="video.every of the runs with videos (default: 5)")
    parser.add_argument("--rounds", type=int, default=2, help="without/with pairs (default: 2)")
    args, overrides = parser.parse_known_args()
    print(f"# {' '.join(overrides) or 'defaults'}; {args.iterations} iterations a run, video.every={args.every}; "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); torch {torch.__version__}; "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    without_all, with_all = [], []
    for round_ in range(args.rounds):
        without, _ = iteration_seconds(overrides, args.iterations)
        with_videos, videos = iteration_seconds([*overrides, f"video.every={args.every}"], args.iterations)
        without_all += without
        with_all += with_videos
        ratio = statistics.median(with_videos) / statistics.median(without)
        print(f"round {round_ + 1}: {statistics.median(without) * 1e3:.1f} ms/iteration without videos, "
              f"{statistics.median(with_videos) * 1e3:.1f} with ({videos} videos written): {ratio - 1:+.1%}",
              flush=True)
    ratio = statistics.median(with_all) / statistics.median(without_all)
    print(f"all rounds: the loop with videos takes {ratio - 1:+.1%} per iteration (median of "
          f"{len(with_all)} iterations each)")
    sys.exit(0)


if __name__ == "__main__":
    main()
