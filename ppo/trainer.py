"""The training loop: typed settings in, a trained run dir out. No Hydra here (`train.py` is the edge).

The story of a run, read top to bottom in `train`: settings -> environments, agent, buffer -> (collect,
advantages, update, log, checkpoint) until `total_timesteps` -> the final checkpoint. The fast paths
(CUDA graphs, the fused or compiled update, pipelined simulators) live behind the objects that use them:
`Collector`, `RolloutBuffer.compute_advantages` and `Updater`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from buffers import RolloutBuffer
from ppo import distributed
from ppo.agent import make_agent, side_by_side_pays
from ppo.collect import Collector
from ppo.config import ConfigError, TrainSettings, flat_settings
from ppo.envs import make_envs
from ppo.normalize import ObservationNormalizer, RewardScaler, ValueNormalizer
from ppo.policy.video import VideoError, VideoRecorder
from ppo.run import records as run_records
from ppo.run.checkpoint import (
    NonFiniteState,
    check_observation_layout,
    load_checkpoint,
    resolve_checkpoint,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from ppo.run.logger import RunLogger, final_step, last_iterations, mean_of_last_episodes
from ppo.run.signals import Interrupted, StopOnSignal
from ppo.run.tracking import WandbMirror
from ppo.update import (
    Updater,
    compiles,
    current_learning_rate,
    make_optimizer,
    set_learning_rate,
    set_matmul_precision,
)
from ppo.update.fused import auto_fallback_note, fuses

LOSS_TAGS = ("policy_loss", "value_loss", "entropy", "approx_kl", "old_approx_kl", "clipfrac", "explained_variance")


class TrainingFailed(RuntimeError):
    """Training cannot go on (a non-finite loss, a full disk): said in one line, in train.log too where it
    can be written, naming the last good checkpoint."""


def train(settings: TrainSettings, run_dir: str, device: torch.device, given: frozenset[str] = frozenset()) -> float:
    """Train `settings` into `run_dir` on `device`; returns the mean return of the last 100 episodes.
    `given`: the setting keys the command line set (`key=value`); a resume may change only those, and the
    execution keys (ppo.config.EXECUTION_KEYS), from the settings its run trained with."""
    ppo = settings.ppo
    workers = distributed.start(device)  # under torchrun: this worker's rank; else one worker
    if device.type == "cuda" and workers.world_size > 1:
        device = torch.device("cuda", workers.local_rank)
        torch.cuda.set_device(device)
    own_dir, run_dir = run_dir, distributed.broadcast_object(run_dir)  # rank 0's holds the logs and checkpoints
    if own_dir != run_dir:  # this worker's Hydra read the clock (`${now:...}`) a second after rank 0's
        run_records.remove_if_unused(own_dir)
    # One intra-op thread by default: these MLPs are too small to gain from more, and idle OpenMP
    # workers spin on the cores the simulator's threads need (env time 265 -> 179 ms an iteration on 2 cores).
    torch.set_num_threads(settings.torch_threads or 1)
    seed_everything(settings.seed)  # the same initial weights on every worker
    resumed_from = resolve_checkpoint(settings.resume) if settings.resume else None
    checkpoint = load_checkpoint(resumed_from, device) if resumed_from else None
    iteration = checkpoint["iteration"] if checkpoint else 0
    global_step = checkpoint["global_step"] if checkpoint else 0
    if global_step >= settings.total_timesteps:  # a resume that would train nothing is a forgotten override
        raise ConfigError(f"resume={settings.resume}: its checkpoint is at step {global_step:,}, which already "
                          f"reaches `total_timesteps` ({settings.total_timesteps:,}); set it higher to train on")
    changed = run_records.resumed_changes(settings, checkpoint["settings"], given) if checkpoint else []
    # Before the envs: a machine that cannot render refuses the run in a second, not after a compile.
    recorder = start_video_recorder(settings, run_dir) if workers.is_main and settings.video.every else None

    tf32 = set_matmul_precision(ppo, device)
    env_seed = settings.seed + iteration + 1_000_003 * workers.rank  # disjoint env streams per worker
    envs = make_envs(settings.env, device, env_seed)
    value_normalizer = ValueNormalizer(device, ppo.normalize_values)
    agent = make_agent(envs.obs_dim, envs.act_dim, settings.model, value_normalizer).to(device)
    # The update's fast paths, decided once for what is left of the run; the settings carry the answers.
    minibatch_size = settings.batch_size // ppo.num_minibatches
    fallback = auto_fallback_note(ppo, agent, device, workers.world_size, minibatch_size)  # said below
    ppo = dataclasses.replace(ppo, fused_update=fuses(ppo, agent, device, workers.world_size, minibatch_size))
    compiled = compiles(ppo, device, settings.total_timesteps - global_step) and not ppo.fused_update
    ppo = dataclasses.replace(ppo, compile=compiled)
    # On a GPU the compiled loss runs actor and critic side by side (fewer kernels a step) up to a minibatch size.
    agent.set_side_by_side(compiled and side_by_side_pays(device, minibatch_size))
    # CUDA graphs for collection and update on one GPU (a torchrun group's all-reduces are not captured).
    graphs = ppo.cuda_graphs and device.type == "cuda" and workers.world_size == 1
    optimizer = make_optimizer(agent, ppo, device, graphs)
    updater = Updater(agent, optimizer, ppo, graphs)
    obs_normalizer = ObservationNormalizer(envs.obs_dim, device, ppo.observation_clip, ppo.normalize_observations)
    reward_scaler = RewardScaler(envs.num_envs, ppo.gamma, device, ppo.reward_clip, ppo.normalize_rewards)
    normalizers = {"obs_normalizer": obs_normalizer, "reward_scaler": reward_scaler,
                   "value_normalizer": value_normalizer}  # by checkpoint key
    generator = torch.Generator(device).manual_seed(settings.seed)
    if checkpoint:
        check_observation_layout(checkpoint, envs.obs_layout, f"resume={settings.resume}")
        restore_training_state(checkpoint, agent, optimizer, normalizers, generator)
    distributed.broadcast_parameters(agent)
    if workers.world_size > 1:  # each worker samples actions and shuffles minibatches its own way
        torch.manual_seed(env_seed)
        generator.manual_seed(env_seed)
    buffer = RolloutBuffer(ppo.num_steps, envs.num_envs, envs.obs_dim, envs.act_dim, device)
    collector = Collector(envs, agent, obs_normalizer, reward_scaler, device, env_seed, graphs,
                          resumed=checkpoint is not None)
    steps_per_iteration = settings.batch_size * workers.world_size
    last_step = final_step(global_step, settings.total_timesteps, steps_per_iteration)
    logger = RunLogger(run_dir, last_step, global_step, settings.log_every_s, enabled=workers.is_main)
    last_checkpoint = resumed_from  # the last good one: a new run dir holds none until its first save

    def state() -> dict:
        return training_state(settings, iteration, global_step, agent, optimizer, normalizers, generator,
                              envs.obs_layout, last_iterations(recent))

    def save() -> Path:
        nonlocal last_checkpoint
        try:
            last_checkpoint = save_checkpoint(run_dir, state())
        except NonFiniteState as error:
            raise TrainingFailed(f"the model became non-finite by iteration {iteration} (step {global_step:,}): "
                                 f"{error}, so it was not saved; the run stopped there, and {kept()}") from error
        return last_checkpoint

    def kept() -> str:
        if last_checkpoint is None:
            return f"no checkpoint was written yet (checkpoint.every={settings.checkpoint.every} iterations)"
        return f"the last good checkpoint is {last_checkpoint}"

    if workers.is_main:
        # A resumed run writes a new run dir unless told its own: say (and record) what it continues.
        resumed = {"resumed_from": str(resumed_from.resolve()), "resumed_at_step": global_step} if checkpoint else {}
        run_records.write_run_info(run_dir, settings, device, workers.world_size, resumed)
        logger.settings(global_step, {key: run_records.command_value(value)
                                      for key, value in flat_settings(dataclasses.asdict(settings)).items()})
        fast_paths = [name for name, on in (("CUDA graphs", graphs), ("fused update step", ppo.fused_update),
                                            ("compiled update", compiled), ("TF32 matrix products", tf32)) if on]
        resumed_at = (resumed_from, global_step, iteration) if checkpoint else None
        for line in opening_lines(settings, device, run_dir, len(envs.members), envs.num_envs, workers.world_size,
                                  last_step, fast_paths, resumed_at, fallback, changed):
            logger.say(line)
    if workers.is_main and settings.logger.wandb:
        logger.mirror = WandbMirror(settings, run_dir, logger.say, resumed_from)

    def video_policy() -> dict:
        """What the recorder needs of the policy now: `ppo.policy.policy_from_state`'s keys, on the CPU."""
        return {"settings": dataclasses.asdict(settings), "observation_layout": envs.obs_layout,
                "agent": {k: v.detach().cpu().clone() for k, v in agent.state_dict().items()},
                "obs_normalizer": {k: v.detach().cpu().clone() for k, v in obs_normalizer.state_dict().items()}}

    def report_videos(finished: tuple[list, str | None], ended: bool = False) -> None:
        videos, error = finished
        for step, path, episodic_return, frames in videos:
            logger.say(f"video at step {step:,}: {path} ({frames} frames, return {episodic_return:.1f})")
            logger.video(step, path)
        if error:
            logger.say(f"video.every: {error}" + ("" if ended else "; training goes on without videos"), sys.stderr)

    # (episodes, mean return) per iteration that finished any; a resume continues its run's
    recent: list[tuple[float, float]] = [tuple(pair) for pair in checkpoint.get("recent_episodes", [])] \
        if checkpoint else []
    failed = True
    stop = StopOnSignal()  # from here a signal stops the run at the end of an iteration, with a checkpoint
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
            rollout_s = synchronized_seconds(iteration_start, device)  # a GPU simulator's steps end only here

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
                raise TrainingFailed(
                    f"non-finite loss at iteration {iteration} (step {global_step:,}): policy {values['policy_loss']}, "
                    f"value {values['value_loss']}; the run stopped there, and {kept()}"
                )
            mean_return = return_sum / episodes if episodes else None
            if episodes:
                recent.append((episodes, mean_return))
                logger.scalars(global_step, {"charts/episodic_return": mean_return,
                                             "charts/episodic_length": length_sum / episodes,
                                             "charts/episodes": episodes})
            logger.scalars(global_step, {
                "charts/SPS": logger.sps(global_step), "charts/learning_rate": values["learning_rate"],
                **{f"losses/{n}": values[n] for n in LOSS_TAGS},
                "time/env": collector.env_seconds - env_s, "time/inference": collector.inference_seconds - inference_s,
                "time/rollout": rollout_s, "time/gae": gae_s, "time/update": update_s,
                "time/iteration": time.perf_counter() - iteration_start,
            })
            logger.progress(global_step, mean_return)
            if recorder is not None:
                if iteration % settings.video.every == 0:
                    recorder.submit(global_step, video_policy())  # skipped while the last is still rendering
                report_videos(recorder.poll())
            if settings.checkpoint.every and iteration % settings.checkpoint.every == 0 and workers.is_main:
                save()
        if workers.is_main:
            path = save()
            logger.progress(global_step, None, final=True)
            if stop.requested:
                logger.say(f"stopped by {stop.requested} at step {global_step:,}; checkpoint {path}; to go on: "
                           f"{run_records.resume_command(run_dir)}")
            else:
                final = mean_of_last_episodes(recent)
                score = (f"mean return of the last 100 episodes {final:.1f} (CleanRL's metric)" if math.isfinite(final)
                         else "no episode finished")
                logger.say(f"finished at step {global_step:,} after {logger.elapsed()}: {score}; "
                           f"logs and checkpoint in {run_dir}")
        failed = False
    except OSError as error:  # a full disk or a lost mount, under the checkpoint or the logs
        go_on = (f"; once fixed, continue it with: {run_records.resume_command(run_dir, str(last_checkpoint))}"
                 if last_checkpoint else "")
        failure = TrainingFailed(f"{describe_os_error(error)} at step {global_step:,}; the run stopped there, and "
                                 f"{kept()}{go_on}")
        logger.say(f"error: {failure}", sys.stderr)
        raise failure from error
    except TrainingFailed as error:
        logger.say(f"error: {error}", sys.stderr)
        raise
    except Interrupted as interrupt:
        logger.say(f"aborted by a second {interrupt.name} at step {global_step:,}; {kept()}", sys.stderr)
        interrupt.said = True
        raise
    finally:
        envs.close()
        if recorder is not None:  # the video in progress may finish, unless the run is being stopped
            report_videos(recorder.close(wait_s=0 if failed or stop.requested else 60), ended=True)
        if logger.mirror is not None:
            logger.mirror.finish(failed)
        logger.close()
        stop.close()  # a signal from here on ends the process where it stands (a sweep: before its next job)
    distributed.stop()
    return mean_of_last_episodes(recent)


def opening_lines(settings: TrainSettings, device: torch.device, run_dir: str, groups: int, num_envs: int,
                  world_size: int, last_step: int, fast_paths: list[str], resumed_at: tuple | None,
                  fallback: str | None, changed: list[tuple]) -> list[str]:
    """What a run says before its first iteration: task, simulator, envs, device, fast paths, steps and run
    dir; the checkpoint a resume continues (`resumed_at`: path, step, iteration); that the first iteration
    warms the fast paths up (the first progress line comes only after it); why a fast path does not run
    (`fallback`); the settings a resume changes on purpose."""
    steps_per_iteration = settings.batch_size * world_size
    grouped = f" in {groups} pipelined groups" if groups > 1 else ""
    paths = " with " + " and ".join(fast_paths) if fast_paths else ""
    # Whole iterations: say where the run really ends when that is past the requested count.
    past = (f" (whole iterations of {steps_per_iteration:,}: it ends at {last_step:,})"
            if last_step > settings.total_timesteps else "")
    per_worker = f" x {world_size} workers" if world_size > 1 else ""
    count = f"{num_envs} env" + "s" * (num_envs != 1)
    lines = [f"training {settings.env.id} ({settings.env.backend}, {count}{grouped}{per_worker}) "
             f"on {device}{paths} for {settings.total_timesteps:,} steps{past}; run dir {run_dir}"]
    if resumed_at:
        path, step, iteration = resumed_at
        lines.append(f"resumed from {path} at step {step:,} (iteration {iteration})")
    warmed = [path for path in fast_paths if path != "TF32 matrix products"]  # the rest need a first iteration
    if warmed:
        # As measured. On CUDA the first update (a real update, torch.compile's and the graph's capture) took
        # 3.9-5.2 s in Ant's runs on an H100 host with torch's cache filled by a run of the same preset; with the
        # loss compiled afresh 8.9 s (Ant), 17 s (Humanoid-v5, 65,536 worlds). A CPU compile's time follows its cores.
        takes = ("the first update takes ~5 s on an H100 host once torch's cache holds it, ~20 s before"
                 if device.type == "cuda"
                 else "torch.compile takes ~25 s on a 2-core CPU, about a minute on the slow cores of a 16-core "
                      "GPU host; seconds once cached")
        compile_time = f" ({takes})" if "compiled update" in fast_paths else ""
        lines.append(f"the first iteration also warms up the {' and '.join(warmed)} (one-off){compile_time}")
    if fallback:
        lines.append(fallback)
    if changed:
        lines.append("resumed with settings changed on purpose: " + ", ".join(
            f"{key} {run_records.command_value(old)} -> {run_records.command_value(new)}" for key, old, new in changed))
    return lines


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_video_recorder(settings: TrainSettings, run_dir: str) -> VideoRecorder:
    """The recorder of `video.every`; a machine that cannot render or write MP4 refuses the run before it
    trains (ConfigError), with what to install."""
    video = settings.video
    try:
        return VideoRecorder(run_dir, video.width, video.height, video.max_steps, settings.seed)
    except VideoError as error:
        raise ConfigError(f"video.every={video.every}: {error}") from error


def synchronized_seconds(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def describe_os_error(error: OSError) -> str:
    """`No space left on device (writing <file>)`: the system's reason and the file, in one line."""
    where = f" (writing {error.filename})" if error.filename else ""
    return f"{error.strerror or error}{where}"
