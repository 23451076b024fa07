"""MuJoCo Warp tasks: the public API a task is written in, and gymnasium's MuJoCo locomotion tasks in it.

A task says, as batched torch code over the worlds' state, what gymnasium's `MujocoEnv` subclasses say
per env: its MJCF model and `frame_skip`, how a world's state is reset, what a policy observes, the reward
terms, when an episode terminates, and its time limit. `register` makes it a task of `env.backend=mjwarp`
under an id; `python train.py env.backend=mjwarp env.id=mypkg.tasks:MyTask-v0` imports `mypkg.tasks` (which
registers `MyTask-v0`) and trains it. docs/your-own-task.md walks through one; examples/mjwarp_swimmer.py
is gymnasium's Swimmer-v5 written this way, held to gymnasium's env by tests/test_mjwarp.py as the
built-in tasks below are.

The state a task reads (`State`) holds torch views of MuJoCo Warp's arrays, `[W, ...]` for W worlds,
float32, on the run's device: `qpos [W, nq]`, `qvel [W, nv]`, `ctrl [W, nu]`, `xpos [W, nbody, 3]`,
`xipos [W, nbody, 3]`, `cinert [W, nbody, 10]`, `cvel [W, nbody, 6]`, `qfrc_actuator [W, nv]`,
`cfrc_ext [W, nbody, 6]` (with `needs_contact_forces`), and `body_mass [nbody]`. They are read after the
step's `frame_skip` physics steps; the task's functions must not write them.

The built-in tasks are gymnasium 1.x's own (`gymnasium/envs/mujoco/<task>_v4.py`, `_v5.py`): their model
XML from the installed package, `frame_skip`, observation, every reward term, healthy rule, reset noise and
time limit, with their default keyword arguments. The differences between v4 and v5 that matter here: v4's
healthy reward is paid on the step that terminates too (`float(is_healthy or terminate_when_unhealthy)`),
v5's only while healthy; v5's Ant observes its contact forces and pays for them, v5's Humanoid drops the
world body's rows from its observation and pays for contact; v5's Walker2d has its own XML (both feet with
friction 1.9).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from ppo.config import ConfigError

State = SimpleNamespace  # torch views of MuJoCo Warp's arrays (see above)
RESET_NOISES = ("uniform", "uniform_normal")


@dataclass(frozen=True)
class Task:
    """One MuJoCo Warp task; each function takes the worlds' `State` and returns `[W]` or `[W, k]` tensors."""

    model: str | Path  # the MJCF file (an absolute path; `gymnasium_asset(name)` for gymnasium's)
    frame_skip: int  # physics steps per env step
    # A reset sets qpos0 + U(-scale, scale) and qvel + U(-scale, scale) ("uniform"), or qvel + scale * N(0, 1)
    # ("uniform_normal"), as gymnasium's reset_model does; scale 0 resets to qpos0 and rest exactly.
    reset_noise: str
    reset_noise_scale: float
    # [W, k]: the position whose change over a step is the forward velocity (gymnasium's "before"/"after")
    position: Callable[[State], torch.Tensor]
    # (state, action [W, nu], position before the step, dt) -> {reward term name: [W]}; the reward is their sum
    rewards: Callable[[State, torch.Tensor, torch.Tensor, float], dict[str, torch.Tensor]]
    terminated: Callable[[State], torch.Tensor]  # [W] bool
    observe: Callable[[State], torch.Tensor]  # [W, obs_dim] float32
    # Observation parts a reset does not leave in MuJoCo Warp's state as gymnasium's does: gymnasium resets
    # with mj_resetData + mj_forward, which leaves cfrc_ext and qfrc_actuator zero (ctrl is 0, and
    # cfrc_ext is computed only by the mj_rnePostConstraint after a step). Columns to zero at a reset.
    zero_at_reset: Callable[[int], slice | None] = lambda obs_dim: None
    needs_contact_forces: bool = False  # run rne_postconstraint after the step (cfrc_ext)
    needs_kinematics_at_reset: bool = False  # observation or position read xpos/xipos/cinert/cvel
    newton_solver: bool = False  # the XML asks for PGS, which MuJoCo Warp does not have: solve with Newton
    max_episode_steps: int = 1000  # the time limit: a truncation after this many steps

    def __post_init__(self):
        if self.reset_noise not in RESET_NOISES:
            raise ConfigError(f"Task.reset_noise must be one of {', '.join(RESET_NOISES)}, got {self.reset_noise!r}")
        for name, value in (("frame_skip", self.frame_skip), ("max_episode_steps", self.max_episode_steps)):
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"Task.{name} must be a positive integer, got {value!r}")
        if not self.reset_noise_scale >= 0:
            raise ConfigError(f"Task.reset_noise_scale must be 0 or more, got {self.reset_noise_scale!r}")


TASKS: dict[str, Callable[[], Task]] = {}  # by id: the function that builds the task


def register(task_id: str, make: Callable[[], Task]) -> None:
    """Make `make()`'s task a task of `env.backend=mjwarp` under `task_id` (e.g. "MyTask-v0"). Registering an
    id again with another function is an error (two modules would fight over it)."""
    if TASKS.get(task_id, make) is not make:
        raise ConfigError(f"a MuJoCo Warp task {task_id!r} is registered already")
    TASKS[task_id] = make


def gymnasium_asset(name: str) -> Path:
    """The path of one of gymnasium's MuJoCo model files (e.g. "ant.xml"), in the installed gymnasium."""
    import gymnasium

    return Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / name


def _sq(x: torch.Tensor) -> torch.Tensor:
    return x.square().sum(dim=-1)


def _all_finite(s: State) -> torch.Tensor:
    return torch.isfinite(s.qpos).all(dim=-1) & torch.isfinite(s.qvel).all(dim=-1)


def _survive(healthy: torch.Tensor, weight: float, v4: bool) -> torch.Tensor:
    # v4: float(is_healthy or terminate_when_unhealthy) * weight, and terminate_when_unhealthy is True
    return torch.full_like(healthy, weight, dtype=torch.float32) if v4 else healthy.float() * weight


def _velocity(after: torch.Tensor, before: torch.Tensor, dt: float) -> torch.Tensor:
    return (after[:, 0] - before[:, 0]) / dt


# Ant: torso (body 1) xy from xpos; healthy: state finite and 0.2 <= z <= 1.0.
def _ant_healthy(s: State) -> torch.Tensor:
    z = s.qpos[:, 2]
    return _all_finite(s) & (z >= 0.2) & (z <= 1.0)


def _ant(v4: bool) -> Task:
    def contact_forces(s):
        return s.cfrc_ext.clamp(-1.0, 1.0)

    def rewards(s, action, before, dt):
        terms = {"reward_forward": _velocity(s.xpos[:, 1, :2], before, dt),
                 "reward_ctrl": -0.5 * _sq(action),
                 "reward_survive": _survive(_ant_healthy(s), 1.0, v4)}
        if not v4:
            terms["reward_contact"] = -5e-4 * _sq(contact_forces(s).flatten(1))
        return terms

    def observe(s):
        parts = [s.qpos[:, 2:], s.qvel]
        if not v4:
            parts.append(contact_forces(s)[:, 1:].flatten(1))
        return torch.cat(parts, dim=1)

    nq_nv = 13 + 14  # the observation's qpos[2:] and qvel: the contact forces follow
    return Task(gymnasium_asset("ant.xml"), 5, "uniform_normal", 0.1, lambda s: s.xpos[:, 1, :2], rewards,
                lambda s: ~_ant_healthy(s), observe,
                zero_at_reset=(lambda obs_dim: None) if v4 else (lambda obs_dim: slice(nq_nv, obs_dim)),
                needs_contact_forces=not v4, needs_kinematics_at_reset=True)


def _half_cheetah() -> Task:
    def rewards(s, action, before, dt):
        return {"reward_forward": _velocity(s.qpos[:, :1], before, dt), "reward_ctrl": -0.1 * _sq(action)}

    return Task(gymnasium_asset("half_cheetah.xml"), 5, "uniform_normal", 0.1, lambda s: s.qpos[:, :1], rewards,
                lambda s: torch.zeros_like(s.qpos[:, 0], dtype=torch.bool),
                lambda s: torch.cat([s.qpos[:, 1:], s.qvel], dim=1))


def _planar_walker(xml: str, healthy: Callable[[State], torch.Tensor], v4: bool) -> Task:
    """Hopper and Walker2d: x from qpos[0], observation qpos[1:] and qvel clipped to [-10, 10]."""
    def rewards(s, action, before, dt):
        return {"reward_forward": _velocity(s.qpos[:, :1], before, dt), "reward_ctrl": -1e-3 * _sq(action),
                "reward_survive": _survive(healthy(s), 1.0, v4)}

    return Task(gymnasium_asset(xml), 4, "uniform", 5e-3, lambda s: s.qpos[:, :1], rewards, lambda s: ~healthy(s),
                lambda s: torch.cat([s.qpos[:, 1:], s.qvel.clamp(-10.0, 10.0)], dim=1))


def _hopper_healthy(s: State) -> torch.Tensor:
    z, angle = s.qpos[:, 1], s.qpos[:, 2]
    state = torch.cat([s.qpos, s.qvel], dim=1)[:, 2:]
    return (((state > -100.0) & (state < 100.0)).all(dim=1) & (z > 0.7) & (z < math.inf)
            & (angle > -0.2) & (angle < 0.2))


def _walker_healthy(s: State) -> torch.Tensor:
    z, angle = s.qpos[:, 1], s.qpos[:, 2]
    return (z > 0.8) & (z < 2.0) & (angle > -1.0) & (angle < 1.0)


def _humanoid(v4: bool) -> Task:
    def healthy(s):
        return (s.qpos[:, 2] > 1.0) & (s.qpos[:, 2] < 2.0)

    def mass_center(s):
        return (s.body_mass[:, None] * s.xipos).sum(dim=1)[:, :2] / s.body_mass.sum()

    def rewards(s, action, before, dt):
        terms = {"reward_forward": 1.25 * _velocity(mass_center(s), before, dt),
                 "reward_ctrl": -0.1 * _sq(s.ctrl),
                 "reward_survive": _survive(healthy(s), 5.0, v4)}
        if not v4:
            terms["reward_contact"] = -(5e-7 * _sq(s.cfrc_ext.flatten(1))).clamp(max=10.0)
        return terms

    first = 0 if v4 else 1  # v5 leaves out the world body's rows and the free joint's actuator forces

    def observe(s):
        return torch.cat([s.qpos[:, 2:], s.qvel, s.cinert[:, first:].flatten(1), s.cvel[:, first:].flatten(1),
                          s.qfrc_actuator[:, 6 * first:], s.cfrc_ext[:, first:].flatten(1)], dim=1)

    nbody, nv = 14, 23
    actuator_start = 22 + nv + (nbody - first) * 16  # after qpos[2:], qvel, cinert (10) and cvel (6)
    return Task(gymnasium_asset("humanoid.xml"), 5, "uniform", 1e-2, mass_center, rewards, lambda s: ~healthy(s),
                observe, zero_at_reset=lambda obs_dim: slice(actuator_start, obs_dim), needs_contact_forces=True,
                needs_kinematics_at_reset=True, newton_solver=True)


def _inverted_pendulum(v4: bool) -> Task:
    def observe(s):
        return torch.cat([s.qpos, s.qvel], dim=1)

    def ended(s):
        obs = observe(s)
        return ~torch.isfinite(obs).all(dim=1) | (obs[:, 1].abs() > 0.2)

    def rewards(s, action, before, dt):
        return {"reward_survive": torch.ones_like(s.qpos[:, 0]) if v4 else (~ended(s)).float()}

    return Task(gymnasium_asset("inverted_pendulum.xml"), 2, "uniform", 0.01, lambda s: s.qpos[:, :1], rewards, ended,
                observe)


for task_id, make in {
    "Ant-v4": lambda: _ant(v4=True),
    "Ant-v5": lambda: _ant(v4=False),
    "HalfCheetah-v4": _half_cheetah,
    "HalfCheetah-v5": _half_cheetah,
    "Hopper-v4": lambda: _planar_walker("hopper.xml", _hopper_healthy, v4=True),
    "Hopper-v5": lambda: _planar_walker("hopper.xml", _hopper_healthy, v4=False),
    "Walker2d-v4": lambda: _planar_walker("walker2d.xml", _walker_healthy, v4=True),
    "Walker2d-v5": lambda: _planar_walker("walker2d_v5.xml", _walker_healthy, v4=False),
    "Humanoid-v4": lambda: _humanoid(v4=True),
    "Humanoid-v5": lambda: _humanoid(v4=False),
    "InvertedPendulum-v4": lambda: _inverted_pendulum(v4=True),
    "InvertedPendulum-v5": lambda: _inverted_pendulum(v4=False),
}.items():
    register(task_id, make)
