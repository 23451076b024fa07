"""Return against wall-clock and against steps, for runs side by side (e.g. MuJoCo Warp beside envpool).

    python scripts/plot_time_to_score.py runs/Ant-v5/seed1_* runs/Humanoid-v5/seed1_* --out curves.png
    python scripts/plot_time_to_score.py RUN ... --score 5000      # and when each run first reached 5000
    python scripts/plot_time_to_score.py runs/*/ --by-task --out seconds.png   # a panel per task, its reference

Wall-clock counts from the command's start (run_info.json's `started`, to the second), so it includes the
imports, the first iteration's compiles and warm-up; for runs from before that was recorded, from the
run's first line in train.log. Each run is
labelled with its task, backend and env count (its checkpoint's settings) and its GPU (run_info.json).
Prints a line per run: the last return logged, and with --score the first step and second at which the
return reached it. `--by-task` draws one panel per task against seconds, every seed of it, with the
published score for the runs' step budget (scripts/summarize_results.py's references) as the line to reach.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import sys
from pathlib import Path
from typing import NamedTuple

from summarize_results import reference

from ppo.config import ConfigError
from ppo.run.records import check_tool_output


class Curve(NamedTuple):
    label: str
    env_id: str
    budget: int  # total_timesteps the run was asked for
    name: str  # the run dir's name
    points: list[tuple[int, float, float]]  # (step, seconds since the command, mean return)


def curve(run_dir: Path) -> Curve:
    """A run dir's training returns against steps and seconds, labelled from its checkpoint's settings."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    info = json.loads((run_dir / "run_info.json").read_text())
    settings = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["settings"]
    env = settings["env"]
    label = f"{env['id']} ({env['backend']}, {env['num_envs']} envs; {info.get('gpu') or 'CPU'}), {run_dir.name}"
    start = info.get("started")  # the command's start (ppo.run.records.write_run_info)
    if start is None:  # a run from before it was recorded: its first line in train.log
        first_line = (run_dir / "train.log").read_text().splitlines()[0]
        start = datetime.datetime.strptime(first_line[1:20], "%Y-%m-%d %H:%M:%S").timestamp()
    files = [f for f in glob.glob(str(run_dir / "events.out.tfevents.*")) if f[-1].isdigit()]
    events = EventAccumulator(files[0], size_guidance={"scalars": 0})
    events.Reload()
    points = [(e.step, e.wall_time - start, e.value) for e in events.Scalars("charts/episodic_return")]
    return Curve(label, env["id"], int(settings["total_timesteps"]), run_dir.name, points)


def target(run: Curve, score: float | None) -> float | None:
    """The score a run is measured against: --score, else with --by-task its task's published one."""
    if score is not None:
        return score
    public = reference(run.env_id, run.budget)
    return public[0] if public else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run dirs (with run_info.json, train.log and TensorBoard events)")
    parser.add_argument("--out", help="the PNG to write (two panels: against seconds, against steps; "
                                      "--by-task: a panel per task)")
    parser.add_argument("--score", type=float, help="say when each run's return first reached this")
    parser.add_argument("--by-task", action="store_true",
                        help="one panel per task against seconds, with the task's published score at the runs' budget")
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
    for run in curves:
        step, seconds, value = run.points[-1]
        line = f"{run.label}: return {value:.1f} at step {step:,}, {seconds:.0f} s"
        score = target(run, args.score) if args.score is not None or args.by_task else None
        if score is not None:
            hit = next((p for p in run.points if p[2] >= score), None)
            line += f"; first >= {score:g} at step {hit[0]:,}, {hit[1]:.0f} s" if hit else f"; never >= {score:g}"
        print(line)
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        (by_task if args.by_task else side_by_side)(plt, curves, args.score)
        plt.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")


def side_by_side(plt, curves: list[Curve], score: float | None) -> None:
    """Every run in two panels: against seconds and against steps."""
    figure, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4))
    for run in curves:
        steps, seconds, values = zip(*run.points, strict=True)
        by_time.plot(seconds, values, label=run.label)
        by_step.plot(steps, values, label=run.label)
    by_time.set_xlabel(SECONDS)
    by_step.set_xlabel("environment steps")
    for axes in (by_time, by_step):
        axes.set_ylabel("mean episodic return (training)")
        axes.grid(alpha=0.3)
        if score is not None:
            axes.axhline(score, color="gray", linestyle="--", linewidth=1)
    by_time.legend(fontsize=7, loc="lower right")
    figure.tight_layout()


def by_task(plt, curves: list[Curve], score: float | None) -> None:
    """A panel per task against seconds, its runs labelled by run dir, and the score to reach."""
    tasks = sorted({run.env_id for run in curves})
    figure, panels = plt.subplots(1, len(tasks), figsize=(3.4 * len(tasks), 3.4), squeeze=False)
    for axes, task in zip(panels[0], tasks, strict=True):
        runs = [run for run in curves if run.env_id == task]
        for run in runs:
            _, seconds, values = zip(*run.points, strict=True)
            axes.plot(seconds, values, linewidth=1, label=run.name)
        if (line := target(runs[0], score)) is not None:
            public = reference(task, runs[0].budget)
            label = f"{score:g}" if score is not None else f"{public[1]}, {runs[0].budget / 1e6:g}M"
            axes.axhline(line, color="black", linestyle="--", linewidth=1, label=label)
        axes.set_title(task, fontsize=10)
        axes.set_xlabel(SECONDS, fontsize=7)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6, loc="best")
    panels[0][0].set_ylabel("mean episodic return (training)")
    figure.tight_layout()


SECONDS = "seconds since the command started (compiles included)"


if __name__ == "__main__":
    main()
