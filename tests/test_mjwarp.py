"""env.backend=mjwarp: gymnasium's tasks on MuJoCo Warp, held against gymnasium's own envs.

Two layers. The task code (observation, reward terms, termination) is checked on gymnasium's own
simulation states, so nothing but the task code differs: it must agree to float32 rounding (2e-6 of
1 + |value|). The whole env (MuJoCo Warp's float32 physics beside MuJoCo's float64) is checked from
identical states and actions; there the two simulators drift apart as a trajectory's sensitivity
amplifies float32 rounding, so the tolerance is the drift measured over 20 steps with margin.
"""

import subprocess
import sys
from types import SimpleNamespace

import gymnasium
import mujoco
import numpy as np
import pytest
import torch

import examples.mjwarp_swimmer  # noqa: F401  (registers Swimmer-v5: held to gymnasium's as the built-in tasks)
from buffers import RolloutBuffer
from ppo.collect import Collector
from ppo.config import ConfigError, EnvSettings
from ppo.envs import print_mujoco_warnings_once, simulator_version
from ppo.envs.mjwarp_tasks import TASKS
from ppo.normalize import ObservationNormalizer, RewardScaler
from tests.conftest import ROOT
from tests.test_collect import GAMMA, KnownPolicy

IDS = list(TASKS)
try:
    import mujoco_warp  # noqa: F401

    HAVE_MJWARP = True
except ImportError:
    HAVE_MJWARP = False
needs_mjwarp = pytest.mark.skipif(not HAVE_MJWARP, reason='needs pip install -e ".[mjwarp]"')


def _warp_has_a_cpu_compiler() -> bool:
    from ppo.envs.mjwarp import import_mujoco_warp

    return import_mujoco_warp()[0].is_cpu_available()


# A CUDA-only Warp install (no warp-clang) runs MuJoCo Warp on GPUs alone: its CPU-backend tests skip.
needs_warp_cpu = pytest.mark.skipif(not HAVE_MJWARP or not _warp_has_a_cpu_compiler(),
                                    reason="MuJoCo Warp on the CPU: this Warp has no CPU compiler (warp-clang)")
CPU = torch.device("cpu")
CUDA = torch.device("cuda")
DEVICES = [pytest.param(CPU, marks=needs_warp_cpu, id="cpu"),
           *([pytest.param(CUDA, id="cuda")] if torch.cuda.is_available() else [])]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gym_env(env_id: str):
    print_mujoco_warnings_once()  # HalfCheetah's XML warns: to stderr, not into MUJOCO_LOG.TXT here
    env = gymnasium.make(env_id).unwrapped
    if TASKS[env_id]().newton_solver:  # as the backend runs it (MuJoCo Warp has no PGS)
        env.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return env


def state_of(env) -> SimpleNamespace:
    """The task's view of a gymnasium env's MjData, as MuJoCo Warp's arrays give it (float32)."""
    d = env.data

    def f32(x):
        return torch.tensor(np.asarray(x), dtype=torch.float32)[None]

    return SimpleNamespace(qpos=f32(d.qpos), qvel=f32(d.qvel), ctrl=f32(d.ctrl), xpos=f32(d.xpos),
                           xipos=f32(d.xipos), cinert=f32(d.cinert), cvel=f32(d.cvel),
                           qfrc_actuator=f32(d.qfrc_actuator), cfrc_ext=f32(d.cfrc_ext),
                           body_mass=torch.tensor(env.model.body_mass, dtype=torch.float32))


def close(ours, theirs, rtol):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return np.max(np.abs(ours - theirs) / (1 + np.abs(theirs)), initial=0.0) <= rtol


@pytest.mark.parametrize("env_id", IDS)
def test_the_task_code_is_gymnasiums_on_its_own_states(env_id):
    task, env = TASKS[env_id](), gym_env(env_id)
    assert env.frame_skip == task.frame_skip
    assert gymnasium.spec(env_id).max_episode_steps == 1000  # the truncation MjWarpEnvs takes from gymnasium
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(40):
        before = task.position(state_of(env))
        action = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
        obs, reward, terminated, _, info = env.step(action)
        state = state_of(env)
        assert close(task.observe(state)[0], obs, 2e-6)
        terms = task.rewards(state, torch.tensor(action)[None], before, env.dt)
        assert close(sum(terms.values())[0].item(), reward, 2e-6)
        for name, value in terms.items():
            if name in info:  # v4 names fewer of them
                assert close(value[0].item(), info[name], 2e-6), name
        assert bool(task.terminated(state)[0]) == terminated
        checked += 1
        if terminated:
            env.reset(seed=checked)
    assert checked == 40


def make(env_id: str, num_envs: int, device: torch.device = CPU, **kwargs):
    from ppo.envs.mjwarp import MjWarpEnvs

    return MjWarpEnvs(EnvSettings(id=env_id, num_envs=num_envs, backend="mjwarp"), device, seed=0, **kwargs)


# Largest drift over 20 steps of 2 worlds from gymnasium's reset states, measured on a 2-core CPU
# (mujoco 4.0.1, mujoco-warp 4.0.0), with a margin of 5-40x: HalfCheetah 4.9e-3 (its gait amplifies
# rounding fastest), Humanoid 2.0e-4, Walker2d 4.4e-5, Hopper 9.3e-6, InvertedPendulum 2.5e-7; Ant's
# first step 6e-7; the example Swimmer (examples/mjwarp_swimmer.py) 1.8e-6.
DRIFT = {"HalfCheetah": 3e-2, "Humanoid": 1e-3, "Walker2d": 3e-4, "Hopper": 1e-4, "InvertedPendulum": 1e-5,
         "Ant": 1e-4, "Swimmer": 1e-5}
# Ant: MuJoCo Warp's RK4 step and MuJoCo's differ where a leg first touches the floor (qvel by 0.2
# in that physics step, with no task code involved; 9e-3 with Euler on both), which from gymnasium's
# reset states happens within its 2nd step (physics steps 6-12), so Ant is compared until then.
STEPS = {"Ant": 1}


@needs_mjwarp
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("env_id", [i for i in IDS if i.endswith("v5")] + ["Ant-v4", "Humanoid-v4"])
def test_the_env_follows_gymnasium_from_identical_states_and_actions(env_id, device):
    name = env_id.split("-")[0]
    gyms = [gym_env(env_id) for _ in range(2)]
    firsts = np.stack([g.reset(seed=i)[0] for i, g in enumerate(gyms)])
    envs = make(env_id, 2, device)
    observations = envs.set_states(torch.tensor(np.stack([g.data.qpos for g in gyms])),
                                   torch.tensor(np.stack([g.data.qvel for g in gyms])))
    assert close(observations.cpu(), firsts, 1e-6)
    rng = np.random.default_rng(1)
    running = [True, True]
    for _ in range(STEPS.get(name, 20)):
        actions = rng.uniform(gyms[0].action_space.low, gyms[0].action_space.high, (2, envs.act_dim))
        obs, rewards, terminated, truncated = (x.cpu() for x in envs.step(torch.tensor(actions, dtype=torch.float32)))
        for i, g in enumerate(gyms):
            if not running[i]:
                continue
            their_obs, their_reward, their_terminated, _, info = g.step(actions[i])
            assert close(obs[i], their_obs, DRIFT[name])
            assert close(rewards[i].item(), their_reward, DRIFT[name])
            for term, value in envs.reward_terms.items():
                if term in info:
                    assert close(value[i].item(), info[term], DRIFT[name]), term
            assert bool(terminated[i]) == their_terminated and not truncated[i]
            running[i] = not their_terminated


@needs_mjwarp
@needs_warp_cpu
@pytest.mark.parametrize("env_id", ["InvertedPendulum-v5", "HalfCheetah-v5"])
def test_reset_states_follow_gymnasiums_noise_and_each_world_has_its_own_seeded_stream(env_id):
    envs, task, model = make(env_id, 512), TASKS[env_id](), gym_env(env_id).model
    envs.reset(seed=5)
    first_qpos = envs.state.qpos.clone()
    qpos = first_qpos - torch.tensor(model.qpos0, dtype=torch.float32)
    qvel = envs.state.qvel.clone()
    scale = task.reset_noise_scale
    assert qpos.abs().max() <= scale and abs(qpos.std().item() - scale / 3**0.5) < 0.1 * scale
    if task.reset_noise == "uniform":
        assert qvel.abs().max() <= scale and abs(qvel.std().item() - scale / 3**0.5) < 0.1 * scale
    else:  # scale * N(0, 1)
        assert qvel.abs().max() > scale and abs(qvel.std().item() - scale) < 0.1 * scale
    assert abs(qpos.mean().item()) < 0.05 * scale and abs(qvel.mean().item()) < 0.05 * scale
    envs._reset_mask.fill_(True)
    envs._reset_worlds()  # every world's second episode: new noise
    assert not torch.isclose(envs.state.qvel, qvel).any()
    envs.reset(seed=5)
    assert torch.equal(envs.state.qvel, qvel)
    envs.reset(seed=6)
    assert not torch.isclose(envs.state.qvel, qvel).any()
    # World i's noise is its own: the same with 7 worlds beside it as with 511.
    fewer = make(env_id, 7)
    fewer.reset(seed=5)
    assert torch.equal(fewer.state.qvel, qvel[:7]) and torch.equal(fewer.state.qpos, first_qpos[:7])


class Balancing(KnownPolicy):
    """KnownPolicy's value, and a PD controller's action that keeps InvertedPendulum up for good."""

    def sample_action(self, obs):
        x, angle, x_velocity, angular_velocity = obs.T
        action = (3.0 * angle + 0.5 * angular_velocity + 0.3 * x_velocity).clamp(-3, 3)[:, None]
        return action, action


@needs_mjwarp
@needs_warp_cpu
def test_an_episode_truncates_at_gymnasiums_1000_steps_and_the_next_step_autoresets_and_bootstraps():
    envs = make("InvertedPendulum-v5", 2)
    assert envs.max_episode_steps == 1000
    num_steps = 1003
    buffer = RolloutBuffer(num_steps, 2, envs.obs_dim, envs.act_dim, CPU)
    policy = Balancing()
    collector = Collector(envs, policy, ObservationNormalizer(envs.obs_dim, CPU, enabled=False),
                          RewardScaler(2, GAMMA, CPU, enabled=False), CPU, seed=0)
    collector.collect(buffer)
    # Steps 0-999 are the first episode, cut by the limit at 999; step 1000 is the dummy.
    for env in range(2):
        assert buffer.truncateds[:, env].nonzero().squeeze(1).tolist() == [999]
        assert buffer.valid[:, env].logical_not().nonzero().squeeze(1).tolist() == [1000]
    assert not buffer.terminateds.any()
    assert buffer.rewards[999].tolist() == [1.0, 1.0] and buffer.rewards[1000].tolist() == [0.0, 0.0]
    # The dummy step's observation is the final one: its value is the truncated step's bootstrap...
    assert torch.equal(buffer.bootstrap_values[999], policy.get_value(buffer.observations[1000]))
    assert not buffer.bootstrap_values[:999].any()
    # ...and the step after the dummy starts a new episode from gymnasium's reset noise, U(-0.01, 0.01).
    assert buffer.observations[1001].abs().max() <= 0.01 + 1e-6 < buffer.observations[1000].abs().max()


@needs_mjwarp
@needs_warp_cpu
def test_contact_forces_and_actuator_forces_are_zero_in_a_first_observation_as_in_gymnasium():
    envs, env = make("Humanoid-v5", 2), gym_env("Humanoid-v5")
    first = env.reset(seed=0)[0]
    envs.reset(seed=0)
    envs.step(torch.ones(2, envs.act_dim) * 0.4)  # forces now in the state...
    envs._pending.fill_(True)  # ...and both worlds reset on the next step
    obs, rewards, _, _ = envs.step(torch.zeros(2, envs.act_dim))
    assert rewards.tolist() == [0.0, 0.0]
    tail = slice(253, 348)  # qfrc_actuator[6:] and cfrc_ext[1:]
    assert not np.any(first[tail]) and not obs[:, tail].any()


@needs_mjwarp
@needs_cuda
def test_on_cuda_the_replayed_graphs_step_as_the_uncaptured_launches_do():
    # Hopper falls within tens of steps under random actions, so resets (their own graphs) are replayed too.
    captured, plain = make("Hopper-v5", 64, CUDA), make("Hopper-v5", 64, CUDA)
    plain._graphs = dict.fromkeys(("simulate", "reset", "kinematics"), False)  # as where capture fails
    generator = torch.Generator(CUDA).manual_seed(0)
    assert torch.equal(captured.reset(seed=1), plain.reset(seed=1))
    assert set(captured._graphs) == {"simulate", "reset"} and all(captured._graphs.values())
    ended = 0
    for _ in range(60):
        actions = torch.rand(64, captured.act_dim, generator=generator, device=CUDA) * 2 - 1
        ours, theirs = captured.step(actions), plain.step(actions)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        ended += int(ours[2].sum())
    assert ended > 20


@needs_mjwarp
@needs_cuda
def test_on_cuda_a_rollout_on_mjwarp_runs_without_a_host_sync():
    from ppo.agent import Agent

    envs = make("Hopper-v5", 64, CUDA, max_episode_steps=20)  # truncations and resets within each rollout
    agent = Agent(envs.obs_dim, envs.act_dim).to(CUDA)
    collector = Collector(envs, agent, ObservationNormalizer(envs.obs_dim, CUDA), RewardScaler(64, GAMMA, CUDA), CUDA,
                          seed=0, graphs=True)
    buffer = RolloutBuffer(50, 64, envs.obs_dim, envs.act_dim, CUDA)
    collector.collect(buffer)  # eager, then captured: the captures may wait for the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any torch op that waits for the device raises
    try:
        for _ in range(2):
            collector.collect(buffer)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert buffer.truncateds.any() and not buffer.valid.all() and torch.isfinite(buffer.observations).all()


def run_train(*overrides, code=None, timeout=300):
    prefix = ["-c", code] if code else [str(ROOT / "train.py")]
    return subprocess.run([sys.executable, *prefix, *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


TRAIN = ["env=InvertedPendulum-v5", "env.backend=mjwarp", "device=cpu", "env.num_envs=4", "ppo.num_steps=16",
         "ppo.num_minibatches=2", "ppo.update_epochs=1"]


@needs_mjwarp
@needs_warp_cpu
def test_train_py_trains_checkpoints_and_resumes_on_mjwarp(tmp_path):
    first = run_train(*TRAIN, "total_timesteps=128", f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "training InvertedPendulum-v5 (mjwarp, 4 envs)" in first.stdout
    assert first.stderr.strip().startswith("env.backend=mjwarp on the CPU")  # and nothing else
    assert len(first.stderr.strip().splitlines()) == 1, first.stderr
    resumed = run_train(*TRAIN, "total_timesteps=256", f"resume={tmp_path}", f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "finished at step 256" in resumed.stdout
    assert '"simulator": "mujoco-warp' in (tmp_path / "run_info.json").read_text()
    # Its policy on gymnasium's own simulator: the same task, so the same observation layout.
    evaluated = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(tmp_path), "--episodes",
                                "2", "--backend", "gymnasium"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0 and "2 episodes: mean return" in evaluated.stdout, evaluated.stderr[-2000:]


@needs_mjwarp
@needs_warp_cpu
def test_evaluate_py_scores_a_policy_trained_elsewhere_on_mujoco_warp_worlds(tmp_path):
    trained = run_train("env=InvertedPendulum-v4", "env.backend=gymnasium", "device=cpu", "env.num_envs=4",
                        "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=1", "total_timesteps=128",
                        f"hydra.run.dir={tmp_path}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    from evaluate import evaluate

    returns = evaluate(str(tmp_path), episodes=6, device=CPU, num_envs=3, backend="mjwarp")
    # InvertedPendulum-v4 pays 1 a step: whole episodes of the policy on MuJoCo Warp, at least a step each.
    assert len(returns) == 6 and all(r >= 1 and float(r).is_integer() for r in returns)
    assert returns == evaluate(str(tmp_path), episodes=6, device=CPU, num_envs=3, backend="mjwarp")  # seeded
    evaluated = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(tmp_path), "--episodes",
                                "2", "--num-envs", "2", "--backend", "mjwarp", "--device", "cpu"], cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0 and "2 episodes: mean return" in evaluated.stdout, evaluated.stderr[-2000:]


@needs_mjwarp
def test_runs_record_the_simulator_versions_without_package_metadata(monkeypatch):
    # A copy of Warp and MuJoCo Warp put on PYTHONPATH (as carried to an offline GPU host) has no
    # dist-info; run_info.json must still say which build produced a result.
    import importlib.metadata

    import mujoco
    import mujoco_warp
    import warp

    def no_metadata(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    assert simulator_version("mjwarp") == (
        f"mujoco-warp {mujoco_warp.__version__}, warp-lang {warp.__version__}, MuJoCo {mujoco.__version__}")


@needs_mjwarp
def test_a_task_the_backend_does_not_have_names_the_ones_it_has(tmp_path):
    result = run_train("env.id=Pusher-v5", "env.backend=mjwarp", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: env.backend=mjwarp has no task 'Pusher-v5' (registered: Ant-v4, Ant-v5, ")
    assert not (tmp_path / "run").exists()


MISSING = """
import runpy, sys
sys.modules["mujoco_warp"] = None  # as where the extra is not installed
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_missing_extra_names_the_pip_command(tmp_path):
    result = run_train(*TRAIN, f"hydra.run.dir={tmp_path / 'run'}", code=MISSING)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().startswith("error: env.backend=mjwarp needs MuJoCo Warp")
    assert result.stderr.strip().endswith('pip install -e ".[mjwarp]"')
    assert not (tmp_path / "run").exists()


@needs_mjwarp
def test_a_warp_without_a_cpu_compiler_refuses_a_cpu_run_in_one_line(monkeypatch):
    from ppo.envs.mjwarp import check_device, import_mujoco_warp

    monkeypatch.setattr(import_mujoco_warp()[0], "is_cpu_available", lambda: False)  # as a CUDA-only install
    with pytest.raises(ConfigError, match="^env.backend=mjwarp on the CPU needs Warp's CPU compiler") as refused:
        check_device(CPU)
    assert "\n" not in str(refused.value)
    check_device(CUDA)  # a GPU needs no CPU compiler


def test_an_unknown_task_is_refused_by_name_where_mujoco_warp_is_not_installed_too():
    from ppo.envs.mjwarp import task_of

    with pytest.raises(ConfigError, match="has no task 'Pusher-v5'"):
        task_of("Pusher-v5")
