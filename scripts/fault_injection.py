"""Kill training with SIGKILL at random moments, or fill its disk, resume it in place each time, and count
what was lost.

    python scripts/fault_injection.py --kills 20 --seed 0
    python scripts/fault_injection.py --full-disk 10 --seed 0     # a small tmpfs that fills (root on Linux)

One run dir, `checkpoint.every=1` (a save every iteration, so faults land in saves too).

SIGKILL: each round starts train.py (the first fresh, every later one with `resume=` into the same dir),
waits until it has started training, sleeps a random time, and sends SIGKILL to its whole process group.
After each kill the checkpoint must load and be at a step no earlier than before the round; each resume
must say in train.log that it continued from exactly that checkpoint's step.

Full disk: the run dir lies on a tmpfs of its own. Each round gives the disk a random amount of room
beyond what it holds (0 to --max-room bytes in whole 4 KiB pages, about log-uniform; the first
round, --max-room), resumes the run in place (the first round starts it) and
lets it run until the disk is full, wherever that happens: Hydra's record of the command, the log, the
TensorBoard events or a checkpoint. The run must end in exactly one line of stderr that names the full
disk, with exit 1 (while training) or 2 (refused before training: the run dir's first records), and its
checkpoint must load at a step no earlier than before the round. Where no tmpfs can be mounted (not root,
not Linux) the mode is skipped with the reason.

Either way a last resume then trains two more iterations and must exit 0. Prints one line per round and a
summary; exits 1 if anything was lost.
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

from ppo.run.checkpoint import CHECKPOINT_DIR, LAST, CheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]  # train.py's


@dataclass
class Tally:
    kills: int = 0
    in_save: int = 0  # kills that left a `last.tmp` behind: the process died while writing a checkpoint
    lost: int = 0  # a kill after which no loadable checkpoint at the round's starting step (or later) was left
    resumes: int = 0
    continued: int = 0  # resumes whose train.log names the checkpoint's step as where they continued
    fills: int = 0  # full-disk rounds
    one_line: int = 0  # full-disk rounds that ended in one line of stderr naming the full disk, exit 1 or 2
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


def mount_tmpfs(mount: Path, size: int, remount: bool = False) -> str | None:
    """Mount (or resize) a tmpfs of `size` bytes at `mount`; None, or why it could not."""
    options = f"{'remount,' if remount else ''}size={max(size, 4096)}"
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True)
    return None if made.returncode == 0 else (made.stderr.strip() or f"mount exited {made.returncode}")


def used_bytes(mount: Path) -> int:
    stats = os.statvfs(mount)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def fill_round(args, run_dir: Path, mount: Path, tally: Tally, rng: random.Random, number: int) -> bool:
    """Room for a random number of bytes more, a resume (or the first start) until the disk is full; False
    to stop."""
    before = checkpoint_step(run_dir)
    # In whole pages (tmpfs allocates 4 KiB pages), about log-uniform in [0, max_room]: often none or a few, for
    # the small writes of start-up. The first round has room for checkpoints.
    pages = args.max_room // 4096
    room = 4096 * (pages if before is None else int((pages + 1) ** rng.random()) - 1)
    reason = mount_tmpfs(mount, used_bytes(mount) + room, remount=True)
    if reason:
        tally.problems.append(f"round {number}: could not resize the tmpfs: {reason}")
        return False
    try:
        result = subprocess.run(train_command(args, run_dir, before is not None, args.never_reached), cwd=ROOT,
                                capture_output=True, text=True, timeout=args.start_timeout + 300)
    except subprocess.TimeoutExpired:
        tally.problems.append(f"round {number}: train.py did not end on a full disk within its time")
        return False
    tally.fills += 1
    lines = result.stderr.strip().splitlines()
    # A resume that could not claim its dir for want of room is a refusal too ("cannot be made or written").
    ended_well = (result.returncode in (1, 2) and len(lines) == 1 and "No space left on device" in lines[0]
                  and "Traceback" not in result.stderr)
    tally.one_line += ended_well
    after = checkpoint_step(run_dir)
    lost = (before is not None and (after is None or after < before))
    tally.lost += lost
    if not ended_well:
        tally.problems.append(f"round {number}: exit {result.returncode}, stderr: {result.stderr.strip()[-600:]!r}")
    if lost:
        tally.problems.append(f"round {number}: checkpoint at step {after} after the full disk, {before} before")
    if result.returncode == 1 and before is not None:
        tally.resumes += 1
        tally.continued += f"resumed from {run_dir / CHECKPOINT_DIR / LAST} at step {before:,}" in log_text(run_dir)
    where = lines[0][:110] if lines else f"(no line; exit {result.returncode})"
    print(f"round {number:3d}: room {room:7,} bytes, exit {result.returncode}, checkpoint step "
          f"{after if after is not None else '-':>7} {'LOST' if lost else 'ok'}: {where}", flush=True)
    return not lost and ended_well


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="how many SIGKILLs (default 20)")
    parser.add_argument("--full-disk", type=int, default=0, metavar="ROUNDS",
                        help="instead of SIGKILLs: this many rounds of a disk that fills (a tmpfs; root on Linux)")
    parser.add_argument("--max-room", type=int, default=400_000,
                        help="--full-disk: the most bytes of room a round gives (default 400,000)")
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
        mount = Path(scratch) / "disk"
        if args.full_disk:
            if args.dir:
                parser.error("--full-disk makes its own run dir on a tmpfs: leave out --dir")
            mount.mkdir()
            reason = mount_tmpfs(mount, 4096)
            if reason:
                print(f"skipped: --full-disk needs to mount a tmpfs (root on Linux): {reason}")
                return 0
        try:
            return faults(args, rng, Path(scratch), mount)
        finally:
            if args.full_disk:
                subprocess.run(["umount", str(mount)], capture_output=True)


def faults(args, rng: random.Random, scratch: Path, mount: Path) -> int:
    """The rounds (SIGKILLs, or disks that fill), the last resume, the summary; the exit code."""
    run_dir = (mount / "run" if args.full_disk else args.dir or scratch / "run").resolve()
    console = scratch / "console.txt"
    tally, began = Tally(), time.monotonic()
    if args.full_disk:
        print(f"{args.full_disk} full disks under `train.py env={args.env}` (checkpoint.every=1), run dir {run_dir}")
    else:
        print(f"{args.kills} SIGKILLs of `train.py env={args.env}` (checkpoint.every=1), run dir {run_dir}")
    for number in range(1, (args.full_disk or args.kills) + 1):
        if time.monotonic() - began > args.time_limit:
            tally.problems.append(f"time limit of {args.time_limit:.0f} s reached after {number - 1} rounds")
            break
        if args.full_disk:
            if not fill_round(args, run_dir, mount, tally, rng, number):
                break
        elif not round_of(args, run_dir, tally, rng, number, console):
            break
    if args.full_disk:  # room for the last resume
        mount_tmpfs(mount, used_bytes(mount) + 64 * 2**20, remount=True)
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

    faults_done = (f"full disks: {tally.fills} ({tally.one_line} ended in one line)" if args.full_disk
                   else f"kills: {tally.kills} ({tally.in_save} mid-save)")
    print(f"{faults_done}, lost checkpoints: {tally.lost}, resumes that continued: {tally.continued} of "
          f"{tally.resumes}, last resume finished: {'yes' if final_ok else 'no'}, {time.monotonic() - began:.0f} s")
    for problem in tally.problems:
        print(f"problem: {problem}")
    return 0 if final_ok and not tally.problems and tally.continued == tally.resumes else 1


if __name__ == "__main__":
    sys.exit(main())
