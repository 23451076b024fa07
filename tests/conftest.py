"""Test setup and the helpers tests share.

Without a GPU, Triton kernels run under Triton's CPU interpreter. TRITON_INTERPRET must be set before
triton is imported, so it is set here, first.
"""

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]  # the repository: train.py, configs/, scripts/


def compose_config(*overrides: str, return_hydra_config: bool = False):
    """configs/train.yaml composed with `overrides`, as train.py's Hydra composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=return_hydra_config)


def compose_settings(*overrides: str):
    """The `TrainSettings` train.py would build from these overrides."""
    from omegaconf import OmegaConf

    from ppo.config import settings_from_dict

    return settings_from_dict(OmegaConf.to_container(compose_config(*overrides), resolve=True))


def filled_buffer(seed: int, num_steps: int = 8, num_envs: int = 16, obs_dim: int = 5, act_dim: int = 2,
                  device: str | torch.device = "cpu", invalid_fraction: float = 0.1):
    """A `RolloutBuffer` of random contents for the update's tests: about `invalid_fraction` of the steps
    are autoreset dummies (invalid), advantages and returns are filled in as GAE would."""
    from buffers import RolloutBuffer

    g = torch.Generator().manual_seed(seed)
    buffer = RolloutBuffer(num_steps, num_envs, obs_dim, act_dim, torch.device(device))
    for name in ("observations", "actions", "values", "advantages", "returns"):
        getattr(buffer, name).copy_(torch.randn(getattr(buffer, name).shape, generator=g))
    buffer.log_probs.copy_(torch.randn(buffer.log_probs.shape, generator=g) - 2)
    buffer.valid.copy_(torch.rand(buffer.valid.shape, generator=g) >= invalid_fraction)
    return buffer


@pytest.fixture
def gae_by_reference(monkeypatch):
    """compute_gae on CPU tensors by the pure-torch reference, as outside the tests, not by the kernel
    under the interpreter. The cache of planned calls starts empty: its entries were decided without this."""
    import kernels.gae

    monkeypatch.setattr(kernels.gae, "_runs", {})
    monkeypatch.setattr(kernels.gae, "_INTERPRET", False)
    return kernels.gae


@pytest.fixture(scope="session")
def discrete_envpool_task():
    """An envpool task with Discrete actions, which PPO here refuses: CartPole-v1 where this envpool has it
    (1.2.5 does, 1.2.7 does not), else the first such task envpool lists."""
    envpool = pytest.importorskip("envpool")
    from gymnasium.spaces import Discrete

    tasks = envpool.list_all_envs()
    for task in ["CartPole-v1", "Pong-v5", *tasks]:
        if task in tasks and isinstance(envpool.make_spec(task).gymnasium_action_space, Discrete):
            return task
    pytest.skip("this envpool build has no task with Discrete actions")


@pytest.fixture(scope="session")
def deepmind_control_task():
    """CheetahRun-v1, an envpool task observing a Dict (position, velocity): 1.2.5 has DeepMind Control's
    tasks, 1.2.7 (the GPU host's, Python 3.12) has only gymnasium's MuJoCo ones."""
    envpool = pytest.importorskip("envpool")
    if "CheetahRun-v1" not in envpool.list_all_envs():
        pytest.skip("this envpool build has no DeepMind Control tasks")
    return "CheetahRun-v1"
