"""`env.backend=mjwarp`: thousands of MuJoCo Warp worlds on the run's device, one per env, behind the
VecEnv interface (ppo.envs.interface), with gymnasium's task definitions (ppo.envs.mjwarp_tasks).

Observations, rewards and flags are torch tensors computed on the device from views of Warp's arrays:
no host copy per step, and nothing here waits for the device (Warp launches on torch's current CUDA
stream, and a step's simulation is captured as one Warp CUDA graph after its first call).

Autoreset stays next-step, as on envpool and gymnasium: a world that ended is reset on the following
step, which ignores its action and returns reward 0 and the new episode's first observation. So the
collector, the buffer's validity mask and their tests stay one path for every backend; the price is one
slot per episode, 0.1% at 1000-step episodes. Resetting within the step would save that slot but
needs a second observation per step (the final one, for the bootstrap value) on every backend.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import SimpleNamespace

import torch

from ppo.config import ConfigError, EnvSettings
from ppo.envs.interface import VecEnv, import_task_module, print_mujoco_warnings_once
from ppo.envs.mjwarp_tasks import TASKS, Task

EXTRA = 'pip install -e ".[mjwarp]"'
SIMULATES_ON_THE_DEVICE = True  # nothing to overlap with the policy on the host: no pipelined groups
_said: set[str] = set()


def known_ids(settings: EnvSettings, option: str) -> set[str]:
    """The registered tasks (ppo.envs.mjwarp_tasks), known without importing MuJoCo Warp: an unknown one is
    refused where it is not installed too. For a `module:Id`, the module is imported first (it registers
    `Id`), and `settings.id` itself is known where it did."""
    name = import_task_module(settings.id)
    return set(TASKS) | ({settings.id} if name in TASKS and name != settings.id else set())


def unknown_id(settings: EnvSettings, known: set[str], option: str, elsewhere: list[str]) -> str:
    mine = f"{settings.id.rpartition(':')[0]!r} imports, but " if ":" in settings.id else ""
    return (f"{option}mjwarp has no task {settings.id.rpartition(':')[2]!r} ({mine}registered: {', '.join(TASKS)}; "
            f"docs/your-own-task.md says how to add one, or use {option}envpool or gymnasium)")


def task_of(env_id: str) -> Task:
    """The task registered as `env_id` (or as the `Id` of a `module:Id`, its module imported), built; a
    ConfigError in one line where its function fails."""
    name = import_task_module(env_id)
    if name not in TASKS:
        raise ConfigError(unknown_id(EnvSettings(id=env_id, backend="mjwarp"), set(TASKS), "env.backend=", []))
    try:
        return TASKS[name]()
    except ConfigError as error:
        raise ConfigError(f"env.id={env_id}: {error}") from error
    except Exception as error:  # a user's task function may raise anything
        raise ConfigError(f"env.id={env_id}: its task does not build ({type(error).__name__}: {error})") from error


def check(settings: EnvSettings, option: str) -> None:
    """MuJoCo Warp imports here, and the task builds, its model loads and its observation has a shape
    (`spaces`): a user's task fails here in one line, before anything starts."""
    import_mujoco_warp()
    spaces(settings)


def spaces(settings: EnvSettings) -> tuple[object, object]:
    """The task's spaces, from its model and one state of it on the CPU (MuJoCo's own simulator; no world
    starts): observations a Box of the task's `observe` width, actions its actuators' control range (as
    gymnasium's MujocoEnv makes them)."""
    import mujoco
    import numpy as np
    from gymnasium.spaces import Box

    task = task_of(settings.id)
    model = load_model(task, settings.id)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)

    def view(x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=torch.float32)[None]

    state = SimpleNamespace(qpos=view(data.qpos), qvel=view(data.qvel), ctrl=view(data.ctrl), xpos=view(data.xpos),
                            xipos=view(data.xipos), cinert=view(data.cinert), cvel=view(data.cvel),
                            qfrc_actuator=view(data.qfrc_actuator), cfrc_ext=view(data.cfrc_ext),
                            body_mass=torch.as_tensor(model.body_mass, dtype=torch.float32))
    try:
        observation = task.observe(state)
        shape = tuple(observation.shape)
        if observation.dim() != 2 or shape[0] != 1 or not observation.is_floating_point():
            raise ValueError(f"it returned a {observation.dtype} tensor of shape {shape}, not [W, obs_dim] floats")
    except Exception as error:
        raise ConfigError(f"env.id={settings.id}: its task's observe fails on the model's first state "
                          f"({type(error).__name__}: {error})") from error
    low, high = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    return (Box(-np.inf, np.inf, (shape[1],), np.float32),
            Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32))


def make(settings: EnvSettings, device: torch.device, seed: int, first_cpu: int) -> VecEnv:
    return MjWarpEnvs(settings, device, seed)


def import_mujoco_warp():
    """`(warp, mujoco_warp)`, or a ConfigError naming the pip command."""
    try:
        import warp

        # Else Warp prints its banner, a line per kernel module it loads, and on a machine without a GPU
        # that it found no CUDA driver: the run says where it runs (cpu_notice).
        warp.config.log_level = warp.LOG_ERROR
        with _native_stderr_dropped():  # the CUDA driver's absence is said from C, past the log level
            warp.init()
        import mujoco_warp
    except ImportError as error:
        raise ConfigError(f"env.backend=mjwarp needs MuJoCo Warp, which does not import here ({error}): "
                          f"{EXTRA}") from error
    return warp, mujoco_warp


@contextlib.contextmanager
def _native_stderr_dropped():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_device(device: torch.device) -> None:
    """A ConfigError where MuJoCo Warp cannot run on `device`: on a CPU it needs Warp's CPU compiler
    (warp-clang), which a CUDA-only Warp install leaves out."""
    wp, _ = import_mujoco_warp()
    if device.type == "cpu" and not wp.is_cpu_available():
        raise ConfigError("env.backend=mjwarp on the CPU needs Warp's CPU compiler (warp-clang), which this "
                          "warp-lang install lacks; run it on a CUDA device, or reinstall warp-lang from PyPI")


def cpu_notice(device: torch.device) -> str | None:
    """What a run on a CPU should know, or None."""
    if device.type == "cuda":
        return None
    return ("env.backend=mjwarp on the CPU: MuJoCo Warp runs there through Warp's CPU backend, at a few "
            "hundred physics steps/s; on a machine without a CUDA GPU, env.backend=envpool is far faster")


def version() -> str:
    # From the modules, not the installed distributions' metadata: a copy of the packages put on PYTHONPATH
    # (as carried to an offline GPU host) has none.
    import mujoco
    import mujoco_warp
    import warp

    return f"mujoco-warp {mujoco_warp.__version__}, warp-lang {warp.__version__}, MuJoCo {mujoco.__version__}"


def load_model(task: Task, env_id: str = "the task"):
    """The task's MjModel, compiled from its MJCF file; a ConfigError in one line where it does not load."""
    import mujoco

    print_mujoco_warnings_once()  # HalfCheetah's XML warns once (`settotalmass`), to stderr, not MUJOCO_LOG.TXT
    try:
        model = mujoco.MjModel.from_xml_path(str(task.model))
    except (ValueError, OSError) as error:
        detail = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(f"env.id={env_id}: its model {task.model} does not load ({detail})") from error
    if task.newton_solver:  # the XML's PGS is not in MuJoCo Warp; Newton solves the same contact problem
        model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return model


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (C. Wellons' lowbias32) of int64 values, element-wise; the products wrap in
    int64 and are masked back to 32 bits."""
    x = x & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


class MjWarpEnvs:
    """`settings.num_envs` worlds of `settings.id` on `device`. `max_episode_steps` defaults to the task's
    (gymnasium's registered limit for the built-in tasks: 1000)."""

    def __init__(self, settings: EnvSettings, device: torch.device, seed: int, max_episode_steps: int | None = None):
        task = task_of(settings.id)
        wp, mjw = import_mujoco_warp()
        check_device(device)

        notice = cpu_notice(device)
        if notice and notice not in _said:  # once a process
            _said.add(notice)
            print(notice, file=sys.stderr, flush=True)

        self.task = task
        self.num_envs, self.device, self.members = settings.num_envs, device, [self]
        self.max_episode_steps = max_episode_steps or task.max_episode_steps
        self._wp, self._mjw = wp, mjw
        self._wp_device = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        self._streams: dict[int, object] = {}  # torch stream handle: its Warp wrapper
        mjm = load_model(task, settings.id)
        self.dt = float(mjm.opt.timestep) * task.frame_skip
        with self._warp_scope():
            self._model = mjw.put_model(mjm)
            self._data = mjw.make_data(mjm, nworld=self.num_envs)
        d = self._data
        view = wp.to_torch
        self.state = SimpleNamespace(
            qpos=view(d.qpos), qvel=view(d.qvel), ctrl=view(d.ctrl), xpos=view(d.xpos), xipos=view(d.xipos),
            cinert=view(d.cinert), cvel=view(d.cvel), qfrc_actuator=view(d.qfrc_actuator),
            cfrc_ext=view(d.cfrc_ext), body_mass=torch.as_tensor(mjm.body_mass, dtype=torch.float32, device=device))
        self._init_qpos = torch.as_tensor(mjm.qpos0, dtype=torch.float32, device=device)
        self._init_qvel = torch.zeros(mjm.nv, dtype=torch.float32, device=device)
        low, high = mjm.actuator_ctrlrange[:, 0], mjm.actuator_ctrlrange[:, 1]
        self.act_dim = mjm.nu
        self.action_low = torch.as_tensor(low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(high, dtype=torch.float32, device=device)
        self._world = torch.arange(self.num_envs, device=device)
        self._world_key = self._keys_of(seed)  # reset(seed) replaces it
        nq, nv = mjm.nq, mjm.nv  # a hash column per qpos entry and two per qvel entry (see _noisy_state)
        self._columns = torch.arange(1, nq + 2 * nv + 1, device=device) * 0x9E3779B9
        self._episodes = torch.zeros(self.num_envs, dtype=torch.int64, device=device)  # each world's resets so far
        self._reset_mask = torch.zeros(self.num_envs, dtype=torch.bool, device=device)
        self._reset_mask_wp = wp.from_torch(self._reset_mask)
        self._elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=device)
        self._pending = torch.zeros(self.num_envs, dtype=torch.bool, device=device)  # ended last step
        self._graphs: dict[str, object] = {}  # name: Warp graph, or False where capture failed
        self._graph_stream = None
        self.reward_terms: dict[str, torch.Tensor] = {}
        self._simulate()  # compiles Warp's kernels (once per machine; cached in ~/.cache/warp)
        self._position = task.position(self.state).clone()  # each world's, where its last step left it
        self.obs_dim = self.task.observe(self.state).shape[1]
        self.obs_layout = [["", [self.obs_dim]]]

    # --- VecEnv ---
    def reset(self, seed: int) -> torch.Tensor:
        """Every world starts a new episode. Each world's reset noise is a function of the seed, the world's
        index and how many episodes it has begun, so a seed repeats its run, and world i's episodes do not
        depend on how many worlds run beside it."""
        self._world_key = self._keys_of(seed)
        self._episodes.zero_()
        self._reset_mask.fill_(True)
        observations = self._reset_worlds()
        self._elapsed.zero_()
        self._pending.zero_()
        return observations.clone()

    def send(self, actions: torch.Tensor) -> None:
        """Queue the step on the device; nothing here waits for it."""
        s, task = self.state, self.task
        action = actions.to(self.device, torch.float32)
        before = self._position  # replaced, not written in place, by _reset_worlds below
        s.ctrl.copy_(action)
        self._simulate()
        observations = task.observe(s)
        terms = task.rewards(s, action, before, self.dt)
        rewards = torch.stack(list(terms.values())).sum(dim=0)
        terminated = task.terminated(s)
        self._elapsed += 1
        truncated = self._elapsed >= self.max_episode_steps
        # The worlds that ended on the step before: this step is their dummy (next-step autoreset).
        dummy = self._pending.clone()
        self._reset_mask.copy_(dummy)
        observations = torch.where(dummy[:, None], self._reset_worlds(), observations)
        rewards = torch.where(dummy, 0.0, rewards)
        terminated = terminated & ~dummy
        truncated = truncated & ~dummy
        self._elapsed.masked_fill_(dummy, 0)
        self._pending = terminated | truncated
        self.reward_terms = {name: torch.where(dummy, 0.0, term) for name, term in terms.items()}
        self._result = (observations, rewards, terminated, truncated)

    def recv(self, out=None):
        if out is None:
            return self._result
        for target, value in zip(out.tensors, self._result, strict=True):
            target.copy_(value)
        return out.tensors

    def step(self, actions: torch.Tensor):
        self.send(actions)
        return self.recv()

    def step_outputs(self):
        return SimpleNamespace(tensors=(
            torch.zeros(self.num_envs, self.obs_dim, device=self.device),
            torch.zeros(self.num_envs, device=self.device),
            torch.zeros(self.num_envs, dtype=torch.bool, device=self.device),
            torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)))

    def close(self) -> None:
        self._graphs.clear()

    # --- the simulator ---
    def _warp_scope(self):
        """Where Warp launches: the run's device and, on CUDA, torch's current stream, so that Warp's kernels
        and the torch ops around them are ordered without a host sync."""
        wp = self._wp
        scope = contextlib.ExitStack()
        scope.enter_context(wp.ScopedDevice(self._wp_device))
        if self.device.type == "cuda":
            scope.enter_context(wp.ScopedStream(self._torch_stream()))
        return scope

    def _torch_stream(self):
        """Torch's current CUDA stream as a Warp stream, one wrapper per stream (each holds its own event)."""
        stream = torch.cuda.current_stream(self.device)
        if stream.cuda_stream not in self._streams:
            self._streams[stream.cuda_stream] = self._wp.stream_from_torch(stream)
        return self._streams[stream.cuda_stream]

    def _simulate(self) -> None:
        """frame_skip physics steps of every world, then what the observation reads that a step leaves
        out (cfrc_ext: gymnasium runs mj_rnePostConstraint after its steps). On CUDA, replayed as one
        Warp graph after the first call."""
        def run():
            for _ in range(self.task.frame_skip):
                self._mjw.step(self._model, self._data)
            if self.task.needs_contact_forces:
                self._mjw.rne_postconstraint(self._model, self._data)

        self._launch("simulate", run)

    def _launch(self, name: str, run) -> None:
        """Run `run`'s Warp launches on the run's device, ordered after the torch ops before them. On CUDA
        the first call compiles and loads the kernels (a capture cannot), the second captures them as a
        Warp graph on a stream of their own, and later calls replay it there: torch's default stream is
        CUDA's legacy stream, which cannot be captured, so the graph's stream waits for torch's and
        torch's for it (device-side events, no host sync)."""
        wp = self._wp
        graph = self._graphs.get(name)
        if self.device.type != "cuda" or graph is False or graph is None:
            with self._warp_scope():
                run()
            if graph is None and self.device.type == "cuda":
                self._graphs[name] = self._capture(name, run)
            return
        torch_stream = self._torch_stream()
        self._graph_stream.wait_stream(torch_stream)
        wp.capture_launch(graph, stream=self._graph_stream)
        torch_stream.wait_stream(self._graph_stream)

    def _capture(self, name: str, run):
        """A Warp graph of `run`, or False (said once) where CUDA cannot capture it."""
        wp = self._wp
        if self._graph_stream is None:
            self._graph_stream = wp.Stream(self._wp_device)
        torch_stream = self._torch_stream()
        try:
            self._graph_stream.wait_stream(torch_stream)
            # The eager call before loaded every kernel `run` launches; else Warp would load all it knows.
            # Current as well as capturing: MuJoCo Warp's RK4 allocates on the current stream.
            with (wp.ScopedDevice(self._wp_device), wp.ScopedStream(self._graph_stream),
                  wp.ScopedCapture(stream=self._graph_stream, force_module_load=False) as capture):
                run()
            torch_stream.wait_stream(self._graph_stream)
            return capture.graph
        except Exception as error:
            print(f"MuJoCo Warp: the {name} is not captured as a CUDA graph ({error}); it runs uncaptured",
                  file=sys.stderr, flush=True)
            return False

    def _kinematics(self) -> None:
        mjw = self._mjw
        mjw.kinematics(self._model, self._data)
        mjw.com_pos(self._model, self._data)
        mjw.com_vel(self._model, self._data)

    def _noisy_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every world's reset state as gymnasium's reset_model draws it: init_qpos + U(-scale, scale), and
        init_qvel + U(-scale, scale) or + scale * N(0, 1), as the task says."""
        task = self.task
        nq, nv = self._init_qpos.numel(), self._init_qvel.numel()
        scale = task.reset_noise_scale
        uniform = self._uniform()
        qpos = self._init_qpos + uniform[:, :nq] * (2 * scale) - scale
        if task.reset_noise == "uniform_normal":  # Box-Muller on the two columns per qvel entry
            radius = torch.sqrt(-2 * torch.log1p(-uniform[:, nq:nq + nv]))
            return qpos, self._init_qvel + scale * radius * torch.cos(2 * torch.pi * uniform[:, nq + nv:])
        return qpos, self._init_qvel + uniform[:, nq:nq + nv] * (2 * scale) - scale

    def _uniform(self) -> torch.Tensor:
        """`[W, nq + 2 nv]` numbers in [0, 1), each a hash of (seed, world, the world's episode count, column):
        counter-based, so no generator state is shared between worlds."""
        key = _hash32(self._world_key ^ (self._episodes & 0xFFFFFFFF))
        return (_hash32(key[:, None] + self._columns) >> 8).float() * 2.0**-24

    def _keys_of(self, seed: int) -> torch.Tensor:
        """Each world's key under `seed` (set at reset, not per step)."""
        return _hash32(_hash32(torch.tensor(seed % 2**32, device=self.device)) ^ self._world)

    def set_states(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """Start every world's episode from the given `[W, nq]` and `[W, nv]` state instead of a noisy one
        (for tests that hold the task against gymnasium from identical states); their first observations."""
        self._reset_mask.fill_(True)
        observations = self._reset_worlds(qpos.to(self.device, torch.float32), qvel.to(self.device, torch.float32))
        self._elapsed.zero_()
        self._pending.zero_()
        return observations.clone()

    def _reset_worlds(self, qpos: torch.Tensor | None = None, qvel: torch.Tensor | None = None) -> torch.Tensor:
        """Reset the worlds in `_reset_mask` as gymnasium does (mj_resetData, then qpos and qvel plus the
        task's noise, then mj_forward's kinematics) and return their first observations (the rows of the
        others say nothing)."""
        mjw, s, task = self._mjw, self.state, self.task
        if qpos is None:
            qpos, qvel = self._noisy_state()
        stepped_position = task.position(s).clone()  # before the kinematics below rewrite what it reads
        self._launch("reset", lambda: mjw.reset_data(self._model, self._data, reset=self._reset_mask_wp))
        mask = self._reset_mask[:, None]
        s.qpos.copy_(torch.where(mask, qpos, s.qpos))
        s.qvel.copy_(torch.where(mask, qvel, s.qvel))
        if task.needs_kinematics_at_reset:
            self._launch("kinematics", self._kinematics)
        first = task.observe(s)
        columns = task.zero_at_reset(first.shape[1])
        if columns is not None:
            first[:, columns] = 0.0
        self._position = torch.where(mask, task.position(s), stepped_position)
        self._episodes += self._reset_mask
        return first
