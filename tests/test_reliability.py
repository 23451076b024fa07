"""Failures end in one line that names the cause, lose nothing, and leave no stray file behind."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from ppo.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tests.conftest import ROOT

TINY = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
        "ppo.update_epochs=1", "device=cpu"]


def train(*overrides: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *TINY, *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    result = train("total_timesteps=512", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    return run_dir


DAMAGES = {
    "settings a string": ("settings", lambda c: "Ant-v4", "`settings` is str 'Ant-v4', not a dict of settings"),
    "step a string": ("global_step", lambda c: "512", "`global_step` is str '512', not a count of steps"),
    "empty optimiser state": ("optimizer", lambda c: {}, "`optimizer` is an empty dict, not an optimiser state"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_checkpoint_with_the_right_keys_but_wrong_contents_is_refused_in_one_line(finished_run, tmp_path, damage):
    key, change, message = DAMAGES[damage]
    checkpoint = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    checkpoint[key] = change(checkpoint[key])
    path = save_checkpoint(tmp_path / "damaged", checkpoint)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_checkpoint(path, torch.device("cpu"))
    for command in ([sys.executable, "train.py", *TINY, "total_timesteps=2048", f"resume={path}",
                     f"hydra.run.dir={tmp_path / 'resumed'}"],
                    [sys.executable, "scripts/evaluate.py", str(path), "--episodes", "1"]):
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert result.returncode != 0 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "resumed").exists()


def test_a_part_that_torch_refuses_to_restore_is_named_in_one_line(finished_run, tmp_path):
    checkpoint = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    checkpoint["generator"] = checkpoint["generator"][:8]  # a truncated generator state: its form passes
    path = save_checkpoint(tmp_path / "damaged", checkpoint)
    result = train("total_timesteps=2048", f"resume={path}", f"hydra.run.dir={tmp_path / 'resumed'}")
    assert result.returncode == 2
    assert result.stderr.startswith("error: resume: the checkpoint's `generator` does not restore (")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "resumed").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device every write to fails on")
def test_a_full_disk_during_a_checkpoint_is_one_line_in_train_log_too_and_leaves_no_temporary(tmp_path):
    # Every write of the checkpoint's temporary file fails with ENOSPC, as on a full disk.
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.tmp").symlink_to("/dev/full")
    result = train("total_timesteps=2048", "checkpoint.every=1", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device (writing " in lines[0] and "last.tmp" in lines[0], lines
    assert "no checkpoint was written yet" in lines[0]
    assert lines[0] in (tmp_path / "train.log").read_text()
    assert not os.path.lexists(tmp_path / "checkpoints" / "last.tmp")
    assert not (tmp_path / "checkpoints" / "last.pt").exists()


def signal_once_ready(command: list[str], ready: str, signals: list[int], pause: float = 0.0) -> tuple[int, str, str]:
    """Start `command`, wait for a stdout line containing `ready` (if given), then `pause` seconds, then
    send each of `signals` in turn."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    if ready:
        for line in process.stdout:
            seen.append(line)
            if ready in line:
                break
    time.sleep(pause)
    for signum in signals:
        process.send_signal(signum)
        time.sleep(0.05)
    out, err = process.communicate(timeout=120)
    return process.returncode, "".join(seen) + out, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_train_py_imports_ends_it_in_one_line_with_the_signals_exit_code(tmp_path, signum):
    # Python itself starts in ~0.05 s, torch takes seconds to import: the signal lands in the imports.
    code, out, err = signal_once_ready([sys.executable, "train.py", *TINY, f"hydra.run.dir={tmp_path / 'run'}"],
                                       "", [signum], pause=0.5)
    name = signal.Signals(signum).name
    assert code == 128 + signum, (code, err)
    assert err.strip() == f"stopped by {name} during start-up; nothing was trained", err
    assert not (tmp_path / "run").exists()


# Sends this process a signal where the run dir is made but training has not started (the envs).
SIGNAL_DURING_START_UP = """
import os, runpy, signal, sys
import ppo.trainer
make_envs = ppo.trainer.make_envs
def signalled(*args, **kwargs):
    os.kill(os.getpid(), signal.{name})
    return make_envs(*args, **kwargs)
ppo.trainer.make_envs = signalled
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1],
                         ids=["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1"])
def test_a_signal_before_training_starts_removes_the_new_run_dir(tmp_path, signum):
    name = signal.Signals(signum).name
    result = subprocess.run([sys.executable, "-c", SIGNAL_DURING_START_UP.format(name=name), *TINY,
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 128 + signum, result.stderr
    assert result.stderr.strip() == (f"stopped by {name} during start-up; nothing was trained; its new run dir was "
                                     f"removed ({tmp_path / 'run'})"), result.stderr
    assert not (tmp_path / "run").exists()


def test_a_second_signal_aborts_where_the_run_stands_and_train_log_says_so(tmp_path):
    # Iterations of ~1 s, so that both signals land in the first one after the progress line.
    run_dir = tmp_path / "run"
    command = [sys.executable, "train.py", *TINY, "env.num_envs=16", "ppo.num_steps=1024", "ppo.update_epochs=4",
               "total_timesteps=10000000", "log_every_s=0.01", "checkpoint.every=1", f"hydra.run.dir={run_dir}"]
    code, out, err = signal_once_ready(command, " step ", [signal.SIGTERM, signal.SIGTERM], pause=0.2)
    assert code == 128 + signal.SIGTERM, err
    lines = err.strip().splitlines()
    assert lines[0] == "" or lines[0].startswith("SIGTERM: stopping after this iteration"), lines
    assert lines[-1].startswith("aborted by a second SIGTERM at step ") and "the last good checkpoint is " in lines[-1]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert lines[-1] in (run_dir / "train.log").read_text()
    assert (run_dir / "checkpoints" / "last.pt").exists()  # the first iteration's checkpoint is kept


# TensorBoard's writer thread finds the disk full once the run has written a few hundred events.
EVENTS_DISK_FULL = """
import errno, os, runpy, sys
from tensorboard.summary.writer.record_writer import RecordWriter
write, written = RecordWriter.write, [0]
def full_after_a_while(self, data):
    written[0] += 1
    if written[0] > 300:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write(self, data)
RecordWriter.write = full_after_a_while
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_disk_that_fills_under_the_tensorboard_events_ends_the_run_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-c", EVENTS_DISK_FULL, *TINY, "total_timesteps=100000",
                             "checkpoint.every=1", f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: No space left on device (writing TensorBoard events in {tmp_path}) at step ")
    assert "the last good checkpoint is " in lines[0] and f"resume={tmp_path}" in lines[0], lines[0]
    assert lines[0] in (tmp_path / "train.log").read_text()
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["global_step"] > 0


@pytest.fixture
def remountable(tmp_path):
    """A dir made read-only by a call, and the reason a write there then fails: a tmpfs of its own where
    this process may mount one (root passes permission bits, so a chmod would not bind it), else a chmod."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)], capture_output=True).returncode != 0:
        if os.geteuid() == 0:
            pytest.skip("needs to mount a tmpfs, or to run as a user whom permission bits bind")
        yield mount, lambda: mount.chmod(0o555), "Permission denied"
        mount.chmod(0o755)
        return
    yield mount, lambda: subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True), "Read-only file system"
    subprocess.run(["umount", str(mount)], check=True)


def test_a_read_only_run_dir_is_refused_in_one_line_before_anything_starts(remountable):
    disk, make_read_only, reason = remountable
    run_dir = disk / "run"
    assert train("total_timesteps=256", f"hydra.run.dir={run_dir}").returncode == 0
    make_read_only()
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    for where in (run_dir, disk / "new"):
        result = train("total_timesteps=512", f"resume={run_dir}", f"hydra.run.dir={where}")
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().startswith(f"error: run dir {where} cannot be made or written: {reason}")
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


def test_the_fault_injection_script_loses_no_checkpoint_over_a_few_kills(tmp_path):
    # Its full run (20 kills) is in docs/reliability.md; here two kills, one resume, and the finishing resume.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fault_injection.py"), "--kills", "2",
                             "--max-delay", "1", "--dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert summary.startswith("kills: 2 (") and "lost checkpoints: 0, resumes that continued: 1 of 1" in summary
    assert "last resume finished: yes" in summary


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(size)`: a dir on a tmpfs of `size` (e.g. "100k"), as a nearly full disk; skips where this
    process may not mount one."""
    mounts = []

    def mount(size: str):
        disk = tmp_path / f"disk{len(mounts)}"
        disk.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True,
                              text=True)
        if made.returncode != 0:
            pytest.skip(f"needs to mount a small tmpfs as a full disk (root on Linux): {made.stderr.strip()}")
        mounts.append(disk)
        return disk

    yield mount
    for disk in mounts:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_disk_that_the_first_checkpoint_fills_ends_the_run_in_one_line(small_disk):
    run_dir = small_disk("100k") / "run"
    result = train("total_timesteps=2048", "checkpoint.every=1", f"hydra.run.dir={run_dir}")
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0] == (f"error: No space left on device (writing {run_dir / 'checkpoints' / 'last.tmp'}) at step 256; "
                        "the run stopped there, and no checkpoint was written yet (checkpoint.every=1 iterations)")
    assert lines[0] in (run_dir / "train.log").read_text()  # the temporary file gone, the log had room again
    assert not os.path.lexists(run_dir / "checkpoints" / "last.tmp")


def test_a_disk_too_full_for_hydras_record_refuses_the_run_in_one_line_and_leaves_no_dir(small_disk):
    disk = small_disk("8k")
    result = train("total_timesteps=2048", f"hydra.run.dir={disk / 'run'}")
    assert result.returncode == 2, result.stderr[-2000:]
    # Which of Hydra's three records finds the disk full depends on their sizes (the paths they hold).
    assert re.fullmatch(rf"error: cannot write the run's record {re.escape(str(disk / 'run' / '.hydra'))}/"
                        rf"(config|hydra|overrides)\.yaml: No space left on device; its new run dir was removed "
                        rf"\({re.escape(str(disk / 'run'))}\)", result.stderr.strip()), result.stderr
    assert not (disk / "run").exists()


def test_exports_and_evaluation_records_on_a_full_disk_fail_in_one_line(finished_run, small_disk):
    disk = small_disk("4k")
    (disk / "filler").write_bytes(b"x" * 4096)  # the disk is full
    for command, output in ((["scripts/export.py", str(finished_run), "--format", "torchscript", "--output"],
                             disk / "policy.pt"),
                            (["scripts/export.py", str(finished_run), "--format", "onnx", "--output"],
                             disk / "policy.onnx"),
                            (["scripts/evaluate.py", str(finished_run), "--episodes", "1", "--json"], disk / "e.json")):
        result = subprocess.run([sys.executable, *command, str(output)], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1] == f"error: cannot write {output}: No space left on device"
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_run_dir_whose_checkpoints_path_is_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "checkpoints").write_text("not a dir")
    result = train("total_timesteps=2048", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.strip() == (f"error: run dir {tmp_path} cannot be made or written: {tmp_path / 'checkpoints'} "
                                     "is not a dir, where its checkpoints go (hydra.run.dir)")
    assert not list(tmp_path.glob("events.out.tfevents.*"))


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_an_empty_run_or_sweep_dir_is_refused_in_one_line(tmp_path, key):
    sweep = ["-m", "seed=1,2"] if key == "hydra.sweep.dir" else []
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *sweep, *TINY, f"{key}="], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stderr
    what = "sweep" if sweep else "run"
    assert result.stderr.strip() == (f"error: {key} is empty: give the {what} a dir of its own (or leave it to the "
                                     "default)")
    assert list(tmp_path.iterdir()) == []


def test_torchs_cpp_extension_notice_is_not_a_runs_first_line():
    # torch's CUDA build on a machine without CUDA: "No CUDA runtime is found, using CUDA_HOME=..." from this
    # logger when torch.compile first builds CPU code, above the run's own lines.
    import logging

    import ppo.update  # noqa: F401

    assert logging.getLogger("torch.utils.cpp_extension").getEffectiveLevel() >= logging.ERROR


def test_the_fault_injection_scripts_full_disks_lose_no_checkpoint_and_end_in_one_line(small_disk):
    small_disk("4k")  # skips where no tmpfs can be mounted, as the script's mode would
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fault_injection.py"), "--full-disk", "3",
                             "--seed", "5"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert summary.startswith("full disks: 3 (3 ended in one line), lost checkpoints: 0, resumes that continued: "
                              "2 of 2")
    assert "last resume finished: yes" in summary
