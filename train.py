"""Train PPO on a continuous-control task.

    python train.py                                   # Ant-v4, the defaults in configs/
    python train.py env=Hopper-v4 seed=2 device=cuda
    python train.py -m env=Ant-v4,Hopper-v4 seed=1,2,3  # a sweep: one run dir per job
    torchrun --nproc_per_node=2 train.py env=Ant-v4      # data parallel: 2 workers, gradients averaged

Hydra composes the config; `hydra_edge` checks it and turns it into typed settings; `ppo.trainer.train`
runs the loop. Each run writes its resolved config (.hydra/), TensorBoard events, checkpoints and
train.log (what it printed) into its run dir; a command refused before training leaves none.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hydra_edge import check_command_line, checked, command_line_keys, refuse, run_dir_claimed
from ppo.config import ConfigError
from ppo.trainer import NonFiniteLossError, StopOnSignal, train


@hydra.main(version_base=None, config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final mean episodic return (the objective for sweepers)."""
    try:
        settings, device = checked(cfg)
    except ConfigError as error:
        refuse(f"error: {error}", 2)
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        with run_dir_claimed(run_dir, settings.resume):
            objective = train(settings, run_dir, device, command_line_keys())
    except ConfigError as error:  # raised before training starts (a resume that does not fit)
        refuse(f"error: {error}", 1)
    except NonFiniteLossError:  # train() has said why, in the run's train.log too
        sys.exit(1)
    if StopOnSignal.received:  # in a sweep, Ctrl-C/SIGTERM ends the sweep, not just this job
        sys.exit(0)
    return objective


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
