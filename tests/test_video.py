"""Videos: `scripts/evaluate.py --video` and `train.py video.every=N` (MuJoCo's offscreen renderer, MP4)."""

import glob
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.test_policy import hopper_run  # noqa: F401  (a fixture: a short Hopper-v4 run)
from tests.test_train import run_train

imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")


def _renders() -> str | None:
    from ppo.policy.video import VideoError, choose_gl

    try:
        choose_gl()
    except VideoError as error:
        return str(error)
    return None


CANNOT_RENDER = _renders()
needs_gl = pytest.mark.skipif(CANNOT_RENDER is not None, reason=f"{CANNOT_RENDER}")


def frames_of(path) -> tuple[tuple[int, int], list[np.ndarray]]:
    reader = imageio_ffmpeg.read_frames(str(path))
    width, height = next(reader)["size"]
    return (width, height), [np.frombuffer(f, np.uint8).reshape(height, width, 3) for f in reader]


def assert_not_blank(frames: list[np.ndarray]) -> None:
    """A rendered scene (a floor's checks, a body) has contrast, and the body moves between the first and last."""
    for frame in (frames[0], frames[len(frames) // 2], frames[-1]):
        assert frame.std() > 20, frame.std()
    assert np.abs(frames[0].astype(int) - frames[-1]).mean() > 0.5


@needs_gl
def test_evaluate_writes_an_mp4_of_each_episode_with_a_frame_per_step(hopper_run, tmp_path):  # noqa: F811
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(hopper_run), "--episodes", "2",
                             "--video", str(tmp_path), "--size", "160x128"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("2 episodes: mean return")
    for episode, line in enumerate(lines[:2]):
        path, steps, episodic_return = re.fullmatch(r"(.+\.mp4): (\d+) steps, return (-?[\d.]+)", line).groups()
        assert path == str(tmp_path / f"eval_seed12345_{episode}.mp4")
        size, frames = frames_of(path)
        assert size == (160, 128) and len(frames) == int(steps) + 1  # the first observation's frame, one per step
        assert_not_blank(frames)
    assert not glob.glob(str(tmp_path / "*.partial.mp4"))


@needs_gl
def test_training_records_videos_beside_the_loop_into_the_run_dir_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = run_train("env=Hopper-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4",
                       "ppo.update_epochs=1", "device=cpu", "total_timesteps=1024", "video.every=1",
                       "video.max_steps=30", "video.width=96", "video.height=64", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    # The first video is asked for after iteration 1; others asked for while it renders are skipped, and the
    # one in progress when training ends is waited for.
    said = re.findall(r"video at step ([\d,]+): (\S+\.mp4) \((\d+) frames, return (-?[\d.]+)\)", result.stdout)
    assert said and said[0][0] == "256", result.stdout
    for _, path, count, _ in said:
        size, frames = frames_of(path)
        assert size == (96, 64) and len(frames) == int(count) <= 31
        assert_not_blank(frames)
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("videos/evaluation")
    assert [e.step for e in images] == [int(s.replace(",", "")) for s, *_ in said]
    assert images[0].encoded_image_string[:6] == b"GIF89a"
    assert "video at step 256" in (tmp_path / "train.log").read_text()


def test_a_video_still_recording_when_training_ends_is_said_not_dropped_silently():
    # The recorder runs at nice 19: on a machine busy with other work it may not finish in the wait that
    # training's end grants it. Then the run says which video it lost. (No rendering needed: a stand-in
    # recorder process that never answers.)
    import queue
    import types

    from ppo.policy.video import VideoRecorder

    recorder = VideoRecorder.__new__(VideoRecorder)
    recorder._jobs, recorder._results = queue.Queue(maxsize=1), queue.Queue()
    recorder._process = types.SimpleNamespace(is_alive=lambda: True, join=lambda timeout=None: None,
                                              terminate=lambda: None, exitcode=None)
    recorder._busy, recorder._asked, recorder.stopped = 1, 2048, False
    videos, error = recorder.close(wait_s=0.2)
    assert videos == [] and error.startswith("the video of step 2,048 did not finish within 0.2 s of training's end")
    recorder._busy = 1
    assert recorder.close(wait_s=0) == ([], None)  # a run that failed or was stopped does not wait, nor say so


def test_a_machine_that_cannot_render_refuses_a_video_run_before_it_trains(tmp_path):
    import os

    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "env=Hopper-v4", "device=cpu", "video.every=5",
                             f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300,
                            cwd=ROOT, env={**os.environ, "MUJOCO_GL": "no-such-gl"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().startswith(
        "error: video.every=5: MuJoCo cannot render here (tried MUJOCO_GL=no-such-gl)")
    assert "libosmesa6" in result.stderr and not (tmp_path / "run").exists()
