"""TensorBoard scalars with CleanRL's tags, and a console progress line (steps, SPS, return, ETA).

What the run prints also goes to `<run dir>/train.log`, so a run dir keeps its own story: a sweep's
jobs share one console, and a job on a cluster may have none.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


def _quiet_event_writer_errors(args: threading.ExceptHookArgs) -> None:
    """TensorBoard writes events from a thread of its own; an OSError there (a full disk) would print
    that thread's traceback, ~70 lines, and the next write in the training loop raises it again,
    where the run ends with one line. Other threads' errors print as Python prints them."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _print_thread_error(args)


_print_thread_error = threading.excepthook
threading.excepthook = _quiet_event_writer_errors


class RunLogger:
    """With `enabled=False` (data-parallel workers other than rank 0) it writes and prints nothing."""

    LOG_FILE = "train.log"

    def __init__(self, run_dir: str, last_step: int, start_step: int, every_s: float = 2.0,
                 enabled: bool = True):
        """`last_step`: where the run will stop (`final_step`), so the bar ends at 100%."""
        self.enabled = enabled
        self.writer = SummaryWriter(run_dir) if enabled else None
        # Appended to: a resume into the same dir (hydra.run.dir=...) continues the file.
        self.log_file = open(Path(run_dir) / self.LOG_FILE, "a", encoding="utf-8") if enabled else None
        self.total, self.every_s = last_step, every_s
        self.start_time, self.start_step = time.time(), start_step
        self.last_print, self.printed_step = 0.0, None
        self.first_iteration_end: tuple[float, int] | None = None  # (time, step) at the first progress call
        self.recent_return = math.nan
        self.mirror = None  # a ppo.run.tracking.WandbMirror: the same scalars and the videos, to W&B

    def video(self, step: int, path: str) -> None:
        """A video the recorder wrote (TensorBoard has it from the recorder's own events file)."""
        if self.mirror is not None:
            self.mirror.video(step, path)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        try:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, step)
        except OSError as error:  # raised again from the writer's thread, which names no file
            error.filename = error.filename or f"TensorBoard events in {self.writer.log_dir}"
            raise
        if self.mirror is not None:
            self.mirror.scalars(step, values)

    def settings(self, step: int, values: dict[str, str]) -> None:
        """Every setting as a table in TensorBoard's Text tab, under CleanRL's tag `hyperparameters`:
        runs compared side by side there show what each trained with (the run dir's .hydra/ has it too)."""
        if not self.enabled:
            return
        rows = "".join(f"|{key}|{value}|\n" for key, value in values.items())
        self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{rows}", step)

    def say(self, line: str, stream=None) -> None:
        """Print `line` (to stdout, or `stream`) and append it to the run's train.log, time-stamped."""
        if not self.enabled:
            return
        print(line, file=stream or sys.stdout, flush=True)
        try:
            self.log_file.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")
            self.log_file.flush()
        except OSError:  # a full disk: the console has the line, and the run says why it stops
            pass

    def sps(self, step: int) -> float:
        """CleanRL's `charts/SPS`: every step of this process over all its time, warm-up included."""
        return (step - self.start_step) / max(time.time() - self.start_time, 1e-9)

    def elapsed(self) -> str:
        """This process's time since the logger started, as `4m12s` (a resumed run counts its own)."""
        return _duration(time.time() - self.start_time)

    def recent_sps(self, step: int, now: float) -> float:
        """The console's rate, for SPS and ETA: the steps since the first iteration. That one holds
        the one-off warm-up (CUDA graphs, compiles): 10.7 s of a 100k-step Hopper run on an H200,
        whose other iterations ran at 45,875 steps/s and whose `sps` ended at 7,798. `sps` until a
        second iteration is in."""
        if self.first_iteration_end is None or step <= self.first_iteration_end[1]:
            return self.sps(step)
        start_time, start_step = self.first_iteration_end
        return (step - start_step) / max(now - start_time, 1e-9)

    def progress(self, step: int, episodic_return: float | None, final: bool = False) -> None:
        """One line at most every `every_s`; `final` forces the line for `step` unless it is already out."""
        if episodic_return is not None:
            self.recent_return = episodic_return
        now = time.time()
        if self.first_iteration_end is None:  # the loop calls this after every iteration
            self.first_iteration_end = (now, step)
        if not self.enabled or (not final and now - self.last_print < self.every_s) or step == self.printed_step:
            return
        self.last_print, self.printed_step = now, step
        sps = self.recent_sps(step, now)
        # No ETA from the first iteration alone: its one-off warm-up (a compile: ~25 s) would put
        # hours on the first line of a run that takes minutes.
        if step >= self.total:
            eta = 0.0
        elif step > self.first_iteration_end[1] and sps > 0:
            eta = (self.total - step) / sps
        else:
            eta = math.inf  # printed as "--"
        done = min(step / self.total, 1.0)
        bar = "#" * round(20 * done) + "." * (20 - round(20 * done))
        # "-" until an episode has finished (a fresh run's first iterations, or long episodes)
        recent = f"{self.recent_return:9.2f}" if math.isfinite(self.recent_return) else f"{'-':>9}"
        line = (f"[{bar}] step {step:>{len(str(self.total))},}/{self.total:,} ({100 * step / self.total:5.1f}%) | "
                f"SPS {sps:,.0f} | return {recent} | ETA {_duration(eta)}")
        self.say(line)

    def close(self) -> None:
        """Flush and close the events and train.log; a write that fails now (a full disk) has been said."""
        if self.writer is not None:
            for close in (self.writer.close, self.log_file.close):
                try:
                    close()
                except OSError:
                    pass


def final_step(start_step: int, total_timesteps: int, steps_per_iteration: int) -> int:
    """Where training stops (ppo.trainer's loop runs to it): whole iterations while the count is below
    `total_timesteps`, so it may end past it, by at most one iteration less one step."""
    iterations = max(-(-(total_timesteps - start_step) // steps_per_iteration), 0)  # ceil, none if already there
    return start_step + iterations * steps_per_iteration


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def last_iterations(per_iteration: list[tuple[float, float]], episodes_wanted: int = 100) -> list[tuple[float, float]]:
    """The `(episodes, mean return)` pairs `mean_of_last_episodes` reads: whole iterations from the end,
    as few as hold `episodes_wanted` episodes (all of them where fewer do)."""
    count = 0.0
    for first in range(len(per_iteration) - 1, -1, -1):
        count += per_iteration[first][0]
        if count >= episodes_wanted:
            return per_iteration[first:]
    return list(per_iteration)


def mean_of_last_episodes(per_iteration: list[tuple[float, float]], episodes_wanted: int = 100) -> float:
    """Mean return over (about) the last `episodes_wanted` episodes, from `(episodes, mean return)`
    pairs of successive iterations, taking whole iterations from the end (CleanRL's metric is the
    last 100 episodes; iterations finish several at a time)."""
    count = total = 0.0
    for episodes, mean_return in reversed(per_iteration):
        count, total = count + episodes, total + episodes * mean_return
        if count >= episodes_wanted:
            break
    return total / count if count else math.nan
