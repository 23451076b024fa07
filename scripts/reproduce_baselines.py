"""Reproduce the MuJoCo baselines in one command, then summarise them.

    python scripts/reproduce_baselines.py --device cuda          # everything (hours on a GPU host)
    python scripts/reproduce_baselines.py --dry-run              # print the commands only
    python scripts/reproduce_baselines.py --tasks Hopper-v4 --scale 0.01   # a quick check
    python scripts/reproduce_baselines.py --backend mjwarp       # 10M steps on MuJoCo Warp, one GPU
    python scripts/reproduce_baselines.py --backend mjwarp --tasks Ant-v4 --seeds 1 2   # a part of it
    nvidia-cuda-mps-control -d && python scripts/reproduce_baselines.py --backend mjwarp --jobs 15  # all at once

With `--backend mjwarp` (the simulator on the GPU too): HalfCheetah, Hopper, Walker2d, Ant and Humanoid
(-v4) for 10M steps x 3 seeds, each with its `+experiment=mjwarp_<task>` preset, one `train.py` process a
run (so each run's time counts from its own command), one after another; then each run's policy (its mean
action) is scored on gymnasium's own simulator, 10 episodes on the CPU (`--no-evaluation` leaves that
out), and the summary beside Sample Factory's 10M scores gives the training return, the seconds from the
command to Sample Factory's score and the gymnasium score. Runs accumulate in --out: run the tasks in
parts (each part's command as long as you like) and every part's summary covers all of them so far; a
run dir that already holds a finished run is not run again. `--jobs N` trains N runs at once on the one
GPU, each run's output in <out>/mjwarp_10M/logs/: with CUDA MPS running they share the GPU (on an H100,
thirteen 1,024-world runs together trained ~600k steps/s, against 75k-293k for one run alone; eleven 10M
runs of the five tasks finished in 6.3 minutes), without it they take turns; their seconds are then those
of a shared GPU, not of one run alone.

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
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ppo.config import ConfigError, check_device_name, resolve_device

ROOT = Path(__file__).resolve().parents[1]

TASKS = ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4", "Humanoid-v4", "InvertedPendulum-v4"]
# MuJoCo Warp: Sample Factory's five tasks at its 10M budget, each with its preset (configs/experiment/)
MJWARP_TASKS = ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4", "Humanoid-v4"]
MJWARP_PRESETS = {"HalfCheetah": "mjwarp_half_cheetah", "Hopper": "mjwarp_hopper", "Walker2d": "mjwarp_walker2d",
                  "Ant": "mjwarp_ant", "Humanoid": "mjwarp_humanoid", "InvertedPendulum": "mjwarp_inverted_pendulum"}
MJWARP_STEPS = 10_000_000
GYMNASIUM_EVALUATION = "evaluation_gymnasium.json"  # scripts/summarize_results.py reads it
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


def mjwarp_runs(args) -> list[tuple[Path, list[list[str]]]]:
    """Per task and seed, its run dir and the commands of its run, in order: one train.py process
    (`hydra.run.dir=<out>/mjwarp_10M/<task>_seed<seed>`; none where the dir holds a finished run), then its
    gymnasium evaluation. Each run is one job for `--jobs`."""
    runs = []
    for task in args.tasks:
        for seed in args.seeds:
            run_dir = args.out / "mjwarp_10M" / f"{task}_seed{seed}"
            chain = []
            if finished(run_dir):
                print(f"# {run_dir} holds a finished run: not run again", flush=True)
            else:
                steps = max(int(MJWARP_STEPS * args.scale), 1)
                chain.append([sys.executable, "train.py", f"+experiment={MJWARP_PRESETS[task.split('-')[0]]}",
                              f"env={task}", f"seed={seed}", f"total_timesteps={steps}", f"device={args.device}",
                              "log_every_s=10", f"hydra.run.dir={run_dir}"])
            if args.evaluation and not (run_dir / GYMNASIUM_EVALUATION).is_file():
                chain.append([sys.executable, "scripts/evaluate.py", str(run_dir), "--backend", "gymnasium",
                              "--device", "cpu", "--episodes", "10", "--num-envs", "10",
                              "--json", str(run_dir / GYMNASIUM_EVALUATION)])
            if chain:
                runs.append((run_dir, chain))
    return runs


def summary_command(args) -> list[str]:
    return [sys.executable, "scripts/summarize_results.py", str(args.out), "--out", str(args.docs)]


def mjwarp_commands(args) -> list[list[str]]:
    """Every run's commands one after another, then the summary."""
    return [*(command for _, chain in mjwarp_runs(args) for command in chain), summary_command(args)]


def run_side_by_side(runs: list[tuple[Path, list[list[str]]]], jobs: int, logs: Path) -> None:
    """Run the chains `jobs` at a time, each chain's output into `logs`/<run dir name>.log. After a failed
    command no chain starts; those running finish (their runs are good), then one line names the failure."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    logs.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    lock = threading.Lock()

    def run_chain(run: tuple[Path, list[list[str]]]) -> None:
        run_dir, chain = run
        log = logs / f"{run_dir.name}.log"
        for command in chain:
            with lock:
                if failed:
                    return
                print(f"$ {shlex.join(command)}  > {log}", flush=True)
            with log.open("a") as out:
                status = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
            if status:
                with lock:
                    failed.append(f"{shlex.join(command)} exited with status {status} (its output: {log})")
                return
        with lock:
            print(f"# done: {log.stem}", flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            list(pool.map(run_chain, runs))
        except KeyboardInterrupt:  # the runs got the Ctrl-C too and end after their iteration; start no more
            with lock:
                failed.insert(0, "Ctrl-C: the running runs stopped after their iteration (run again to redo them)")
    if failed:
        sys.exit(f"error: {failed[0]}; no run started after it")


def mps_is_running() -> bool:
    """Whether a CUDA MPS control daemon seems to be up (its pipe directory exists)."""
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")).is_dir()


def finished(run_dir: Path) -> bool:
    """Whether `run_dir`'s train.log says its run finished (a stopped or failed one is run again, resumed
    by hand or started over)."""
    log = run_dir / "train.log"
    return log.is_file() and any(" finished at step " in line for line in log.read_text().splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    parser.add_argument("--backend", choices=("envpool", "mjwarp"), default="envpool",
                        help="envpool (the env files' 1M runs, and Ant-v4 at 10M) or mjwarp (the MuJoCo Warp "
                             "presets at 10M; see above)")
    parser.add_argument("--tasks", nargs="+", default=None, choices=ENV_FILES, metavar="TASK",
                        help="configs/env/ names (default: the six -v4 tasks; with --backend mjwarp the five of "
                             "Sample Factory's table)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3],
                        help="seeds of the 1M runs, or of the mjwarp runs (default: 1 2 3)")
    parser.add_argument("--ant-10m-seeds", nargs="*", type=int, default=[1, 2, 3],
                        help="seeds of the 10M Ant-v4 runs, made if --tasks has Ant-v4 (default: 1 2 3; none: no 10M)")
    parser.add_argument("--ant-10m-experiment", default="ant_10m", choices=EXPERIMENTS,
                        help="configs/experiment/ file for the 10M Ant-v4 runs")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every step budget (quick checks)")
    parser.add_argument("--out", type=Path, default=ROOT / "multirun" / "baselines",
                        help="run dirs go here (default: multirun/baselines)")
    parser.add_argument("--docs", type=Path, default=None,
                        help="results.md and results/ go here (default: --out; the project's own: docs)")
    parser.add_argument("--no-evaluation", dest="evaluation", action="store_false",
                        help="--backend mjwarp: leave out the gymnasium evaluation of each run")
    parser.add_argument("--jobs", type=int, default=1,
                        help="--backend mjwarp: train this many runs at once on the one GPU (start CUDA MPS first, "
                             "see above); each run's output goes to <out>/mjwarp_10M/logs/")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args()
    args.docs = args.docs or args.out
    mjwarp = args.backend == "mjwarp"
    args.tasks = args.tasks or (MJWARP_TASKS if mjwarp else TASKS)
    if mjwarp and (unknown := [task for task in args.tasks if task.split("-")[0] not in MJWARP_PRESETS]):
        parser.error(f"--backend mjwarp has presets for {', '.join(MJWARP_PRESETS)}; not for {', '.join(unknown)}")
    if not args.scale > 0:
        parser.error(f"--scale must be positive, got {args.scale}")
    if args.jobs < 1 or (args.jobs > 1 and not mjwarp):
        parser.error(f"--jobs must be 1, or more with --backend mjwarp (its runs share one GPU), got {args.jobs}")
    # Bad input fails here, before hours of jobs, not in the first job's output.
    try:
        check_device_name(args.device, "--device")
        if not args.dry_run:  # a dry run may print a GPU host's commands anywhere
            resolve_device(args.device, "--device")
    except ConfigError as error:
        parser.error(str(error))
    if args.jobs > 1 and not args.dry_run:
        if not mps_is_running():
            print(f"# CUDA MPS does not seem to run: the {args.jobs} runs at once will take turns on the GPU rather "
                  "than share it (start it with `nvidia-cuda-mps-control -d`)", flush=True)
        run_side_by_side(mjwarp_runs(args), args.jobs, args.out / "mjwarp_10M" / "logs")
        print("$", shlex.join(summary_command(args)), flush=True)
        if status := subprocess.run(summary_command(args), cwd=ROOT).returncode:
            sys.exit(f"error: the summary exited with status {status} (its output is above)")
        return
    for command in mjwarp_commands(args) if mjwarp else commands(args):
        print("$", shlex.join(command), flush=True)
        if not args.dry_run and (status := subprocess.run(command, cwd=ROOT).returncode):
            sys.exit(f"error: that command exited with status {status} (its output is above); stopped there")


if __name__ == "__main__":
    main()
