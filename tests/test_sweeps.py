"""Sweeps on existing engines: Optuna search, joblib's parallel launcher, the SLURM config, and the
sweep summary."""

import csv
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, compose_config

TINY = ["env=InvertedPendulum-v4", "total_timesteps=1024", "env.num_envs=4", "ppo.num_steps=64",
        "ppo.num_minibatches=4", "ppo.update_epochs=1", "device=cpu"]


def tiny_without(*keys: str) -> list[str]:
    """TINY less its settings of `keys`, which the test sets itself (in its sweep, or in a config)."""
    return [arg for arg in TINY if arg.split("=", 1)[0] not in keys]


def search_refused(failed: int, corners: int) -> str:
    """The first line of an Optuna search's refusal, which says what it tried (hydra_edge.search_space_corners)."""
    return (f"error: {failed} of {corners} corners of this search space (each choice, each integer of a short range, "
            "the ends of others, a value inside a float range) fail their checks, so no trial was started:")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def refused_sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`train.py -m *overrides`, which must stop before its first job: exit code 2, no sweep dir."""
    result = run("train.py", "-m", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert result.returncode == 2, result.stderr
    assert not (tmp_path / "sweep").exists()
    return result


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_config("hydra/launcher=slurm", "hydra.launcher.partition=gpu", return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.cpus_per_task) == ("gpu", 1, 16)


def test_optuna_search_runs_and_the_summary_ranks_its_trials(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = run("train.py", "-m", "+sweep=ppo_search", *TINY, "hydra.sweeper.n_trials=2",
                 f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "Best value" in result.stdout + result.stderr
    assert "setup plugin alembic" not in result.stdout + result.stderr  # Optuna's imports, not the user's business
    assert (tmp_path / "optimization_results.yaml").is_file()
    # The sweep's last line names the command that ranks its trials: run it as printed.
    said = [line for line in result.stdout.splitlines() if line.startswith("sweep finished: 2 runs in ")]
    assert said, result.stdout[-2000:]
    summary = run(*shlex.split(said[-1].split("of them: python ")[1]))
    assert summary.returncode == 0, summary.stderr
    rows = list(csv.DictReader((tmp_path / "sweep_summary.csv").open()))
    assert len(rows) == 2 and all("ppo.learning_rate=" in row["overrides"] for row in rows)
    returns = [float(row["final_return"]) for row in rows]
    assert returns == sorted(returns, reverse=True)
    assert (tmp_path / "sweep_summary.png").stat().st_size > 1000


def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    result = run("train.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2",
                 "env.num_threads=1", *TINY, f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "Joblib" in result.stdout + result.stderr
    assert len(list(tmp_path.glob("*/checkpoints/last.pt"))) == 2
    assert f"sweep finished: 2 runs in {tmp_path}; " in result.stdout  # from the launching process
    # Two processes of their own, whose runs overlapped in time (train.log's first and last stamps).
    import datetime
    import json

    jobs = sorted(tmp_path.glob("*/run_info.json"))
    assert len({json.loads(info.read_text())["pid"] for info in jobs}) == 2

    def span(run_dir):
        stamps = [line[1:20] for line in (run_dir / "train.log").read_text().splitlines()]
        return [datetime.datetime.strptime(stamps[i], "%Y-%m-%d %H:%M:%S") for i in (0, -1)]

    (start_a, end_a), (start_b, end_b) = (span(info.parent) for info in jobs)
    assert start_a <= end_b and start_b <= end_a


@pytest.mark.parametrize("grid", ["command", "config"])
def test_a_grid_sweep_checks_every_job_before_the_first_starts(tmp_path, grid):
    # Jobs #0 and #1 pass their checks, #2 and #3 do not (3 minibatches of a 256-sample batch). Left to
    # check themselves, #0 and #1 would train, #2 would stop the sweep and #3 never run.
    if grid == "command":
        values = ["ppo.num_minibatches=4,3"]
    else:  # in a config's `hydra.sweeper.params`, which Hydra lists before the command's overrides
        (tmp_path / "grid").mkdir()
        (tmp_path / "grid" / "bad.yaml").write_text(
            "# @package _global_\nhydra:\n  sweeper:\n    params:\n      ppo.num_minibatches: 4,3\n")
        values = ["--config-dir", str(tmp_path), "+grid=bad"]
    tiny = tiny_without("ppo.num_minibatches")
    result = refused_sweep(tmp_path, *values, "seed=1,2", *tiny)
    lines = result.stderr.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == "error: 2 of 4 jobs of this sweep fail their checks, so none was started:"
    for line, job, seed in zip(lines[1:], (2, 3), (1, 2), strict=True):
        assert line.startswith(f"  #{job} ppo.num_minibatches=3 ") and f" seed={seed} " in line, line
        assert line.endswith(": `ppo.num_minibatches` (3) must divide the batch, "
                             "env.num_envs x ppo.num_steps = 4 x 64 = 256; the nearest that do: 2 and 4"), line
    assert "training " not in result.stdout


def test_a_grid_over_tasks_refuses_one_without_continuous_actions_before_the_first_job(tmp_path,
                                                                                      discrete_envpool_task):
    # envpool's spec of CartPole-v1 says Discrete(2) without starting it: InvertedPendulum-v4 no longer
    # trains first, only for the sweep to stop at CartPole and never reach Hopper.
    task = discrete_envpool_task
    tiny = tiny_without("env")
    result = refused_sweep(tmp_path, f"env.id=InvertedPendulum-v4,{task},Hopper-v4", "env.backend=envpool", *tiny)
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 1 of 3 jobs of this sweep fail their checks, so none was started:", lines
    assert lines[1].startswith(f"  #1 env.id={task} ") and len(lines) == 2, lines
    assert re.search(rf": {task} acts in Discrete\(\d+\): PPO here trains continuous control, which needs a 1-D Box of "
                     r"actions \(a MuJoCo task such as Ant-v4\)$", lines[1]), lines


def test_a_large_grid_says_it_is_checking_and_lists_ten_failed_jobs(tmp_path):
    tiny = tiny_without("ppo.num_minibatches")
    result = refused_sweep(tmp_path, "seed=range(1,51)", "ppo.num_minibatches=3", *tiny)
    assert result.stdout.splitlines()[0] == "checking the 50 jobs of this sweep before the first starts..."
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 50 of 50 jobs of this sweep fail their checks, so none was started:"
    assert [line.split()[0] for line in lines[1:11]] == [f"#{n}" for n in range(10)]
    assert lines[11:] == ["  ... and 40 more"]


def test_an_optuna_search_checks_its_space_before_the_first_trial(tmp_path):
    # Left to check themselves, the trials that drew 4 would train and the first to draw 3 would stop
    # the search. Each choice is tried beside each clip_coef of ppo_search's space (its update_epochs
    # is fixed here), 2 x 3 corners; its 3 float intervals, at their ends and a value between, beside
    # the first values of the others, 6 more. The 3 with 3 fail for one reason, shown once.
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = tiny_without("ppo.num_minibatches")
    result = refused_sweep(tmp_path, "+sweep=ppo_search", "ppo.num_minibatches=choice(4,3)", *tiny)
    assert "checking" not in result.stdout  # said from 20 corners up (0.1 s each)
    lines = result.stderr.splitlines()
    assert lines[0] == search_refused(3, 12), lines
    assert len(lines) == 2 and lines[1].startswith("  ppo.learning_rate=0.0001 ppo.ent_coef=0.0 ppo.clip_coef=0.1 ")
    assert lines[1].endswith(" ppo.num_minibatches=3: `ppo.num_minibatches` (3) must divide the batch, env.num_envs x "
                             "ppo.num_steps = 4 x 64 = 256; the nearest that do: 2 and 4 (and 2 more corners)"), lines


def test_a_large_search_space_checks_each_value_once(tmp_path):
    # 30 x 10 combinations are too many to compose (0.1 s each): each value is tried once, beside the
    # first value of the others, 30 + 9 corners, and the interval's other end and a value inside it. The
    # interval's lower end, the first value of clip_coef, fails here. (A range(...) is an integer
    # interval to Optuna, with two ends; choice(...) lists each value.)
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = tiny_without("ppo.update_epochs")
    seeds = ",".join(map(str, range(1, 31)))
    epochs = ",".join(map(str, range(1, 11)))
    result = refused_sweep(tmp_path, "hydra/sweeper=optuna", f"seed=choice({seeds})",
                           f"ppo.update_epochs=choice({epochs})", "ppo.clip_coef=interval(-0.1,0.3)", *tiny)
    lines = result.stderr.splitlines()
    assert "checking the 41 corners of this search space before the first trial starts...\n" in result.stdout
    assert lines == [search_refused(39, 41),
                     "  seed=1 ppo.update_epochs=1 ppo.clip_coef=-0.1: `ppo.clip_coef` must be positive, got -0.1 "
                     "(and 38 more corners)"], lines


def test_an_optuna_search_tries_each_integer_of_a_short_range(tmp_path):
    # Both ends of 4..16 divide the batch of 256, as 8 does; each of the 10 integers between that do
    # not would stop the search at the trial that drew it. The float interval passes at its ends and
    # inside; it is tried beside the first value of the other key only, 13 + 2 corners.
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = tiny_without("ppo.num_minibatches")
    result = refused_sweep(tmp_path, "hydra/sweeper=optuna", "ppo.num_minibatches=int(interval(4,16))",
                           "ppo.clip_coef=interval(0.1,0.3)", *tiny)
    lines = result.stderr.splitlines()
    assert lines[0] == search_refused(10, 15), lines
    powers = {n: 4 if n < 8 else 8 for n in (5, 6, 7, 9, 10, 11, 12, 13, 14, 15)}  # the power of 2 below each
    assert lines[1:] == [f"  ppo.num_minibatches={n} ppo.clip_coef=0.1: `ppo.num_minibatches` ({n}) must divide the "
                         f"batch, env.num_envs x ppo.num_steps = 4 x 64 = 256; the nearest that do: {below} and "
                         f"{2 * below}" for n, below in powers.items()], lines


def test_an_optuna_search_combines_its_discrete_values_whatever_its_float_ranges(tmp_path):
    # ppo.num_minibatches=32 divides the batch at ppo.num_steps=64 (4 x 64) but not at 100 (4 x 100), so
    # only the two together fail. Four float intervals beside them: their ends are not combined with
    # the rest, so the 3 x 2 x 2 discrete combinations stay within the 128 composed in full (2**4 x 12
    # would not, and each value would then be tried once, beside the first values, missing this pair).
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = tiny_without("ppo.num_minibatches", "ppo.num_steps")
    result = refused_sweep(tmp_path, "+sweep=ppo_search", "ppo.gamma=interval(0.95,0.999)",
                           "ppo.num_minibatches=choice(4,32)", "ppo.num_steps=choice(64,100)", *tiny)
    lines = result.stderr.splitlines()
    assert lines[0] == search_refused(3, 20), lines
    assert len(lines) == 2 and lines[1].endswith(
        " ppo.num_minibatches=32 ppo.num_steps=100: `ppo.num_minibatches` (32) must divide the batch, env.num_envs x "
        "ppo.num_steps = 4 x 100 = 400; the nearest that do: 25 and 40 (and 2 more corners)"), lines


def test_an_optuna_search_tries_a_float_range_between_its_ends(tmp_path):
    # An integer key over a float interval: both ends are whole numbers and pass, and nearly every
    # value a trial draws between them is not, so the first trial would stop the search.
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = tiny_without("total_timesteps")
    result = refused_sweep(tmp_path, "hydra/sweeper=optuna", "total_timesteps=interval(1e3,4e3)",
                           "ppo.clip_coef=choice(0.1,0.2)", *tiny)
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0] == search_refused(1, 4), lines
    drawn = re.fullmatch(r"  total_timesteps=(\S+) ppo.clip_coef=0.1: `total_timesteps` must be an integer, got (\S+)",
                         lines[1])
    assert drawn and drawn[1] == drawn[2] and 1e3 < float(drawn[1]) < 4e3, lines


def test_a_sweep_sent_to_slurm_checks_only_the_values_before_it_submits(tmp_path):
    # The jobs will run on the cluster's GPU nodes: `device=cuda` is no error on this machine, which may
    # have none, but a value that fails on every machine still stops the sweep before it submits.
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    tiny = tiny_without("ppo.num_minibatches", "device")
    result = refused_sweep(tmp_path, "hydra/launcher=slurm", "device=cuda", "ppo.num_minibatches=4,3", *tiny)
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 1 of 2 jobs of this sweep fail their checks, so none was started:", lines
    assert lines[1].startswith("  #1 device=cuda ppo.num_minibatches=3 ") and len(lines) == 2


def test_the_sweep_summary_ranks_runs_within_each_env():
    # Returns of different tasks do not compare: a sweep over envs ranks each env's runs among
    # themselves, and a run with no finished episode (NaN) comes last in its env.
    from summarize_sweep import rank

    rows = [{"run": run, "env": env, "final_return": score} for run, env, score in [
        ("a", "Hopper-v4", 900.0), ("b", "Ant-v4", 50.0), ("c", "Hopper-v4", float("nan")),
        ("d", "Ant-v4", 3000.0), ("e", "Hopper-v4", 2000.0)]]
    assert [row["run"] for row in sorted(rows, key=rank)] == ["d", "b", "e", "a", "c"]
