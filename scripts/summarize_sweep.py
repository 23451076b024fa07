"""One table and one plot for a multirun dir: every run's overrides, final return, SPS, wall-clock.

    python scripts/summarize_sweep.py multirun/2026-11-29_10-00-00

Final return: the average over (about) the last 100 training episodes, as train.py returns it.
Steps: the last logged step, marked `*` where the run stopped short of its total_timesteps; a run
with nothing logged to score is named on stderr.
SPS and wall-clock as in summarize_results.py: from each process's first to its last logged
iteration ("-" for a run of one iteration).
Writes sweep_summary.csv and sweep_summary.png into the multirun dir and prints the table, best
first within each task (a sweep over several envs ranks each env's runs among themselves: returns
of different tasks do not compare).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from summarize_results import check_dirs_exist, find_runs, format_sps, mean_sps

from ppo.run.records import recorded_overrides

ROOT = Path(__file__).resolve().parents[1]

COLUMNS = ["run", "env", "overrides", "final_return", "steps", "sps", "wall_clock_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="a multirun dir (multirun/<date>)")
    args = parser.parse_args()
    check_dirs_exist(parser, [args.sweep_dir])
    runs = find_runs([args.sweep_dir], complete_only=False)  # a sweep may stop runs early (target-KL, Ctrl-C)
    if not runs:
        sys.exit(f"no runs under {args.sweep_dir}")
    ranked = sorted((({"run": r.path.name, "env": r.env_id,
                       "overrides": " ".join(recorded_overrides(r.path)), "final_return": round(r.score, 2),
                       "steps": r.final_step, "sps": mean_sps([r]),
                       "wall_clock_s": round(r.wall_clock_s, 1)}, r) for r in runs),
                    key=lambda pair: rank(pair[0]))
    rows = [row for row, _ in ranked]
    # Marked: its return is from fewer steps than the others', and ranked beside them it is easy to misread.
    steps = [f"{run.final_step:,}" + "*" * (run.final_step < run.budget) for _, run in ranked]
    with (args.sweep_dir / "sweep_summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    plot(runs, args.sweep_dir / "sweep_summary.png")
    width, env_width = (max(len(row[key]) for row in rows) for key in ("run", "env"))
    steps_width = max(len("steps"), *map(len, steps))
    print(f"{'run':{width}}  {'env':{env_width}}  {'final return':>12}  {'steps':>{steps_width}}  {'SPS':>7}  "
          f"{'wall s':>7}  overrides")
    for row, step in zip(rows, steps, strict=True):
        sps, wall = format_sps(row["sps"]), row["wall_clock_s"]
        print(f"{row['run']:{width}}  {row['env']:{env_width}}  {row['final_return']:12.2f}  {step:>{steps_width}}  "
              f"{sps:>7}  {wall:7.1f}  {row['overrides']}")
    if any(step.endswith("*") for step in steps):
        print("* stopped before its total_timesteps (Ctrl-C, a crash, or still running)")


def rank(row: dict) -> tuple[str, float]:
    """Grouped by env, best first within each; runs with no finished episode (NaN) last."""
    score = row["final_return"]
    return row["env"], -score if score == score else float("inf")


def plot(runs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        ax.plot(run.steps, run.returns, label=run.path.name)
    ax.set(xlabel="environment steps", ylabel="episodic return", title=path.parent.name)
    if len(runs) <= 12:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
