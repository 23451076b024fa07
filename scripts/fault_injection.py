"""Kill training with SIGKILL at random moments, resume it in place each time, and count what was lost.

    python scripts/fault_injection.py --kills 20 --seed 0

One run dir, `checkpoint.every=1` (a save every iteration, so kills land in saves too). Each round starts
train.py (the first fresh, every later one with `resume=` into the same dir), waits until it has started
training, sleeps a random time, and sends SIGKILL to its whole process group. After each kill the
checkpoint must load and be at a step no earlier than before the round; each resume must say in
train.log that it continued from exactly that checkpoint's step. A last resume then trains two more
iterations and must exit 0. Prints one line per round and a summary; exits 1 if anything was lost.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ppo.checkpoint import CHECKPOINT_DIR, LAST, CheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]  # train.py's


@dataclass
class Tally:
    kills: int = 0
    in_save: int = 0  # kills that left a `last.tmp` behind: the process died while writing a checkpoint
    lost: int = 0  # a kill after which no loadable checkpoint at the round's starting step (or later) was left
    resumes: int = 0
    continued: int = 0  # resumes whose train.log names the checkpoint's step as where they continued
    problems: list[str] = field(default_factory=list)


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run dir's checkpoint, or None if there is none or it does not load."""
    path = run_dir / CHECKPOINT_DIR / LAST
    if not path.exists():
        return None
    try:
        return int(load_checkpoint(path, torch.device("cpu"))["global_step"])
    except CheckpointError:
        return None


def log_text(run_dir: Path) -> str:
    path = run_dir / "train.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for(condition, process: subprocess.Popen, timeout: float) -> bool:
    """Poll until `condition()` holds; False if the process ended or the time ran out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return condition()
        time.sleep(0.02)
    return False


def train_command(args, run_dir: Path, resume: bool, total_timesteps: int) -> list[str]:
    command = [sys.executable, str(ROOT / "train.py"), f"env={args.env}", f"env.num_envs={args.num_envs}",
               f"ppo.num_steps={args.num_steps}", "ppo.num_minibatches=2", "ppo.update_epochs=2",
               "ppo.compile=false",  # no seconds of compiling at each start: the kills land in training
               f"total_timesteps={total_timesteps}", "checkpoint.every=1", "device=cpu", f"seed={args.seed}",
               f"hydra.run.dir={run_dir}"]
    return command + ([f"resume={run_dir}"] if resume else [])


def start(command: list[str], log: Path) -> subprocess.Popen:
    # A process group of its own: killpg also ends the processes it starts (torch.compile's workers).
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def round_of(args, run_dir: Path, tally: Tally, rng: random.Random, number: int, console: Path) -> bool:
    """One start (or resume), one SIGKILL at a random moment after training began; False to stop."""
    before = checkpoint_step(run_dir)
    resuming = before is not None
    log_before = len(log_text(run_dir))
    process = start(train_command(args, run_dir, resuming, args.never_reached), console)
    # Training has begun once train.log says where it starts (a resume) or the first checkpoint exists.
    if resuming:
        marker = f"resumed from {run_dir / CHECKPOINT_DIR / LAST} at step {before:,}"
        began = wait_for(lambda: "resumed from" in log_text(run_dir)[log_before:], process, args.start_timeout)
    else:
        began = wait_for(lambda: checkpoint_step(run_dir) is not None, process, args.start_timeout)
    if not began:
        process.kill()
        process.wait()
        tally.problems.append(f"round {number}: train.py did not start training within {args.start_timeout:.0f} s "
                              f"(exit {process.returncode}); see {console}")
        return False
    if resuming:
        tally.resumes += 1
        if marker in log_text(run_dir)[log_before:]:
            tally.continued += 1
        else:
            tally.problems.append(f"round {number}: the resume did not say it continued at step {before:,}")
    time.sleep(rng.uniform(0, args.max_delay))
    if process.poll() is not None:
        tally.problems.append(f"round {number}: train.py ended by itself (exit {process.returncode}); see {console}")
        return False
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    tally.kills += 1
    in_save = (run_dir / CHECKPOINT_DIR / LAST).with_suffix(".tmp").exists()
    tally.in_save += in_save
    after = checkpoint_step(run_dir)
    lost = after is None or (before is not None and after < before)
    tally.lost += lost
    if lost:
        tally.problems.append(f"round {number}: checkpoint at step {after} after the kill, {before} before")
    print(f"round {number:3d}: killed at checkpoint step {after if after is not None else '-':>8}"
          f"{' (mid-save)' if in_save else '':11} {'LOST' if lost else 'ok'}", flush=True)
    return not lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="how many SIGKILLs (default 20)")
    parser.add_argument("--env", default="InvertedPendulum-v4")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=16, help="steps per env per iteration: small, so saves are "
                                                                   "a large share of the time")
    parser.add_argument("--max-delay", type=float, default=2.0, help="the kill comes 0..this many seconds after "
                                                                     "training began (default 2)")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("--time-limit", type=float, default=900.0, help="stop starting rounds after this many seconds")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill times and the training run")
    parser.add_argument("--dir", type=Path, help="the run dir (default: a new temporary dir, removed at the end)")
    args = parser.parse_args()
    args.never_reached = 10**9

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="fault_injection_") as scratch:
        run_dir = (args.dir or Path(scratch) / "run").resolve()
        console = Path(scratch) / "console.txt"
        tally, began = Tally(), time.monotonic()
        print(f"{args.kills} SIGKILLs of `train.py env={args.env}` (checkpoint.every=1), run dir {run_dir}")
        for number in range(1, args.kills + 1):
            if time.monotonic() - began > args.time_limit:
                tally.problems.append(f"time limit of {args.time_limit:.0f} s reached after {tally.kills} kills")
                break
            if not round_of(args, run_dir, tally, rng, number, console):
                break

        final_ok = False
        step = checkpoint_step(run_dir)
        if step is not None and not tally.problems:
            target = step + 2 * args.num_envs * args.num_steps
            finish = subprocess.run(train_command(args, run_dir, True, target), cwd=ROOT, capture_output=True,
                                    text=True)
            final_ok = finish.returncode == 0 and checkpoint_step(run_dir) == target
            if not final_ok:
                tally.problems.append(f"the last resume to step {target:,} exited {finish.returncode}: "
                                      f"{(finish.stderr.strip().splitlines() or [''])[-1]}")
        stale = (run_dir / CHECKPOINT_DIR / LAST).with_suffix(".tmp").exists()
        if stale:
            tally.problems.append("a last.tmp outlived the resumes")

        print(f"kills: {tally.kills} ({tally.in_save} mid-save), lost checkpoints: {tally.lost}, resumes that "
              f"continued: {tally.continued} of {tally.resumes}, last resume finished: {'yes' if final_ok else 'no'}, "
              f"{time.monotonic() - began:.0f} s")
        for problem in tally.problems:
            print(f"problem: {problem}")
        return 0 if final_ok and not tally.problems and tally.continued == tally.resumes else 1


if __name__ == "__main__":
    sys.exit(main())
