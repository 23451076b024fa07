"""How a run ends on the signals a batch job is sent, and the exit codes a scheduler reads. No torch here:
train.py installs the start-up handler before its heavy imports.

The signals: SIGINT (Ctrl-C), SIGTERM (a scheduler's stop), SIGHUP (the terminal closed) and SIGUSR1
(SLURM's warning before the time limit, with `--signal=USR1@<seconds>`). Each is handled alike.

    0   finished
    1   failed while training (train.log says why; the last good checkpoint is kept)
    2   refused before training (a bad setting or checkpoint, a run dir it may not use, a machine too
        small, a disk too full for the run dir's first records): nothing was made
    75  stopped by a signal after a checkpoint of where it stood (EX_TEMPFAIL: "try again"): requeue it
        with the command it printed, its own overrides plus `resume=<run dir> hydra.run.dir=<run dir>`
    128 + signal (129 SIGHUP, 130 SIGINT, 138 SIGUSR1, 143 SIGTERM): ended by a signal before training
        started (nothing was trained, the new run dir is removed: run the command again), or by a second
        signal (the last checkpoint written is kept)
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED = 1, 2, 75
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1") if hasattr(signal, name))


class Interrupted(BaseException):
    """A signal that ends the process where it stands: during start-up, or the second one while
    training. A BaseException, as KeyboardInterrupt is, so that no `except Exception` swallows it."""

    def __init__(self, signum: int):
        self.signum, self.name = signum, signal.Signals(signum).name
        self.said = False  # whether the run has said where it stood (train.log too)
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process a signal ended


def quit_on_signals() -> None:
    """While train.py imports its modules (no run dir exists yet): one line, and exit."""
    for sig in SIGNALS:
        signal.signal(sig, _quit)


def stopped_during_start_up(name: str) -> str:
    """The line a signal before training ends the run with (`name`: the signal's, e.g. SIGTERM)."""
    return f"stopped by {name} during start-up; nothing was trained"


def _quit(signum: int, frame) -> None:
    print(stopped_during_start_up(signal.Signals(signum).name), file=sys.stderr, flush=True)
    os._exit(128 + signum)


def interrupt_on_signals() -> None:
    """From here until training starts (and again once it has ended), the signals raise `Interrupted`
    (see train.py)."""
    for sig in SIGNALS:
        signal.signal(sig, _interrupt)


def _interrupt(signum: int, frame) -> None:
    raise Interrupted(signum)


class StopOnSignal:
    """While training: the first signal finishes the iteration, saves a checkpoint and ends the run (exit
    EXIT_STOPPED); a second one raises `Interrupted` where the run stands. `close()` when training has
    ended: from then on a signal raises `Interrupted` again, as in start-up (in a sweep, the next job's)."""

    received = False  # for train.py: a signal also ends a sweep
    ended = False  # whether the run (a sweep's current job) has ended training: a signal then loses nothing

    def __init__(self):
        self.requested: str | None = None  # the signal's name
        StopOnSignal.ended = False
        for sig in SIGNALS:
            signal.signal(sig, self._handle)

    def close(self) -> None:
        StopOnSignal.ended = True
        interrupt_on_signals()

    def agreed(self, device) -> bool:
        """Whether any worker was asked to stop (all workers then stop at the same iteration)."""
        from ppo import distributed  # torch: imported where training has started

        if not distributed.active():
            return self.requested is not None
        import torch

        flag = torch.tensor([float(self.requested is not None)], device=device)
        return distributed.all_reduce_sum(flag).item() > 0

    def _handle(self, signum: int, frame) -> None:
        if self.requested:
            raise Interrupted(signum)
        self.requested = signal.Signals(signum).name
        StopOnSignal.received = True
        print(f"\n{self.requested}: stopping after this iteration, with a checkpoint (again to abort)...",
              file=sys.stderr, flush=True)
