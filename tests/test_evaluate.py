"""scripts/evaluate.py: a checkpoint replays deterministically with frozen normalisers."""

import subprocess
import sys
import zipfile

import pytest
import torch

from tests.conftest import ROOT


def test_evaluation_is_deterministic_and_counts_whole_episodes(tmp_path):
    from evaluate import evaluate

    trained = subprocess.run([sys.executable, "train.py", "env=InvertedPendulum-v4", "env.num_envs=4",
                              "ppo.num_steps=64", "ppo.num_minibatches=4", "ppo.update_epochs=2",
                              "total_timesteps=2048", "device=cpu", f"hydra.run.dir={tmp_path}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr
    first = evaluate(str(tmp_path), episodes=6, device=torch.device("cpu"), num_envs=2)
    second = evaluate(str(tmp_path), episodes=6, device=torch.device("cpu"), num_envs=2)
    assert len(first) == 6 and first == second
    # InvertedPendulum pays 1 per step alive: every return is a whole number of steps, at least 1
    assert all(r >= 1 and float(r).is_integer() for r in first)
    # The same policy on the other backend: a whole number of steps again, and the envs really
    # changed (the two backends' reset noise differs, so some episode lasts another number of steps).
    other = evaluate(str(tmp_path), episodes=6, device=torch.device("cpu"), num_envs=2, backend="gymnasium")
    assert len(other) == 6 and all(r >= 1 and float(r).is_integer() for r in other)
    assert other != first

    # What is not a checkpoint of train.py says so in one line (torch's own errors are pickle's or
    # zip's): a copy cut short, a file of the run that is not the checkpoint, a zip archive that torch
    # did not write, a torch archive whose pickle is garbled, a torch file of weights.
    from ppo.run.checkpoint import CheckpointError, load_checkpoint

    real = tmp_path / "checkpoints" / "last.pt"
    assert load_checkpoint(real, torch.device("cpu"))["global_step"] == 2048
    (tmp_path / "torn.pt").write_bytes(real.read_bytes()[:4096])
    torch.save(load_checkpoint(real, torch.device("cpu"))["agent"], tmp_path / "weights.pt")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    with zipfile.ZipFile(real) as source, zipfile.ZipFile(tmp_path / "garbled.pt", "w") as archive:
        for name in source.namelist():
            archive.writestr(name, b"garbled" if name.endswith("/data.pkl") else source.read(name))
    for name, message in [("torn.pt", "is not a checkpoint: not a file torch.save wrote"),
                          ("train.log", "is not a checkpoint: not a file torch.save wrote"),
                          ("other.zip", "is not a checkpoint: not a file torch.save wrote"),
                          ("garbled.pt", "is not a checkpoint: torch.load cannot read it ("),
                          ("weights.pt", "is not a checkpoint of train.py: a torch file without `settings`, ")]:
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(tmp_path / name, torch.device("cpu"))
        assert str(error.value).startswith(f"{tmp_path / name} {message}"), str(error.value)


def test_a_dir_above_run_dirs_names_them_newest_first(tmp_path):
    # `runs`, `runs/Ant-v4` or a sweep's `multirun` given for a run dir: the error names the runs below it
    import os

    from ppo.run.checkpoint import resolve_checkpoint

    for age, run in enumerate(["Ant-v4/seed1_b", "Ant-v4/seed1_a", "Hopper-v4/seed2", "Walker2d-v4/seed3"]):
        last = tmp_path / "runs" / run / "checkpoints" / "last.pt"
        last.parent.mkdir(parents=True)
        last.write_bytes(b"")
        os.utime(last, (1_000_000 - age, 1_000_000 - age))  # the first listed is the newest
    runs = tmp_path / "runs"
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint(str(runs))
    assert str(error.value) == (f"no checkpoint at {runs / 'checkpoints' / 'last.pt'}; run dirs below it, newest "
                                f"first: {runs / 'Ant-v4/seed1_b'}, {runs / 'Ant-v4/seed1_a'}, "
                                f"{runs / 'Hopper-v4/seed2'} and 1 more")
    with pytest.raises(FileNotFoundError, match=r"newest first: .*seed1_b, .*seed1_a$"):
        resolve_checkpoint(str(runs / "Ant-v4"))
    # three levels down is not searched, and an empty dir keeps the plain advice
    plain = r"\(give a checkpoint file or a run dir holding checkpoints/last\.pt\)$"
    with pytest.raises(FileNotFoundError, match=plain):
        resolve_checkpoint(str(tmp_path))
    assert resolve_checkpoint(str(runs / "Hopper-v4/seed2")) == runs / "Hopper-v4/seed2/checkpoints/last.pt"


def test_episodes_are_taken_evenly_over_envs_not_by_when_they_ended():
    from evaluate import take_evenly

    # env 0 fell three times before env 1 and env 2 ended once: the first three to end would all be env 0's
    per_env = [[5.0, 6.0, 7.0], [900.0, 901.0], [800.0]]
    assert take_evenly(per_env, 3) == [5.0, 900.0, 800.0]
    assert take_evenly([[1.0, 2.0], [3.0, 4.0]], 3) == [1.0, 3.0, 2.0]
    with pytest.raises(ValueError, match="need 2 from each"):
        take_evenly(per_env, 4)


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "error: {missing}: no checkpoint at {missing}"),
    (["{readme}"], "error: {readme} is not a checkpoint: not a file torch.save wrote"),
    (["{tmp}", "--episodes", "0"], "--episodes must be at least 1, got 0"),
    (["{tmp}", "--num-envs", "-2"], "--num-envs must be at least 1, got -2"),
    (["{missing}", "--device", "gpu"], "`--device` must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    # no GPU here, or fewer than eight on a GPU host: either way the option as the script spells it
    (["{missing}", "--device", "cuda:7"], "error: `--device=cuda:7` but "),
])
def test_bad_arguments_are_one_line_errors_not_tracebacks(tmp_path, args, message):
    paths = {"tmp": str(tmp_path), "missing": str(tmp_path / "no_such_run"), "readme": str(ROOT / "README.md")}
    result = subprocess.run([sys.executable, "scripts/evaluate.py", *(a.format(**paths) for a in args)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and message.format(**paths) in result.stderr
    assert "Traceback" not in result.stderr
