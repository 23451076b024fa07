"""Every signal a batch job is sent (SIGINT, SIGTERM, SIGHUP, SIGUSR1) ends every phase of a run or a sweep
in one line, with the exit code docs/reliability.md's table gives, and the printed command continues a stopped run
in place."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from ppo.run.signals import EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED, SIGNALS
from tests.conftest import ROOT

TINY = ["env=InvertedPendulum-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
        "ppo.update_epochs=1", "device=cpu", "checkpoint.every=0"]
BATCH_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1]
NAMES = [s.name for s in BATCH_SIGNALS]


def test_every_signal_a_batch_job_is_sent_is_handled():
    assert set(BATCH_SIGNALS) <= set(SIGNALS)


def start(*arguments: str, group: bool = False) -> tuple[subprocess.Popen, list[str]]:
    """train.py with `arguments`, returned once its first progress line is out (or it has ended)."""
    process = subprocess.Popen([sys.executable, "train.py", *arguments, "log_every_s=0.01"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group)
    seen, deadline = [], time.time() + 180
    while time.time() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if (line.startswith("[") and " step " in line) or not line:
            break
    return process, seen


@pytest.mark.parametrize("signum", BATCH_SIGNALS, ids=NAMES)
def test_a_signal_while_training_stops_with_a_checkpoint_and_the_printed_command_continues_in_place(tmp_path,
                                                                                                   signum):
    run_dir = tmp_path / "run"
    process, seen = start(*TINY, "total_timesteps=12800", f"hydra.run.dir={run_dir}")
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    out = "".join(seen) + out
    assert process.returncode == EXIT_STOPPED, err
    assert "Traceback" not in err
    stop = next(line for line in out.splitlines() if line.startswith(f"stopped by {signum.name} at step "))
    assert stop in (run_dir / "train.log").read_text()
    step = int(stop.split(" at step ")[1].split(";")[0].replace(",", ""))
    # The printed command resumes this run in this dir, not a new one under the working directory.
    command = shlex.split(stop.split("to go on: ")[1])
    assert command[:2] == ["python", "train.py"] and command[-1] == f"hydra.run.dir={run_dir}"
    runs_before = sorted((ROOT / "runs").rglob("run_info.json")) if (ROOT / "runs").exists() else []
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'last.pt'} at step {step:,}" in resumed.stdout
    assert "finished at step 12,800" in (run_dir / "train.log").read_text()
    assert (sorted((ROOT / "runs").rglob("run_info.json")) if (ROOT / "runs").exists() else []) == runs_before


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1], ids=["SIGHUP", "SIGUSR1"])
def test_a_signal_while_train_py_imports_ends_it_in_one_line(tmp_path, signum):
    process = subprocess.Popen([sys.executable, "train.py", *TINY, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # Python starts in ~0.05 s, torch takes seconds to import
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err
    assert err.strip() == f"stopped by {signum.name} during start-up; nothing was trained", err
    assert not (tmp_path / "run").exists()


SWEEP = ["-m", "total_timesteps=512,60000", *TINY]

# Sends this process a signal at a chosen moment of a sweep: `after_job` when the first job's training
# has returned (between the jobs), `start_up` in the second job's start-up (its envs).
SIGNAL_IN_A_SWEEP = """
import os, runpy, signal, sys
import ppo.trainer
moment, name = sys.argv.pop(1), sys.argv.pop(1)
train, make_envs, calls = ppo.trainer.train, ppo.trainer.make_envs, []
def after_job(*args, **kwargs):
    result = train(*args, **kwargs)
    os.kill(os.getpid(), getattr(signal, name))
    return result
def start_up(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), getattr(signal, name))
    return make_envs(*args, **kwargs)
if moment == "after_job":
    ppo.trainer.train = after_job
else:
    ppo.trainer.make_envs = start_up
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.parametrize("moment", ["after_job", "start_up"])
def test_a_signal_between_a_sweeps_jobs_or_in_a_jobs_start_up_ends_the_sweep_and_names_the_jobs_never_run(
        tmp_path, moment):
    result = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_SWEEP, moment, "SIGTERM", *SWEEP,
                             f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "stopping after this iteration" not in result.stderr
    lines = result.stderr.strip().splitlines()
    first_job, second_job = tmp_path / "0_InvertedPendulum-v4_seed1", tmp_path / "1_InvertedPendulum-v4_seed1"
    if moment == "after_job":
        assert lines[0] == "stopped by SIGTERM after the run had ended; nothing was lost"
    else:
        assert lines[0] == (f"stopped by SIGTERM during start-up; nothing was trained; its new run dir was removed "
                            f"({second_job})")
    assert lines[1] == "the sweep stopped there; of its 2 jobs these never ran: #1 total_timesteps=60000"
    assert len(lines) == 2
    assert "finished at step 512" in (first_job / "train.log").read_text()
    assert not second_job.exists()


def test_a_signal_while_a_sweeps_job_trains_names_the_jobs_never_run(tmp_path):
    process, _ = start("-m", "seed=1,2,3", *TINY, "total_timesteps=10000000", f"hydra.sweep.dir={tmp_path}")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_STOPPED, err
    assert err.strip().splitlines()[-1] == ("the sweep stopped there; of its 3 jobs these never ran: #1 seed=2; "
                                            "#2 seed=3")


def test_ctrl_c_to_the_process_group_with_videos_on_ends_in_lines_of_the_run_alone(tmp_path):
    from ppo.policy.video import VideoError, choose_gl

    try:
        choose_gl()
    except VideoError as error:
        pytest.skip(str(error))
    process, _ = start(*TINY, "video.every=1", "video.max_steps=200", "total_timesteps=10000000",
                       f"hydra.run.dir={tmp_path}", group=True)
    time.sleep(2)  # a video is rendering
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the group
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_STOPPED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert all(line.startswith("SIGINT: stopping after this iteration") for line in err.strip().splitlines()), err


def test_the_documented_exit_code_table_is_the_codes_the_code_uses():
    table = (ROOT / "docs" / "reliability.md").read_text().split("| exit | meaning | what to do |")[1].split("\n\n")[0]
    codes = re.findall(r"^\| *([0-9]+(?: \+ signal)?) *\| *([^|]+)\|", table, re.M)
    meaning = {code: text for code, text in codes}
    assert list(meaning) == ["0", str(EXIT_FAILED), str(EXIT_REFUSED), str(EXIT_STOPPED), "128 + signal"], codes
    assert meaning[str(EXIT_REFUSED)].startswith("refused before training")
    assert meaning[str(EXIT_FAILED)].startswith("failed while training")
    assert all(name in meaning[str(EXIT_STOPPED)] for name in NAMES), meaning[str(EXIT_STOPPED)]
