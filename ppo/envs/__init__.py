"""The simulators, each behind one interface (`ppo.envs.interface.VecEnv`: torch tensors on the run's device,
next-step autoreset, the observation layout a checkpoint records). One module per backend:

    envpool      envpool's C++ thread pool (Linux x86-64)
    gymnasium    gymnasium's vector envs, anywhere
    mjwarp       thousands of MuJoCo Warp worlds on the run's device (its tasks: mjwarp_tasks)

Each backend module has the same functions: `known_ids(settings, option)` (the ids it can make, or a
ConfigError where it cannot run here), `check(settings, option)` (what it checks of a known id before
anything starts), `spaces(settings)`, `version()` and `make(settings, device, seed, first_cpu)`, and may
say `unknown_id(...)` in its own words. `BACKENDS` lists them; the functions here pick one by
`env.backend`. A new simulator is one module here and one line in `BACKENDS`; code outside this package
imports from `ppo.envs` alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from types import ModuleType

import numpy as np
import torch

from ppo.config import ConfigError, EnvSettings
from ppo.envs.envpool import EnvpoolEnvs, envpool_threads, import_envpool, pins_threads
from ppo.envs.interface import (
    EnvGroups,
    NumpyVecEnv,
    StepOutputs,
    VecEnv,
    action_bounds,
    check_spaces,
    leaf_at,
    member_columns,
    observation_layout,
    observation_leaves,
    observation_size,
    print_mujoco_warnings_once,
)

BACKENDS = {"envpool": "ppo.envs.envpool", "gymnasium": "ppo.envs.gymnasium", "mjwarp": "ppo.envs.mjwarp"}

__all__ = ["BACKENDS", "EnvGroups", "EnvpoolEnvs", "NumpyVecEnv", "StepOutputs", "VecEnv", "action_bounds",
           "backend", "check_env_id", "check_spaces", "env_groups", "envpool_threads", "import_envpool", "leaf_at",
           "make_envs", "member_columns", "observation_action_size", "observation_layout", "observation_leaves",
           "observation_size", "pins_threads", "print_mujoco_warnings_once", "simulator_version", "task_spaces"]


def backend(name: str) -> ModuleType:
    """The module of backend `name` (imported on first use: MuJoCo Warp's only where a run asks for it)."""
    if name not in BACKENDS:
        raise ConfigError(f"`env.backend` must be {', '.join(BACKENDS)} or auto, got {name!r}")
    return importlib.import_module(BACKENDS[name])


def check_env_id(settings: EnvSettings, option: str = "env.backend=") -> None:
    """Raise ConfigError, in one line naming the closest known ids and the backends that have the id, if the
    backend cannot run `settings.id` here: an id it does not know, a backend that is not installed, a task
    whose spaces or packages it can tell are wrong before anything starts. `option`: how the caller's user
    picks a backend (train.py's `env.backend=`, evaluate.py's `--backend `)."""
    module = backend(settings.backend)
    known = module.known_ids(settings, option)
    if settings.id not in known:
        elsewhere = [name for name in BACKENDS if name != settings.backend and _knows(name, settings)]
        if hasattr(module, "unknown_id"):
            raise ConfigError(module.unknown_id(settings, known, option, elsewhere))
        hint = "".join(f"; {name} has it: add {option}{name}" for name in elsewhere)
        close = difflib.get_close_matches(settings.id, sorted(known), n=4, cutoff=0.5)
        suggestion = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown environment id {settings.id!r} for {option}{settings.backend}{hint}.{suggestion}")
    module.check(settings, option)


def _knows(name: str, settings: EnvSettings) -> bool:
    """Whether backend `name` has the id too (for the hint); False where it cannot run here."""
    try:
        return settings.id in backend(name).known_ids(dataclasses.replace(settings, backend=name), "")
    except ConfigError:
        return False


def task_spaces(settings: EnvSettings) -> tuple[object, object]:
    """`(observation_space, action_space)` of `settings.id` on `settings.backend` (call `check_env_id`
    first), without stepping it."""
    return backend(settings.backend).spaces(settings)


def observation_action_size(settings: EnvSettings) -> int:
    """How many numbers one observation and one action of the task hold (`task_spaces`)."""
    observation_space, action_space = task_spaces(settings)
    return observation_size(observation_space) + int(np.prod(action_space.shape))


def simulator_version(name: str) -> str:
    """The simulator build a run used, e.g. "envpool 1.2.5, MuJoCo 3.6.0", for run_info.json. Recorded
    because results depend on it: PPO's Ant-v4 scores differ between envpool 1.2.5 (MuJoCo 3.6.0) and 1.2.7
    (MuJoCo 3.11.0) (docs/results.md)."""
    return backend(name).version()


def env_groups(settings: EnvSettings, device: torch.device) -> int:
    """`env.groups` as a count. `auto` is 2 on CUDA where the envs split evenly: on an H200 host
    two pipelined groups trained Ant-v4 4-7% faster than one lockstep simulator; on the 2-core CPU
    machine they measured the same, with no core to spare for the overlap, so CPU runs keep one
    simulator. A simulator that runs on the device itself (MuJoCo Warp) has nothing to overlap."""
    if settings.groups != "auto":
        return settings.groups
    if getattr(backend(settings.backend), "SIMULATES_ON_THE_DEVICE", False):
        return 1
    return 2 if device.type == "cuda" and settings.num_envs % 2 == 0 else 1


def make_envs(settings: EnvSettings, device: torch.device, seed: int) -> VecEnv:
    """Start `settings.num_envs` environments of `settings.id` (call `check_env_id` first), as
    `env_groups(settings, device)` simulators; pinned (`pins_threads`), simulator g's threads take
    the CPUs after those of the simulators before it."""
    make = backend(settings.backend).make
    groups = env_groups(settings, device)
    pinned = pins_threads(settings, device)
    if groups == 1:
        return make(settings, device, seed, 0 if pinned else -1)
    size = settings.num_envs // groups
    threads = max(1, envpool_threads(settings) // groups)
    member = dataclasses.replace(settings, num_envs=size, groups=1, num_threads=threads)
    return EnvGroups([make(member, device, seed + g * size, g * threads if pinned else -1) for g in range(groups)])
