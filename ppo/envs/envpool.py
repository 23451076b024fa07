"""`env.backend=envpool`: envpool's C++ thread pool (Linux x86-64 wheels), its MuJoCo and DeepMind Control
tasks among others. `send` returns at once and the threads simulate until `recv`."""

from __future__ import annotations

import contextlib
import io
import os
import warnings

import numpy as np
import torch

from ppo import distributed
from ppo.config import ConfigError, EnvSettings
from ppo.envs.interface import NumpyVecEnv, VecEnv, check_spaces


def known_ids(settings: EnvSettings, option: str) -> set[str]:
    """The ids envpool can make; a ConfigError where it is not installed (else every id would read as unknown)."""
    try:
        return set(import_envpool().list_all_envs())
    except ImportError as error:
        raise ConfigError(f"{option}envpool, but envpool does not import here ({error}); it has wheels for "
                          f"Linux x86-64 only: pip install envpool, or add {option}gymnasium") from error


def check(settings: EnvSettings, option: str) -> None:
    """envpool describes a task's spaces without starting it: a task PPO here cannot train (CartPole's
    Discrete actions) is refused now, and a sweep over it before its first job."""
    check_spaces(settings.id, *spaces(settings))


def spaces(settings: EnvSettings) -> tuple[object, object]:
    spec = import_envpool().make_spec(settings.id)  # about 0.1 ms; starts no simulator
    # The gymnasium_* spaces: envpool 0.8.4's plain ones are the old gym's, which are no gymnasium Box.
    with envpool_bounds_quiet():
        return spec.gymnasium_observation_space, spec.gymnasium_action_space


def version() -> str:
    """e.g. "envpool 1.2.5, MuJoCo 3.6.0": envpool carries its own MuJoCo inside its extension, whatever
    `mujoco` package is installed beside it (4.0.0 on both hosts), so the version is asked of the
    extension itself."""
    envpool = import_envpool()
    name = f"envpool {envpool.__version__}"
    mujoco = _envpool_mujoco_version(os.path.dirname(envpool.__file__))
    return f"{name}, MuJoCo {mujoco}" if mujoco else name


def make(settings: EnvSettings, device: torch.device, seed: int, first_cpu: int) -> VecEnv:
    return EnvpoolEnvs(settings, device, seed, first_cpu)


@contextlib.contextmanager
def envpool_bounds_quiet():
    """Around reading envpool's spaces: it states some tasks' observation bounds (Pendulum-v1's) in float64
    and builds float32 Boxes from them, and gymnasium warns, for low and high, that the cast lowers
    precision (four lines on every run). Nothing here reads bounds at more than float32."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*Box (low|high)'s precision lowered", UserWarning)
        yield


def import_envpool():
    """`import envpool`, quietly: envpool 0.8.4 (the last release for Python 3.10) imports the old
    `gym`, which prints a four-line notice about itself to stderr on import. Nothing here uses gym,
    and the notice would push a run's one-line errors down. Import errors still raise."""
    with contextlib.redirect_stderr(io.StringIO()):
        import envpool
    return envpool


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


def envpool_threads(settings: EnvSettings) -> int:
    """`env.num_threads` resolved: 0 means one thread per env, up to the CPU count."""
    return settings.num_threads or min(settings.num_envs, os.cpu_count() or 1)


def pins_threads(settings: EnvSettings, device: torch.device) -> bool:
    """`env.pin_threads` resolved. Pinned, each envpool worker thread keeps one CPU.

    `auto` pins on a CPU run whose envpool threads number the machine's CPUs, all of them usable by
    this one process. There the training loop's own work lands on a core a worker also needs: on the
    2-core machine, ~0.9 ms of busy work between steps slowed unpinned steps by 14-18%, pinned ones
    by 0-14%, and pinned stepping was faster to begin with. Not where several
    runs or workers share the machine (threads fewer than CPUs, a restricted CPU set, data-parallel
    workers): envpool pins thread i to CPU i in every process, which would stack their threads on
    the same cores. Not on a GPU run, where it made no difference on a 16-core H200 host."""
    if settings.pin_threads != "auto":
        return bool(settings.pin_threads)
    if settings.backend != "envpool" or device.type != "cpu" or distributed.active():
        return False
    cpus = os.cpu_count() or 1
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(cpus))
    return usable == set(range(cpus)) and envpool_threads(settings) == cpus


class EnvpoolEnvs(NumpyVecEnv):
    """`first_cpu` >= 0 pins worker thread i to CPU `first_cpu + i` (modulo the CPU count); -1 leaves
    them to the OS."""

    def __init__(self, settings: EnvSettings, device: torch.device, seed: int, first_cpu: int = -1):
        envpool = import_envpool()
        if envpool.__version__.startswith("0.") and not np.__version__.startswith("1."):
            # Built against numpy 1, envpool 0.8.4 hands back wrong env ids beside numpy 2 (all 0).
            raise ConfigError(f"envpool {envpool.__version__} needs numpy < 2 (here {np.__version__}): "
                              "pip install 'numpy<2', or use Python >= 3.11 and envpool >= 1.2.5")
        # envpool takes int32 seeds; a run's (its seed + the iteration it resumes at + a worker's offset,
        # plus a group's first env) may pass 2**31 - 1. Seeds below that are passed as they are.
        env = envpool.make(settings.id, env_type="gymnasium", num_envs=settings.num_envs, seed=seed % 2**31,
                           num_threads=envpool_threads(settings), thread_affinity_offset=first_cpu)
        with envpool_bounds_quiet():
            spaces = env.observation_space, env.action_space
        super().__init__(env, settings.id, settings.num_envs, *spaces, device)
        self._env_ids = np.arange(settings.num_envs, dtype=np.int32)

    def send(self, actions: torch.Tensor) -> None:
        super().send(actions)
        self.env.send(self._actions, self._env_ids)  # returns at once: the threads simulate meanwhile

    def _step_results(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        obs, rewards, terminateds, truncateds, info = self.env.recv()
        if not np.array_equal(info["env_id"], self._env_ids):  # a whole-pool batch comes back in env order
            raise RuntimeError(f"envpool returned envs {info['env_id']} out of order")
        return obs, rewards, terminateds, truncateds

    def _reset_kwargs(self, seed: int) -> dict:
        return {}  # envpool is seeded at construction; a reset restarts every episode from that stream


