"""Videos of a policy: episodes on gymnasium's own env of the task, rendered by MuJoCo's offscreen
renderer, written as MP4 (`imageio-ffmpeg`) and, for TensorBoard's Images tab, as a small GIF.

`VideoRecorder` records them beside training, in a process of its own at the lowest CPU priority, so
the training loop does not wait for a frame: a video asked for while the last one is still being
rendered is skipped, not queued.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np

EXTRA = 'pip install -e ".[video]"'
INSTALL_GL = ("a headless machine renders with OSMesa (Debian/Ubuntu: apt-get install libosmesa6) or, with a GPU "
              "driver, EGL; MUJOCO_GL=osmesa|egl|glfw picks one")
_PROBE = "import mujoco; m = mujoco.MjModel.from_xml_string('<mujoco/>'); mujoco.Renderer(m, 8, 8).render()"


class VideoError(RuntimeError):
    """Rendering or writing a video is not possible here; one line that says why and what to do."""


def choose_gl() -> str:
    """The OpenGL backend MuJoCo renders with: MUJOCO_GL where set, else glfw with a display, else the
    first of egl and osmesa; whichever it is must render a frame here. Probed in subprocesses: a backend
    that fails cannot be swapped for another within one process."""
    if os.environ.get("MUJOCO_GL"):
        candidates = [os.environ["MUJOCO_GL"]]
    else:
        candidates = ["glfw"] if os.environ.get("DISPLAY") else ["egl", "osmesa"]
    for name in candidates:
        probe = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, "MUJOCO_GL": name},
                               capture_output=True, timeout=60)
        if probe.returncode == 0:
            return name
    raise VideoError(f"MuJoCo cannot render here (tried MUJOCO_GL={' and '.join(candidates)}): {INSTALL_GL}")


def use_headless_gl() -> None:
    """Set MUJOCO_GL for this process before its first render (VideoError if none works)."""
    os.environ["MUJOCO_GL"] = choose_gl()


def render_episode(policy, seed: int, width: int, height: int, max_steps: int
                   ) -> tuple[list[np.ndarray], float, int]:
    """One episode of `policy` (a `ppo.policy.Policy`: its mean action) on gymnasium's env of its task, from
    `seed`: its frames (the first observation's, then one per step; at most `max_steps` steps), its return
    (raw rewards) and the frame rate that plays it in real time (1 / the env's dt). The env is gymnasium's
    whatever backend the run trained on: the same task."""
    import gymnasium

    try:
        env = gymnasium.make(policy.settings.env.id, render_mode="rgb_array", width=width, height=height)
    except Exception as error:  # e.g. a task gymnasium does not have, or no render mode
        raise VideoError(f"cannot render {policy.settings.env.id} with gymnasium: {error}") from error
    try:
        _follow_the_body(env)
        obs, _ = env.reset(seed=seed)
        fps = int(env.metadata.get("render_fps") or 30)
        frames, total = [_frame(env)], 0.0
        for _ in range(max_steps):
            obs, reward, terminated, truncated, _ = env.step(policy(obs).cpu().numpy())
            frames.append(_frame(env))
            total += float(reward)
            if terminated or truncated:
                break
        return frames, total, fps
    finally:
        env.close()


def _follow_the_body(env) -> None:
    """Render through the model's `track` camera where it has one (gymnasium's locomotion XMLs do): some
    tasks' default view stays put, and a trained Ant leaves it within seconds."""
    import mujoco

    renderer, model = getattr(env.unwrapped, "mujoco_renderer", None), getattr(env.unwrapped, "model", None)
    if renderer is None or model is None:
        return
    camera = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "track")
    if camera >= 0:
        renderer.camera_id = camera


def _frame(env) -> np.ndarray:
    try:
        return np.asarray(env.render(), dtype=np.uint8)
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise VideoError(f"MuJoCo cannot render here (MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {first}); "
                         f"{INSTALL_GL}") from error


def write_mp4(frames: list[np.ndarray], path: str | Path, fps: int) -> Path:
    """H.264 in an MP4 (yuv420p, which every player shows), one video frame per frame."""
    try:
        import imageio_ffmpeg
    except ImportError as error:
        raise VideoError(f"writing MP4 needs imageio-ffmpeg: {EXTRA}") from error
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".partial.mp4")  # a recorder stopped mid-video leaves no broken MP4
    height, width = frames[0].shape[:2]
    writer = imageio_ffmpeg.write_frames(str(partial), (width, height), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                         quality=7, macro_block_size=1, ffmpeg_log_level="error")
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))
    writer.close()
    os.replace(partial, path)
    return path


def write_frame_strip(frames: list[np.ndarray], path: str | Path, fps: int, count: int = 5, seconds: float = 8.0
                      ) -> Path:
    """`count` frames spread evenly over the episode's first `seconds`, side by side, as one PNG (gymnasium's
    floors are drawn 40-100 m wide: a good runner leaves them within a minute)."""
    from PIL import Image

    picks = np.linspace(0, min(len(frames) - 1, round(seconds * fps)), count).round().astype(int)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.concatenate([frames[i] for i in picks], axis=1)).save(path, optimize=True)
    return path


def gif_bytes(frames: list[np.ndarray], fps: int, every: int = 2, scale: int = 2) -> bytes:
    """A small animated GIF of the frames (every `every`-th, 1/`scale` of the size), for TensorBoard."""
    from PIL import Image

    images = [Image.fromarray(frame[::scale, ::scale]) for frame in frames[::every]]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 * every / fps),
                   loop=0)
    return out.getvalue()


def add_gif(writer, tag: str, gif: bytes, shape: tuple[int, int], step: int) -> None:
    """An animated GIF as an image summary: TensorBoard's Images tab plays it (what SummaryWriter.add_video
    writes, without its moviepy dependency)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    height, width = shape
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    writer.flush()


# --- beside training ---

def _record_loop(jobs, results, run_dir: str, gl: str) -> None:
    """The recorder process: each job is (step, policy state, seed, width, height, max_steps)."""
    os.nice(19)  # the lowest priority: training's threads come first on every core
    os.environ["MUJOCO_GL"] = gl
    import gymnasium

    gymnasium.logger.min_level = gymnasium.logger.ERROR  # its notes ("v4 is out of date") are training's to say
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from ppo.policy import policy_from_state

    torch.set_num_threads(1)
    writer = SummaryWriter(run_dir, filename_suffix=".videos")  # a second events file: TensorBoard reads both
    try:
        while (job := jobs.get()) is not None:
            step, state, seed, width, height, max_steps = job
            try:
                state = torch.load(io.BytesIO(state), map_location="cpu", weights_only=True)
                policy = policy_from_state(state, torch.device("cpu"), backend="gymnasium",
                                           what=f"the policy at step {step}")
                frames, episodic_return, fps = render_episode(policy, seed, width, height, max_steps)
                path = write_mp4(frames, Path(run_dir) / "videos" / f"step_{step:010d}.mp4", fps)
                add_gif(writer, "videos/evaluation", gif_bytes(frames, fps), (height // 2, width // 2), step)
                writer.add_scalar("videos/return", episodic_return, step)
                writer.flush()
                results.put(("video", step, str(path), episodic_return, len(frames)))
            except VideoError as error:
                results.put(("error", step, str(error), None, None))
                return
            except Exception as error:  # a bug here must not end training: say it once, stop recording
                detail = traceback.format_exception_only(error)[-1].strip()
                results.put(("error", step, f"recording failed ({detail})", None, None))
                return
    finally:
        writer.close()


@contextlib.contextmanager
def _deaf_children():
    """Processes started inside never hear SIGINT, SIGHUP or SIGUSR1 (a Ctrl-C, a closed terminal or SLURM's
    warning, sent to the whole process group): training hears them and ends the recorder itself, which
    would otherwise die in a KeyboardInterrupt traceback. SIGINT is ignored (a new interpreter keeps an
    ignored SIGINT, and unblocks a blocked one), the others blocked; both are inherited through exec.
    The parent's own signals wait, blocked, until the child has started."""
    deaf = {getattr(signal, name) for name in ("SIGINT", "SIGHUP", "SIGUSR1") if hasattr(signal, name)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, deaf)
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class VideoRecorder:
    """Records an evaluation episode (the policy's mean action, frozen normalisers) when `submit` is called,
    in a spawned process at nice 19; `poll` returns what finished since: `(step, path, return, frames)`
    videos, and an error line once if recording stopped."""

    def __init__(self, run_dir: str, width: int, height: int, max_steps: int, seed: int):
        import multiprocessing

        self.width, self.height, self.max_steps, self.seed = width, height, max_steps, seed
        gl = choose_gl()  # VideoError before training starts, not in the middle
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError as error:
            raise VideoError(f"video.every needs imageio-ffmpeg: {EXTRA}") from error
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA or thread state forked
        self._jobs, self._results = context.Queue(maxsize=1), context.Queue()
        self._process = context.Process(target=_record_loop, args=(self._jobs, self._results, run_dir, gl),
                                        daemon=True, name="video-recorder")
        with _deaf_children():
            self._process.start()
        self._busy = 0  # jobs handed over and not yet reported
        self._asked = 0  # the step of the last video asked for
        self.stopped = False

    def submit(self, step: int, state: dict) -> bool:
        """Ask for a video of `state`'s policy (`ppo.policy.policy_from_state`'s keys); False (skipped) while
        one is being recorded."""
        if self.stopped or self._busy:
            return False
        import torch

        buffer = io.BytesIO()
        torch.save(state, buffer)  # bytes through the queue: no tensors shared between the processes
        state = buffer.getvalue()
        try:
            self._jobs.put_nowait((step, state, self.seed + step, self.width, self.height, self.max_steps))
        except queue.Full:
            return False
        self._busy += 1
        self._asked = step
        return True

    def poll(self) -> tuple[list[tuple], str | None]:
        videos, error = [], None
        while True:
            try:
                kind, step, what, episodic_return, frames = self._results.get_nowait()
            except queue.Empty:
                break
            self._busy -= 1
            if kind == "video":
                videos.append((step, what, episodic_return, frames))
            else:
                self.stopped, error = True, what
        if not self.stopped and not self._process.is_alive():
            self.stopped = True
            if self._process.exitcode >= 0:  # else a signal from outside (SIGTERM to the job's processes), said there
                error = f"the video recorder ended (exit code {self._process.exitcode})"
        return videos, error

    def close(self, wait_s: float) -> tuple[list[tuple], str | None]:
        """Let the video in progress finish (up to `wait_s`), then end the process; what finished."""
        import time

        deadline = time.monotonic() + wait_s
        videos, error = self.poll()
        while self._busy and not self.stopped and time.monotonic() < deadline:
            time.sleep(0.1)
            more, error = self.poll()
            videos += more
        if self._busy and not self.stopped and wait_s > 0:  # a starved recorder (nice 19): said, not dropped silently
            error = (f"the video of step {self._asked:,} did not finish within {wait_s:g} s of training's end "
                     "(the recorder runs at nice 19 and yields to any other work); it was not recorded")
        try:
            self._jobs.put(None, timeout=1)
        except queue.Full:
            pass
        self._process.join(timeout=2)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        return videos, error
