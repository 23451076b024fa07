"""The interface every simulator backend speaks, and what the backends share.

A backend's envs (`VecEnv`) take and return torch tensors on the run's device, `[N, ...]` for N envs,
and reset a finished env on the *next* step (next-step autoreset): the step that ends an episode returns
its final observation, and the following step ignores its action, returns reward 0 and the first
observation of the new episode. `ppo.collect` relies on exactly this. Observations are flat
`[N, obs_dim]`: a Dict of observations (DeepMind Control's) is flattened in the order its space lists its
keys (`observation_leaves`), and `obs_layout` records that order for checkpoints.
"""

from __future__ import annotations

import sys
from typing import Protocol

import numpy as np
import torch

from ppo.config import ConfigError


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
    images = next((f"{leaf} at {'/'.join(path)}" if path else str(leaf) for path, leaf in leaves
                   if len(leaf.shape) == 3 or (len(leaf.shape) == 2 and leaf.dtype == np.uint8)), None)
    if images:
        raise ConfigError(f"{env_id} observes images ({images}): the agent is an MLP over vectors of numbers, and "
                          "pixels need a convolutional encoder it does not have")


def import_task_module(env_id: str, option: str = "env.id=") -> str:
    """For an id of the form `module:Id` (gymnasium's, for a task its module registers on import), import the
    module and return `Id`; a ConfigError in one line where the module does not import. Other ids as given."""
    module, colon, name = env_id.rpartition(":")
    if not colon:
        return env_id
    import importlib

    try:
        importlib.import_module(module)
    except Exception as error:  # a user's module may raise anything while it imports
        detail = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(f"{option}{env_id}: its module {module!r} does not import ({type(error).__name__}: "
                          f"{detail}); is it on PYTHONPATH?") from error
    return name


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


class NumpyVecEnv:
    """The plumbing every simulator with a gymnasium-API vector env (`self.env`) shares: numpy in and out
    of the simulator, torch on the run's device. envpool's and gymnasium's backends build on it."""

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
