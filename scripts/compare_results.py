"""Compare the returns of two sets of runs at equal steps: a change must not cost learning.

    python scripts/compare_results.py --before runs/old_code --after runs/new_code [--tasks Hopper-v4]

    python scripts/compare_results.py --before runs/defaults --after runs/lr_1e-3   # a config change

Each set is searched for finished runs as scripts/summarize_results.py finds them; per task and
step budget it prints each set's mean and std over seeds of the last-100-episode return (CleanRL's
metric), the difference, and Welch's t statistic of that difference (|t| < ~2.8 for 3 vs 3 seeds
is within seed noise at the 5% level), as a markdown table.

A task is an env id with the run's learning overrides (`Hopper-v4 ppo.learning_rate=0.001`, as
summarize_results.py names it). Runs of the same task pair up; beyond those, where each set has
exactly one task left on an env and budget, those two pair up too, so a config change compares
against its baseline (the row names both tasks). Tasks left without a partner are named on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from summarize_results import check_dirs_exist, env_of, find_runs


def scores_by_task(roots: list[Path]) -> dict[tuple[str, int], list[float]]:
    scores: dict[tuple[str, int], list[float]] = defaultdict(list)
    for run in find_runs(roots):
        scores[(run.task, run.budget)].append(run.score)
    return scores


def pair_up(before: list[tuple[str, int]], after: list[tuple[str, int]]) -> list[tuple[str, str, int]]:
    """`(before task, after task, budget)` pairs: equal tasks first, then per env and budget the one
    task each set has left there."""
    pairs = [(task, task, steps) for task, steps in sorted(set(before) & set(after))]
    left: dict[tuple[str, int], tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for side, keys in enumerate((before, after)):
        for task, steps in sorted(set(keys) - set(after if side == 0 else before)):
            left[(env_of(task), steps)][side].append(task)
    for (_, steps), (old, new) in sorted(left.items()):
        if len(old) == 1 and len(new) == 1:
            pairs.append((old[0], new[0], steps))
        else:
            for side, tasks in (("before", old), ("after", new)):
                for task in tasks:
                    print(f"not compared: {task} at {steps:,} steps ({side}), with no single partner in the other "
                          f"set", file=sys.stderr)
    return sorted(pairs, key=lambda pair: (env_of(pair[0]), pair[2], pair[0], pair[1]))


def welch_t(a: np.ndarray, b: np.ndarray) -> float:
    """Welch's t of mean(b) - mean(a); NaN with fewer than two seeds on a side."""
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    standard_error = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return float((b.mean() - a.mean()) / standard_error) if standard_error > 0 else float("nan")


def t_cell(a: np.ndarray, b: np.ndarray) -> str:
    """The table's Welch t, or why there is none (a bare `nan` reads like a failed run)."""
    if len(a) < 2 or len(b) < 2:
        return "n/a: one seed"
    t = welch_t(a, b)
    return "n/a: no spread" if np.isnan(t) else f"{t:+.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, nargs="+", required=True, help="run dirs, or folders holding them")
    parser.add_argument("--after", type=Path, nargs="+", required=True, help="run dirs, or folders holding them")
    parser.add_argument("--tasks", nargs="*", help="only these tasks (default: those both sets have)")
    args = parser.parse_args()
    check_dirs_exist(parser, args.before + args.after)
    before, after = scores_by_task(args.before), scores_by_task(args.after)
    pairs = pair_up(list(before), list(after))
    if args.tasks:
        pairs = [p for p in pairs if p[0] in args.tasks or p[1] in args.tasks or env_of(p[0]) in args.tasks]
    if not pairs:
        sys.exit("no task and step budget has finished runs in both sets")
    print("| task | steps | before: mean +- std (seeds) | after: mean +- std (seeds) | after - before | Welch t |")
    print("|---|---:|---:|---:|---:|---:|")
    for old, new, steps in pairs:
        a, b = np.array(before[(old, steps)]), np.array(after[(new, steps)])
        task = old if old == new else f"{old} -> {new}"
        print(f"| {task} | {steps:,} | {a.mean():.0f} +- {a.std():.0f} ({len(a)}) | {b.mean():.0f} +- {b.std():.0f} "
              f"({len(b)}) | {b.mean() - a.mean():+.0f} | {t_cell(a, b)} |")


if __name__ == "__main__":
    main()
