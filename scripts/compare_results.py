"""Compare the returns of two sets of runs at equal steps (issue 4: speed must not cost learning).

    python scripts/compare_results.py --before runs/old_code --after runs/new_code [--tasks Hopper-v4]

Each set is searched for finished runs as scripts/summarize_results.py finds them; per task and
step budget it prints each set's mean and std over seeds of the last-100-episode return (CleanRL's
metric), the difference, and Welch's t statistic of that difference (|t| < ~2.8 for 3 vs 3 seeds
is within seed noise at the 5% level), as a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize_results import find_runs  # noqa: E402


def scores_by_task(roots: list[Path]) -> dict[tuple[str, int], list[float]]:
    scores: dict[tuple[str, int], list[float]] = defaultdict(list)
    for run in find_runs(roots):
        scores[(run.task, run.budget)].append(run.score)
    return scores


def welch_t(a: np.ndarray, b: np.ndarray) -> float:
    """Welch's t of mean(b) - mean(a); NaN with fewer than two seeds on a side."""
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    standard_error = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return float((b.mean() - a.mean()) / standard_error) if standard_error > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, nargs="+", required=True)
    parser.add_argument("--after", type=Path, nargs="+", required=True)
    parser.add_argument("--tasks", nargs="*", help="only these tasks (default: those both sets have)")
    args = parser.parse_args()
    before, after = scores_by_task(args.before), scores_by_task(args.after)
    keys = sorted(set(before) & set(after))
    if args.tasks:
        keys = [k for k in keys if k[0] in args.tasks]
    if not keys:
        sys.exit("no task and step budget has finished runs in both sets")
    print("| task | steps | before: mean +- std (seeds) | after: mean +- std (seeds) | after - before | Welch t |")
    print("|---|---:|---:|---:|---:|---:|")
    for task, steps in keys:
        a, b = np.array(before[(task, steps)]), np.array(after[(task, steps)])
        print(f"| {task} | {steps:,} | {a.mean():.0f} +- {a.std():.0f} ({len(a)}) | {b.mean():.0f} +- {b.std():.0f} "
              f"({len(b)}) | {b.mean() - a.mean():+.0f} | {welch_t(a, b):+.2f} |")


if __name__ == "__main__":
    main()
