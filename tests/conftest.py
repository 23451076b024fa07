"""Test setup: without a GPU, Triton kernels run under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, first.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
    tasks, 1.2.7 (the H200 host's) has only gymnasium's MuJoCo ones."""
    envpool = pytest.importorskip("envpool")
    if "CheetahRun-v1" not in envpool.list_all_envs():
        pytest.skip("this envpool build has no DeepMind Control tasks")
    return "CheetahRun-v1"
