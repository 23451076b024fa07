"""ppo.policy: a checkpoint's policy used outside train.py, on observations as the task returns them."""

import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from ppo.config import ConfigError, ModelSettings, TrainSettings
from ppo.policy import load_policy
from tests.test_train import run_train

HOPPER = ["env=Hopper-v4", "env.num_envs=4", "ppo.num_steps=64", "ppo.num_minibatches=4", "ppo.update_epochs=2",
          "device=cpu"]


@pytest.fixture(scope="module")
def hopper_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("hopper")
    trained = run_train(*HOPPER, "total_timesteps=2048", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr
    return run_dir


def reference_actions(run_dir: Path, observations: np.ndarray) -> torch.Tensor:
    """What the checkpoint's networks say, written out from its tensors: normalise with the saved
    statistics, clip at 10, the actor's mean, clip to Hopper's [-1, 1]."""
    from ppo.agent import make_agent

    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    agent = make_agent(11, 3, ModelSettings(**{**state["settings"]["model"],
                                               "hidden_sizes": tuple(state["settings"]["model"]["hidden_sizes"])}))
    agent.load_state_dict(state["agent"])
    stats = state["obs_normalizer"]
    obs = torch.as_tensor(observations, dtype=torch.float64)
    normalised = ((obs - stats["mean"]) / torch.sqrt(stats["var"] + 1e-8)).clamp(-10, 10).float()
    with torch.no_grad():
        return agent.actor_mean(normalised).clamp(-1.0, 1.0)


def test_a_checkpoints_policy_acts_on_raw_observations_as_its_networks_say(hopper_run):
    policy = load_policy(str(hopper_run))
    assert (policy.obs_dim, policy.act_dim, policy.settings.env.id) == (11, 3, "Hopper-v4")
    observations = np.random.default_rng(0).normal(scale=2.0, size=(5, 11))
    expected = reference_actions(hopper_run, observations)
    batch = policy(observations)
    assert batch.shape == (5, 3) and batch.dtype == torch.float32
    torch.testing.assert_close(batch, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(policy(observations[2]), expected[2], rtol=1e-5, atol=1e-6)  # one observation
    torch.testing.assert_close(policy(torch.as_tensor(observations)), expected, rtol=1e-5, atol=1e-6)
    # Acting leaves the trained statistics as they were, and sampling stays within the bounds.
    count = policy.normalizer.rms.count.clone()
    torch.manual_seed(0)
    sampled = policy(observations, deterministic=False)
    assert torch.equal(policy.normalizer.rms.count, count)
    assert not torch.equal(sampled, batch) and sampled.abs().max() == 1.0  # std ~1: some draws clipped
    # The task's spaces from the other backend: the same networks.
    torch.testing.assert_close(load_policy(str(hopper_run), backend="gymnasium")(observations), expected,
                               rtol=1e-5, atol=1e-6)


def test_observations_of_the_wrong_shape_are_refused_naming_the_shape_expected(hopper_run):
    policy = load_policy(str(hopper_run))
    for shape in [(4,), (2, 3, 11), (5, 12)]:
        with pytest.raises(ValueError, match=rf"^observations: Hopper-v4 expects shape \(11,\), or \[N, \*\(11,\)\] "
                                             rf"for a batch; got {re.escape(str(shape))}$"):
            policy(np.zeros(shape))
    with pytest.raises(ValueError, match=r"^observations: Hopper-v4 expects an array of shape \(11,\), got dict$"):
        policy({"position": np.zeros(11)})
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_policy(str(hopper_run / "nowhere"))


def test_a_checkpoint_whose_observations_were_laid_out_otherwise_is_refused(hopper_run, tmp_path):
    # A checkpoint records the layout its agent saw. The same count of numbers laid out otherwise (a Dict
    # task whose keys another simulator build lists in another order) would load its weights and read
    # every feature as another: resume and load_policy refuse it in one line.
    state = torch.load(hopper_run / "checkpoints" / "last.pt", weights_only=True)
    assert state["observation_layout"] == [["", [11]]]
    moved = tmp_path / "moved.pt"
    torch.save({**state, "observation_layout": [["position", [5]], ["velocity", [6]]]}, moved)
    said = ("its agent saw observations as position (5,), velocity (6,); here they come as one array (11,): the "
            "same 11 numbers laid out otherwise, which it would read as other features")
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{moved}: {said}')}$"):
        load_policy(str(moved))
    resumed = run_train(*HOPPER, "total_timesteps=4096", f"resume={moved}", f"hydra.run.dir={tmp_path / 'resumed'}")
    assert resumed.returncode == 2 and resumed.stderr == f"error: resume={moved}: {said}\n"
    # A checkpoint written before layouts were recorded loads as it did.
    older = tmp_path / "older.pt"
    torch.save({key: value for key, value in state.items() if key != "observation_layout"}, older)
    observations = np.random.default_rng(1).normal(size=(5, 11))
    assert torch.equal(load_policy(str(older))(observations), load_policy(str(hopper_run))(observations))


def test_a_dict_tasks_policy_takes_its_observations_as_a_dict():
    # As DeepMind Control's tasks return them: a dict, here with a nested one and a scalar part, given in
    # any key order; the networks see them in the order the space lists its keys.
    from gymnasium.spaces import Box, Dict

    from ppo.agent import make_agent
    from ppo.normalize import ObservationNormalizer
    from ppo.policy import Policy

    goal = Dict(OrderedDict(kettle=Box(-1.0, 1.0, (2,)), burner=Box(-1.0, 1.0, ())))
    space = Dict(OrderedDict(velocity=Box(-9.0, 9.0, (3,)), goal=goal))
    torch.manual_seed(0)
    agent = make_agent(6, 2, ModelSettings())
    normalizer = ObservationNormalizer(6, torch.device("cpu"))
    normalizer.frozen = True
    policy = Policy(TrainSettings(), agent, normalizer, space, Box(-0.5, 0.5, (2,)), torch.device("cpu"))
    assert policy.obs_dim == 6
    rng = np.random.default_rng(1)
    batch = {"goal": {"burner": rng.normal(size=4), "kettle": rng.normal(size=(4, 2))},
             "velocity": rng.normal(size=(4, 3))}
    flat = np.concatenate([batch["velocity"], batch["goal"]["kettle"], batch["goal"]["burner"][:, None]], axis=1)
    expected = policy.act(torch.as_tensor(flat, dtype=torch.float32))
    assert torch.equal(policy(batch), expected)
    torch.manual_seed(0)
    assert policy(batch, deterministic=False).abs().max() == 0.5  # draws of std 1, clipped to the bounds
    one = {"velocity": batch["velocity"][1], "goal": {"kettle": batch["goal"]["kettle"][1],
                                                      "burner": batch["goal"]["burner"][1]}}
    torch.testing.assert_close(policy(one), expected[1])  # a batch of one: the same up to the products' rounding
    with pytest.raises(ValueError, match=r"^observations: Ant-v4 expects a dict with a part at velocity, got "
                                         r"ndarray$"):
        policy(flat)
    with pytest.raises(ValueError, match=r"^observations at goal/kettle: Ant-v4 expects shape \(2,\)"):
        policy({**one, "goal": {"kettle": np.zeros(3), "burner": 0.0}})
    with pytest.raises(ValueError, match=r"^observations: its parts disagree on the batch"):
        policy({**one, "velocity": batch["velocity"]})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_policy_loaded_onto_cuda_acts_as_on_the_cpu(hopper_run):
    observations = np.random.default_rng(2).normal(size=(7, 11))
    on_cuda = load_policy(str(hopper_run), device="cuda")(observations)
    assert on_cuda.device.type == "cuda"
    torch.testing.assert_close(on_cuda.cpu(), load_policy(str(hopper_run))(observations), rtol=1e-4, atol=1e-5)
