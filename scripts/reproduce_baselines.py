"""Reproduce the MuJoCo baselines in one command, then summarise them.

    python scripts/reproduce_baselines.py --device cuda          # everything (hours on a GPU host)
    python scripts/reproduce_baselines.py --dry-run              # print the commands only
    python scripts/reproduce_baselines.py --tasks Hopper-v4 --scale 0.01   # a quick check

Runs, each with its configs/env/ defaults: HalfCheetah, Hopper, Walker2d, Ant, Humanoid and
InvertedPendulum (-v4) for 1M steps x 3 seeds; and Ant-v4 for 10M steps with a 10M experiment of
configs/experiment/, 3 seeds (`--ant-10m-experiment`: ant_10m, the default, rl_games' values, which
scored higher and trained faster on an H200 host; or ant_10m_adaptive, CleanRL's values with
rl_games' KL-adaptive rate; CleanRL's own annealed rate collapses over 10M steps; docs/results.md);
then scripts/summarize_results.py writes results.md, results/baselines.csv and the plots into --out,
beside the runs, so that they compare with the project's docs/results.md rather than replace it
(that file pools every machine's runs and says how each ran; `--docs docs` writes there anyway).
Jobs run one after another (Hydra's basic launcher); each has its own run dir under --out.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from ppo.config import ConfigError, check_device_name, resolve_device

ROOT = Path(__file__).resolve().parents[1]

TASKS = ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4", "Humanoid-v4", "InvertedPendulum-v4"]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
ENV_FILES = sorted(p.stem for p in (ROOT / "configs" / "env").glob("*.yaml"))


def commands(args) -> list[list[str]]:
    def sweep(tasks: list[str], seeds: list[int], name: str, *overrides: str) -> list[str]:
        return [sys.executable, "train.py", "-m", f"env={','.join(tasks)}", f"seed={','.join(map(str, seeds))}",
                *overrides, f"device={args.device}", "log_every_s=30", f"hydra.sweep.dir={args.out / name}"]

    def budget(steps: int) -> str:
        return f"total_timesteps={max(int(steps * args.scale), 1)}"

    runs = [sweep(args.tasks, args.seeds, "1M", budget(1_000_000))]
    if "Ant-v4" in args.tasks and args.ant_10m_seeds:
        # the experiment file sets its 10M budget (its header says why its values)
        scaled = [budget(10_000_000)] if args.scale != 1.0 else []
        runs.append(sweep(["Ant-v4"], args.ant_10m_seeds, "Ant-v4_10M", f"+experiment={args.ant_10m_experiment}",
                          *scaled))
    runs.append([sys.executable, "scripts/summarize_results.py", str(args.out), "--out", str(args.docs)])
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    parser.add_argument("--tasks", nargs="+", default=TASKS, choices=ENV_FILES, metavar="TASK",
                        help="configs/env/ names for the 1M runs (default: the six -v4 tasks)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds of the 1M runs (default: 1 2 3)")
    parser.add_argument("--ant-10m-seeds", nargs="*", type=int, default=[1, 2, 3],
                        help="seeds of the 10M Ant-v4 runs, made if --tasks has Ant-v4 (default: 1 2 3; none: no 10M)")
    parser.add_argument("--ant-10m-experiment", default="ant_10m", choices=EXPERIMENTS,
                        help="configs/experiment/ file for the 10M Ant-v4 runs")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every step budget (quick checks)")
    parser.add_argument("--out", type=Path, default=ROOT / "multirun" / "baselines",
                        help="run dirs go here (default: multirun/baselines)")
    parser.add_argument("--docs", type=Path, default=None,
                        help="results.md and results/ go here (default: --out; the project's own: docs)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args()
    args.docs = args.docs or args.out
    if not args.scale > 0:
        parser.error(f"--scale must be positive, got {args.scale}")
    # Bad input fails here, before hours of jobs, not in the first job's output.
    try:
        check_device_name(args.device, "--device")
        if not args.dry_run:  # a dry run may print a GPU host's commands anywhere
            resolve_device(args.device, "--device")
    except ConfigError as error:
        parser.error(str(error))
    for command in commands(args):
        print("$", shlex.join(command), flush=True)
        if not args.dry_run and (status := subprocess.run(command, cwd=ROOT).returncode):
            sys.exit(f"error: that command exited with status {status} (its output is above); stopped there")


if __name__ == "__main__":
    main()
