"""The tools beside train.py (export, evaluate, the plots) never write over a run's own files, and no tool
turns a checkpoint holding NaN or inf into a score, a file or a resumed run."""

import math
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

TINY = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
        "ppo.update_epochs=1", "device=cpu"]


def run(*command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    result = run("train.py", *TINY, "total_timesteps=512", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    return run_dir


def snapshot(run_dir):
    return {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}


def one_line_error(result: subprocess.CompletedProcess, code: int = 1) -> str:
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    return result.stderr.strip()


def test_no_tool_writes_over_the_files_of_the_run_it_reads(finished_run, tmp_path):
    before = snapshot(finished_run)
    checkpoint = finished_run / "checkpoints" / "last.pt"
    attempts = [
        ("scripts/export.py", str(finished_run), "--format", "torchscript", "--output", str(checkpoint)),
        ("scripts/export.py", str(finished_run), "--format", "torchscript", "--output",
         str(finished_run / "train.log")),
        ("scripts/export.py", str(finished_run), "--format", "torchscript", "--output", str(finished_run)),
        ("scripts/export.py", str(checkpoint), "--format", "onnx", "--output", str(finished_run / "run_info.json")),
        ("scripts/evaluate.py", str(finished_run), "--episodes", "1", "--json",
         str(finished_run / ".hydra" / "overrides.yaml")),
        ("scripts/evaluate.py", str(finished_run), "--episodes", "1", "--video", str(finished_run / "checkpoints"),
         "--frame-strip", str(finished_run / "strip.png")),
        ("scripts/plot_time_to_score.py", str(finished_run), "--out", str(finished_run / "train.log")),
    ]
    for command in attempts:
        line = one_line_error(run(*command))
        assert line.startswith("error: ") and ("would overwrite the run's own" in line or "is a directory" in line
                                               or "is the checkpoint this reads" in line), (command, line)
    assert snapshot(finished_run) == before
    # A checkpoint copied out of its run: the same file as input and output is refused too.
    loose = tmp_path / "loose.pt"
    loose.write_bytes(checkpoint.read_bytes())
    line = one_line_error(run("scripts/export.py", str(loose), "--format", "torchscript", "--output", str(loose)))
    assert line == f"error: --output {loose} is the checkpoint this reads; write elsewhere"
    # Beside the run's files a tool writes freely: the default export path, a new file of its own.
    exported = run("scripts/export.py", str(finished_run), "--format", "torchscript")
    assert exported.returncode == 0 and (finished_run / "policy.pt").is_file(), exported.stderr[-2000:]
    (finished_run / "policy.pt").unlink()
    assert snapshot(finished_run) == before


def test_a_frame_strip_must_be_a_png(finished_run, tmp_path):
    result = run("scripts/evaluate.py", str(finished_run), "--video", str(tmp_path), "--frame-strip",
                 str(tmp_path / "x.pt"))
    # A usage error, as argparse says them: the usage, then one error line; no picture library's traceback.
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"evaluate.py: error: --frame-strip writes a PNG picture: give a file name ending in .png, got "
        f"'{tmp_path / 'x.pt'}'")


def nan_checkpoint(finished_run, tmp_path, part: str = "agent"):
    state = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    if part == "agent":
        state["agent"]["actor_mean.0.weight"][0, 0] = math.nan
    else:  # the optimiser's second moment of a parameter
        state["optimizer"]["state"][0]["exp_avg_sq"][0, 0] = math.inf
    path = tmp_path / f"{part}.pt"
    torch.save(state, path)  # as an edit or a bad copy would: save_checkpoint itself refuses NaN
    return path


@pytest.mark.parametrize("part, where", [("agent", "`agent` (actor_mean.0.weight)"),
                                         ("optimizer", "`optimizer` (state.0.exp_avg_sq)")])
def test_a_checkpoint_holding_nan_is_refused_by_every_tool_in_one_line(finished_run, tmp_path, part, where):
    path = nan_checkpoint(finished_run, tmp_path, part)
    said = f"{path} holds NaN or inf in {where}: no policy or resume can come of it"
    resumed = run("train.py", *TINY, "total_timesteps=2048", f"resume={path}", f"hydra.run.dir={tmp_path / 'resumed'}")
    assert said in one_line_error(resumed, code=2)
    assert not (tmp_path / "resumed").exists()
    for command in (("scripts/evaluate.py", str(path), "--episodes", "2"),
                    ("scripts/export.py", str(path), "--format", "torchscript", "--output", str(tmp_path / "p.pt")),
                    ("scripts/export.py", str(path), "--format", "onnx", "--output", str(tmp_path / "p.onnx"))):
        assert said in one_line_error(run(*command)), command
    assert not (tmp_path / "p.pt").exists() and not (tmp_path / "p.onnx").exists()


# The third update leaves a NaN in the actor (as a diverging run would): it must not be saved over the
# last good checkpoint, nor named as one.
NAN_AFTER_TWO_UPDATES = """
import math, runpy, sys
import ppo.trainer
call = ppo.trainer.Updater.__call__
calls = [0]
def diverging(self, buffer, generator):
    stats = call(self, buffer, generator)
    calls[0] += 1
    if calls[0] == 3:
        self.agent.actor_mean[0].weight.data[0, 0] = math.nan
    return stats
ppo.trainer.Updater.__call__ = diverging
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_model_that_turns_nan_is_not_saved_and_the_last_good_checkpoint_stays(tmp_path):
    result = run("-c", NAN_AFTER_TWO_UPDATES, *TINY, "total_timesteps=4096", "checkpoint.every=1",
                 f"hydra.run.dir={tmp_path}")
    line = one_line_error(result)
    last = tmp_path / "checkpoints" / "last.pt"
    assert line == (f"error: the model became non-finite by iteration 3 (step 768): `agent` (actor_mean.0.weight) "
                    f"holds NaN or inf, so it was not saved; the run stopped there, and the last good checkpoint is "
                    f"{last}")
    assert line in (tmp_path / "train.log").read_text()
    from ppo.run.checkpoint import load_checkpoint

    assert load_checkpoint(last, torch.device("cpu"))["global_step"] == 512
