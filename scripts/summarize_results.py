"""Summarise training runs into results.md, results/baselines.csv and learning-curve PNGs, written
beside the runs (in the first folder named) or into --out.

    python scripts/summarize_results.py multirun/ runs/          # any run dirs or folders holding them
    python scripts/summarize_results.py RUNS --out docs          # the project's docs/results.md
    python scripts/summarize_results.py --rows docs/results/baselines.csv --out docs   # the page from its CSV

A run is a folder with `run_info.json` (written by train.py) and TensorBoard events. Per run, the
score is CleanRL's metric: the average return of the last 100 training episodes (whole iterations
from the end, from `charts/episodic_return` weighted by `charts/episodes`). Rows group runs by task,
step budget and hardware, where a run's task names its configuration beyond the env file: a Hydra
experiment (`+experiment=ant_10m` makes `Ant-v4+ant_10m`) and any override that changes what is
learned (`Ant-v4+ant_10m ppo.adaptive_lr_kl=0.016`), so runs of different configurations never pool
as seeds (seed, device, threads, logging, checkpoints, compile and CUDA graphs do not count). Per
row: `mean`/`std` over seeds (numpy's std, ddof=0, as CleanRL reports), wall-clock and SPS averaged
over seeds (wall-clock: from the first to the last logged iteration of each process; SPS: the steps
trained in that span over it, so a process's first iteration, its start-up and compile, counts in
neither), and where they ran. One plot per task and budget, all its runs, and `results/curves.png`, the
1M-step plots of the six MuJoCo tasks in one picture.

results.md keeps what is written by hand between its NOTES markers (how the runs ran, what the rows
say) when it is rewritten; `--rows` rebuilds the table from a CSV where the runs are not all on one
machine (the project's pools several), keeping the plots already there.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppo.config import EXECUTION_KEYS
from ppo.run.logger import mean_of_last_episodes
from ppo.run.records import override_key, recorded_overrides

ROOT = Path(__file__).resolve().parents[1]

# Public PPO results at the same budgets (mean return), drawn as a line on each plot.
REFERENCES: dict[tuple[str, int], tuple[float, str]] = {
    ("HalfCheetah-v4", 1_000_000): (1442, "CleanRL ppo_continuous_action"),
    ("Walker2d-v4", 1_000_000): (2288, "CleanRL ppo_continuous_action"),
    ("Hopper-v4", 1_000_000): (2383, "CleanRL ppo_continuous_action"),
    ("Humanoid-v4", 1_000_000): (716, "CleanRL ppo_continuous_action"),
    ("InvertedPendulum-v4", 1_000_000): (963, "CleanRL ppo_continuous_action"),
    ("Ant-v4", 1_000_000): (2965, "CleanRL ppo_continuous_action_envpool"),
    # Sample Factory's MuJoCo results at 10M steps (its docs' environment integrations, MuJoCo page).
    ("HalfCheetah-v4", 10_000_000): (6263, "Sample Factory"),
    ("Hopper-v4", 10_000_000): (2793, "Sample Factory"),
    ("Walker2d-v4", 10_000_000): (5488, "Sample Factory"),
    ("Ant-v4", 10_000_000): (5876, "Sample Factory (rl_games reports ~6000 at 8M)"),
    ("Humanoid-v4", 10_000_000): (5439, "Sample Factory"),
    # DeepMind Control through Shimmy: CleanRL's docs/rl-algorithms/rpo.md, ppo_continuous_action_8M, 10 seeds.
    ("CheetahRun-v1", 8_000_000): (472.14, "CleanRL ppo_continuous_action_8M, dm_control/cheetah-run-v0"),
    ("WalkerWalk-v1", 8_000_000): (305.74, "CleanRL ppo_continuous_action_8M, dm_control/walker-walk-v0"),
}
CSV_COLUMNS = ["task", "steps", "seeds", "mean", "std", "wall_clock_s", "sps", "hardware", "seconds_to_reference",
               "gymnasium_eval_mean", "gymnasium_eval_std"]
# What scripts/evaluate.py --json writes into a run dir for scripts/reproduce_baselines.py: the policy's mean
# action on gymnasium's own simulator.
GYMNASIUM_EVALUATION = "evaluation_gymnasium.json"


@dataclass
class Run:
    path: Path
    env_id: str
    task: str  # env_id and the run's learning overrides
    budget: int  # total_timesteps asked for
    seed: int
    hardware: str
    steps: np.ndarray  # global step of each iteration that finished episodes
    returns: np.ndarray  # mean episodic return of those iterations
    episodes: np.ndarray
    final_step: int
    wall_clock_s: float  # from the first to the last logged iteration, per process, summed
    timed_steps: int  # the steps trained within those spans
    # Seconds from the command's start to each logged return (None: a resumed run, or one from before
    # run_info.json recorded its start)
    seconds: np.ndarray | None = None
    gymnasium_returns: list[float] | None = None  # GYMNASIUM_EVALUATION's episodes, where it was evaluated

    def seconds_to(self, score: float) -> float | None:
        """Seconds from the command to the first iteration whose mean return reached `score`; None where it
        never did or the run's start is unknown."""
        if self.seconds is None:
            return None
        reached = np.flatnonzero(self.returns >= score)
        return float(self.seconds[reached[0]]) if reached.size else None

    @property
    def sps(self) -> float | None:
        """Steps per second over the timed spans; None for a run that logged one iteration per process."""
        return self.timed_steps / self.wall_clock_s if self.wall_clock_s > 0 else None

    @property
    def score(self) -> float:
        return mean_of_last_episodes(list(zip(self.episodes.tolist(), self.returns.tolist(), strict=True)))


def load_run(path: Path) -> Run | None:
    """The run in `path`; None, named on stderr, for one with nothing to score (a job of a sweep that died
    early must not vanish from its table unsaid)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    info = json.loads((path / "run_info.json").read_text())
    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    if "charts/episodic_return" not in tags or "charts/SPS" not in tags:
        reason = ("no episode finished" if "charts/SPS" in tags
                  else "no iteration logged: it stopped or died in its first")
        print(f"skipping {path}: {reason}", file=sys.stderr)
        return None
    returns = events.Scalars("charts/episodic_return")
    episodes = {e.step: e.value for e in events.Scalars("charts/episodes")} if "charts/episodes" in tags else {}
    sps = events.Scalars("charts/SPS")
    budget = _budget(path) or sps[-1].step
    wall_clock_s, timed_steps = _timed_span(path)
    task = info["env_id"] + _configuration(path)
    one_process = len(list(path.glob("events.out.tfevents.*"))) == 1 and "resumed_from" not in info
    seconds = (np.array([e.wall_time for e in returns]) - info["started"]
               if one_process and "started" in info else None)
    evaluation = path / GYMNASIUM_EVALUATION
    gymnasium_returns = json.loads(evaluation.read_text())["returns"] if evaluation.is_file() else None
    # The simulator build counts as hardware: the same code and config score differently on another
    # build (envpool 1.2.5 against 1.2.7 and gymnasium, docs/results.md), so such runs must not pool.
    # Runs from before it was recorded lack it.
    hardware = "; ".join(filter(None, (info["hardware"], info.get("simulator"))))
    return Run(path=path, env_id=info["env_id"], task=task, budget=budget, seed=info["seed"], hardware=hardware,
               steps=np.array([e.step for e in returns]), returns=np.array([e.value for e in returns]),
               episodes=np.array([episodes.get(e.step, 1.0) for e in returns]),
               final_step=sps[-1].step, wall_clock_s=wall_clock_s, timed_steps=timed_steps, seconds=seconds,
               gymnasium_returns=gymnasium_returns)


def _timed_span(path: Path) -> tuple[float, int]:
    """Seconds and steps from the first to the last logged iteration, per TensorBoard events file,
    summed: a resumed run (one file per process) counts the time it trained, not the time between
    its processes. The steps are those trained inside the span (a process's first iteration ends
    where it starts), so that their ratio is a true rate even for a run of a few iterations."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seconds, steps = 0.0, 0
    for file in sorted(path.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        events.Reload()
        if "charts/SPS" in events.Tags()["scalars"]:
            sps = events.Scalars("charts/SPS")
            seconds += sps[-1].wall_time - sps[0].wall_time
            steps += sps[-1].step - sps[0].step
    return seconds, steps


# Overrides that change how or where a run executes, not what it learns (or that are its task and
# budget, grouped on their own): runs differing only in these pool as seeds of one row.
POOLED_KEYS = EXECUTION_KEYS | {"seed", "env", "env.id"}


def _configuration(path: Path) -> str:
    """What the run's overrides (`.hydra/overrides.yaml`) add to its env file: `+<experiment>`, then
    each learning override as ` key=value`, sorted; "" for a run of the env file's defaults."""
    experiment, others = "", []
    for override in recorded_overrides(path):
        key, value = override_key(override), override.partition("=")[2]
        if key == "experiment":
            experiment = f"+{value}"
        elif key and key not in POOLED_KEYS and not key.startswith("checkpoint."):
            others.append(f"{key}={value}")
    return experiment + "".join(f" {o}" for o in sorted(others))


def env_of(task: str) -> str:
    """The env id a task starts with (`Ant-v4+ant_10m ppo.gamma=0.9` -> `Ant-v4`)."""
    return re.split(r"[+ ]", task)[0]


def reference(task: str, steps: int) -> tuple[float, str] | None:
    """The public result drawn beside a task; an experiment's runs compare against their env's."""
    return REFERENCES.get((env_of(task), steps))


def _budget(path: Path) -> int | None:
    config = path / ".hydra" / "config.yaml"
    if config.is_file():
        for line in config.read_text().splitlines():
            if line.startswith("total_timesteps:"):
                return int(float(line.split(":", 1)[1]))  # `total_timesteps=1e6` is recorded as 1000000.0
    return None


def check_dirs_exist(parser: argparse.ArgumentParser, paths: list[Path]) -> None:
    """A usage error naming the paths that do not exist: else a mistyped path reads as a dir of no runs."""
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        parser.error(f"no such dir: {', '.join(missing)}")


def find_runs(roots: list[Path], complete_only: bool = True) -> list[Run]:
    """Runs under `roots`; with `complete_only`, those that reached their step budget (others are
    named on stderr: a run still going, or one that died, must not count as a seed)."""
    runs = []
    for root in roots:
        for info in sorted(root.rglob("run_info.json")):
            run = load_run(info.parent)
            if run is None:
                continue
            if complete_only and run.final_step < run.budget:
                print(f"skipping {run.path}: {run.final_step:,} of {run.budget:,} steps", file=sys.stderr)
                continue
            runs.append(run)
    return runs


def summarize(runs: list[Run]) -> list[dict]:
    groups: dict[tuple[str, int, str], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.task, run.budget, run.hardware)].append(run)
    rows = []
    for (task, budget, hardware), group in sorted(groups.items()):
        seeds = Counter(r.seed for r in group)
        if max(seeds.values()) > 1:
            twice = [str(r.path) for r in group if seeds[r.seed] > 1]
            raise ValueError(f"{task}, {budget:,} steps on {hardware}: a seed appears more than once, so it would "
                             f"count twice in the mean: {', '.join(twice)}. Pass each run once.")
        scores = np.array([r.score for r in group])
        wall = float(np.mean([r.wall_clock_s for r in group]))
        rows.append({
            "task": task, "steps": budget, "seeds": len(group),
            "mean": round(float(scores.mean()), 1), "std": round(float(scores.std()), 1),
            "wall_clock_s": round(wall, 1),
            "sps": mean_sps(group),
            "hardware": hardware,
            "seconds_to_reference": seconds_to_reference(task, budget, group),
            **gymnasium_evaluation(group),
        })
    return rows


def seconds_to_reference(task: str, budget: int, runs: list[Run]) -> float | None:
    """When the slowest seed first reached the task's reference score, in seconds from its command (so every
    seed had by then); None where there is no reference, a seed never reached it, or its start is unknown."""
    public = reference(task, budget)
    times = [run.seconds_to(public[0]) for run in runs] if public else [None]
    return None if None in times else round(max(times), 1)


def gymnasium_evaluation(runs: list[Run]) -> dict[str, float | None]:
    """The mean over seeds of each seed's mean evaluation return on gymnasium's simulator, and their std
    (ddof=0, as the training score's); None where a seed was not evaluated."""
    if any(run.gymnasium_returns is None for run in runs):
        return {"gymnasium_eval_mean": None, "gymnasium_eval_std": None}
    means = np.array([np.mean(run.gymnasium_returns) for run in runs])
    return {"gymnasium_eval_mean": round(float(means.mean()), 1), "gymnasium_eval_std": round(float(means.std()), 1)}


def mean_sps(runs: list[Run]) -> int | None:
    """The mean steps per second over the runs that timed any; None (an empty CSV cell, "-" in a
    table) where none did."""
    rates = [r.sps for r in runs if r.sps is not None]
    return round(float(np.mean(rates))) if rates else None


def format_sps(sps: int | None) -> str:
    return "-" if sps is None else f"{sps:,}"


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot_name(task: str, budget: int) -> str:
    """`<task>_<budget>.png`, the task's spaces and other characters unsafe in a file name as `_`."""
    return re.sub(r"[^A-Za-z0-9+._-]", "_", f"{task}_{budget}") + ".png"


def plot(task: str, budget: int, group: list[Run], path: Path) -> None:
    """One figure per task and budget: per hardware row (machine and simulator build), the mean over
    its seeds and their min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_hardware: dict[str, list[Run]] = defaultdict(list)
    for run in group:
        by_hardware[run.hardware].append(run)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for hardware, runs in sorted(by_hardware.items()):
        start = max(r.steps[0] for r in runs)  # where every seed has logged an episode
        grid = np.linspace(start, budget, 200)
        curves = np.stack([np.interp(grid, r.steps, r.returns) for r in runs])
        label = f"{hardware}: mean of {len(runs)} seed{'s' if len(runs) > 1 else ''}"
        (line,) = ax.plot(grid, curves.mean(axis=0), label=label if len(by_hardware) > 1 else f"ppo-triton, {label}")
        ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0), alpha=0.25 if len(by_hardware) == 1 else 0.12,
                        color=line.get_color())
    if reference(task, budget):
        value, source = reference(task, budget)
        ax.axhline(value, color="black", linestyle="--", label=f"{source}: {value}")
    ax.set(title=f"{task}, {budget:,} steps", xlabel="environment steps", ylabel="episodic return")
    ax.legend(loc="upper left", fontsize=6, title="shaded: min-max over seeds", title_fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


NOTES_START = "<!-- notes: written by hand; summarize_results.py keeps them when it rewrites this page -->"
NOTES_END = "<!-- end of notes -->"


def kept_notes(path: Path) -> str:
    """The hand-written notes block of an existing results.md (markers included), or ""."""
    text = path.read_text() if path.is_file() else ""
    start, end = text.find(NOTES_START), text.find(NOTES_END)
    return text[start:end + len(NOTES_END)] if 0 <= start < end else ""


def write_markdown(rows: list[dict], path: Path, images: Path) -> None:
    """results.md: the table of `rows`, the notes the page already holds, then every task's plot."""
    notes = kept_notes(path)
    lines = ["# Results", "",
             "The table is written by `scripts/summarize_results.py`. Score: the average return of each run's last",
             "100 training episodes (CleanRL's metric); mean and std (ddof=0) over seeds. `s to reference`: seconds",
             "from the command until every seed's training return had reached the reference; `gymnasium eval`: the",
             "policy's mean action on gymnasium's own simulator (10 episodes a seed; mean and std over seeds). The",
             "hardware column ends with the simulator build. How and where the runs ran, and what the rows say:",
             "below the table.", "",
             "| task | steps | seeds | mean | std | reference | s to reference | gymnasium eval | wall-clock s | SPS "
             "| hardware |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for row in rows:
        public = reference(row["task"], row["steps"])
        ref = f"{public[0]} ({public[1]})" if public else "-"
        to_reference = "-" if row.get("seconds_to_reference") is None else f"{row['seconds_to_reference']:,}"
        evaluation = ("-" if row.get("gymnasium_eval_mean") is None
                      else f"{row['gymnasium_eval_mean']} +- {row['gymnasium_eval_std']}")
        lines.append(f"| {row['task']} | {row['steps']:,} | {row['seeds']} | {row['mean']} | {row['std']} | {ref} | "
                     f"{to_reference} | {evaluation} | {row['wall_clock_s']:,} | {format_sps(row['sps'])} | "
                     f"{row['hardware']} |")
    lines.append("")
    if notes:
        lines += [notes, ""]
    for task, budget in sorted({(row["task"], row["steps"]) for row in rows}):
        image = images / plot_name(task, budget)
        if image.is_file():
            lines.append(f"![{task} {budget:,} steps]({image.relative_to(path.parent).as_posix()})")
    path.write_text("\n".join(lines) + "\n")


OVERVIEW = "curves.png"


def write_overview(rows: list[dict], images: Path) -> Path | None:
    """One picture of the 1M-step plots of the tasks with a CleanRL reference (the README's), tiled three
    a row from the plots already in `images`; None where there are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    tasks = [task for task, steps in REFERENCES if steps == 1_000_000]
    names = [plot_name(task, 1_000_000) for task in tasks if any(r["task"] == task for r in rows)]
    names = [name for name in names if (images / name).is_file()]
    if not names:
        return None
    columns = min(3, len(names))
    fig, axes = plt.subplots(-(-len(names) // columns), columns, figsize=(7 * columns, 4.5 * -(-len(names) // columns)),
                             squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, name in zip(axes.flat, names, strict=False):  # a last row may have empty places
        ax.imshow(mpimg.imread(images / name))
    fig.tight_layout(pad=0.2)
    fig.savefig(images / OVERVIEW, dpi=60)
    plt.close(fig)
    return images / OVERVIEW


def read_csv(path: Path) -> list[dict]:
    """The rows `write_csv` wrote, typed back."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["steps"], row["seeds"] = int(row["steps"]), int(row["seeds"])
        row["mean"], row["std"], row["wall_clock_s"] = float(row["mean"]), float(row["std"]), float(row["wall_clock_s"])
        row["sps"] = int(row["sps"]) if row["sps"] else None
        for column in ("seconds_to_reference", "gymnasium_eval_mean", "gymnasium_eval_std"):
            row[column] = float(row[column]) if row.get(column) else None  # older CSVs lack these columns
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="*", type=Path, help="run dirs, or folders holding them")
    parser.add_argument("--rows", type=Path, help="instead of runs: rebuild results.md from this baselines.csv")
    parser.add_argument("--out", type=Path, default=None,
                        help="writes results.md and results/ here (default: the first folder of runs named)")
    args = parser.parse_args()
    if bool(args.roots) == bool(args.rows):
        parser.error("name run dirs, or --rows CSV (not both)")
    if args.rows:
        check_dirs_exist(parser, [args.rows])
        out = args.out or args.rows.parent.parent
        rows = read_csv(args.rows)
        write_markdown(rows, out / "results.md", out / "results")
        write_overview(rows, out / "results")
        print(f"wrote {out / 'results.md'} and {out / 'results' / OVERVIEW} from {args.rows}")
        return
    check_dirs_exist(parser, args.roots)
    runs = find_runs(args.roots)
    if not runs:
        sys.exit(f"no runs (folders with run_info.json and TensorBoard events) under {[str(r) for r in args.roots]}")
    try:
        rows = summarize(runs)
    except ValueError as error:
        sys.exit(str(error))
    out = args.out or args.roots[0]
    write_csv(rows, out / "results" / "baselines.csv")
    plots = sorted({(row["task"], row["steps"]) for row in rows})
    for task, budget in plots:
        group = [r for r in runs if (r.task, r.budget) == (task, budget)]
        plot(task, budget, group, out / "results" / plot_name(task, budget))
    write_markdown(rows, out / "results.md", out / "results")
    write_overview(rows, out / "results")
    for row in rows:
        print(", ".join(f"{k}={row[k]}" for k in CSV_COLUMNS))
    print(f"wrote {out / 'results.md'}, {out / 'results' / 'baselines.csv'} and {len(plots)} "
          f"plot{'s' * (len(plots) != 1)} in {out / 'results'}")


if __name__ == "__main__":
    main()
