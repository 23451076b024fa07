"""Train PPO on a continuous-control task.

    python train.py                                   # Ant-v4, the defaults in configs/
    python train.py env=Hopper-v4 seed=2 device=cuda
    python train.py -m env=Ant-v4,Hopper-v4 seed=1,2,3  # a sweep: one run dir per job
    torchrun --nproc_per_node=2 train.py env=Ant-v4      # data parallel: 2 workers, gradients averaged

Hydra composes the config; `hydra_edge` checks it and turns it into typed settings; `ppo.trainer.train`
runs the loop. Each run writes its resolved config (.hydra/), TensorBoard events, checkpoints and
train.log (what it printed, and how it ended) into its run dir; a command refused or stopped before
training leaves none. Exit codes: `ppo/run/signals.py` (0 finished, 75 stopped with a checkpoint).
"""

from __future__ import annotations

import sys

from ppo.run.signals import quit_on_signals

if __name__ == "__main__":
    quit_on_signals()  # a Ctrl-C during the imports below: one line, not a traceback

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from hydra_edge import (  # noqa: E402
    check_command_line,
    checked,
    command_line_keys,
    jobs_never_run,
    refuse,
    run_dir_claimed,
)
from ppo.config import ConfigError  # noqa: E402
from ppo.run import records as run_records  # noqa: E402
from ppo.run.signals import (  # noqa: E402
    EXIT_FAILED,
    EXIT_REFUSED,
    EXIT_STOPPED,
    Interrupted,
    StopOnSignal,
    interrupt_on_signals,
    stopped_during_start_up,
)
from ppo.trainer import TrainingFailed, describe_os_error, train  # noqa: E402


@hydra.main(version_base=None, config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final mean episodic return (the objective for sweepers)."""
    interrupt_on_signals()  # until training starts: a signal ends start-up (see ended_by_signal)
    try:
        settings, device = checked(cfg)
    except ConfigError as error:
        refuse(f"error: {error}", EXIT_REFUSED)
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        with run_dir_claimed(run_dir, settings.resume):
            objective = train(settings, run_dir, device, command_line_keys())
    except ConfigError as error:  # raised before training starts (a resume that does not fit, a task's spaces)
        run_records.discard_if_new(run_dir)
        refuse(f"error: {error}", EXIT_REFUSED)
    except TrainingFailed:  # train() has said why, in the run's train.log too
        sys.exit(EXIT_FAILED)
    except OSError as error:  # before the loop (whose failures are TrainingFailed): the run dir's first records
        removed = run_records.discard_if_new(run_dir)
        refuse(f"error: cannot write the run's first records: {describe_os_error(error)}; nothing was trained"
               + (f", and its new run dir was removed ({run_dir})" if removed else ""), EXIT_REFUSED)
    if StopOnSignal.received:  # in a sweep, a signal ends the sweep, not just this job
        never = jobs_never_run(current_ran=True)
        if never:
            print(never, file=sys.stderr, flush=True)
        sys.exit(EXIT_STOPPED)
    return objective


def ended_by_signal(interrupt: Interrupted) -> None:
    """A signal during start-up (no checkpoint yet: the new run dir goes), a second one while training
    (train.log says where), or one after training ended (a sweep's next job not begun): one line, the
    sweep's jobs that never ran, and the shell's exit code for a signal."""
    removed = [run_dir for run_dir in run_records.new_dirs() if run_records.discard_if_new(run_dir)]
    ran = interrupt.said or StopOnSignal.ended
    if not ran:  # stopped before training: a resume in place leaves its run's record as it was
        run_records.restore_record()
    if interrupt.said:  # a second signal while training: train.log and the console have its line
        pass
    elif StopOnSignal.ended:
        print(f"stopped by {interrupt.name} after the run had ended; nothing was lost", file=sys.stderr, flush=True)
    else:
        gone = f"; its new run dir was removed ({removed[0]})" if removed else ""
        print(stopped_during_start_up(interrupt.name) + gone, file=sys.stderr, flush=True)
    never = jobs_never_run(current_ran=ran)
    if never:
        print(never, file=sys.stderr, flush=True)
    sys.exit(interrupt.exit_code)


if __name__ == "__main__":
    try:
        check_command_line(sys.argv[1:])
        main()
    except Interrupted as interrupt:
        ended_by_signal(interrupt)
