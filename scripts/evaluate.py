"""Evaluate a checkpoint: deterministic actions (the policy mean), frozen normalisers, N episodes.

    python scripts/evaluate.py runs/Ant-v4/seed1_2026-11-29_10-00-00 --episodes 10
    python scripts/evaluate.py path/to/last.pt --episodes 5 --device cpu
    python scripts/evaluate.py <run dir> --backend gymnasium   # the same policy on another simulator
    python scripts/evaluate.py <run dir> --backend mjwarp --device cuda --episodes 1000   # MuJoCo Warp worlds
    python scripts/evaluate.py <run dir> --episodes 3 --video   # and an MP4 of each, in <run dir>/videos

Prints the mean and std of the episodic returns (raw environment rewards). With `--video` the episodes
run one by one on gymnasium's own env of the task, which renders them (MuJoCo's offscreen renderer:
OSMesa or EGL on a machine without a display).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

import ppo.policy
from ppo.config import ConfigError, check_seed, resolve_device
from ppo.envs import VecEnv, make_envs
from ppo.policy.video import VideoError
from ppo.run.checkpoint import CheckpointError, resolve_checkpoint
from ppo.run.records import check_tool_output


def envs_and_policy(checkpoint_path: str, device: torch.device, seed: int,
                **env_overrides) -> tuple[VecEnv, ppo.policy.Policy]:
    """`(envs, policy)` of a run's checkpoint: its task's envs (`env_overrides` replace `env.*`
    settings, e.g. `num_envs`, `backend`) and its policy (`ppo.policy`: normalisers frozen)."""
    policy = ppo.policy.load_policy(checkpoint_path, device, env_overrides.get("backend"), "--backend ")
    envs = make_envs(dataclasses.replace(policy.settings.env, **env_overrides), device, seed)
    return envs, policy


@torch.no_grad()
def evaluate(checkpoint_path: str, episodes: int, device: torch.device, seed: int = 12345,
             num_envs: int | None = None, backend: str | None = None) -> list[float]:
    """`backend` (envpool, gymnasium or mjwarp) replays the policy on another simulator than it trained
    on: the same task's scores differ between simulator builds (docs/results.md), and this asks whether
    the policy or the simulator makes the difference. On MuJoCo Warp, `num_envs` worlds run on `device`
    at once (a GPU's thousands give hundreds of episodes in one episode's time)."""
    overrides = {key: value for key, value in (("num_envs", num_envs), ("backend", backend)) if value is not None}
    envs, policy = envs_and_policy(checkpoint_path, device, seed, **overrides)
    # The same number of episodes from every env, taken in env order: the first episodes to end are
    # the short ones (falls), so keeping whichever ended first would bias the mean low.
    per_env = math.ceil(episodes / envs.num_envs)
    returns: list[list[float]] = [[] for _ in range(envs.num_envs)]
    running = torch.zeros(envs.num_envs, dtype=torch.float64, device=device)
    dummy = torch.zeros(envs.num_envs, dtype=torch.bool, device=device)
    obs = envs.reset(seed)
    while min(len(r) for r in returns) < per_env:
        obs, reward, terminated, truncated = envs.step(policy.act(obs))
        done = (terminated | truncated) & ~dummy  # the step after an episode is autoreset's dummy
        running += torch.where(dummy, 0.0, reward.double())
        for env in done.nonzero().flatten().tolist():
            returns[env].append(float(running[env]))
        running[done] = 0.0
        dummy = done
    envs.close()
    return take_evenly(returns, episodes)


def record_videos(checkpoint_path: str, episodes: int, seed: int, directory: str | None, width: int,
                  height: int, strip: str | None = None) -> list[float]:
    """Each episode on gymnasium's env of the task, rendered and written to `directory` (default: the run
    dir's videos/) as eval_seed<seed>_<i>.mp4, and the first one's frames side by side to `strip` (a PNG)
    if given; their returns."""
    from pathlib import Path

    from ppo.policy.video import render_episode, use_headless_gl, write_frame_strip, write_mp4
    from ppo.run.checkpoint import resolve_checkpoint, run_dir_of

    path = resolve_checkpoint(checkpoint_path)
    directory = Path(directory) if directory else run_dir_of(path) / "videos"
    videos = [directory / f"eval_seed{seed}_{episode}.mp4" for episode in range(episodes)]
    for video in videos:  # before anything renders
        check_tool_output(video, path, "--video")
    use_headless_gl()
    policy = ppo.policy.load_policy(checkpoint_path, "cpu", "gymnasium", "--backend ")
    returns = []
    for episode, video in enumerate(videos):
        frames, episodic_return, fps = render_episode(policy, seed + episode, width, height, max_steps=10**9)
        video = write_mp4(frames, video, fps)
        print(f"{video}: {len(frames) - 1} steps, return {episodic_return:.2f}", flush=True)
        if strip and episode == 0:
            print(f"{write_frame_strip(frames, strip, fps)}: 5 frames of episode 0's first 8 seconds", flush=True)
        returns.append(episodic_return)
    return returns


def take_evenly(per_env: list[list[float]], count: int) -> list[float]:
    """`count` returns, round by round over the envs (each env's first episode, then each env's
    second, ...), so that no env's long or short episodes crowd out the others'."""
    needed = math.ceil(count / len(per_env))
    if any(len(r) < needed for r in per_env):
        raise ValueError(f"{count} episodes over {len(per_env)} envs need {needed} from each, got "
                         f"{[len(r) for r in per_env]}")
    rounds = zip(*(r[:needed] for r in per_env), strict=True)
    return [value for one_round in rounds for value in one_round][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run dir or a checkpoint file")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to average (default: 10)")
    parser.add_argument("--num-envs", type=int, default=None, help="default: the run's env.num_envs")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=int, default=12345,
                        help="seeds the envs (default: 12345, apart from the training seeds)")
    parser.add_argument("--backend", choices=["envpool", "gymnasium", "mjwarp"], default=None,
                        help="simulate with this backend instead of the run's env.backend (mjwarp: MuJoCo Warp "
                             "worlds on --device)")
    parser.add_argument("--video", nargs="?", const="", default=None, metavar="DIR",
                        help="write an MP4 of each episode to DIR (default: <run dir>/videos); the episodes run on "
                             "gymnasium's env of the task, which renders them")
    parser.add_argument("--size", default="320x240", help="--video's frame size, WIDTHxHEIGHT (default: 320x240)")
    parser.add_argument("--json", metavar="FILE", help="also write the returns, backend, seed and checkpoint to FILE")
    parser.add_argument("--frame-strip", metavar="PNG", help="with --video: 5 frames of the first episode's first 8 "
                                                             "seconds side by side, as one picture")
    args = parser.parse_args()
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    if args.num_envs is not None and args.num_envs < 1:
        parser.error(f"--num-envs must be at least 1, got {args.num_envs}")
    try:
        check_seed(args.seed, "--seed")
    except ConfigError as error:
        parser.error(str(error))
    try:
        width, height = (int(n) for n in args.size.lower().split("x"))
        assert width > 0 and height > 0
    except (ValueError, AssertionError):
        parser.error(f"--size must be WIDTHxHEIGHT, e.g. 320x240; got {args.size!r}")
    if args.frame_strip and Path(args.frame_strip).suffix.lower() != ".png":
        parser.error(f"--frame-strip writes a PNG picture: give a file name ending in .png, got {args.frame_strip!r}")
    try:
        device = resolve_device(args.device, "--device") if args.video is None else None  # the options first
        checkpoint = resolve_checkpoint(args.checkpoint)
        for option, output in (("--json", args.json), ("--frame-strip", args.frame_strip)):
            if output:  # before the episodes run
                check_tool_output(output, checkpoint, option)
        if args.video is not None:
            if args.backend in ("envpool", "mjwarp") or args.num_envs is not None:
                parser.error("--video runs its episodes on gymnasium's env, one by one: leave out --backend "
                             f"{args.backend} and --num-envs" if args.backend else
                             "--video runs its episodes on gymnasium's env, one by one: leave out --num-envs")
            returns = record_videos(args.checkpoint, args.episodes, args.seed, args.video or None, width, height,
                                    args.frame_strip)
        else:
            if args.frame_strip:
                parser.error("--frame-strip comes with --video")
            returns = evaluate(args.checkpoint, args.episodes, device, args.seed, args.num_envs, args.backend)
        returns = torch.tensor(returns, dtype=torch.float64)
    except FileNotFoundError as error:
        sys.exit(f"error: {args.checkpoint}: {error}")
    except (ConfigError, CheckpointError, VideoError) as error:  # e.g. a backend without the run's task
        sys.exit(f"error: {error}")
    except OSError as error:  # a full disk or a read-only dir under a video or a frame strip
        sys.exit(f"error: cannot write {error.filename or 'a video'}: {error.strerror or error}")
    print(f"{len(returns)} episodes: mean return {returns.mean():.2f} +- {returns.std(unbiased=False):.2f} "
          f"(min {returns.min():.2f}, max {returns.max():.2f})")
    if args.json:
        record = {"checkpoint": str(checkpoint), "backend": "gymnasium" if args.video is not None else args.backend,
                  "seed": args.seed, "returns": returns.tolist()}
        try:
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        except OSError as error:
            sys.exit(f"error: cannot write {args.json}: {error.strerror or error}")


if __name__ == "__main__":
    main()
