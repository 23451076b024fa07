"""Return against wall-clock and against steps, for runs side by side (e.g. MuJoCo Warp beside envpool).

    python scripts/plot_time_to_score.py runs/Ant-v5/seed1_* runs/Humanoid-v5/seed1_* --out curves.png
    python scripts/plot_time_to_score.py RUN ... --score 5000      # and when each run first reached 5000

Wall-clock counts from the command's start (run_info.json's `started`, to the second), so it includes the
imports, the first iteration's compiles and warm-up; for runs from before that was recorded, from the
run's first line in train.log. Each run is
labelled with its task, backend and env count (its checkpoint's settings) and its GPU (run_info.json).
Prints a line per run: the last return logged, and with --score the first step and second at which the
return reached it.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import sys
from pathlib import Path

from ppo.config import ConfigError
from ppo.run.records import check_tool_output


def curve(run_dir: Path) -> tuple[str, list[tuple[int, float, float]]]:
    """(label, [(step, seconds since the run's first line, mean return)]) of a run dir."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    info = json.loads((run_dir / "run_info.json").read_text())
    env = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["settings"]["env"]
    label = f"{env['id']} ({env['backend']}, {env['num_envs']} envs; {info.get('gpu') or 'CPU'}), {run_dir.name}"
    start = info.get("started")  # the command's start (ppo.run.records.write_run_info)
    if start is None:  # a run from before it was recorded: its first line in train.log
        first_line = (run_dir / "train.log").read_text().splitlines()[0]
        start = datetime.datetime.strptime(first_line[1:20], "%Y-%m-%d %H:%M:%S").timestamp()
    files = [f for f in glob.glob(str(run_dir / "events.out.tfevents.*")) if f[-1].isdigit()]
    events = EventAccumulator(files[0], size_guidance={"scalars": 0})
    events.Reload()
    return label, [(e.step, e.wall_time - start, e.value) for e in events.Scalars("charts/episodic_return")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run dirs (with run_info.json, train.log and TensorBoard events)")
    parser.add_argument("--out", help="the PNG to write (two panels: against seconds, against steps)")
    parser.add_argument("--score", type=float, help="say when each run's return first reached this")
    args = parser.parse_args()
    if args.out:
        try:
            check_tool_output(args.out)
        except ConfigError as error:
            sys.exit(f"error: {error}")
    curves = []
    for run in args.runs:
        try:
            curves.append(curve(Path(run)))
        except (OSError, IndexError, KeyError, ValueError, RuntimeError) as error:
            sys.exit(f"error: {run}: not a run dir with run_info.json, train.log, a checkpoint and events ({error})")
    for label, points in curves:
        step, seconds, value = points[-1]
        line = f"{label}: return {value:.1f} at step {step:,}, {seconds:.0f} s"
        if args.score is not None:
            hit = next((p for p in points if p[2] >= args.score), None)
            line += (f"; first >= {args.score:g} at step {hit[0]:,}, {hit[1]:.0f} s" if hit
                     else f"; never >= {args.score:g}")
        print(line)
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4))
        for label, points in curves:
            steps, seconds, values = zip(*points, strict=True)
            by_time.plot(seconds, values, label=label)
            by_step.plot(steps, values, label=label)
        by_time.set_xlabel("seconds since the command started (compiles included)")
        by_step.set_xlabel("environment steps")
        for axes in (by_time, by_step):
            axes.set_ylabel("mean episodic return (training)")
            axes.grid(alpha=0.3)
            if args.score is not None:
                axes.axhline(args.score, color="gray", linestyle="--", linewidth=1)
        by_time.legend(fontsize=7, loc="lower right")
        figure.tight_layout()
        figure.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
