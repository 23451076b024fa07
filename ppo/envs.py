"""Vectorised environments behind one interface that speaks torch tensors on the run's device.

Both backends reset a finished env on the *next* `step` call (next-step autoreset): the step that
ends an episode returns its final observation, and the following step ignores its action, returns
reward 0 and the first observation of the new episode. `ppo.collect` relies on exactly this.
"""

from __future__ import annotations

import difflib
import os
from typing import Protocol

import numpy as np
import torch

from ppo.config import ConfigError, EnvSettings


class VecEnv(Protocol):
    num_envs: int
    obs_dim: int
    act_dim: int
    action_low: torch.Tensor  # [act_dim], on the run's device
    action_high: torch.Tensor

    def reset(self, seed: int) -> torch.Tensor: ...

    def step(self, actions: torch.Tensor, out: tuple | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(observations [N, obs_dim] f32, rewards [N] f32, terminateds [N] bool, truncateds [N] bool)`,
        copied into the tensors of `out` when given (fixed addresses, for CUDA graphs)."""
        ...

    def close(self) -> None: ...


def check_env_id(settings: EnvSettings) -> None:
    """Raise ConfigError, naming the closest known ids, if the backend does not know `settings.id`."""
    known = _known_ids(settings.backend)
    if settings.id in known:
        return
    other = "gymnasium" if settings.backend == "envpool" else "envpool"
    hint = ""
    if settings.id in _known_ids(other):
        hint = f"; {other} has it: add env.backend={other}"
    close = difflib.get_close_matches(settings.id, sorted(known), n=4, cutoff=0.5)
    suggestion = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown environment id {settings.id!r} for env.backend={settings.backend}{hint}.{suggestion}")


def _known_ids(backend: str) -> set[str]:
    if backend == "envpool":
        try:
            import envpool
        except ImportError:
            return set()
        return set(envpool.list_all_envs())
    import gymnasium

    return set(gymnasium.registry.keys())


def simulator_version(backend: str) -> str:
    """The simulator build a run used, e.g. "envpool 1.2.5, MuJoCo 3.6.0", for run_info.json.

    Recorded because results depend on it: PPO's Ant-v4 scores differ between envpool 1.2.5
    (MuJoCo 3.6.0) and 1.2.7 (MuJoCo 3.11.0) (docs/results.md). envpool carries its own MuJoCo
    inside its extension, whatever `mujoco` package is installed beside it (4.0.0 on both hosts),
    so the version is asked of the extension itself.
    """
    if backend == "envpool":
        import envpool

        name = f"envpool {envpool.__version__}"
        mujoco = _envpool_mujoco_version(os.path.dirname(envpool.__file__))
    else:
        import gymnasium

        name = f"gymnasium {gymnasium.__version__}"
        try:
            import mujoco as mujoco_module

            mujoco = mujoco_module.mj_versionString()
        except ImportError:
            mujoco = None
    return f"{name}, MuJoCo {mujoco}" if mujoco else name


def _envpool_mujoco_version(package_dir: str) -> str | None:
    import ctypes
    import glob

    for library in glob.glob(os.path.join(package_dir, "mujoco", "mujoco_gym_envpool*.so")):
        try:
            version_string = ctypes.CDLL(library).mj_versionString
        except (OSError, AttributeError):
            continue
        version_string.restype = ctypes.c_char_p
        return version_string().decode()
    return None


def make_envs(settings: EnvSettings, device: torch.device, seed: int) -> VecEnv:
    """Start `settings.num_envs` environments of `settings.id` (call `check_env_id` first)."""
    if settings.backend == "envpool":
        return EnvpoolEnvs(settings, device, seed)
    return GymnasiumEnvs(settings, device)


class _TensorEnvs:
    """Shared plumbing around a gymnasium-API vector env (`self.env`): numpy in and out of the
    simulator, torch on the run's device."""

    def __init__(self, env, num_envs: int, observation_space, action_space, device: torch.device):
        self.env, self.num_envs, self.device = env, num_envs, device
        self.obs_dim = int(np.prod(observation_space.shape))
        self.act_dim = int(np.prod(action_space.shape))
        self.action_low = torch.as_tensor(action_space.low, dtype=torch.float32, device=device).reshape(-1)
        self.action_high = torch.as_tensor(action_space.high, dtype=torch.float32, device=device).reshape(-1)

    def reset(self, seed: int) -> torch.Tensor:
        obs, _ = self.env.reset(**self._reset_kwargs(seed))
        return self._move(obs.reshape(self.num_envs, -1), torch.float32)

    def step(self, actions: torch.Tensor, out: tuple | None = None):
        obs, rewards, terminateds, truncateds, _ = self.env.step(actions.detach().to("cpu", torch.float32).numpy())
        arrays = (obs.reshape(self.num_envs, -1), rewards, terminateds, truncateds)
        if out is not None:
            for tensor, array in zip(out, arrays, strict=True):
                tensor.copy_(torch.from_numpy(np.ascontiguousarray(array)))
            return out
        return tuple(self._move(x, dtype) for x, dtype in
                     zip(arrays, (torch.float32, torch.float32, torch.bool, torch.bool), strict=True))

    def close(self) -> None:
        self.env.close()

    def _reset_kwargs(self, seed: int) -> dict:
        return {"seed": seed}

    def _move(self, x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # No pinned staging copy: the policy consumes these on the next op of the same stream, and
        # the action hand-off already syncs every step, so an async copy would overlap nothing.
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device, dtype)


class EnvpoolEnvs(_TensorEnvs):
    def __init__(self, settings: EnvSettings, device: torch.device, seed: int):
        import envpool

        threads = settings.num_threads or min(settings.num_envs, os.cpu_count() or 1)
        env = envpool.make(settings.id, env_type="gymnasium", num_envs=settings.num_envs, seed=seed,
                           num_threads=threads)
        super().__init__(env, settings.num_envs, env.observation_space, env.action_space, device)

    def _reset_kwargs(self, seed: int) -> dict:
        return {}  # envpool is seeded at construction; a reset restarts every episode from that stream


class GymnasiumEnvs(_TensorEnvs):
    def __init__(self, settings: EnvSettings, device: torch.device):
        import gymnasium

        env = gymnasium.make_vec(
            settings.id, num_envs=settings.num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP},
        )
        super().__init__(env, settings.num_envs, env.single_observation_space, env.single_action_space, device)
