"""logger.wandb=true: the run's scalars, config and videos mirrored to Weights & Biases, offline here."""

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest.importorskip("wandb")

SMALL = ["env=Hopper-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4", "ppo.update_epochs=1",
         "device=cpu", "logger.wandb=true"]


def run(*overrides, env=None, code=None, cwd=ROOT):
    prefix = ["-c", code] if code else [str(ROOT / "train.py")]
    environment = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run([sys.executable, *prefix, *overrides], capture_output=True, text=True, timeout=300,
                          env=environment, cwd=cwd)


def records(path: str):
    """The protobuf records of an offline W&B run file (LevelDB's log format: 32 KiB blocks of chunks, each
    with a 7-byte header: checksum, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if left < 7 or (length == 0 and kind == 0):  # a block's padding
            position += left
            continue
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_run(run_dir: Path, index: int = -1) -> dict:
    """What one offline W&B run in `run_dir` holds: its id, group, config and history rows."""
    files = sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb")))
    found = {"history": []}
    for record in records(files[index]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.update(id=record.run.run_id, group=record.run.run_group, project=record.run.project,
                         config={item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                 for item in record.run.config.update})
        elif kind == "history":
            found["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                     for item in record.history.item})
    return found


def tensorboard_scalars(run_dir: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_an_offline_run_holds_the_runs_scalars_and_config_and_a_resume_continues_it(tmp_path):
    first = run(*SMALL, "total_timesteps=768", "seed=4", f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    logged = offline_run(tmp_path)
    run_id = (tmp_path / "wandb_id").read_text().strip()
    assert logged["id"] == run_id and logged["project"] == "ppo-triton" and logged["group"] == ""
    assert logged["config"]["seed"] == 4 and logged["config"]["env"]["id"] == "Hopper-v4"
    history = logged["history"]
    for tag in ("charts/episodic_return", "losses/value_loss", "charts/SPS"):
        mirrored = {row["global_step"]: row[tag] for row in history if tag in row}
        expected = tensorboard_scalars(tmp_path, tag)
        assert sorted(mirrored) == sorted(expected) == [256, 512, 768], tag
        assert all(mirrored[s] == pytest.approx(expected[s], rel=1e-6) for s in expected), tag

    resumed = run(*SMALL, "total_timesteps=1280", "seed=4", f"resume={tmp_path}", f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = offline_run(tmp_path, index=-1)
    assert len(glob.glob(str(tmp_path / "wandb" / "offline-run-*"))) == 2
    assert again["id"] == run_id  # the same W&B run, continued
    steps = sorted({row["global_step"] for row in again["history"] if "charts/SPS" in row})
    assert steps == [1024, 1280]


def test_a_sweeps_jobs_share_a_group(tmp_path):
    sweep = tmp_path / "sweep"
    result = run("-m", *SMALL, "total_timesteps=256", "seed=1,2", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if (p / "wandb_id").exists())
    assert len(jobs) == 2
    groups = {offline_run(job)["group"] for job in jobs}
    assert groups == {str(sweep)}
    assert len({offline_run(job)["id"] for job in jobs}) == 2


def with_wandb(setup: str) -> str:
    """Python that runs train.py as its command line does, after `setup` has put a `wandb` of its own in
    sys.modules."""
    return f"import runpy, sys, types\n{setup}\nsys.argv = ['train.py', *sys.argv[1:]]\n" \
           "runpy.run_path('train.py', run_name='__main__')\n"


MISSING = with_wandb('sys.modules["wandb"] = None  # as where the extra is not installed')


def test_a_missing_or_unusable_wandb_never_stops_a_run(tmp_path):
    missing = run(*SMALL, "total_timesteps=256", f"hydra.run.dir={tmp_path / 'a'}", code=MISSING)
    assert missing.returncode == 0, missing.stderr[-3000:]
    assert missing.stdout.count("logger.wandb: W&B is not installed") == 1
    assert 'pip install -e ".[wandb]"' in missing.stdout and "finished at step 256" in missing.stdout
    # Online, without a login (no key, a home without credentials): said once; no prompt, no network.
    online = run(*SMALL, "total_timesteps=256", f"hydra.run.dir={tmp_path / 'b'}",
                 env={"WANDB_MODE": "online", "WANDB_API_KEY": "", "HOME": str(tmp_path), "NETRC": str(tmp_path / "x")})
    assert online.returncode == 0, online.stderr[-3000:]
    assert online.stdout.count("logger.wandb: not logged in to W&B") == 1 and "finished at step 256" in online.stdout


FAILING = with_wandb("""
class Run:  # W&B's run, as when its server goes away after the run began
    def define_metric(self, *args, **kwargs):
        pass

    def log(self, values):
        raise ConnectionError("the W&B server went away")

    def finish(self, exit_code=0, quiet=None):
        pass

sys.modules["wandb"] = types.SimpleNamespace(init=lambda **kwargs: Run(), Settings=lambda **kwargs: None)
""")


def test_wandb_failing_in_the_middle_of_a_run_is_said_once_and_training_goes_on(tmp_path):
    result = run(*SMALL, "total_timesteps=768", f"hydra.run.dir={tmp_path}", code=FAILING)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("logger.wandb: W&B failed (the W&B server went away); the run goes on without it") == 1
    assert "finished at step 768" in result.stdout
