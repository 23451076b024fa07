"""The results summariser on synthetic runs with known returns, and the reproduction command."""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import summarize_results
from torch.utils.tensorboard import SummaryWriter

from tests.conftest import ROOT


def fake_run(path: Path, task: str, seed: int, final_return: float, budget: float = 10_000,
             overrides: tuple[str, ...] = (), hardware: str = "test box", simulator: str | None = None,
             iteration: int = 1000, started: float | None = None, seconds_per_iteration: float = 10.0) -> None:
    """Ten iterations of `iteration` steps: 20 episodes each, returns rising to `final_return`; with `started`
    (the command's start), iteration i logged `seconds_per_iteration` x i seconds after it."""
    path.mkdir(parents=True)
    info = {"env_id": task, "seed": seed, "hardware": hardware, **({"started": started} if started else {})}
    if simulator is not None:
        info["simulator"] = simulator
    (path / "run_info.json").write_text(json.dumps(info))
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text(f"seed: {seed}\ntotal_timesteps: {budget}\n")
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in (*overrides, f"seed={seed}")))
    writer = SummaryWriter(str(path))
    for i in range(1, 11):
        step = i * iteration
        wall = started + seconds_per_iteration * i if started else None
        writer.add_scalar("charts/episodic_return", final_return * i / 10, step, walltime=wall)
        writer.add_scalar("charts/episodes", 20, step, walltime=wall)
        writer.add_scalar("charts/SPS", 1000.0, step, walltime=wall)
    writer.close()


def test_the_time_to_the_reference_is_the_slowest_seeds_and_the_gymnasium_score_is_averaged_over_seeds(tmp_path):
    # Hopper-v4 at 10M against Sample Factory's 2793: returns rise by a tenth of 4000 an iteration, so each
    # seed first reaches it at iteration 7 (2800), 70 s after its command at 10 s an iteration, 105 s at 15.
    for seed, pace in ((1, 10.0), (2, 15.0)):
        run = tmp_path / "runs" / f"hopper{seed}"
        fake_run(run, "Hopper-v4", seed, 4000.0, budget=10_000_000, iteration=1_000_000, started=1e9,
                 seconds_per_iteration=pace)
        (run / summarize_results.GYMNASIUM_EVALUATION).write_text(json.dumps({"returns": [3000.0 + 100 * seed] * 10}))
    fake_run(tmp_path / "runs" / "walker", "Walker2d-v4", 1, 4000.0, budget=10_000_000, iteration=1_000_000,
             started=1e9)  # never reaches Sample Factory's 5488, and was not evaluated
    out = tmp_path / "docs"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "summarize_results.py"), str(tmp_path / "runs"), "--out",
                    str(out)], check=True, capture_output=True, text=True)
    rows = {r["task"]: r for r in csv.DictReader((out / "results" / "baselines.csv").open())}
    assert float(rows["Hopper-v4"]["seconds_to_reference"]) == pytest.approx(105.0, abs=0.05)
    assert float(rows["Hopper-v4"]["gymnasium_eval_mean"]) == 3150.0
    assert float(rows["Hopper-v4"]["gymnasium_eval_std"]) == 50.0
    assert rows["Walker2d-v4"]["seconds_to_reference"] == "" and rows["Walker2d-v4"]["gymnasium_eval_mean"] == ""
    page = (out / "results.md").read_text()
    assert "| Hopper-v4 | 10,000,000 | 2 | 3200.0 | 0.0 | 2793 (Sample Factory) | 105.0 | 3150.0 +- 50.0 |" in page
    assert "| Walker2d-v4 | 10,000,000 | 1 | 3200.0 | 0.0 | 5488 (Sample Factory) | - | - |" in page


def test_scores_are_the_last_100_episodes_averaged_over_seeds(tmp_path):
    for seed, final in ((1, 100.0), (2, 200.0)):
        fake_run(tmp_path / "runs" / f"hopper{seed}", "Hopper-v4", seed, final)
    fake_run(tmp_path / "runs" / "pendulum", "InvertedPendulum-v4", 1, 50.0, budget=1e4)  # `total_timesteps=1e4`
    fake_run(tmp_path / "runs" / "unfinished", "Hopper-v4", 3, 1e6, budget=20_000)  # stopped at 10k of 20k
    out = tmp_path / "docs"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "summarize_results.py"), str(tmp_path / "runs"),
                             "--out", str(out)], check=True, capture_output=True, text=True)
    assert "skipping" in result.stderr and "unfinished: 10,000 of 20,000 steps" in result.stderr
    rows = {r["task"]: r for r in csv.DictReader((out / "results" / "baselines.csv").open())}
    assert list(rows["Hopper-v4"]) == summarize_results.CSV_COLUMNS
    # last 100 episodes = the last 5 iterations of 20: mean of 0.6..1.0 x final = 0.8 x final
    hopper_scores = [0.8 * 100.0, 0.8 * 200.0]
    assert float(rows["Hopper-v4"]["mean"]) == pytest.approx(sum(hopper_scores) / 2)
    assert float(rows["Hopper-v4"]["std"]) == pytest.approx(40.0)
    assert rows["Hopper-v4"]["seeds"] == "2" and rows["Hopper-v4"]["steps"] == "10000"
    assert float(rows["InvertedPendulum-v4"]["mean"]) == pytest.approx(40.0)
    assert rows["InvertedPendulum-v4"]["steps"] == "10000"  # its config recorded the budget as 10000.0
    assert rows["Hopper-v4"]["hardware"] == "test box"
    assert (out / "results" / "Hopper-v4_10000.png").stat().st_size > 1000
    assert "| Hopper-v4 | 10,000 | 2 | 120.0 | 40.0 |" in (out / "results.md").read_text()


def test_the_page_is_rebuilt_from_its_csv_keeping_the_notes_written_by_hand(tmp_path):
    for seed, final in ((1, 100.0), (2, 200.0)):
        fake_run(tmp_path / "runs" / f"hopper{seed}", "Hopper-v4", seed, final, budget=1e6, iteration=100_000)
    out = tmp_path / "docs"
    script = [sys.executable, str(ROOT / "scripts" / "summarize_results.py")]
    subprocess.run([*script, str(tmp_path / "runs"), "--out", str(out)], check=True, capture_output=True)
    page = out / "results.md"
    generated = page.read_text()
    notes = f"{summarize_results.NOTES_START}\nHow these ran: on a test box.\n{summarize_results.NOTES_END}"
    table_end = generated.index("\n\n![")
    page.write_text(generated[:table_end] + "\n\n" + notes + generated[table_end:])
    rows = (out / "results" / "baselines.csv").read_text()
    with_notes = page.read_text()
    (out / "results" / "curves.png").unlink()
    result = subprocess.run([*script, "--rows", str(out / "results" / "baselines.csv")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # The same table from the CSV alone, the notes kept, the overview picture drawn again from the plots.
    assert page.read_text() == with_notes and (out / "results" / "baselines.csv").read_text() == rows
    assert "| Hopper-v4 | 1,000,000 | 2 | 120.0 | 40.0 |" in with_notes and "test box" in with_notes
    assert (out / "results" / "curves.png").stat().st_size > 1000
    # Runs again: the notes survive a rewrite from runs too.
    subprocess.run([*script, str(tmp_path / "runs"), "--out", str(out)], check=True, capture_output=True)
    assert notes in page.read_text()
    neither = subprocess.run(script, capture_output=True, text=True)
    assert neither.returncode == 2 and "--rows" in neither.stderr


def test_the_summary_is_written_beside_the_runs_and_leaves_the_projects_own_alone(tmp_path):
    # It wrote into docs/ by default: a user summarising their own runs replaced the project's table of
    # every machine's runs and the notes below it, whose run dirs are on no one machine.
    docs = ROOT / "docs"
    project = {path: path.read_bytes() for path in (docs / "results.md", docs / "results" / "baselines.csv")}
    images = set((docs / "results").iterdir())
    runs = tmp_path / "runs"
    fake_run(runs / "hopper1", "Hopper-v4", 1, 100.0)
    try:
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "summarize_results.py"), str(runs)],
                                capture_output=True, text=True, timeout=120)
        changed = [path.name for path, data in project.items() if path.read_bytes() != data]
        added = [path.name for path in set((docs / "results").iterdir()) - images]
    finally:  # were this to regress, the checkout would keep its files
        for path, data in project.items():
            path.write_bytes(data)
        for path in set((docs / "results").iterdir()) - images:
            path.unlink()
    assert result.returncode == 0, result.stderr
    assert (changed, added) == ([], [])
    assert "| Hopper-v4 | 10,000 | 1 | 80.0 | 0.0 |" in (runs / "results.md").read_text()
    assert (runs / "results" / "Hopper-v4_10000.png").exists()
    last = f"wrote {runs / 'results.md'}, {runs / 'results' / 'baselines.csv'} and 1 plot in {runs / 'results'}"
    assert result.stdout.splitlines()[-1] == last, result.stdout


def test_runs_of_an_experiment_are_their_own_row(tmp_path):
    # Same env and budget, different configurations: never pooled as seeds of one row.
    fake_run(tmp_path / "runs" / "default", "Ant-v4", 1, 100.0)
    fake_run(tmp_path / "runs" / "tuned", "Ant-v4", 1, 300.0, overrides=("+experiment=ant_10m", "device=cuda"))
    rows = {r["task"]: r for r in summarize_results.summarize(summarize_results.find_runs([tmp_path / "runs"]))}
    assert set(rows) == {"Ant-v4", "Ant-v4+ant_10m"}
    assert rows["Ant-v4"]["mean"] == pytest.approx(80.0) and rows["Ant-v4+ant_10m"]["mean"] == pytest.approx(240.0)
    assert summarize_results.reference("Ant-v4+ant_10m", 10_000_000) == summarize_results.REFERENCES[
        ("Ant-v4", 10_000_000)]


def test_learning_overrides_and_hardware_split_rows_and_execution_overrides_do_not(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "a1", "Ant-v4", 1, 100.0, overrides=("+experiment=ant_10m", "device=cuda", "env.num_threads=16"))
    fake_run(runs / "a2", "Ant-v4", 2, 300.0, overrides=("+experiment=ant_10m", "ppo.compile=false", "env.groups=2",
                                                        "log_every_s=30",
                                                        "hydra.run.dir=/tmp/x", "checkpoint.every=5"))
    fake_run(runs / "kl", "Ant-v4", 1, 500.0, overrides=("+experiment=ant_10m", "ppo.adaptive_lr_kl=0.016",
                                                        "'model.hidden_sizes=[8,8]'"))
    fake_run(runs / "cpu", "Ant-v4", 3, 700.0, overrides=("+experiment=ant_10m",), hardware="other box")
    rows = summarize_results.summarize(summarize_results.find_runs([runs]))
    by_key = {(r["task"], r["hardware"]): r for r in rows}
    assert set(by_key) == {("Ant-v4+ant_10m", "test box"), ("Ant-v4+ant_10m", "other box"),
                           ("Ant-v4+ant_10m model.hidden_sizes=[8,8] ppo.adaptive_lr_kl=0.016", "test box")}
    pooled = by_key[("Ant-v4+ant_10m", "test box")]
    assert pooled["seeds"] == 2 and pooled["mean"] == pytest.approx(160.0)  # 0.8 x (100 + 300) / 2
    for task in ("Ant-v4+ant_10m ppo.adaptive_lr_kl=0.016", "Ant-v4 ppo.adaptive_lr_kl=0.016"):
        assert summarize_results.reference(task, 10_000_000) == summarize_results.REFERENCES[("Ant-v4", 10_000_000)]
    assert summarize_results.plot_name("Ant-v4+ant_10m ppo.adaptive_lr_kl=0.016", 10) == \
        "Ant-v4+ant_10m_ppo.adaptive_lr_kl_0.016_10.png"


def test_runs_on_another_simulator_build_get_their_own_row(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "a", "Ant-v4", 1, 100.0, simulator="envpool 1.2.5, MuJoCo 3.6.0")
    fake_run(runs / "b", "Ant-v4", 2, 300.0, simulator="envpool 1.2.5, MuJoCo 3.6.0")
    fake_run(runs / "c", "Ant-v4", 1, 500.0, simulator="envpool 1.2.7, MuJoCo 4.0.0")
    fake_run(runs / "d", "Ant-v4", 3, 700.0)  # recorded before run_info named the simulator
    rows = {r["hardware"]: r for r in summarize_results.summarize(summarize_results.find_runs([runs]))}
    assert set(rows) == {"test box; envpool 1.2.5, MuJoCo 3.6.0", "test box; envpool 1.2.7, MuJoCo 4.0.0", "test box"}
    assert rows["test box; envpool 1.2.5, MuJoCo 3.6.0"]["seeds"] == 2
    assert rows["test box; envpool 1.2.5, MuJoCo 3.6.0"]["mean"] == pytest.approx(160.0)


def test_a_seed_passed_twice_is_an_error_not_a_double_weight(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "a", "Ant-v4", 1, 100.0)
    fake_run(runs / "b", "Ant-v4", 2, 300.0)
    fake_run(runs / "a_copy", "Ant-v4", 1, 100.0)
    with pytest.raises(ValueError, match="seed appears more than once.*a_copy"):
        summarize_results.summarize(summarize_results.find_runs([runs]))


def test_a_resumed_run_counts_its_training_time_not_the_pause(tmp_path):
    # Two processes, 1000 s apart, each logging 5 iterations 10 s apart: 80 s of training.
    path = tmp_path / "runs" / "ant"
    fake_run(path, "Ant-v4", 1, 100.0)
    for file in path.glob("events.out.tfevents.*"):
        file.unlink()
    for start, first_iteration in ((0.0, 1), (1000.0, 6)):
        writer = SummaryWriter(str(path), filename_suffix=f".part{first_iteration}")
        for i in range(5):
            step = (first_iteration + i) * 1000
            writer.add_scalar("charts/episodic_return", 100.0, step, walltime=start + 10 * i)
            writer.add_scalar("charts/SPS", 100.0, step, walltime=start + 10 * i)
        writer.close()
    run = summarize_results.load_run(path)
    assert run.final_step == 10_000 and run.wall_clock_s == pytest.approx(80.0)
    # 4,000 steps trained inside each process's 40 s span: a process's first iteration ends where
    # its span starts, so counting all 10,000 steps would claim 125 steps/s.
    assert run.timed_steps == 8_000 and run.sps == pytest.approx(100.0)


def test_a_run_of_one_iteration_has_no_rate_rather_than_a_huge_one(tmp_path):
    path = tmp_path / "runs" / "short"
    fake_run(path, "Hopper-v4", 1, 100.0, budget=1_000)
    for file in path.glob("events.out.tfevents.*"):
        file.unlink()
    writer = SummaryWriter(str(path))
    writer.add_scalar("charts/episodic_return", 100.0, 1000)
    writer.add_scalar("charts/SPS", 1000.0, 1000)
    writer.close()
    (row,) = summarize_results.summarize(summarize_results.find_runs([tmp_path / "runs"]))
    assert row["sps"] is None and row["wall_clock_s"] == 0.0
    assert summarize_results.format_sps(row["sps"]) == "-" and summarize_results.format_sps(4746) == "4,746"


def test_reproduction_dry_run_lists_every_task_and_the_10m_ant():
    result = subprocess.run([sys.executable, "scripts/reproduce_baselines.py", "--dry-run"], cwd=ROOT,
                            capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert "env=HalfCheetah-v4,Hopper-v4,Walker2d-v4,Ant-v4,Humanoid-v4,InvertedPendulum-v4" in lines[0]
    assert "seed=1,2,3" in lines[0] and "total_timesteps=1000000" in lines[0]
    ant_10m = lines[1].split()
    assert "env=Ant-v4" in ant_10m and "+experiment=ant_10m" in ant_10m and "seed=1,2,3" in ant_10m
    assert not any(word.startswith("total_timesteps") for word in ant_10m)  # the experiment sets 10M
    # the summary goes beside the runs: docs/results.md (every machine's runs, and notes) stays as it is
    runs = str(ROOT / "multirun" / "baselines")
    assert lines[2].split()[-3:] == [runs, "--out", runs]


def test_the_mujoco_warp_reproduction_runs_each_preset_at_10m_in_a_process_of_its_own(tmp_path):
    # Five tasks x 3 seeds, one train.py a run (its time counts from its own command), each followed by its
    # gymnasium evaluation; a finished run is not run again (the runs accumulate, part by part); the
    # summary covers them all.
    finished = tmp_path / "mjwarp_10M" / "Ant-v4_seed2"
    finished.mkdir(parents=True)
    (finished / "train.log").write_text("[2026-12-07 10:00:00] finished at step 10,027,008 after 1m40s: ...\n")
    result = subprocess.run([sys.executable, "scripts/reproduce_baselines.py", "--backend", "mjwarp", "--dry-run",
                             "--device", "cuda", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    trains = [line.split() for line in result.stdout.splitlines() if " train.py " in line]
    evaluations = [line.split() for line in result.stdout.splitlines() if "scripts/evaluate.py" in line]
    presets = {"HalfCheetah": "mjwarp_half_cheetah", "Hopper": "mjwarp_hopper", "Walker2d": "mjwarp_walker2d",
               "Ant": "mjwarp_ant", "Humanoid": "mjwarp_humanoid"}
    expected = [(task, seed) for task in presets for seed in (1, 2, 3) if (task, seed) != ("Ant", 2)]
    assert [(w[w.index("train.py") + 2].split("=")[1].split("-")[0], int(w[w.index("train.py") + 3][5:]))
            for w in trains] == expected
    for words in trains:
        task = words[words.index("train.py") + 2].split("=")[1]
        assert words[words.index("train.py") + 1] == f"+experiment={presets[task.split('-')[0]]}"
        assert "total_timesteps=10000000" in words and "device=cuda" in words and task.endswith("-v4")
    assert len(evaluations) == 15 and all("--backend" in w and "gymnasium" in w and "--json" in w for w in evaluations)
    assert "# " + str(finished) + " holds a finished run: not run again" in result.stdout
    assert result.stdout.splitlines()[-1].split()[-3:] == [str(tmp_path), "--out", str(tmp_path)]
    refused = subprocess.run([sys.executable, "scripts/reproduce_baselines.py", "--backend", "mjwarp", "--dry-run",
                              "--tasks", "Ant-v5", "InvertedPendulum-v4", "Hopper-v4"], cwd=ROOT, capture_output=True,
                             text=True)
    assert refused.returncode == 0  # every task with a preset: v5 ids and InvertedPendulum too


def test_reproduction_takes_another_10m_experiment_and_rejects_unknown_ones():
    def dry_run(*args):
        return subprocess.run([sys.executable, "scripts/reproduce_baselines.py", "--dry-run", *args], cwd=ROOT,
                              capture_output=True, text=True)

    result = dry_run("--ant-10m-experiment", "ant_10m_adaptive")
    assert result.returncode == 0 and "+experiment=ant_10m_adaptive" in result.stdout.splitlines()[1].split()
    result = dry_run("--ant-10m-experiment", "ant_1m")
    assert result.returncode == 2 and "invalid choice: 'ant_1m'" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--tasks", "Hoper-v4"], "argument --tasks: invalid choice: 'Hoper-v4'"),
    (["--scale", "0"], "--scale must be positive, got 0.0"),
    (["--device", "gpu", "--dry-run"], "`--device` must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    # no GPU here, or fewer than eight on a GPU host: refused before any job starts
    (["--device", "cuda:7", "--tasks", "Hopper-v4"], "error: `--device=cuda:7` but "),
])
def test_reproduction_refuses_bad_arguments_before_any_job(tmp_path, args, message):
    # --out and --docs in tmp_path: were a refusal to regress, its jobs and summary land there, not in docs/
    where = ["--out", str(tmp_path / "runs"), "--docs", str(tmp_path / "docs")]
    result = subprocess.run([sys.executable, "scripts/reproduce_baselines.py", *args, *where], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert "$ " not in result.stdout  # no command printed, so none ran


def test_a_failed_reproduction_job_stops_the_rest_with_one_line(tmp_path, monkeypatch):
    import reproduce_baselines
    ran = []

    def fails(command, cwd):
        ran.append(command)
        return subprocess.CompletedProcess(command, returncode=3)

    monkeypatch.setattr(reproduce_baselines.subprocess, "run", fails)
    monkeypatch.setattr(sys, "argv", ["reproduce_baselines.py", "--device", "cpu", "--tasks", "Hopper-v4",
                                      "--out", str(tmp_path / "runs"), "--docs", str(tmp_path / "docs")])
    with pytest.raises(SystemExit, match=r"^error: that command exited with status 3 \(its output is above\)"):
        reproduce_baselines.main()
    assert len(ran) == 1 and "env=Hopper-v4" in ran[0]  # the summary after it did not run


def test_random_action_statistics_of_the_toy_env(capsys):
    # The toy env's 8 steps from reset (tests/test_collect.py): two valid episodes per env (lengths 2
    # and 3, one terminated, one truncated) and two autoreset dummies, which are left out.
    from simulator_trajectory import random_action_statistics

    from tests.toy_env import TOY_ID, register_toy_envs

    register_toy_envs()
    random_action_statistics(TOY_ID, "gymnasium", num_envs=2, steps=8, seed=0, action_seed=0)
    out = capsys.readouterr().out
    assert "reward per step 1.6667" in out  # rewards 1, 2 | 1, 2, 3 | 1 over the valid steps
    assert "terminations 2, truncations 2, mean episode length 2.5" in out


def test_compare_pairs_equal_tasks_and_a_config_change_against_its_baseline(tmp_path):
    # before: the defaults on Hopper and Ant; after: Hopper with another learning rate, Ant as before.
    for seed in (1, 2):
        fake_run(tmp_path / "before" / f"hopper{seed}", "Hopper-v4", seed, 100.0 * seed)
        fake_run(tmp_path / "before" / f"ant{seed}", "Ant-v4", seed, 1000.0)
        fake_run(tmp_path / "after" / f"hopper{seed}", "Hopper-v4", seed, 200.0 * seed,
                 overrides=("ppo.learning_rate=0.001",))
        fake_run(tmp_path / "after" / f"ant{seed}", "Ant-v4", seed, 1000.0)
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_results.py"), "--before",
                             str(tmp_path / "before"), "--after", str(tmp_path / "after")],
                            check=True, capture_output=True, text=True)
    rows = result.stdout.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| Ant-v4", "| Hopper-v4 -> Hopper-v4 ppo.learning_rate=0.001"]
    # scores are 0.8 x the final return (last 100 episodes): Hopper 80, 160 before and 160, 320 after
    assert rows[1].endswith("| 120 +- 40 (2) | 240 +- 80 (2) | +120 | +1.34 |"), rows[1]
    # Ant scored 800 in every run of both sets: no t to give, and the cell says why rather than `nan`
    assert rows[0].endswith("| 800 +- 0 (2) | 800 +- 0 (2) | +0 | n/a: no spread |"), rows[0]
    from compare_results import t_cell

    assert t_cell(np.array([800.0]), np.array([700.0, 900.0])) == "n/a: one seed"
    # a mistyped dir is named, not read as a set that shares no task with the other
    typo = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_results.py"), "--before",
                           str(tmp_path / "before"), "--after", str(tmp_path / "aftr")], capture_output=True, text=True)
    assert typo.returncode == 2 and f"error: no such dir: {tmp_path / 'aftr'}" in typo.stderr


def test_the_sweep_table_marks_runs_stopped_short_and_names_runs_it_cannot_score(tmp_path):
    # A sweep's jobs: one finished, one stopped at 10k of 20k steps (its return is from half the
    # training), and one that died in its first iteration (run_info.json and nothing logged).
    fake_run(tmp_path / "0_Hopper-v4_seed1", "Hopper-v4", 1, 100.0)
    fake_run(tmp_path / "1_Hopper-v4_seed2", "Hopper-v4", 2, 300.0, budget=20_000)
    fake_run(tmp_path / "2_Hopper-v4_seed3", "Hopper-v4", 3, 200.0)
    for file in (tmp_path / "2_Hopper-v4_seed3").glob("events.out.tfevents.*"):
        file.unlink()
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "summarize_sweep.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    header, *rows, note = result.stdout.splitlines()
    assert header.split() == ["run", "env", "final", "return", "steps", "SPS", "wall", "s", "overrides"]
    assert [row.split()[:4] for row in rows] == [["1_Hopper-v4_seed2", "Hopper-v4", "240.00", "10,000*"],
                                                 ["0_Hopper-v4_seed1", "Hopper-v4", "80.00", "10,000"]]
    assert note == "* stopped before its total_timesteps (Ctrl-C, a crash, or still running)"
    dead = tmp_path / "2_Hopper-v4_seed3"
    assert f"skipping {dead}: no iteration logged: it stopped or died in its first" in result.stderr


@pytest.mark.parametrize("script", ["summarize_results.py", "summarize_sweep.py"])
def test_the_summaries_name_a_dir_that_does_not_exist(tmp_path, script):
    # as compare_results.py does (above): a mistyped dir is not a dir that holds no runs
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), str(tmp_path / "multrun")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"error: no such dir: {tmp_path / 'multrun'}" in result.stderr, result.stderr
    empty = subprocess.run([sys.executable, str(ROOT / "scripts" / script), str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert empty.returncode == 1 and "no runs" in empty.stderr and "no such dir" not in empty.stderr


def test_compare_leaves_a_config_change_unpaired_where_its_baseline_is_ambiguous():
    from compare_results import pair_up

    before = [("Hopper-v4", 10), ("Hopper-v4 ppo.gamma=0.9", 10), ("Ant-v4", 10)]
    after = [("Hopper-v4 ppo.learning_rate=0.001", 10), ("Ant-v4", 10), ("Ant-v4", 20)]
    assert pair_up(before, after) == [("Ant-v4", "Ant-v4", 10)]


def test_time_to_score_by_task_measures_each_run_against_its_tasks_published_score(tmp_path):
    # Hopper-v4 at 10M against Sample Factory's 2793: returns rise by 400 an iteration, so it is reached at
    # iteration 7 (2800), 70 s after the command; Walker2d's 5488 is never reached; no reference at 12,345 steps.
    import torch

    runs = []
    for task, budget, final in (("Hopper-v4", 10_000_000, 4000.0), ("Walker2d-v4", 10_000_000, 4000.0),
                                ("Hopper-v4", 12_345, 4000.0)):
        run = tmp_path / f"{task}_{budget}"
        fake_run(run, task, 1, final, budget=budget, iteration=1_000_000, started=1e9)
        (run / "checkpoints").mkdir()
        torch.save({"settings": {"env": {"id": task, "backend": "mjwarp", "num_envs": 1024},
                                 "total_timesteps": budget}}, run / "checkpoints" / "last.pt")
        runs.append(str(run))
    out = tmp_path / "seconds.png"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_time_to_score.py"), *runs, "--by-task",
                             "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("first >= 2793 at step 7,000,000, 70 s")
    assert lines[1].endswith("never >= 5488")
    assert lines[2].endswith("return 4000.0 at step 10,000,000, 100 s")  # no published score at that budget
    assert out.stat().st_size > 0


def side_by_side(tmp_path, monkeypatch, fails: str | None) -> tuple[list[list[str]], pytest.ExceptionInfo | None]:
    """`--backend mjwarp --jobs 2` over Hopper and Ant x seeds 1-2 with faked commands; the run named by
    `fails` ("Hopper-v4 seed=2") fails at once, every other command takes 0.2 s."""
    import threading
    import time

    import reproduce_baselines
    ran, lock = [], threading.Lock()

    def fake_run(command, cwd, stdout=None, stderr=None):
        with lock:
            ran.append(command)
        if fails and f"env={fails.split()[0]}" in command and fails.split()[1] in command:
            return subprocess.CompletedProcess(command, returncode=5)
        time.sleep(0.2)
        if stdout is not None:
            stdout.write(f"ran {command[1]}\n")
        return subprocess.CompletedProcess(command, returncode=0)

    monkeypatch.setattr(reproduce_baselines.subprocess, "run", fake_run)
    monkeypatch.setattr(reproduce_baselines, "mps_is_running", lambda: True)
    monkeypatch.setattr(sys, "argv", ["reproduce_baselines.py", "--backend", "mjwarp", "--device", "cpu", "--jobs", "2",
                                      "--tasks", "Hopper-v4", "Ant-v4", "--seeds", "1", "2",
                                      "--out", str(tmp_path / "runs")])
    if fails is None:
        reproduce_baselines.main()
        return ran, None
    with pytest.raises(SystemExit) as stopped:
        reproduce_baselines.main()
    return ran, stopped


def test_side_by_side_runs_evaluate_each_run_after_its_training_then_summarise(tmp_path, monkeypatch):
    ran, _ = side_by_side(tmp_path, monkeypatch, fails=None)
    runs = [f"{task}_seed{seed}" for task in ("Hopper-v4", "Ant-v4") for seed in (1, 2)]
    for run in runs:
        steps = [c[1] for c in ran if any(word.endswith(run) for word in c)]
        assert steps == ["train.py", "scripts/evaluate.py"], (run, steps)
        assert (tmp_path / "runs" / "mjwarp_10M" / "logs" / f"{run}.log").read_text() == (
            "ran train.py\nran scripts/evaluate.py\n")
    assert ran[-1][1] == "scripts/summarize_results.py" and len(ran) == 9


def test_side_by_side_runs_start_nothing_after_a_failure_and_name_it_in_one_line(tmp_path, monkeypatch):
    # Hopper seed 2 fails at once, while Hopper seed 1 trains: seed 1 is not evaluated, the Ant runs never
    # start, no summary is written, and one line names the command and its log.
    ran, stopped = side_by_side(tmp_path, monkeypatch, fails="Hopper-v4 seed=2")
    assert [(c[1], c[3], c[4]) for c in ran] in (
        [("train.py", "env=Hopper-v4", "seed=1"), ("train.py", "env=Hopper-v4", "seed=2")],
        [("train.py", "env=Hopper-v4", "seed=2"), ("train.py", "env=Hopper-v4", "seed=1")])
    assert re.match(r"error: .*train\.py .*env=Hopper-v4 seed=2 .* exited with status 5 \(its output: "
                    r".*Hopper-v4_seed2\.log\); no run started after it$", str(stopped.value))


def test_jobs_is_refused_for_the_cpu_baselines():
    result = subprocess.run([sys.executable, "scripts/reproduce_baselines.py", "--jobs", "2", "--dry-run"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--jobs must be 1, or more with --backend mjwarp" in result.stderr
