"""train.py end to end on CPU: smoke runs on both backends, TensorBoard, checkpoints, resume,
multirun, error messages, the NaN guard, and (slow, still run in CI) learning InvertedPendulum."""

import json
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import hydra
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ppo.config import setting_keys, settings_from_dict
from ppo.run.checkpoint import (
    KEYS,
    CheckpointError,
    load_checkpoint,
    numpy_rng_state,
    resolve_checkpoint,
    set_numpy_rng_state,
)
from ppo.run.logger import RunLogger, final_step
from tests.conftest import ROOT, compose_config
from tests.toy_env import STAGGER_ID, TOY_ID, TOY_NAN_ID, register_toy_envs, stagger_episodes


def run_train(*overrides: str, timeout: int = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_smoke_run_writes_events_and_a_checkpoint(tmp_path, backend):
    result = run_train("env=Hopper-v4", f"env.backend={backend}", "env.num_envs=4", "ppo.num_steps=64",
                       "ppo.num_minibatches=4", "ppo.update_epochs=2", "total_timesteps=400", "device=cpu",
                       f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    # 400 steps take two whole iterations of 256: the first line says so and the bar ends at 100%.
    assert "for 400 steps (whole iterations of 256: it ends at 512)" in result.stdout
    assert "step 512/512 (100.0%)" in result.stdout and "SPS" in result.stdout
    # the closing line: where it stopped, after how long, the score, and where the run is
    assert re.search(r"^finished at step 512 after \d+m\d\ds: mean return of the last 100 episodes -?\d+\.\d "
                     rf"\(CleanRL's metric\); logs and checkpoint in {re.escape(str(tmp_path))}$", result.stdout, re.M)
    assert "compiled update" not in result.stdout, "ppo.compile=auto must not compile a short CPU run"
    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert (tmp_path / ".hydra" / "config.yaml").is_file()
    # train.log keeps what the console showed, each line time-stamped.
    logged = [line.split("] ", 1)[1] for line in (tmp_path / "train.log").read_text().splitlines()]
    assert logged == result.stdout.splitlines()
    checkpoint = torch.load(resolve_checkpoint(str(tmp_path)), weights_only=True)
    assert checkpoint["global_step"] == 512 and checkpoint["iteration"] == 2
    # The simulator build is part of what a result depends on: run_info names it, MuJoCo included.
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert re.fullmatch(rf"{backend} [0-9.]+, MuJoCo [0-9]+\.[0-9]+\.[0-9]+", info["simulator"]), info["simulator"]
    # TensorBoard holds the tags the README lists (CleanRL's), and the settings as CleanRL's text table.
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == readme_tensorboard_tags()
    (table,) = events.Tensors("hyperparameters/text_summary")
    rows = table.tensor_proto.string_val[0].decode().splitlines()
    assert rows[:2] == ["|param|value|", "|-|-|"]
    assert {"|env.id|Hopper-v4|", "|ppo.num_steps|64|", "|total_timesteps|400|", "|ppo.target_kl|null|",
            "|model.hidden_sizes|[64,64]|"} <= set(rows)


def test_the_reported_returns_are_those_of_the_episodes_the_env_finished(tmp_path):
    # The score every baseline claim rests on, against an independent count: a toy task whose episodes
    # (terminated and truncated, staggered over the envs, several ending on one step) have returns known
    # from its rules. Per iteration: the episodes that ended in it, their mean return and length; at the
    # end: the mean return of the last 100 episodes, taking whole iterations from the end.
    from ppo import trainer

    register_toy_envs()
    num_envs, num_steps, iterations = 6, 5, 20
    settings = settings_from_dict({
        "total_timesteps": iterations * num_envs * num_steps, "device": "cpu", "seed": 0, "checkpoint": {"every": 0},
        "env": {"id": STAGGER_ID, "num_envs": num_envs, "backend": "gymnasium"},
        "ppo": {"num_steps": num_steps, "num_minibatches": 2, "update_epochs": 1}})
    score = trainer.train(settings, str(tmp_path), torch.device("cpu"))
    known = stagger_episodes(num_envs, iterations * num_steps)
    per_iteration = [[(r, n) for end, _, r, n in known if k * num_steps <= end < (k + 1) * num_steps]
                     for k in range(iterations)]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(f"charts/{tag}")}
              for tag in ("episodic_return", "episodic_length", "episodes")}
    expected = {k: ended for k, ended in enumerate(per_iteration) if ended}
    assert sorted(logged["episodes"]) == [(k + 1) * num_envs * num_steps for k in expected]
    for k, ended in expected.items():
        step = (k + 1) * num_envs * num_steps
        assert logged["episodes"][step] == len(ended)
        assert logged["episodic_return"][step] == pytest.approx(sum(r for r, _ in ended) / len(ended), rel=1e-6)
        assert logged["episodic_length"][step] == pytest.approx(sum(n for _, n in ended) / len(ended), rel=1e-6)
    last: list[float] = []
    for ended in reversed(per_iteration):
        if len(last) >= 100:
            break
        last += [r for r, _ in ended]
    assert len(known) > 150 and 100 <= len(last) < 120
    assert score == pytest.approx(sum(last) / len(last), rel=1e-12)


def readme_tensorboard_tags() -> set[str]:
    section = (ROOT / "README.md").read_text().split("### TensorBoard", 1)[1].split("###", 1)[0]
    return set(re.findall(r"`((?:charts|losses|time)/\w+)`", section))


@pytest.mark.parametrize(("start", "total", "per_iteration", "expected"), [
    (0, 512, 256, 512), (0, 400, 256, 512), (0, 1, 256, 256), (0, 1_000_000, 2048, 1_001_472),
    (512, 1024, 256, 1024), (512, 600, 256, 768), (512, 512, 256, 512), (768, 512, 256, 768)])
def test_final_step_is_where_the_loop_of_whole_iterations_stops(start, total, per_iteration, expected):
    step = start  # whole iterations while the count is below the total, run by hand
    while step < total:
        step += per_iteration
    assert step == expected
    assert final_step(start, total, per_iteration) == expected


@pytest.mark.parametrize("every_s", [0.0, 3600.0], ids=["last-step-printed-in-loop", "throttled"])
def test_the_closing_progress_line_is_printed_once(tmp_path, capsys, every_s):
    logger = RunLogger(str(tmp_path), last_step=512, start_step=0, every_s=every_s)
    logger.progress(256, None)  # no episode has finished yet
    logger.progress(512, 2.0)  # the loop's last iteration: printed unless throttled
    logger.progress(512, None, final=True)  # after the loop: the 100% line, once
    logger.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.count("step 512/512 (100.0%)") for line in lines] == [0, 1]
    assert "| return         - |" in lines[0] and "| return      2.00 |" in lines[1]


def test_the_console_rate_leaves_out_the_first_iteration(tmp_path, capsys, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("ppo.run.logger.time.time", lambda: clock[0])
    logger = RunLogger(str(tmp_path), last_step=20_480, start_step=0, every_s=0.0)
    clock[0] += 12.0  # a first iteration of 2,048 steps with 12 s of one-off warm-up
    logger.progress(2_048, None)
    clock[0] += 1.0  # then 9 iterations a second
    logger.progress(20_480, None)
    assert logger.sps(20_480) == pytest.approx(20_480 / 13)  # charts/SPS: CleanRL's, over all the time
    logger.close()
    first, last = capsys.readouterr().out.splitlines()
    # The first iteration's rate, as measured; no ETA from it, whose warm-up would say 1m48s here.
    assert "| SPS 171 |" in first and first.endswith("| ETA --")
    assert "| SPS 18,432 |" in last and "ETA 0m00s" in last


def test_checkpoints_load_weights_only_and_older_ones_still_do(tmp_path):
    import numpy as np

    # numpy's RNG state goes into a checkpoint as tensors and numbers, and comes back whole
    np.random.seed(3)
    np.random.standard_normal()  # a cached Gaussian is part of the state
    state = numpy_rng_state()
    draws = np.random.standard_normal(5)
    set_numpy_rng_state(state)
    np.testing.assert_array_equal(np.random.standard_normal(5), draws)

    stub = {key: torch.zeros(2) for key in KEYS}  # the form of each part, as load_checkpoint checks it
    stub.update(settings={"env": {}}, iteration=0, global_step=0, agent={"w": torch.zeros(2)},
                optimizer={"state": {}, "param_groups": [{}]}, obs_normalizer={}, reward_scaler={},
                generator=torch.zeros(8, dtype=torch.uint8), torch_rng=torch.zeros(8, dtype=torch.uint8))
    torch.save({**stub, "numpy_rng": state}, tmp_path / "new.pt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "new.pt") == []
    loaded = load_checkpoint(tmp_path / "new.pt", torch.device("cpu"))
    set_numpy_rng_state(loaded["numpy_rng"])
    np.testing.assert_array_equal(np.random.standard_normal(5), draws)

    # Written before 2026-12-04: numpy's own form, a numpy array in a tuple
    set_numpy_rng_state(state)
    torch.save({**stub, "numpy_rng": np.random.get_state()}, tmp_path / "older.pt")
    set_numpy_rng_state(load_checkpoint(tmp_path / "older.pt", torch.device("cpu"))["numpy_rng"])
    np.testing.assert_array_equal(np.random.standard_normal(5), draws)

    # Any other object is refused, not rebuilt: a pickle can name any callable to rebuild it with
    torch.save({**stub, "settings": Path("/")}, tmp_path / "code.pt")
    with pytest.raises(CheckpointError, match=r"code.pt is not a checkpoint of train.py: it holds objects a "
                                              r"checkpoint does not \(pathlib.PosixPath\), which loading would"):
        load_checkpoint(tmp_path / "code.pt", torch.device("cpu"))


def test_a_resume_refused_in_place_leaves_its_runs_record_and_names_the_runs_own_command(tmp_path):
    # Hydra writes the command's .hydra/ record before the resume is checked: a refused resume sent into
    # the run's own dir must not leave its command there (the next resume command is built from it).
    run = tmp_path / "a"
    common = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
              "ppo.update_epochs=1", "device=cpu", "total_timesteps=512"]
    assert run_train(*common, f"hydra.run.dir={run}").returncode == 0
    record = {path.name: path.read_bytes() for path in (run / ".hydra").glob("*.yaml")}
    refused = run_train(f"resume={run}", f"hydra.run.dir={run}")
    assert refused.returncode == 2
    assert "its run trained with other settings: env.id InvertedPendulum-v4" in refused.stderr
    assert {path.name: path.read_bytes() for path in (run / ".hydra").glob("*.yaml")} == record
    suggested = shlex.split(refused.stderr.split("own overrides: ")[1].split("; or set")[0])
    assert suggested == ["python", "train.py", *common, f"resume={run}", f"hydra.run.dir={run}"]
    onward = run_train(*suggested[2:], "total_timesteps=1024")
    assert onward.returncode == 0 and "finished at step 1,024" in onward.stdout, onward.stderr


def test_an_accepted_resume_in_place_keeps_its_own_record(tmp_path):
    # What keep_record remembers is put back only where the resume is refused: an accepted one's stop line
    # is built from its own command (a target raised on purpose, say), which Hydra wrote over the run's.
    from ppo.run import records

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- env=Hopper-v4\n")
    records.keep_record(str(tmp_path))
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- env=Hopper-v4\n- total_timesteps=2000000\n")
    try:
        assert records.recorded_overrides(tmp_path) == ["env=Hopper-v4", "total_timesteps=2000000"]
    finally:
        records.restore_record()
    assert records.recorded_overrides(tmp_path) == ["env=Hopper-v4"]


def test_a_resume_names_forgotten_overrides_continues_the_step_count_and_records_what_it_continues(tmp_path):
    common = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
              "ppo.update_epochs=1", "device=cpu", "checkpoint.every=1", "ppo.normalize_values=true",
              "model.shared_trunk=true"]
    first = run_train(*common, "total_timesteps=512", f"hydra.run.dir={tmp_path / 'a'}")
    assert first.returncode == 0, first.stderr
    before = torch.load(resolve_checkpoint(str(tmp_path / "a")), weights_only=True)
    # The run's overrides forgotten: an error naming the settings, and the command that continues it.
    forgot = run_train(*common[:-2], "total_timesteps=1024", f"resume={tmp_path / 'a'}",
                       f"hydra.run.dir={tmp_path / 'forgot'}")
    assert forgot.returncode == 2 and "Traceback" not in forgot.stderr
    assert forgot.stderr.startswith(f"error: resume={tmp_path / 'a'}: its run trained with other settings: "
                                    "model.shared_trunk true (here false), ppo.normalize_values true (here false). "
                                    "Continue it with its own overrides: python train.py ")
    assert not list((tmp_path / "forgot").glob("events.out.tfevents.*"))
    suggested = shlex.split(forgot.stderr.split("own overrides: ")[1].split("; or set")[0])
    assert suggested[:2] == ["python", "train.py"] and "total_timesteps=1024" in suggested
    # A task changed on purpose whose model cannot take the checkpoint's weights: one line naming a tensor.
    other_task = run_train(*suggested[2:], "env.id=Hopper-v4", f"hydra.run.dir={tmp_path / 'other_task'}")
    assert other_task.returncode == 2 and len(other_task.stderr.strip().splitlines()) == 1
    assert other_task.stderr.startswith("error: resume: the checkpoint's model does not fit this env/model config "
                                        "(size mismatch for ")
    # That command, and a learning rate changed on purpose: it continues the run and says so.
    second = run_train(*suggested[2:], "ppo.learning_rate=0.001", f"hydra.run.dir={tmp_path / 'b'}")
    assert second.returncode == 0, second.stderr
    assert "resumed with settings changed on purpose: ppo.learning_rate 0.0003 -> 0.001" in second.stdout
    # The new run dir says what it continues, on the console, in train.log and in run_info.json.
    source = resolve_checkpoint(str(tmp_path / "a"))
    said = f"resumed from {source} at step 512 (iteration {before['iteration']})"
    assert said in second.stdout.splitlines() and said in (tmp_path / "b" / "train.log").read_text()
    info = json.loads((tmp_path / "b" / "run_info.json").read_text())
    assert (info["resumed_from"], info["resumed_at_step"]) == (str(source.resolve()), 512)
    assert "resumed_from" not in json.loads((tmp_path / "a" / "run_info.json").read_text())
    after = torch.load(resolve_checkpoint(str(tmp_path / "b")), weights_only=True)
    assert (before["global_step"], after["global_step"]) == (512, 1024)
    assert after["iteration"] == before["iteration"] + 2
    assert after["obs_normalizer"]["count"] > before["obs_normalizer"]["count"]
    # the value statistics travelled too, and took at most the two iterations' 2 x 4 x 64 returns
    assert 0 < after["value_normalizer"]["count"] - before["value_normalizer"]["count"] <= 512
    # A resume whose total the checkpoint already reaches would train nothing: one line, no new run.
    again = run_train(*common, "total_timesteps=1000", "ppo.learning_rate=0.001", f"resume={tmp_path / 'b'}",
                      f"hydra.run.dir={tmp_path / 'c'}")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.strip() == (f"error: resume={tmp_path / 'b'}: its checkpoint is at step 1,024, which "
                                    "already reaches `total_timesteps` (1,000); set it higher to train on")
    assert not list((tmp_path / "c").glob("events.out.tfevents.*"))


def test_a_compiled_cpu_run_resumes_with_its_adam_state(tmp_path):
    # ppo.compile=true on a CPU runs each minibatch step as one compiled function that advances
    # Adam's own state: the checkpoint must carry it, and the resumed run must continue from it.
    common = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
              "ppo.update_epochs=2", "device=cpu", "ppo.compile=true"]
    first = run_train(*common, "total_timesteps=1024", f"hydra.run.dir={tmp_path / 'a'}")
    assert first.returncode == 0, first.stderr
    assert "compiled update" in first.stdout
    second = run_train(*common, "total_timesteps=2048", f"resume={tmp_path / 'a'}", f"hydra.run.dir={tmp_path / 'b'}")
    assert second.returncode == 0, second.stderr
    for run, updates in (("a", 4), ("b", 8)):  # 256 samples per update, 2 epochs x 4 minibatches each
        state = torch.load(resolve_checkpoint(str(tmp_path / run)), weights_only=True)["optimizer"]["state"]
        assert {float(s["step"]) for s in state.values()} == {8.0 * updates}


@pytest.mark.parametrize(("backend", "device"), [
    ("envpool", "cpu"), ("gymnasium", "cpu"),
    pytest.param("envpool", "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_a_seed_repeats_its_run_bit_for_bit_and_another_seed_does_not(tmp_path, backend, device):
    # docs/results.md repeats runs "to the last digit" and pools seeds as independent draws: on one
    # machine and build, a seed must give the same run again, and another seed another run. On CUDA
    # this holds the CUDA graphs and the fused update step (the defaults there) to it too.
    common = ["env=InvertedPendulum-v4", f"env.backend={backend}", "env.num_envs=4", "ppo.num_steps=64",
              "ppo.num_minibatches=4", "ppo.update_epochs=2", "total_timesteps=1024", f"device={device}",
              "checkpoint.every=0"]
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        result = run_train(*common, f"seed={seed}", f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
        checkpoint = torch.load(resolve_checkpoint(str(tmp_path / name)), weights_only=True)
        score = result.stdout.split("finished at step 1,024 after ")[1].split(": ")[1].split(";")[0]
        runs[name] = (checkpoint["agent"], checkpoint["obs_normalizer"]["mean"], score)

    def same(x, y):
        return all(torch.equal(x[0][k], y[0][k]) for k in x[0]) and torch.equal(x[1], y[1]) and x[2] == y[2]

    assert same(runs["a"], runs["b"]), (runs["a"][2], runs["b"][2])
    assert not any(torch.equal(runs["a"][0][k], runs["c"][0][k]) for k in runs["a"][0])


def test_multirun_makes_one_dir_per_job(tmp_path):
    result = run_train("-m", "env=InvertedPendulum-v4", "seed=1,2", "env.num_envs=4", "ppo.num_steps=64",
                       "ppo.num_minibatches=4", "ppo.update_epochs=1", "total_timesteps=256", "device=cpu",
                       f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    runs = sorted(p.parent for p in tmp_path.glob("*/checkpoints"))
    assert len(runs) == 2 and all(list(r.glob("events.out.tfevents.*")) for r in runs)
    # After the last job: where the runs are and the command that ranks them.
    assert result.stdout.splitlines()[-1] == (f"sweep finished: 2 runs in {tmp_path}; one table and plot of them: "
                                              f"python scripts/summarize_sweep.py {tmp_path}")


@pytest.mark.parametrize("override,message", [
    ("env.id=Antt-v4", "error: unknown environment id 'Antt-v4' for env.backend=envpool. Did you mean: Ant-v4"),
    ("ppo.num_minibatches=3", "error: `ppo.num_minibatches` (3) must divide the batch"),
    ("env.backend=brax", "error: `env.backend` must be envpool, gymnasium, mjwarp or auto"),
    ("resume=/nonexistent/run", "error: resume=/nonexistent/run: no checkpoint"),
    (f"resume={ROOT / 'README.md'}", f"error: resume={ROOT / 'README.md'}: {ROOT / 'README.md'} is not a checkpoint: "
                                     "not a file torch.save wrote"),
    ("hydra.run.dir=out/${nonexistent}",  # Hydra's own message would be a traceback of its formatter
     "error: hydra.run.dir=out/${nonexistent} does not resolve: Interpolation key 'nonexistent' not found"),
    # Checked before Hydra composes (check_command_line; its other cases run in-process below). Hydra's
    # own message for the first advised `+ppo.lerning_rate=1`, which the settings then refuse, as here.
    ("ppo.lerning_rate=1", "error: unknown setting `ppo.lerning_rate`: did you mean `ppo.learning_rate`?"),
    # A NaN passes every comparison, and an inf rate NaNs the weights an iteration later.
    ("ppo.ent_coef=nan", "error: `ppo.ent_coef` must be a finite number, got nan"),
    ("ppo.learning_rate=inf", "error: `ppo.learning_rate` must be a finite number, got inf"),
    # Sized by the machine: checked against it before any simulator starts.
    ("env.num_envs=1e9", "error: `env.num_envs=1000000000` needs about"),
    ("torch_threads=100000", "error: `torch_threads=100000` asks for more threads than this machine's"),
    ("+ppo.lerning_rate=1", "error: unknown setting `ppo.lerning_rate`: did you mean `ppo.learning_rate`?"),
    ("env=Hoper-v4", "error: no config file configs/env/Hoper-v4.yaml: did you mean `env=Hopper-v4`? (a task without "
                     "a file runs as env.id=Hoper-v4)"),
])
def test_errors_are_one_line_without_traceback(tmp_path, override, message):
    # Run from an empty dir, so that the default run dir (runs/<env.id>/seed1_<date>) lands in it.
    result = run_train(override, "device=cpu", timeout=120, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith(message), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir()), "a command that fails its checks leaves no run dir behind"


def test_mistyped_keys_and_config_files_are_named_with_what_was_meant(capsys):
    import train

    for command in (["-m", "env=Hopper-v4,Ant-v4", "model=default", "hydra/launcher=basic", "hydra.run.dir=x",
                     "ppo.gamma=0.9,0.99", "+experiment=ant_10m", "~ppo.target_kl", "env@foo=Hopper-v4"],
                    ["-m", "env=glob(*-v4)", "env.id=${oc.env:TASK}"], ["model=null"],
                    ["--config-dir", "elsewhere", "robot=arm"],  # its groups are not ours to know
                    ["--cfg", "job", "env.id=Pusher-v5", "checkpoint.every=0"], ["--no-such-flag"], ["ppo.gamma=(("]):
        train.check_command_line(command)  # returns: Hydra composes (or refuses) these itself
    for command, message in [
        (["-m", "seed=1,2", "ppo.lerning_rate=1e-4,3e-4"], "unknown setting `ppo.lerning_rate`: did you mean"),
        (["num_envs=8"], "error: unknown setting `num_envs`: did you mean `env.num_envs`?\n"),  # CleanRL's flat name
        (["-m", "env=Ant-v4,Hoper-v4"], "did you mean `env=Hopper-v4`?"),  # each value of a sweep
        (["-m", "env=choice(Hopper-v4,Walker2d-v3)"], "(a task without a file runs as env.id=Walker2d-v3)"),
        (["+experiment=ant10m"], "did you mean `+experiment=ant_10m`?"),  # the `+` it needs
        (["env=Pusher-v5"], "error: no config file configs/env/Pusher-v5.yaml (known: Ant-v4, Ant-v5, "),
        (["env=Pusher-v5"], "; a task without a file runs as env.id=Pusher-v5)\n"),
        (["model=big"], "error: no config file configs/model/big.yaml (known: default)\n"),
        (["-m", "env=glob(*-v9)"], "error: env=glob(*-v9) matches no file of configs/env (known: Ant-v4, "),
    ]:
        with pytest.raises(SystemExit) as exit_:
            train.check_command_line(command)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err, command


def test_a_missing_envpool_is_named_not_read_as_an_unknown_id(monkeypatch):
    # Off Linux x86-64 pip installs no envpool: the default backend must say so, not call Ant-v4 unknown.
    from ppo.config import ConfigError, EnvSettings
    from ppo.envs import check_env_id

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "envpool", None)  # `import envpool` raises ImportError
        with pytest.raises(ConfigError, match=r"^env.backend=envpool, but envpool does not import here \(.*\); it "
                                              "has wheels for Linux x86-64 only: pip install envpool, or add "
                                              "env.backend=gymnasium$"):
            check_env_id(EnvSettings(id="Ant-v4", backend="envpool"))
        check_env_id(EnvSettings(id="Ant-v4", backend="gymnasium"))  # the other backend is untouched
        # scripts/evaluate.py picks a backend with --backend: its errors say so
        with pytest.raises(ConfigError, match=r"^--backend envpool, but .* or add --backend gymnasium$"):
            check_env_id(EnvSettings(id="Ant-v4", backend="envpool"), "--backend ")
    register_toy_envs()  # gymnasium alone knows the toy env: the unknown-id error in evaluate.py's words
    with pytest.raises(ConfigError, match=rf"^unknown environment id '{TOY_ID}' for --backend envpool; gymnasium "
                                          "has it: add --backend gymnasium\\."):
        check_env_id(EnvSettings(id=TOY_ID, backend="envpool"), "--backend ")


def test_the_default_backend_is_envpool_where_installed_and_gymnasium_elsewhere(monkeypatch):
    # Linux aarch64 (a GH200, say) has no envpool wheel: `python train.py` must still train there.
    from ppo.config import EnvSettings, settings_from_dict

    pytest.importorskip("envpool")
    assert EnvSettings().backend == "envpool"
    assert settings_from_dict({"env": {"backend": "auto"}}).env.backend == "envpool"
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "envpool", None)  # as if not installed
        assert EnvSettings().backend == "gymnasium"
        assert settings_from_dict({"env": {"backend": "auto"}}).env.backend == "gymnasium"
        # asked for by name, it stays: check_env_id then says envpool is missing (the test above)
        assert EnvSettings(backend="envpool").backend == "envpool"
    # Every env file leaves the choice to this rule.
    for env_file in sorted((ROOT / "configs" / "env").glob("*.yaml")):
        assert compose_config(f"env={env_file.stem}").env.backend == "auto", env_file


def test_a_task_that_is_not_continuous_control_is_refused_in_one_line(tmp_path):
    from gymnasium.spaces import Box, Dict, Discrete

    from ppo.config import ConfigError
    from ppo.envs import check_spaces

    result = run_train("env.id=CartPole-v1", "env.backend=gymnasium", "device=cpu", timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: CartPole-v1 acts in Discrete(2): PPO here trains continuous control, which needs a 1-D Box of "
        "actions (a MuJoCo task such as Ant-v4)")
    assert not list(tmp_path.iterdir()), "a command that fails its checks leaves no run dir behind"
    box = Box(-1.0, 1.0, (3,))
    check_spaces("Fine-v0", Box(-1.0, 1.0, (2, 5)), box)  # observations are flattened: any Box will do
    with pytest.raises(ConfigError, match=r"^Grid-v0 acts in Box\(-1.0, 1.0, \(2, 2\)"):
        check_spaces("Grid-v0", box, Box(-1.0, 1.0, (2, 2)))
    check_spaces("Run-v1", Dict({"position": box, "height": Box(0.0, 1.0, ())}), box)  # a Dict of Boxes: flattened
    check_spaces("Kitchen-v1", Dict({"observation": box, "goal": Dict({"kettle": box})}), box)  # nested too
    with pytest.raises(ConfigError, match=r"^Goal-v0 observes a Dict holding Discrete\(3\) at goal/door: the agent's "
                                          r"MLP needs a Box of observations, or a Dict of Boxes$"):
        check_spaces("Goal-v0", Dict({"observation": box, "goal": Dict({"door": Discrete(3), "kettle": box})}), box)
    with pytest.raises(ConfigError, match=r"^Empty-v0 observes Dict\(\)"):
        check_spaces("Empty-v0", Dict({}), box)
    with pytest.raises(ConfigError, match=r"^Pick-v0 acts in Discrete\(4\)"):
        check_spaces("Pick-v0", box, Discrete(4))


def test_a_deepmind_control_task_trains_and_evaluates_on_its_flattened_observations(tmp_path, deepmind_control_task):
    # envpool's DeepMind Control tasks observe a Dict (CheetahRun-v1: position, velocity) and end each
    # episode by truncation at step 1000: two envs finish one each within 2,048 steps.
    result = run_train(f"env.id={deepmind_control_task}", "env.num_envs=2", "ppo.num_steps=64", "ppo.num_minibatches=2",
                       "ppo.update_epochs=1", "total_timesteps=2048", "device=cpu", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^finished at step 2,048 .*: mean return of the last 100 episodes \d+\.\d ", result.stdout, re.M)
    evaluate = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(tmp_path), "--episodes", "2"]
    evaluated = subprocess.run(evaluate, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert re.fullmatch(r"2 episodes: mean return \d+\.\d\d \+- \d+\.\d\d \(min .*\)\n", evaluated.stdout)
    # In a user's own loop: the policy takes the task's dicts as envpool returns them.
    import envpool

    from ppo.policy import load_policy

    policy, raw = load_policy(str(tmp_path)), envpool.make(deepmind_control_task, env_type="gymnasium", num_envs=3)
    observations, _ = raw.reset()
    for _ in range(3):
        actions = policy(observations)
        assert actions.shape == (3, 6) and actions.abs().max() <= 1.0
        observations = raw.step(actions.numpy())[0]
    raw.close()
    # The checkpoint records the order it saw the keys in; a simulator build listing them in another
    # order would be refused, not read permuted (tests/test_policy.py has the refusal itself).
    from ppo.config import ConfigError

    state = torch.load(resolve_checkpoint(str(tmp_path)), weights_only=True)
    assert state["observation_layout"] == [["position", [8]], ["velocity", [9]]]
    torch.save({**state, "observation_layout": state["observation_layout"][::-1]}, tmp_path / "swapped.pt")
    with pytest.raises(ConfigError, match=r"as velocity \(9,\), position \(8,\); here they come as position \(8,\), "):
        load_policy(str(tmp_path / "swapped.pt"))


def test_envpool_refuses_a_task_it_cannot_train_from_its_spec_before_any_simulator_starts(monkeypatch,
                                                                                           discrete_envpool_task):
    # envpool describes a task's spaces without starting it, so the check runs with the others: before a
    # run dir is made, and before a sweep's first job (tests/test_sweeps.py).
    import envpool

    from ppo.config import ConfigError, EnvSettings
    from ppo.envs import check_env_id

    def no_simulator(*args, **kwargs):
        raise AssertionError("the check started a simulator")

    monkeypatch.setattr(envpool, "make", no_simulator)
    task = discrete_envpool_task
    with pytest.raises(ConfigError, match=rf"^{task} acts in Discrete\(\d+\): PPO here trains continuous control"):
        check_env_id(EnvSettings(id=task, backend="envpool"))
    with warnings.catch_warnings():  # Pendulum-v1's float64 bounds: read without gymnasium's precision warnings
        warnings.simplefilter("error")
        for task in {"Ant-v4", "Pendulum-v1"} & set(envpool.list_all_envs()):  # envpool 1.2.7 has no Pendulum-v1
            check_env_id(EnvSettings(id=task, backend="envpool"))


def test_a_gymnasium_task_whose_package_is_missing_is_refused_in_one_line(tmp_path, monkeypatch):
    # As gymnasium's Box2D tasks do without Box2D: their module raises DependencyNotInstalled on import,
    # which check_env_id now meets before any run dir or simulator, instead of a traceback from the run.
    import gymnasium

    from ppo.config import ConfigError, EnvSettings
    from ppo.envs import check_env_id

    (tmp_path / "needs_box2d.py").write_text(
        "from gymnasium.error import DependencyNotInstalled\n"
        "raise DependencyNotInstalled('Box2D is not installed, you can install it by run ...')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    gymnasium.register("NeedsBox2D-v0", entry_point="needs_box2d:Walker")
    try:
        with pytest.raises(ConfigError, match=r"^NeedsBox2D-v0 needs a package that is not installed here: Box2D is "
                                              r"not installed, you can install it by run \.\.\.$"):
            check_env_id(EnvSettings(id="NeedsBox2D-v0", backend="gymnasium"))
    finally:
        del gymnasium.registry["NeedsBox2D-v0"]
    check_env_id(EnvSettings(id="Hopper-v4", backend="gymnasium"))


def test_hydras_flags_print_once(tmp_path):
    result = run_train("--version", timeout=120, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.splitlines() == [f"Hydra {hydra.__version__}"], result.stdout
    assert not list(tmp_path.iterdir())


def test_help_shows_examples_every_env_file_and_where_the_keys_are_explained(tmp_path):
    result = run_train("--help", timeout=120, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("ppo-triton: PPO for continuous control")
    env_line = next(line for line in result.stdout.splitlines() if line.startswith("env: "))
    assert env_line[len("env: "):].split(", ") == sorted(p.stem for p in (ROOT / "configs" / "env").glob("*.yaml"))
    assert "What each key means: docs/configuration.md." in result.stdout
    page = (ROOT / "docs" / "configuration.md").read_text()  # the page it points to has every setting
    settings = [key for key in setting_keys() if not any(other.startswith(f"{key}.") for other in setting_keys())]
    assert [key for key in settings if f"| `{key}` |" not in page] == []
    assert not list(tmp_path.iterdir())  # help starts no run


def test_a_refused_command_removes_only_the_run_dir_it_made(tmp_path):
    kept = tmp_path / "runs" / "Ant-v4" / "seed1_earlier"  # another run beside it, in the same parent
    kept.mkdir(parents=True)
    result = run_train("ppo.num_minibatches=3", "device=cpu", timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "ppo.num_minibatches" in result.stderr
    assert sorted(p for p in tmp_path.rglob("*") if p.is_dir()) == [tmp_path / "runs", kept.parent, kept]
    outside = tmp_path / "given"  # hydra.run.dir outside the working directory: the dir alone goes
    assert run_train("ppo.num_minibatches=3", f"hydra.run.dir={outside}", timeout=120).returncode == 2
    assert not outside.exists() and kept.is_dir()


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    import train

    register_toy_envs()
    settings = settings_from_dict({
        "total_timesteps": 4096, "device": "cpu", "checkpoint": {"every": 1},
        "env": {"id": TOY_NAN_ID, "num_envs": 2, "backend": "gymnasium"},
        "ppo": {"num_steps": 16, "num_minibatches": 2, "update_epochs": 1},
    })
    with pytest.raises(train.TrainingFailed, match=r"non-finite loss at iteration (\d+)") as error:
        train.train(settings, str(tmp_path), torch.device("cpu"))
    failed_at = int(re.search(r"iteration (\d+)", str(error.value)).group(1))
    assert failed_at > 1  # rewards turn NaN after 40 env steps
    good = torch.load(resolve_checkpoint(str(tmp_path)), weights_only=True)
    assert good["iteration"] == failed_at - 1 and all(v.isfinite().all() for v in good["agent"].values())
    assert (tmp_path / "train.log").read_text().splitlines()[-1].endswith(f"] error: {error.value}")


@pytest.mark.slow
def test_inverted_pendulum_learns_within_150k_steps(tmp_path, gae_by_reference):
    import train

    # GAE by the pure-torch reference, as a CPU run outside the tests has it: under Triton's
    # interpreter (conftest's TRITON_INTERPRET=1) this test took 132 s on 2 cores instead of 53. The kernel
    # is checked against that reference in tests/test_gae_*.py, and runs inside train.py in the smoke runs.
    settings = settings_from_dict({"total_timesteps": 150_000, "device": "cpu", "seed": 1,
                                   "env": {"id": "InvertedPendulum-v4", "num_envs": 64}})
    final_return = train.train(settings, str(tmp_path), torch.device("cpu"))
    runs = gae_by_reference._runs.values()
    assert runs and all(entry[0] is gae_by_reference._reference for entry in runs)
    assert final_return >= 800, f"mean return of the last ~100 episodes: {final_return:.1f}"


def start_training(*overrides: str) -> subprocess.Popen:
    """A run of 10M steps, returned once its first progress line is out (or it has ended)."""
    process = subprocess.Popen([sys.executable, "train.py", *overrides, "total_timesteps=10000000", "log_every_s=0.01"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = process.stdout.readline()
        if (line.startswith("[") and " step " in line) or not line:
            break
    return process


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, sweep):
    # In a sweep the signal ends the whole sweep: the second job (seed=2) never starts.
    where = ["-m", "seed=1,2", f"hydra.sweep.dir={tmp_path}"] if sweep else [f"hydra.run.dir={tmp_path}"]
    process = start_training(*where, "env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64",
                             "ppo.num_minibatches=4", "ppo.update_epochs=1", "device=cpu", "checkpoint.every=0")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err  # stopped with a checkpoint: requeue it (ppo/run/signals.py)
    assert "stopped by SIGTERM at step" in out and "finished at step" not in out
    run_dirs = [p.parent for p in tmp_path.rglob("checkpoints")]
    assert len(run_dirs) == 1
    # The stop line gives the command that continues the run: its own overrides, then resume=.
    go_on = shlex.split(out.split("to go on: ")[1].splitlines()[0])
    assert go_on[:2] == ["python", "train.py"] and go_on[-2:] == [f"resume={run_dirs[0]}",
                                                                   f"hydra.run.dir={run_dirs[0]}"]
    assert "env=InvertedPendulum-v4" in go_on and ("seed=1" in go_on) == sweep
    assert [arg for arg in go_on if arg.startswith("hydra.")] == [f"hydra.run.dir={run_dirs[0]}"]  # in place
    checkpoint = torch.load(resolve_checkpoint(str(run_dirs[0])), weights_only=True)
    assert 0 < checkpoint["global_step"] < 10_000_000


def test_a_run_dir_that_cannot_be_made_is_one_error_line(tmp_path):
    (tmp_path / "taken").write_text("a file, not a dir")
    result = run_train("env=InvertedPendulum-v4", "device=cpu", f"hydra.run.dir={tmp_path / 'taken'}", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: run dir {tmp_path / 'taken'} cannot be made or written: File exists " \
                                    "(hydra.run.dir)", result.stderr
    assert (tmp_path / "taken").read_text() == "a file, not a dir"


def test_a_refused_run_leaves_the_other_runs_dir_alone_even_while_it_is_new(tmp_path):
    # A run that has just started holds its dir with nothing in it yet but Hydra's .hydra/; the run
    # refused there must not clean it up as its own empty dir (which a refused command's dir is), nor
    # write its own .hydra/ record over the other run's.
    import fcntl
    import os

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- env=Hopper-v4\n")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the other run holds it
        result = run_train("env=InvertedPendulum-v4", "device=cpu", f"hydra.run.dir={tmp_path}", timeout=120)
    finally:
        os.close(fd)
    assert result.returncode == 2 and result.stderr.startswith(f"error: run dir {tmp_path} is in use"), result.stderr
    assert [p.name for p in tmp_path.rglob("*")] == [".hydra", "overrides.yaml"]
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- env=Hopper-v4\n"


def test_a_run_sent_into_a_finished_runs_dir_is_refused_unless_it_resumes_it(tmp_path):
    common = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
              "ppo.update_epochs=1", "device=cpu", f"hydra.run.dir={tmp_path}"]
    first = run_train(*common, "total_timesteps=256", timeout=120)
    assert first.returncode == 0, first.stderr
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    # A fresh run there (the in-place form without resume=) would overwrite the other run's checkpoint,
    # run_info.json and .hydra/, and add to its train.log and events: refused, nothing touched.
    for extra in ([], [f"resume={ROOT / 'README.md'}"]):
        second = run_train(*common, "total_timesteps=512", *extra, timeout=120)
        assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert second.stderr.startswith(f"error: run dir {tmp_path} holds another run's checkpoint")
        assert f"resume={tmp_path}" in second.stderr and f"hydra.run.dir={tmp_path}_2" in second.stderr
        assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    # Resumed in place, it continues, and clears the temporary file a crash mid-save would leave.
    stray = tmp_path / "checkpoints" / "last.tmp"
    stray.write_bytes(b"cut short")
    third = run_train(*common, "total_timesteps=512", f"resume={tmp_path}", timeout=120)
    assert third.returncode == 0 and "finished at step 512" in third.stdout, third.stderr
    assert not stray.exists()


def test_a_run_dir_in_use_by_another_run_is_refused(tmp_path):
    # As when two runs of one env and seed start in the same second: both get the same default dir.
    common = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
              "ppo.update_epochs=1", "device=cpu", "checkpoint.every=0", f"hydra.run.dir={tmp_path}"]
    first = start_training(*common)
    second = run_train(*common, "total_timesteps=1024", timeout=120)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=120)
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip() == (
        f"error: run dir {tmp_path} is in use by a run still training there (runs of one env and seed started in "
        f"the same second get the same dir); give this one its own: hydra.run.dir={tmp_path}_2")
    assert first.returncode == 75 and "stopped by SIGTERM at step" in out, err
    # The first run's files are its own alone: one event file, no line of the second in train.log, and
    # Hydra's record of the first command, not of the second.
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    assert "for 1,024 steps" not in (tmp_path / "train.log").read_text()
    assert "total_timesteps=1024" not in (tmp_path / ".hydra" / "overrides.yaml").read_text()
    # Once that run has ended, the dir is free again: a resume in place continues it.
    step = torch.load(resolve_checkpoint(str(tmp_path)), weights_only=True)["global_step"]
    third = run_train(*common, f"total_timesteps={step + 256}", f"resume={tmp_path}", timeout=120)
    assert third.returncode == 0, third.stderr
    assert f"finished at step {step + 256:,}" in third.stdout
