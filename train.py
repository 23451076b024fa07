"""Train PPO on a continuous-control task.

    python train.py                                   # Ant-v4, the defaults in configs/
    python train.py env=Hopper-v4 seed=2 device=cuda
    python train.py -m env=Ant-v4,Hopper-v4 seed=1,2,3  # a sweep: one run dir per job
    torchrun --nproc_per_node=2 train.py env=Ant-v4      # data parallel: 2 workers, gradients averaged

Each run writes its resolved config (.hydra/), TensorBoard events, checkpoints and train.log (what
it printed) into its run dir; a command refused before training leaves none.
The story of a run: settings -> environments, agent, buffer -> (collect, advantages, update, log,
checkpoint) until `total_timesteps` -> the final checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import io
import itertools
import json
import logging
import math
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import hydra
import numpy as np
import torch
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # how it lists a grid's jobs: public in all 1.x
from hydra._internal.utils import get_args_parser  # hydra.main's own command-line parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, Override, OverrideType
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from buffers import RolloutBuffer
from ppo import distributed
from ppo.agent import make_agent
from ppo.checkpoint import (
    CheckpointError,
    check_observation_layout,
    load_agent_weights,
    load_checkpoint,
    numpy_rng_state,
    resolve_checkpoint,
    save_checkpoint,
    set_numpy_rng_state,
)
from ppo.collect import Collector
from ppo.config import (
    ConfigError,
    TrainSettings,
    check_setting_key,
    flat_settings,
    learning_differences,
    resolve_device,
    settings_from_dict,
)
from ppo.envs import check_env_id, env_groups, make_envs, simulator_version
from ppo.fused_update import auto_fallback_note, fuses
from ppo.logger import RunLogger, final_step, mean_of_last_episodes
from ppo.normalize import ObservationNormalizer, RewardScaler, ValueNormalizer
from ppo.update import Updater, compiles, current_learning_rate, make_optimizer, set_learning_rate

# Optuna imports alembic, whose INFO lines on its plugins Hydra's console logger would print at the
# start of every search (7 lines of `[HYDRA] setup plugin alembic...`).
logging.getLogger("alembic").setLevel(logging.WARNING)


class NonFiniteLossError(RuntimeError):
    pass


@hydra.main(version_base=None, config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final mean episodic return (the objective for sweepers)."""
    try:
        settings, device = checked(cfg)
    except ConfigError as error:
        refuse(f"error: {error}", 2)
    # Keys this command sets itself (`key=value`): a resume may change those on purpose.
    given = frozenset(map(override_key, HydraConfig.get().overrides.task))
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        with run_dir_claimed(run_dir):
            objective = train(settings, run_dir, device, given)
    except ConfigError as error:  # raised before training starts (a resume that does not fit)
        refuse(f"error: {error}", 1)
    except NonFiniteLossError:  # train() has said why, in the run's train.log too
        sys.exit(1)
    if StopOnSignal.received:  # in a sweep, Ctrl-C/SIGTERM ends the sweep, not just this job
        sys.exit(0)
    return objective


def checked(cfg: DictConfig) -> tuple[TrainSettings, torch.device]:
    """A command's settings and device, after the checks that need no simulator: a ConfigError names
    the first key that fails. Every run passes them before it starts, and a sweep runs them on each of
    its jobs before the first one starts (Sweep.on_multirun_start)."""
    settings = settings_of(cfg)
    check_env_id(settings.env)
    device = resolve_device(settings.device)
    if settings.resume:
        try:
            # Read here as well as in train(): a file that is no checkpoint is refused before a run dir is
            # made, and before a sweep's first job. The default model's is about 0.2 MB (Ant-v4).
            load_checkpoint(resolve_checkpoint(settings.resume), torch.device("cpu"))
        except (FileNotFoundError, CheckpointError) as error:
            raise ConfigError(f"resume={settings.resume}: {error}") from error
    return settings, device


def settings_of(cfg: DictConfig) -> TrainSettings:
    """The settings of a composed config; a ConfigError names the first value that fails its check.
    These checks ask nothing of the machine: checked() adds those that do."""
    return settings_from_dict(OmegaConf.to_container(cfg, resolve=True))


_claimed: dict[str, int] = {}  # run dir (absolute) -> the descriptor through which this process locks it


def claim_run_dir(run_dir: str) -> None:
    """Lock the run dir (made if new) for this process, or exit when another process holds it. Two runs
    of one env and seed started in the same second get the same default dir (runs/<env.id>/seed<N>_
    <second>), and a resume in place (`hydra.run.dir=`) may name a dir whose run still trains: unlocked,
    either pair would interleave its logs and overwrite the other's checkpoints without a word. The
    kernel drops the lock when the process ends, however it ends. The refused run exits without
    touching the dir: even one that holds nothing but `.hydra/` yet is the other run's."""
    run_dir = os.path.abspath(run_dir)
    if run_dir in _claimed or distributed.launched_rank() != 0:  # under torchrun only rank 0 writes the dir
        return
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError as error:  # a file of that name, no permission: Hydra's own mkdir would raise a traceback
        print(f"error: run dir {run_dir} cannot be made or opened: {error.strerror} (hydra.run.dir)", file=sys.stderr)
        sys.exit(2)
    if not locked(fd):
        os.close(fd)
        print(f"error: run dir {run_dir} is in use by a run still training there (runs of one env and seed "
              "started in the same second get the same dir); give this one its own: "
              f"hydra.run.dir={shlex.quote(run_dir + '_2')}", file=sys.stderr)
        sys.exit(1)
    _claimed[run_dir] = fd


def locked(fd: int) -> bool:
    """Take the run-dir lock through `fd`: False when another process holds it. On a file system
    without locks, True: the run trains unguarded, as before the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


@contextlib.contextmanager
def run_dir_claimed(run_dir: str) -> Iterator[None]:
    """Hold the run dir's lock (claim_run_dir) while this process trains into it. A single run has
    claimed it already, in RunDirLock; a sweep's job claims its own here, and lets it go when done."""
    claim_run_dir(run_dir)
    try:
        yield
    finally:
        fd = _claimed.pop(os.path.abspath(run_dir), None)
        if fd is not None:
            os.close(fd)


def refuse(message: str, code: int) -> NoReturn:
    """A command that fails its checks before training: print `message`, remove the run dir Hydra
    made for it (it holds nothing but Hydra's `.hydra/` record of the command, so a typo leaves no
    empty run behind), and exit with `code`."""
    print(message, file=sys.stderr)
    remove_unused_run_dir(HydraConfig.get().runtime.output_dir)
    sys.exit(code)


def remove_unused_run_dir(run_dir: str) -> None:
    """Remove a run dir that holds nothing but Hydra's `.hydra/` record, unless another process trains
    there (claim_run_dir's lock); then the parents this command made (runs/<env.id>/ for a mistyped
    id) while they are empty, inside the working directory only."""
    path = Path(run_dir).resolve()
    if not path.is_dir() or [p.name for p in path.iterdir()] not in ([], [".hydra"]):
        return
    if os.path.abspath(run_dir) not in _claimed:  # this process's lock aside, a lock held there is another run's
        fd = os.open(path, os.O_RDONLY)
        try:
            free = locked(fd)
        finally:
            os.close(fd)  # a probe only: the lock goes with the descriptor
        if not free:
            return
    shutil.rmtree(path)
    cwd, parent = Path.cwd().resolve(), path.parent
    while cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def train(settings: TrainSettings, run_dir: str, device: torch.device, given: frozenset[str] = frozenset()) -> float:
    """`given`: the setting keys the command line set (`key=value`); a resume may change only those,
    and the execution keys (ppo.config.EXECUTION_KEYS), from the settings its run trained with."""
    ppo = settings.ppo
    workers = distributed.start(device)  # under torchrun: this worker's rank; else one worker
    if device.type == "cuda" and workers.world_size > 1:
        device = torch.device("cuda", workers.local_rank)
        torch.cuda.set_device(device)
    own_dir, run_dir = run_dir, distributed.broadcast_object(run_dir)  # rank 0's holds the logs and checkpoints
    if own_dir != run_dir:  # this worker's Hydra read the clock (`${now:...}`) a second after rank 0's
        remove_unused_run_dir(own_dir)
    # One intra-op thread by default: these MLPs are too small to gain from more, and idle OpenMP
    # workers spin on the cores the simulator's threads need (measured: env time 265 -> 179 ms per
    # iteration on 2 cores, docs/benchmarks.md).
    torch.set_num_threads(settings.torch_threads or 1)
    seed_everything(settings.seed)  # the same initial weights on every worker
    resumed_from = resolve_checkpoint(settings.resume) if settings.resume else None
    checkpoint = load_checkpoint(resumed_from, device) if resumed_from else None
    iteration = checkpoint["iteration"] if checkpoint else 0
    global_step = checkpoint["global_step"] if checkpoint else 0
    if global_step >= settings.total_timesteps:  # a resume that would train nothing is a forgotten override
        raise ConfigError(f"resume={settings.resume}: its checkpoint is at step {global_step:,}, which already "
                          f"reaches `total_timesteps` ({settings.total_timesteps:,}); set it higher to train on")
    changed = resumed_changes(settings, checkpoint, given) if checkpoint else []

    env_seed = settings.seed + iteration + 1_000_003 * workers.rank  # disjoint env streams per worker
    envs = make_envs(settings.env, device, env_seed)
    value_normalizer = ValueNormalizer(device, ppo.normalize_values)
    agent = make_agent(envs.obs_dim, envs.act_dim, settings.model, value_normalizer).to(device)
    minibatch_size = settings.batch_size // ppo.num_minibatches
    fallback = auto_fallback_note(ppo, agent, device, workers.world_size, minibatch_size)  # printed below
    ppo = dataclasses.replace(ppo, fused_update=fuses(ppo, agent, device, workers.world_size, minibatch_size))
    # `ppo.compile=auto` decided once, for what is left of the run; the settings carry the answer.
    compiled_loss = compiles(ppo, device, settings.total_timesteps - global_step) and not ppo.fused_update
    ppo = dataclasses.replace(ppo, compile=compiled_loss)
    # On a GPU the compiled loss runs the actor and critic side by side (fewer kernels per step); on a
    # CPU that is slower, compiled or not (docs/benchmarks.md).
    agent.set_side_by_side(compiled_loss and device.type == "cuda")
    # CUDA graphs for collection and update on one GPU (a torchrun group keeps the eager loops:
    # its all-reduces are not captured).
    graphs = ppo.cuda_graphs and device.type == "cuda" and workers.world_size == 1
    optimizer = make_optimizer(agent, ppo, device, graphs)
    updater = Updater(agent, optimizer, ppo, graphs)
    obs_normalizer = ObservationNormalizer(envs.obs_dim, device, ppo.observation_clip, ppo.normalize_observations)
    reward_scaler = RewardScaler(envs.num_envs, ppo.gamma, device, ppo.reward_clip, ppo.normalize_rewards)
    normalizers = {"obs_normalizer": obs_normalizer, "reward_scaler": reward_scaler,
                   "value_normalizer": value_normalizer}  # checkpoint keys
    generator = torch.Generator(device).manual_seed(settings.seed)
    if checkpoint:
        check_observation_layout(checkpoint, envs.obs_layout, f"resume={settings.resume}")
        restore(checkpoint, agent, optimizer, normalizers, generator)
    distributed.broadcast_parameters(agent)
    if workers.world_size > 1:  # each worker samples actions and shuffles minibatches its own way
        torch.manual_seed(env_seed)
        generator.manual_seed(env_seed)
    buffer = RolloutBuffer(ppo.num_steps, envs.num_envs, envs.obs_dim, envs.act_dim, device)
    collector = Collector(envs, agent, obs_normalizer, reward_scaler, device, env_seed, graphs)
    steps_per_iteration = settings.batch_size * workers.world_size
    last_step = final_step(global_step, settings.total_timesteps, steps_per_iteration)
    logger = RunLogger(run_dir, last_step, global_step, settings.log_every_s, enabled=workers.is_main)
    stop = StopOnSignal()

    def state() -> dict:
        return snapshot(settings, iteration, global_step, agent, optimizer, normalizers, generator, envs.obs_layout)

    if workers.is_main:
        # A resumed run writes a new run dir unless told its own: say (and record) what it continues.
        resumed = {"resumed_from": str(resumed_from.resolve()), "resumed_at_step": global_step} if checkpoint else {}
        write_run_info(run_dir, settings, device, workers.world_size, resumed)
        logger.settings(global_step, {key: _yaml(value) for key, value in
                                      flat_settings(dataclasses.asdict(settings)).items()})
        fast_paths = [name for name, on in (("CUDA graphs", graphs), ("fused update step", ppo.fused_update),
                                            ("compiled update", compiled_loss)) if on]
        groups = f" in {len(envs.members)} pipelined groups" if len(envs.members) > 1 else ""
        paths = " with " + " and ".join(fast_paths) if fast_paths else ""
        # Whole iterations: say where the run really ends when that is past the requested count.
        past = (f" (whole iterations of {steps_per_iteration:,}: it ends at {last_step:,})"
                if last_step > settings.total_timesteps else "")
        per_worker = f" x {workers.world_size} workers" if workers.world_size > 1 else ""
        count = f"{envs.num_envs} env" + "s" * (envs.num_envs != 1)
        logger.say(f"training {settings.env.id} ({settings.env.backend}, {count}{groups}{per_worker}) "
                   f"on {device}{paths} for {settings.total_timesteps:,} steps{past}; run dir {run_dir}")
        if checkpoint:
            logger.say(f"resumed from {resumed_from} at step {global_step:,} (iteration {iteration})")
        if fast_paths:  # the first progress line comes only after this
            # Cold-cache compile times as measured (docs/benchmarks.md): a CPU compile's time follows its cores.
            takes = ("~25 s on an H200 host" if device.type == "cuda"
                     else "~25 s on a 2-core CPU, about a minute on the H200 host's slow cores")
            compile_time = (f" (torch.compile takes {takes}; seconds once cached)"
                            if "compiled update" in fast_paths else "")
            logger.say(f"the first iteration also warms up the {' and '.join(fast_paths)} (one-off){compile_time}")
        if fallback:
            logger.say(fallback)
        if changed:
            logger.say("resumed with settings changed on purpose: " + ", ".join(
                f"{key} {_yaml(old)} -> {_yaml(new)}" for key, old, new in changed))
    recent: list[tuple[float, float]] = []  # (episodes, mean return) per iteration
    try:
        while global_step < last_step and not stop.agreed(device):
            iteration += 1
            if ppo.adaptive_lr_kl is None:  # else the updater adapts the rate after each epoch
                set_learning_rate(optimizer, ppo.learning_rate * (1 - global_step / settings.total_timesteps
                                                                  if ppo.anneal_lr else 1))
            env_s, inference_s = collector.env_seconds, collector.inference_seconds
            iteration_start = time.perf_counter()

            collector.collect(buffer)
            global_step += steps_per_iteration

            start = time.perf_counter()
            buffer.compute_advantages(ppo.gamma, ppo.gae_lambda)
            gae_s = synchronized_seconds(start, device)

            start = time.perf_counter()
            value_normalizer.update(buffer.returns, buffer.valid)  # this update's targets in the critic's units
            stats = updater(buffer, generator)
            update_s = synchronized_seconds(start, device)
            stats["learning_rate"] = current_learning_rate(optimizer)  # after the update: adaptive rates move

            # One read of device scalars per iteration: episodes summed, losses averaged over workers.
            episodes, return_sum, length_sum = distributed.all_reduce_sum(collector.episodes.pop()).tolist()
            names = list(stats)
            stacked = distributed.mean_over_workers(torch.stack([stats[n].float().to(device) for n in names]))
            values = dict(zip(names, stacked.tolist(), strict=True))
            if not all(math.isfinite(values[n]) for n in ("policy_loss", "value_loss", "approx_kl")):
                raise NonFiniteLossError(
                    f"non-finite loss at iteration {iteration} (step {global_step:,}): policy {values['policy_loss']}, "
                    f"value {values['value_loss']}; the last good checkpoint is kept in {run_dir}/checkpoints"
                )
            mean_return = return_sum / episodes if episodes else None
            if episodes:
                recent.append((episodes, mean_return))
                logger.scalars(global_step, {"charts/episodic_return": mean_return,
                                             "charts/episodic_length": length_sum / episodes,
                                             "charts/episodes": episodes})
            logger.scalars(global_step, {
                "charts/SPS": logger.sps(global_step), "charts/learning_rate": values["learning_rate"],
                **{f"losses/{n}": values[n] for n in ("policy_loss", "value_loss", "entropy", "approx_kl",
                                                      "old_approx_kl", "clipfrac", "explained_variance")},
                "time/env": collector.env_seconds - env_s, "time/inference": collector.inference_seconds - inference_s,
                "time/gae": gae_s, "time/update": update_s, "time/iteration": time.perf_counter() - iteration_start,
            })
            logger.progress(global_step, mean_return)
            if settings.checkpoint.every and iteration % settings.checkpoint.every == 0 and workers.is_main:
                save_checkpoint(run_dir, state())
        if workers.is_main:
            path = save_checkpoint(run_dir, state())
            logger.progress(global_step, None, final=True)
            if stop.requested:
                logger.say(f"stopped by signal at step {global_step:,}; checkpoint {path}; to go on: "
                           f"{resume_command(run_dir)}")
            else:
                final = mean_of_last_episodes(recent)
                score = (f"mean return of the last 100 episodes {final:.1f} (CleanRL's metric)" if math.isfinite(final)
                         else "no episode finished")
                logger.say(f"finished at step {global_step:,} after {logger.elapsed()}: {score}; "
                           f"logs and checkpoint in {run_dir}")
    except NonFiniteLossError as error:
        logger.say(f"error: {error}", sys.stderr)
        raise
    finally:
        envs.close()
        logger.close()
    distributed.stop()
    return mean_of_last_episodes(recent)


def resumed_changes(settings: TrainSettings, checkpoint: dict, given: frozenset[str]) -> list[tuple]:
    """The learning settings this resume changes on purpose, as `(key, the run's value, this one)`.
    Any other learning setting that differs from the run's is an error: a forgotten override (the
    env, the seed, a batch size) would silently train another configuration from this checkpoint,
    in a run dir named after the wrong one."""
    differences = learning_differences(checkpoint["settings"], dataclasses.asdict(settings))
    forgotten = [d for d in differences if d[0] not in given]
    if forgotten:
        shown = ", ".join(f"{key} {_yaml(old)} (here {_yaml(new)})" for key, old, new in forgotten[:4])
        more = f" and {len(forgotten) - 4} more" if len(forgotten) > 4 else ""
        run_dir = resolve_checkpoint(settings.resume).parent.parent  # <run dir>/checkpoints/last.pt
        command = resume_command(run_dir, settings.resume, settings.total_timesteps)
        raise ConfigError(f"resume={settings.resume}: its run trained with other settings: {shown}{more}. Continue "
                          f"it with its own overrides: {command}; or set a key as key=value (to the run's value, "
                          f"or to a new one on purpose)")
    return differences


def resume_command(run_dir: str | Path, resume: str | None = None, total_timesteps: int | None = None) -> str:
    """`python train.py <the run's own overrides> resume=<resume, or the run dir>`; `total_timesteps`
    replaces the run's own target."""
    dropped = {"resume"} | ({"total_timesteps"} if total_timesteps is not None else set())
    kept = [o for o in recorded_overrides(run_dir) if override_key(o) not in dropped]
    if total_timesteps is not None:
        kept.append(f"total_timesteps={total_timesteps}")
    return " ".join(["python train.py", *map(shlex.quote, kept), shlex.quote(f"resume={resume or run_dir}")])


def recorded_overrides(run_dir: str | Path) -> list[str]:
    """The command-line overrides Hydra recorded for a run (`<run dir>/.hydra/overrides.yaml`),
    without Hydra's own `hydra.*` ones; [] where it kept no record. Scripts read runs through this."""
    recorded = Path(run_dir) / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in OmegaConf.load(recorded)] if recorded.is_file() else []
    return [o for o in overrides if not override_key(o).startswith("hydra.")]


def override_key(override: str) -> str:
    """The setting or config group a Hydra override names: `+ppo.x=1` -> `ppo.x`, `env=Ant-v4` -> `env`."""
    return override.lstrip("+~").partition("=")[0]


def _yaml(value) -> str:
    """A setting's value as it would be written on the command line."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return f"[{','.join(map(str, value))}]" if isinstance(value, tuple) else str(value)


def write_run_info(run_dir: str, settings: TrainSettings, device: torch.device, workers: int = 1,
                   resumed: dict | None = None) -> None:
    """What ran where, for scripts/summarize_results.py (the resolved config is in .hydra/); `resumed`:
    the checkpoint a resumed run continues and its step."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    cpu = cpu_name()
    hardware = f"{gpu} + {os.cpu_count()} CPU cores" if gpu else f"CPU only, {os.cpu_count()} cores ({cpu})"
    info = {"env_id": settings.env.id, "seed": settings.seed, "device": str(device), "gpu": gpu, "workers": workers,
            "cpus": os.cpu_count(), "cpu": cpu, "torch": torch.__version__,
            "simulator": simulator_version(settings.env.backend), "env_groups": env_groups(settings.env, device),
            "hardware": hardware if workers == 1 else f"{workers} workers x ({hardware})", **(resumed or {})}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "run_info.json").write_text(json.dumps(info, indent=1))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def synchronized_seconds(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def snapshot(settings, iteration, global_step, agent, optimizer, normalizers, generator, obs_layout) -> dict:
    return {
        "settings": dataclasses.asdict(settings), "iteration": iteration, "global_step": global_step,
        "observation_layout": obs_layout,
        "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
        **{name: normalizer.state_dict() for name, normalizer in normalizers.items()},
        "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": numpy_rng_state(), "python_rng": random.getstate(),
    }


def restore(checkpoint, agent, optimizer, normalizers, generator) -> None:
    load_agent_weights(agent, checkpoint["agent"], "resume: the checkpoint's model does not fit this env/model config")
    optimizer.load_state_dict(checkpoint["optimizer"])
    for name, normalizer in normalizers.items():
        # Only a checkpoint from before value normalisation existed may lack one (of "value_normalizer").
        if name in checkpoint or name != "value_normalizer":
            normalizer.load_state_dict(checkpoint[name])
    generator.set_state(checkpoint["generator"].cpu())
    torch.set_rng_state(checkpoint["torch_rng"].cpu())
    if checkpoint["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in checkpoint["cuda_rng"]])
    set_numpy_rng_state(checkpoint["numpy_rng"])
    random.setstate(checkpoint["python_rng"])


class Sweep(Callback):
    """A sweep's checks and its last line (configs/train.yaml's `hydra.callbacks`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """Check a sweep's jobs before the first one starts. Each job checks itself anyway, but only when
        its turn comes: `ppo.num_minibatches=32,7 seed=1,2` would train both jobs with 32 (hours, maybe)
        and then stop the sweep at the first with 7, and the last job would never run.
        A grid's jobs are checked one by one. An Optuna search picks its trials as it goes, so its space
        is checked instead, at its corners (search_space_corners). Other sweepers' jobs check themselves.
        A launcher that runs the jobs elsewhere (SLURM) gets the value checks only: the GPU, envpool
        and the checkpoints the jobs need are on the machines that run them, not on this one."""
        sweeper = config.hydra.sweeper._target_
        grid = sweeper == f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
        if grid:
            jobs, what, first, none_started = grid_jobs(config), "jobs of this sweep", "first", "none was started"
        elif sweeper.endswith(".OptunaSweeper"):
            jobs, what = search_space_corners(config), "corners of this search space"
            first, none_started = "first trial", "no trial was started"
        else:
            return
        if not jobs:  # a sweep Hydra cannot expand: let it say why, as without this check
            return
        here = config.hydra.launcher._target_.rsplit(".", 1)[-1] in ("BasicLauncher", "JoblibLauncher", "LocalLauncher")
        check = checked if here else settings_of
        if len(jobs) >= 20:  # Hydra composes each job's config in 0.1-0.15 s (2-core CPU)
            print(f"checking the {len(jobs)} {what} before the {first} starts...", flush=True)
        loader = GlobalHydra.instance().config_loader()
        failed = []  # (job, why)
        for name, overrides in jobs:
            try:
                job_cfg = loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides))
            except HydraException:  # a job Hydra cannot compose (a sweep config's params name no file): Hydra says so
                return
            with open_dict(job_cfg):
                del job_cfg["hydra"]  # what the job's main() receives
            try:
                check(job_cfg)
            except ConfigError as error:
                failed.append((name, str(error)))
        if failed:
            if grid:  # each job, as each is one the sweep would run
                lines = [f"  {name}: {why}" for name, why in failed]
            else:  # one corner per reason: the rest differ only in values the reason does not depend on
                by_reason = {}
                for name, why in failed:
                    by_reason.setdefault(why, []).append(name)
                lines = [f"  {names[0]}: {why}" + f" (and {len(names) - 1} more corners)" * (len(names) > 1)
                         for why, names in by_reason.items()]
            shown = lines[:10] + [f"  ... and {len(lines) - 10} more"] * (len(lines) > 10)
            if not grid:
                what += (" (each choice, each integer of a short range, the ends of others, a value inside a float "
                         "range)")
            print(f"error: {len(failed)} of {len(jobs)} {what} fail their checks, so {none_started}:", *shown,
                  sep="\n", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """After the last job: where the runs are, and the command that ranks them. Hydra itself ends a
        sweep on the last job's last line."""
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = len(list(sweep_dir.glob("*/run_info.json")))
        script = Path(__file__).resolve().parent / "scripts" / "summarize_sweep.py"
        if script.is_relative_to(Path.cwd()):  # as typed from the repo root; else a path that works from here
            script = script.relative_to(Path.cwd())
        print(f"sweep finished: {runs} run{'s' * (runs != 1)} in {sweep_dir}; one table and plot of them: "
              f"python {shlex.quote(str(script))} {shlex.quote(str(sweep_dir))}", flush=True)


class RunDirLock(Callback):
    """A single run claims its dir (claim_run_dir) before Hydra writes its `.hydra/` record there
    (configs/train.yaml's `hydra.callbacks`): from main(), a run refused because another still trains
    in that dir would already have overwritten that run's record with its own. A sweep's jobs each get
    a dir of their own and claim it in main()."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        HydraConfig.instance().set_config(config)  # as Hydra's run_job does first: `${hydra:...}` in the dir resolves
        try:
            run_dir = OmegaConf.select(config, "hydra.run.dir", throw_on_resolution_failure=True)
        except OmegaConfBaseException as error:  # Hydra would fail too, in a traceback of its own formatting
            print(f"error: hydra.run.dir={OmegaConf.to_container(config.hydra.run)['dir']} does not resolve: "
                  f"{str(error).splitlines()[0]}", file=sys.stderr)
            sys.exit(2)
        claim_run_dir(str(run_dir))


def sweep_arguments(config: DictConfig) -> list[str]:
    """What a sweeper expands into jobs, in the order both Hydra's basic sweeper and its Optuna sweeper
    read it: `hydra.sweeper.params` (a config's), then the command's overrides."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.params or {}).items()]
    return params + list(config.hydra.overrides.task)


def grid_jobs(config: DictConfig) -> list[tuple[str, list[str]]]:
    """A grid sweep's jobs, each as (`#<number> <overrides>`, its overrides), listed as Hydra's
    BasicSweeper.sweep lists them; [] if Hydra cannot."""
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    try:
        overrides = parser.parse_overrides(sweep_arguments(config))
        jobs = [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except HydraException:
        return []
    return [(f"#{number} {' '.join(job)}", job) for number, job in enumerate(jobs)]


def search_space_corners(config: DictConfig, most: int = 128, whole: int = 64) -> list[tuple[str, list[str]]]:
    """An Optuna search's corners, each as (its swept values, its overrides). A value the checks refuse
    there would stop the search at the first trial that draws one, after the trials before it have trained.
    - Discrete keys: every value of a `choice(...)`, every integer of an integer range of at most `whole`
      of them (`int(interval(4, 64))` minibatches: only the powers of two may divide the batch), the two
      ends of a longer one or of a float `range(...)`; in every combination while there are at most
      `most` of them, else each value once, beside the first value of the others. Checks that read
      several keys read these (`ppo.num_minibatches` must divide `env.num_envs` x `ppo.num_steps`).
    - A float `interval(...)`: its two ends and one value between, each beside the first value of the
      others. The checks on a float are bounds on that key alone (`ppo.gamma` in [0, 1]), which the
      ends meet if any value does, so its values are not combined with the others': four such ranges
      would otherwise take 16 times the combinations. The value between catches an integer key swept
      over a float range (`total_timesteps=interval(1e5,1e6)`), which passes at its two whole ends and
      fails at nearly every draw between them.
    [] if the plugin cannot parse the space."""
    try:
        from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
        from optuna.distributions import CategoricalDistribution
    except ImportError:
        return []
    try:  # as the plugin's OptunaSweeperImpl.sweep parses them (its older `search_space` key is not read)
        space, fixed = create_params_from_overrides(sweep_arguments(config))
    except Exception:  # the plugin's own errors are plain exceptions: it says why when it parses them next
        return []

    def continuous(dist) -> bool:
        """A float interval without a grid (optuna 2's (Log)UniformDistribution, 3's FloatDistribution)."""
        grid = getattr(dist, "step", None) or getattr(dist, "q", None)  # q: optuna 2's DiscreteUniformDistribution
        return not isinstance(dist, CategoricalDistribution) and not grid

    def tried(dist) -> list:
        if isinstance(dist, CategoricalDistribution):
            return list(dist.choices)
        step = getattr(dist, "step", None)  # an int for integer ranges (all optuna versions), else None or a float
        if isinstance(step, int) and isinstance(dist.low, int) and (dist.high - dist.low) // step < whole:
            return list(range(dist.low, dist.high + 1, step))
        ends = sorted({dist.low, dist.high})
        if continuous(dist):  # (3 - sqrt 5) / 2 of the way up: no round fraction, so an integer key gets one
            ends.insert(1, dist.low + (dist.high - dist.low) * (3 - math.sqrt(5)) / 2)
        return ends

    values = {name: tried(dist) for name, dist in space.items() if name not in fixed}
    names = list(values)
    firsts = [v[0] for v in values.values()]

    def beside_firsts(i: int, value) -> tuple:
        return tuple(firsts[:i] + [value] + firsts[i + 1:])

    discrete = [i for i, name in enumerate(names) if not continuous(space[name])]
    if math.prod(len(values[names[i]]) for i in discrete) <= most:
        picks = []
        for combination in itertools.product(*(values[names[i]] for i in discrete)):
            pick = list(firsts)
            for i, value in zip(discrete, combination, strict=True):
                pick[i] = value
            picks.append(tuple(pick))
    else:
        picks = [beside_firsts(i, value) for i in discrete for value in values[names[i]]]
    picks += [beside_firsts(i, value) for i, name in enumerate(names) if i not in discrete for value in values[name]]
    corners = []
    for pick in dict.fromkeys(picks):
        swept = [f"{name}={value}" for name, value in zip(names, pick, strict=True)]
        corners.append((" ".join(swept), swept + [f"{name}={value}" for name, value in fixed.items()]))
    return corners


CONFIGS = Path(__file__).resolve().parent / "configs"


def check_command_line(arguments: list[str]) -> None:
    """Refuse, in one line that names what was most likely meant, a command that changes a setting
    that does not exist (`ppo.lerning_rate=1`, CleanRL's flat `learning_rate=1`) or picks a config
    file that does not exist (`env=Hoper-v4`, `+experiment=ant10m`). Hydra would refuse both too: the
    first with advice to add the key (`+ppo.lerning_rate=1`) that leads only to the settings' own
    refusal, the second in a list of the files, with no word on `env.id`, which runs any id without
    one; a `glob(...)` that matches no file is refused too. `~key`, `key@package`, Hydra's own groups
    and keys, and `${...}` values are left to Hydra, and so is a command that reads configs from
    elsewhere (`--config-dir`, ...)."""
    try:
        # Quietly: what argparse prints and exits on (a flag it refuses, `--version`), Hydra prints next.
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = get_args_parser().parse_args(arguments)
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except (SystemExit, HydraException):
        return
    if args.config_path or args.config_dir or args.config_name or args.shell_completion:
        return
    if any(o.key_or_group.startswith("hydra.searchpath") for o in overrides):
        return
    groups = {path.name: sorted(p.stem for p in path.glob("*.yaml")) for path in CONFIGS.iterdir() if path.is_dir()}
    for override in overrides:
        key = override.key_or_group
        if override.type == OverrideType.DEL or override.package is not None:
            continue
        if "/" in key or key.split(".")[0] == "hydra":  # Hydra's own groups and keys
            continue
        try:
            if key in groups:
                check_config_file(key, groups[key], override)
            elif override.type == OverrideType.CHANGE:
                check_setting_key(key)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)


def check_config_file(group: str, files: list[str], override: Override) -> None:
    """A ConfigError if `group=NAME` (each NAME of a `a,b` or `choice(a,b)` sweep) names no file of
    the group's."""
    if isinstance(override.value(), ChoiceSweep):
        names = list(override.sweep_string_iterator())
    elif isinstance(override.value(), Glob):
        if not override.value().filter(files):  # else Hydra would launch a sweep of no jobs
            raise ConfigError(f"{group}={override.get_value_string()} matches no file of configs/{group} "
                              f"(known: {', '.join(files)})")
        return
    elif override.is_sweep_override() or override.value() is None:  # range(...); `env=null` drops the group
        return
    else:
        names = [override.get_value_element_as_str()]
    for name in names:
        if name in files or "${" in name:
            continue
        meant = difflib.get_close_matches(name, files, n=1, cutoff=0.75)
        plus = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(override.type, "")
        hint = f"a task without a file runs as env.id={name}" if group == "env" else ""  # any id does
        if meant:
            raise ConfigError(f"no config file configs/{group}/{name}.yaml: did you mean `{plus}{group}={meant[0]}`?"
                              + f" ({hint})" * bool(hint))
        known = "; ".join(filter(None, [f"known: {', '.join(files)}", hint]))
        raise ConfigError(f"no config file configs/{group}/{name}.yaml ({known})")


class StopOnSignal:
    """Ctrl-C or SIGTERM: finish the iteration, save a checkpoint, exit cleanly. A second one aborts."""

    received = False  # for main(): a signal also ends a sweep

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def agreed(self, device: torch.device) -> bool:
        """Whether any worker was asked to stop (all workers then stop at the same iteration)."""
        if not distributed.active():
            return self.requested
        flag = torch.tensor([float(self.requested)], device=device)
        return distributed.all_reduce_sum(flag).item() > 0

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = StopOnSignal.received = True
        print("\nstopping after this iteration (again to abort)...", file=sys.stderr, flush=True)


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
