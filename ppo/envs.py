"""Vectorised environments behind one interface that speaks torch tensors on the run's device.

Every backend (envpool, gymnasium, and MuJoCo Warp in ppo.mjwarp) resets a finished env on the *next*
`step` call (next-step autoreset): the step that ends an episode returns its final observation, and the
following step ignores its action, returns reward 0 and the first observation of the new episode.
`ppo.collect` relies on exactly this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import sys
import warnings
from typing import Protocol

import numpy as np
import torch

from ppo import distributed
from ppo.config import ConfigError, EnvSettings


class VecEnv(Protocol):
    num_envs: int
    obs_dim: int
    obs_layout: list[list]  # observation_layout's: what a checkpoint records
    act_dim: int
    action_low: torch.Tensor  # [act_dim], on the run's device
    action_high: torch.Tensor
    # The simulators behind it, in column order: `[self]`, or an EnvGroups' groups. Each can be
    # sent actions and received from on its own, which lets the collector pipeline them.
    members: list[VecEnv]

    def reset(self, seed: int) -> torch.Tensor: ...

    def send(self, actions: torch.Tensor) -> None:
        """Start a step with `actions` `[N, act_dim]`; envpool simulates it on its threads meanwhile."""
        ...

    def recv(self, out: StepOutputs | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Wait for the step `send` started: `(observations [N, obs_dim] f32, rewards [N] f32,
        terminateds [N] bool, truncateds [N] bool)`; with `out` (from `step_outputs()`), its
        fixed tensors, refilled (for CUDA graphs, which read fixed addresses)."""
        ...

    def step_outputs(self) -> StepOutputs: ...

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`send` then `recv`."""
        ...

    def close(self) -> None: ...


def check_env_id(settings: EnvSettings, option: str = "env.backend=") -> None:
    """Raise ConfigError, naming the closest known ids, if the backend does not know `settings.id`
    (or, for envpool, is not installed: else every id would read as unknown). `option`: how the
    caller's user picks a backend (train.py's `env.backend=`, evaluate.py's `--backend `)."""
    if settings.backend == "mjwarp":
        from ppo import mjwarp

        mjwarp.check_task(settings.id)
        mjwarp.import_mujoco_warp()
        return
    try:
        known = _known_ids(settings.backend)
    except ImportError as error:  # only envpool can be missing: gymnasium is a dependency everywhere
        raise ConfigError(f"{option}envpool, but envpool does not import here ({error}); it has wheels for "
                          f"Linux x86-64 only: pip install envpool, or add {option}gymnasium") from error
    if settings.id in known:
        if settings.backend == "envpool":
            # envpool describes a task's spaces without starting it: a task PPO here cannot train (CartPole's
            # Discrete actions) is refused now, and a sweep over it before its first job. gymnasium tells
            # its spaces only once an env is made: make_envs checks them there.
            check_spaces(settings.id, *task_spaces(settings))
        else:
            _check_gymnasium_dependencies(settings.id)
        return
    other = "gymnasium" if settings.backend == "envpool" else "envpool"
    try:
        hint = f"; {other} has it: add {option}{other}" if settings.id in _known_ids(other) else ""
    except ImportError:  # no envpool here: no hint to give
        hint = ""
    close = difflib.get_close_matches(settings.id, sorted(known), n=4, cutoff=0.5)
    suggestion = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown environment id {settings.id!r} for {option}{settings.backend}{hint}.{suggestion}")


@contextlib.contextmanager
def envpool_bounds_quiet():
    """Around reading envpool's spaces: it states some tasks' observation bounds (Pendulum-v1's) in float64
    and builds float32 Boxes from them, and gymnasium warns, for low and high, that the cast lowers
    precision (four lines on every run). Nothing here reads bounds at more than float32."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*Box (low|high)'s precision lowered", UserWarning)
        yield


def _check_gymnasium_dependencies(env_id: str) -> None:
    """Import the module behind a gymnasium id, without making an env: a task whose package is missing
    (Box2D's BipedalWalker-v3) says so in one line here, rather than in a traceback from inside the run."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry_point = gymnasium.spec(env_id).entry_point
    if isinstance(entry_point, str):  # else a callable: imported already
        try:
            load_env_creator(entry_point)
        except gymnasium.error.DependencyNotInstalled as error:
            raise ConfigError(f"{env_id} needs a package that is not installed here: {error}") from error


def import_envpool():
    """`import envpool`, quietly: envpool 0.8.4 (the last release for Python 3.10) imports the old
    `gym`, which prints a four-line notice about itself to stderr on import. Nothing here uses gym,
    and the notice would push a run's one-line errors down. Import errors still raise."""
    with contextlib.redirect_stderr(io.StringIO()):
        import envpool
    return envpool


def _known_ids(backend: str) -> set[str]:
    """The ids `backend` can make; ImportError where it is not installed."""
    if backend == "envpool":
        return set(import_envpool().list_all_envs())
    import gymnasium

    return set(gymnasium.registry.keys())


def simulator_version(backend: str) -> str:
    """The simulator build a run used, e.g. "envpool 1.2.5, MuJoCo 3.6.0", for run_info.json.

    Recorded because results depend on it: PPO's Ant-v4 scores differ between envpool 1.2.5
    (MuJoCo 3.6.0) and 1.2.7 (MuJoCo 3.11.0) (docs/results.md). envpool carries its own MuJoCo
    inside its extension, whatever `mujoco` package is installed beside it (4.0.0 on both hosts),
    so the version is asked of the extension itself.
    """
    if backend == "mjwarp":
        from ppo import mjwarp

        return mjwarp.version()
    if backend == "envpool":
        envpool = import_envpool()
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


def env_groups(settings: EnvSettings, device: torch.device) -> int:
    """`env.groups` as a count. `auto` is 2 on CUDA where the envs split evenly: on an H200 host
    two pipelined groups trained Ant-v4 4-7% faster than one lockstep simulator; on the 2-core CPU
    machine they measured the same, with no core to spare for the overlap, so CPU runs keep one
    simulator."""
    if settings.groups != "auto":
        return settings.groups
    if settings.backend == "mjwarp":  # the simulator runs on the device itself: nothing to overlap
        return 1
    return 2 if device.type == "cuda" and settings.num_envs % 2 == 0 else 1


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


def make_envs(settings: EnvSettings, device: torch.device, seed: int) -> VecEnv:
    """Start `settings.num_envs` environments of `settings.id` (call `check_env_id` first), as
    `env_groups(settings, device)` simulators; pinned (`pins_threads`), simulator g's threads take
    the CPUs after those of the simulators before it."""
    groups = env_groups(settings, device)
    pinned = pins_threads(settings, device)
    if groups == 1:
        return _make_simulator(settings, device, seed, 0 if pinned else -1)
    size = settings.num_envs // groups
    threads = max(1, envpool_threads(settings) // groups)
    member = dataclasses.replace(settings, num_envs=size, groups=1, num_threads=threads)
    return EnvGroups([_make_simulator(member, device, seed + g * size, g * threads if pinned else -1)
                      for g in range(groups)])


def _make_simulator(settings: EnvSettings, device: torch.device, seed: int, first_cpu: int) -> VecEnv:
    if settings.backend == "mjwarp":
        from ppo.mjwarp import MjWarpEnvs

        return MjWarpEnvs(settings, device, seed)
    if settings.backend == "envpool":
        return EnvpoolEnvs(settings, device, seed, first_cpu)
    return GymnasiumEnvs(settings, device)


def check_spaces(env_id: str, observation_space, action_space) -> None:
    """The agent is an MLP with a Gaussian policy: it needs a 1-D Box of actions, and a Box of observations
    or a Dict of Boxes, Dicts nested in it included (DeepMind Control's, in envpool: CheetahRun-v1's
    position and velocity), which it sees flattened. Anything else (CartPole's Discrete actions, a Dict
    holding a Discrete) fails here with one line, not deep inside the first step."""
    from gymnasium.spaces import Box

    if not (isinstance(action_space, Box) and len(action_space.shape) == 1):
        raise ConfigError(f"{env_id} acts in {action_space}: PPO here trains continuous control, which needs a "
                          "1-D Box of actions (a MuJoCo task such as Ant-v4)")
    leaves = observation_leaves(observation_space)
    other = next((f"a Dict holding {leaf} at {'/'.join(path)}" if path else str(leaf)
                  for path, leaf in leaves if not isinstance(leaf, Box)), None)
    if other or not leaves:
        # A Dict's other leaf, not the whole Dict: FrankaKitchen-v1's would fill a screen.
        raise ConfigError(f"{env_id} observes {other or observation_space}: the agent's MLP needs a Box of "
                          "observations, or a Dict of Boxes")


def task_spaces(settings: EnvSettings) -> tuple[object, object]:
    """`(observation_space, action_space)` of `settings.id` on `settings.backend` (call `check_env_id`
    first), without stepping it: envpool's from its spec, gymnasium's (and MuJoCo Warp's, which runs
    gymnasium's tasks) from one gymnasium env, made and closed."""
    if settings.backend == "envpool":
        spec = import_envpool().make_spec(settings.id)  # about 0.1 ms; starts no simulator
        # The gymnasium_* spaces: envpool 0.8.4's plain ones are the old gym's, which are no gymnasium Box.
        with envpool_bounds_quiet():
            return spec.gymnasium_observation_space, spec.gymnasium_action_space
    import gymnasium

    print_mujoco_warnings_once()
    env = gymnasium.make(settings.id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def observation_action_size(settings: EnvSettings) -> int:
    """How many numbers one observation and one action of the task hold (`task_spaces`)."""
    observation_space, action_space = task_spaces(settings)
    return observation_size(observation_space) + int(np.prod(action_space.shape))


def observation_leaves(space) -> list[tuple[tuple[str, ...], object]]:
    """`(key path, space)` of each leaf of a Dict of observations, nested Dicts walked in the order their
    spaces list their keys: the order the agent sees them in, whatever order a step's dict arrives in.
    A space that is not a Dict is one leaf, at path `()`."""
    from gymnasium.spaces import Dict

    if not isinstance(space, Dict):
        return [((), space)]
    return [((key, *path), leaf) for key, part in space.spaces.items() for path, leaf in observation_leaves(part)]


def observation_layout(space) -> list[list]:
    """What a checkpoint records of the observations its agent saw: `[key path, shape]` of each leaf in
    the order the agent sees them (`observation_leaves`; the path '/'-joined, '' for a Box), in plain
    lists, which a weights-only load reads back as they were written."""
    return [["/".join(path), list(leaf.shape)] for path, leaf in observation_leaves(space)]


def observation_size(space) -> int:
    """How many numbers the agent sees of one observation of `space`: its leaves, flattened."""
    return sum(int(np.prod(leaf.shape)) for _, leaf in observation_leaves(space))


def action_bounds(action_space, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(low, high)` of a 1-D Box of actions, float32 on `device`: what actions are clipped to."""
    return tuple(torch.as_tensor(bound, dtype=torch.float32, device=device).reshape(-1)
                 for bound in (action_space.low, action_space.high))


def leaf_at(observations, path: tuple[str, ...]):
    """The part of a (nested) dict of observations at `path` from `observation_leaves`; `()`: all of them."""
    for key in path:
        observations = observations[key]
    return observations


class _TensorEnvs:
    """Shared plumbing around a gymnasium-API vector env (`self.env`): numpy in and out of the
    simulator, torch on the run's device."""

    def __init__(self, env, env_id: str, num_envs: int, observation_space, action_space, device: torch.device):
        try:
            check_spaces(env_id, observation_space, action_space)
        except ConfigError:
            env.close()
            raise
        self.env, self.num_envs, self.device = env, num_envs, device
        self.members = [self]
        self._obs_paths = [path for path, _ in observation_leaves(observation_space)]  # [()]: a Box
        self.obs_dim = observation_size(observation_space)
        self.obs_layout = observation_layout(observation_space)
        self.act_dim = int(np.prod(action_space.shape))
        self.action_low, self.action_high = action_bounds(action_space, device)

    def reset(self, seed: int) -> torch.Tensor:
        obs, _ = self.env.reset(**self._reset_kwargs(seed))
        return self._move(self._flat(obs), torch.float32)

    def step(self, actions: torch.Tensor):
        self.send(actions)
        return self.recv()

    def send(self, actions: torch.Tensor) -> None:
        # A blocking copy: it waits for the device work queued before it. StepOutputs relies on that.
        self._actions = actions.detach().to("cpu", torch.float32).numpy()  # held until recv

    def recv(self, out: StepOutputs | None = None):
        obs, rewards, terminateds, truncateds = self._step_results()
        arrays = (self._flat(obs), rewards, terminateds, truncateds)
        if out is not None:
            return out.fill(arrays)
        return tuple(self._move(x, dtype) for x, dtype in
                     zip(arrays, (torch.float32, torch.float32, torch.bool, torch.bool), strict=True))

    def step_outputs(self) -> StepOutputs:
        return StepOutputs(self.num_envs, self.obs_dim, self.device)

    def close(self) -> None:
        self.env.close()

    def _flat(self, obs) -> np.ndarray:
        """`[N, obs_dim]`: a Box's observations reshaped, a Dict's leaves concatenated (`observation_leaves`)."""
        parts = [leaf_at(obs, path).reshape(self.num_envs, -1) for path in self._obs_paths]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _step_results(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        obs, rewards, terminateds, truncateds, _ = self.env.step(self._actions)
        return obs, rewards, terminateds, truncateds

    def _reset_kwargs(self, seed: int) -> dict:
        return {"seed": seed}

    def _move(self, x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # No pinned staging copy: the policy consumes these on the next op of the same stream, and
        # the action hand-off already syncs every step, so an async copy would overlap nothing.
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device, dtype)


class EnvpoolEnvs(_TensorEnvs):
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


def print_mujoco_warnings_once() -> None:
    """Route the MuJoCo library's warnings (its Python package, which gymnasium's tasks run on) to stderr,
    each distinct text once. Its own handler prints every one to stdout and appends it to MUJOCO_LOG.TXT
    in the working directory: with MuJoCo 4, gymnasium 1.4's HalfCheetah model (`settotalmass`, now
    deprecated) printed the same warning once per env, 64 times on a default run, and left that file
    wherever the command ran. A physics warning (`Nan, Inf or huge value in QACC ...`) still shows, once.
    MuJoCo keeps one handler per process, so this one stays. envpool embeds a MuJoCo of its own, untouched here."""
    try:
        import mujoco
    except ImportError:  # gymnasium without its MuJoCo extra: tasks that need none
        return
    if mujoco.get_mju_user_warning() is _print_new_mujoco_warning:
        return
    mujoco.set_mju_user_warning(_print_new_mujoco_warning)


_mujoco_warnings_seen: set[str] = set()


def _print_new_mujoco_warning(text: str) -> None:
    if text not in _mujoco_warnings_seen:
        _mujoco_warnings_seen.add(text)
        print(f"MuJoCo warning: {text}", file=sys.stderr, flush=True)


class GymnasiumEnvs(_TensorEnvs):
    """gymnasium's synchronous vector env: `send` only stores the actions, `recv` steps them."""

    def __init__(self, settings: EnvSettings, device: torch.device):
        import gymnasium

        print_mujoco_warnings_once()
        env = gymnasium.make_vec(
            settings.id, num_envs=settings.num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP},
        )
        super().__init__(env, settings.id, settings.num_envs, env.single_observation_space, env.single_action_space,
                         device)


class StepOutputs:
    """The fixed tensors one simulator's `recv(out=...)` refills: `tensors` is `(observations
    [N, obs_dim] f32, rewards [N] f32, terminateds [N] bool, truncateds [N] bool)`, views of one
    device buffer. On CUDA they arrive as one copy from a pinned host buffer of the same layout
    instead of four blocking copies from pageable memory (~16 us each on an H200 host, twice per
    step with two env groups; all of it on the path from an observation to the next action).

    The copy is asynchronous. The host buffer is safe to refill at the next `recv` because a `send`
    comes between: its blocking copy of the actions waits for every copy queued before it."""

    def __init__(self, num_envs: int, obs_dim: int, device: torch.device):
        n = num_envs
        sizes = [4 * n * obs_dim, 4 * n, n, n]  # bytes: float32, float32, bool, bool
        self._device_bytes = torch.zeros(sum(sizes), dtype=torch.uint8, device=device)
        self._host_bytes = (torch.zeros(sum(sizes), dtype=torch.uint8, pin_memory=True)
                            if device.type == "cuda" else self._device_bytes)

        def views(data: torch.Tensor) -> tuple[torch.Tensor, ...]:
            obs, rewards, terminateds, truncateds = data.split(sizes)
            return (obs.view(torch.float32).view(n, obs_dim), rewards.view(torch.float32),
                    terminateds.view(torch.bool), truncateds.view(torch.bool))

        self.tensors = views(self._device_bytes)
        self._host_arrays = [view.numpy() for view in views(self._host_bytes)]

    def fill(self, arrays: tuple[np.ndarray, ...]) -> tuple[torch.Tensor, ...]:
        """Write one step's `(observations, rewards, terminateds, truncateds)` arrays; returns `tensors`."""
        for target, array in zip(self._host_arrays, arrays, strict=True):
            np.copyto(target, array.reshape(target.shape), casting="unsafe")  # casts as torch's copy_ would
        if self._host_bytes is not self._device_bytes:
            self._device_bytes.copy_(self._host_bytes, non_blocking=True)
        return self.tensors


def member_columns(envs: VecEnv) -> list[slice]:
    """Each of `envs.members`' envs as a slice of the whole's columns (of the buffer, of actions)."""
    sizes = [m.num_envs for m in envs.members]
    return [slice(sum(sizes[:g]), sum(sizes[:g + 1])) for g in range(len(sizes))]


class EnvGroups:
    """Several simulators seen as one VecEnv, their envs side by side in group order.

    `ppo.collect` steps the groups as a pipeline: it sends one group's actions, then, while that
    group simulates on envpool's threads, receives the next group's step and runs the policy for
    it. The simulator's hand-off and the policy's inference then hide behind simulation instead of
    stalling every env. Env i of the whole is seeded `seed + i` as in one simulator (both backends
    seed env i of a simulator with its seed + i; group g is made and reset with `seed + g * size`),
    so grouping changes when the envs step, not what they are.
    """

    def __init__(self, members: list[VecEnv]):
        self.members = members
        first = members[0]
        self.num_envs = sum(m.num_envs for m in members)
        self.obs_dim, self.obs_layout, self.act_dim = first.obs_dim, first.obs_layout, first.act_dim
        self.action_low, self.action_high = first.action_low, first.action_high
        self._columns = member_columns(self)

    def reset(self, seed: int) -> torch.Tensor:
        return torch.cat([m.reset(seed + rows.start) for m, rows in zip(self.members, self._columns, strict=True)])

    def send(self, actions: torch.Tensor) -> None:
        for m, rows in zip(self.members, self._columns, strict=True):
            m.send(actions[rows])

    def recv(self, out: StepOutputs | None = None):
        if out is not None:
            raise TypeError("EnvGroups.recv: fixed outputs belong to one simulator; receive from each of .members")
        parts = [m.recv() for m in self.members]
        return tuple(torch.cat(column) for column in zip(*parts, strict=True))

    def step_outputs(self) -> StepOutputs:
        raise TypeError("EnvGroups.step_outputs: fixed outputs belong to one simulator; ask each of .members")

    def step(self, actions: torch.Tensor):
        self.send(actions)
        return self.recv()

    def close(self) -> None:
        for m in self.members:
            m.close()
