"""Checkpoints: written durably, restored exactly, and a resume is the run it continues."""

import os
import random

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo.run.checkpoint
from ppo.agent import Agent
from ppo.config import settings_from_dict
from ppo.normalize import ObservationNormalizer, RewardScaler, ValueNormalizer
from ppo.run.checkpoint import load_checkpoint, restore_training_state, save_checkpoint, training_state
from ppo.update import make_optimizer, ppo_update
from tests.conftest import filled_buffer
from tests.toy_env import TOY_ID, register_toy_envs

CPU = torch.device("cpu")


def test_checkpoints_are_flushed_to_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ppo.run.checkpoint.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
                        or real_fsync(fd))
    path = save_checkpoint(tmp_path, {"x": torch.zeros(3)})
    assert synced == [str(path.with_suffix(".tmp")), str(path.parent)]
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.zeros(3))


def fresh_run_state(seed: int):
    """A run's parts after a few updates: settings, agent, optimiser, normalisers and generator."""
    settings = settings_from_dict({"ppo": {"num_minibatches": 4, "update_epochs": 2, "normalize_values": True}})
    torch.manual_seed(seed)
    values = ValueNormalizer(CPU)
    agent = Agent(5, 2, value_normalizer=values)
    optimizer = make_optimizer(agent, settings.ppo, CPU, graphs=False)
    normalizers = {"obs_normalizer": ObservationNormalizer(5, CPU), "reward_scaler": RewardScaler(16, 0.99, CPU),
                   "value_normalizer": values}
    generator = torch.Generator().manual_seed(seed)
    return settings, agent, optimizer, normalizers, generator


def draws(generator: torch.Generator) -> list:
    """The next numbers of every random stream a run uses."""
    return [torch.rand(3, generator=generator), torch.rand(3), np.random.rand(3), random.random()]


def test_a_restored_run_is_the_saved_one_in_every_part_its_random_streams_included(tmp_path):
    settings, agent, optimizer, normalizers, generator = fresh_run_state(0)
    for seed in range(2):
        buffer = filled_buffer(seed)
        normalizers["obs_normalizer"](buffer.observations.reshape(-1, 5))
        normalizers["reward_scaler"](buffer.rewards[0], buffer.terminateds[0])
        normalizers["value_normalizer"].update(buffer.returns, buffer.valid)
        ppo_update(agent, optimizer, buffer, settings.ppo, generator)
    torch.manual_seed(11), np.random.seed(12), random.seed(13)
    path = save_checkpoint(tmp_path, training_state(settings, 2, 256, agent, optimizer, normalizers, generator,
                                                    [["", [5]]], [(4.0, 1.5)]))
    expected = draws(generator)
    saved = load_checkpoint(path, CPU)

    _, agent2, optimizer2, normalizers2, generator2 = fresh_run_state(1)  # other weights, other streams
    np.random.seed(99), random.seed(99)
    restore_training_state(saved, agent2, optimizer2, normalizers2, generator2)
    again = training_state(settings, 2, 256, agent2, optimizer2, normalizers2, generator2, [["", [5]]], [(4.0, 1.5)])
    for key in ("agent", "obs_normalizer", "reward_scaler", "value_normalizer"):
        assert saved[key].keys() == again[key].keys()
        assert all(torch.equal(saved[key][name], again[key][name]) for name in saved[key]), key
    for state, restored in zip(saved["optimizer"]["state"].values(), again["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(state[name], restored[name]) for name in state)
    assert saved["recent_episodes"] == [[4.0, 1.5]]
    for got, want in zip(draws(generator2), expected, strict=True):  # every stream continues where it stood
        assert np.array_equal(np.asarray(got), np.asarray(want))


def scalars(run_dir) -> dict[str, dict[int, float]]:
    """Every scalar of the run's TensorBoard files but its timings and rates, by tag and step."""
    found: dict[str, dict[int, float]] = {}
    for file in sorted(run_dir.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            if not tag.startswith(("time/", "charts/SPS")):
                found.setdefault(tag, {}).update({e.step: e.value for e in events.Scalars(tag)})
    return found


def test_a_run_stopped_and_resumed_is_the_uninterrupted_run_bit_for_bit(tmp_path, monkeypatch):
    # On a task whose episodes restart at the resume point (the toy chain's 7-step cycle: episodes of 2
    # and 3 steps and their dummies; 7-step rollouts end on its boundary), nothing tells a resumed run from
    # the uninterrupted one: weights, Adam's state, every normaliser, every random stream, every logged
    # number and the final score. Simulators that cannot be saved (envpool's, MuJoCo's) restart their
    # episodes elsewhere; there the resumed run goes on from the same state into other episodes.
    from ppo import trainer

    register_toy_envs()

    def settings(total: int, resume: str | None = None):
        return settings_from_dict({
            "total_timesteps": total, "device": "cpu", "seed": 5, "resume": resume, "checkpoint": {"every": 0},
            "env": {"id": TOY_ID, "num_envs": 3, "backend": "gymnasium"},
            "ppo": {"num_steps": 7, "num_minibatches": 3, "update_epochs": 2, "normalize_values": True,
                    "ent_coef": 0.01}})

    class StoppedAfterThreeIterations(trainer.StopOnSignal):
        """As a SIGTERM during the third iteration: the run saves after it and ends (its schedule still
        aims at the whole run's steps)."""

        def agreed(self, device) -> bool:
            self.asked = getattr(self, "asked", 0) + 1
            if self.asked == 4:
                self.requested = "SIGTERM"
            return self.requested is not None

    whole, split = tmp_path / "whole", tmp_path / "split"
    score = trainer.train(settings(6 * 21), str(whole), CPU)
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "StopOnSignal", StoppedAfterThreeIterations)
        trainer.train(settings(6 * 21), str(split), CPU)
    assert load_checkpoint(split / "checkpoints" / "last.pt", CPU)["global_step"] == 3 * 21
    resumed_score = trainer.train(settings(6 * 21, resume=str(split)), str(split), CPU)
    assert resumed_score == score
    a, b = (load_checkpoint(d / "checkpoints" / "last.pt", CPU) for d in (whole, split))
    assert (a["global_step"], a["iteration"], a["recent_episodes"]) == (b["global_step"], b["iteration"],
                                                                        b["recent_episodes"])
    for key in ("agent", "obs_normalizer", "reward_scaler", "value_normalizer"):
        assert all(torch.equal(a[key][name], b[key][name]) for name in a[key]), key
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(x[name], y[name]) for name in x)
    for key in ("generator", "torch_rng"):
        assert torch.equal(a[key], b[key])
    logged, resumed_logged = scalars(whole), scalars(split)
    assert len(list(split.glob("events.out.tfevents.*"))) == 2 and logged == resumed_logged
    assert len(logged["charts/episodic_return"]) == 6 and len(logged["losses/policy_loss"]) == 6


@pytest.mark.parametrize("resumed", [False, True])
def test_the_first_observations_of_a_resumed_run_are_normalised_not_folded_in_again(resumed):
    # The restored statistics already hold the last step's observations; a fresh run's start adds its own.
    from ppo.collect import Collector
    from ppo.config import EnvSettings
    from ppo.envs import make_envs
    from tests.test_collect import KnownPolicy

    register_toy_envs()
    envs = make_envs(EnvSettings(id=TOY_ID, num_envs=2, backend="gymnasium"), CPU, seed=0)
    normalizer = ObservationNormalizer(1, CPU)
    Collector(envs, KnownPolicy(), normalizer, RewardScaler(2, 0.99, CPU), CPU, seed=0, resumed=resumed)
    envs.close()
    assert normalizer.rms.count.item() == pytest.approx(1e-4 if resumed else 2 + 1e-4)
