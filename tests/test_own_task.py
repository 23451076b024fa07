"""A user's own task: a gymnasium environment given by `module:Id`, and a MuJoCo Warp task written with the
public task API, from a module outside the package; each tool works on them, and bad ones are refused in
one line that leaves no run dir."""

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

TASKS = '''
import gymnasium
import numpy as np
from gymnasium.spaces import Box, Discrete


class Reach(gymnasium.Env):
    """A point pushed toward a goal in the plane; 50 steps (the time limit); draws itself."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    observation_space = Box(-np.inf, np.inf, (4,), np.float32)
    action_space = Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, render_mode=None, width=64, height=48):
        self.render_mode, self.size = render_mode, (height, width)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.point, self.goal = self.np_random.uniform(-1, 1, (2, 2))
        return self._obs(), {}

    def _obs(self):
        return np.concatenate([self.point, self.goal]).astype(np.float32)

    def step(self, action):
        self.point = np.clip(self.point + 0.1 * np.asarray(action), -1, 1)
        return self._obs(), -float(np.linalg.norm(self.point - self.goal)), False, False, {}

    def render(self):
        frame = np.zeros((*self.size, 3), np.uint8)
        for spot, colour in ((self.goal, 0), (self.point, 1)):
            row, column = ((spot + 1) / 2 * (np.array(self.size) - 1)).astype(int)
            frame[row, column, colour] = 255
        return frame


class Flip(Reach):
    action_space = Discrete(2)


class Pixels(Reach):
    observation_space = Box(0, 255, (48, 64, 3), np.uint8)


gymnasium.register("Reach-v0", entry_point=Reach, max_episode_steps=50)
gymnasium.register("Flip-v0", entry_point=Flip, max_episode_steps=50)
gymnasium.register("Pixels-v0", entry_point=Pixels, max_episode_steps=50)
'''

# MuJoCo Warp tasks written with the public API: one that trains, and three that are wrong in one way each.
WARP_TASKS = '''
import torch

from ppo.envs.mjwarp_tasks import Task, gymnasium_asset, register


def balance(**changes):
    values = dict(model=gymnasium_asset("inverted_pendulum.xml"), frame_skip=2, reset_noise="uniform",
                  reset_noise_scale=0.01, position=lambda s: s.qpos[:, :1],
                  rewards=lambda s, action, before, dt: {"reward_upright": torch.cos(s.qpos[:, 1])},
                  terminated=lambda s: s.qpos[:, 1].abs() > 0.5, observe=lambda s: torch.cat([s.qpos, s.qvel], 1),
                  max_episode_steps=200)
    return Task(**{**values, **changes})


register("Balance-v0", balance)
register("NoModel-v0", lambda: balance(model="/no/such/model.xml"))
register("NoSkip-v0", lambda: balance(frame_skip=0))
register("BadObservation-v0", lambda: balance(observe=lambda s: s.qpos.sum()))
'''

TINY = ["env.num_envs=4", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=1", "device=cpu"]


@pytest.fixture
def task_dir(tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "reachtask.py").write_text(TASKS)
    (modules / "warptask.py").write_text(WARP_TASKS)
    (modules / "brokentask.py").write_text("raise RuntimeError('this module is broken')\n")
    return modules


def run(modules, *command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A fresh process that finds the user's modules on PYTHONPATH, as a user's shell would."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(modules),
                                                                              os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=environment)


def test_a_gymnasium_task_of_ones_own_trains_resumes_evaluates_exports_and_films_by_module_id(task_dir, tmp_path):
    run_dir = tmp_path / "run"
    trained = run(task_dir, "train.py", "env.id=reachtask:Reach-v0", *TINY, "total_timesteps=256",
                  f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    # env.backend=auto takes gymnasium for a `module:Id`: envpool cannot import a user's module.
    assert "training reachtask:Reach-v0 (gymnasium, 4 envs)" in trained.stdout
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["settings"]["env"]["id"] == "reachtask:Reach-v0"  # what a later process imports
    resumed = run(task_dir, "train.py", "env.id=reachtask:Reach-v0", *TINY, "total_timesteps=512",
                  f"resume={run_dir}", f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0 and "finished at step 512" in resumed.stdout, resumed.stderr[-2000:]
    evaluated = run(task_dir, "scripts/evaluate.py", str(run_dir), "--episodes", "4", "--num-envs", "2")
    assert evaluated.returncode == 0 and "4 episodes: mean return" in evaluated.stdout, evaluated.stderr[-2000:]
    exported = run(task_dir, "scripts/export.py", str(run_dir), "--format", "torchscript")
    assert exported.returncode == 0, exported.stderr[-2000:]
    policy = torch.jit.load(str(run_dir / "policy.pt"))
    assert policy(torch.zeros(3, 4)).shape == (3, 2)
    from ppo.policy.video import VideoError, choose_gl

    try:
        choose_gl()
    except VideoError:
        return  # no renderer on this machine: evaluate.py would say so in one line
    filmed = run(task_dir, "scripts/evaluate.py", str(run_dir), "--episodes", "1", "--video", str(tmp_path / "v"))
    assert filmed.returncode == 0 and (tmp_path / "v" / "eval_seed12345_0.mp4").stat().st_size > 0, \
        filmed.stderr[-2000:]


def mjwarp_on_the_cpu() -> bool:
    try:
        from ppo.envs.mjwarp import import_mujoco_warp

        return import_mujoco_warp()[0].is_cpu_available()
    except Exception:
        return False


@pytest.mark.parametrize(("env", "said"), [
    ("env.id=nosuchmodule:Reach-v0", "error: env.id=nosuchmodule:Reach-v0: its module 'nosuchmodule' does not import "
                                     "(ModuleNotFoundError: No module named 'nosuchmodule'); is it on PYTHONPATH?"),
    ("env.id=brokentask:Reach-v0", "error: env.id=brokentask:Reach-v0: its module 'brokentask' does not import "
                                   "(RuntimeError: this module is broken); is it on PYTHONPATH?"),
    ("env.id=reachtask:Rech-v0", "error: env.id=reachtask:Rech-v0: module 'reachtask' imports, but no 'Rech-v0' is "
                                 "registered; it registers Flip-v0, Pixels-v0, Reach-v0"),
    ("env.id=reachtask:Flip-v0", "error: reachtask:Flip-v0 acts in Discrete(2): PPO here trains continuous "
                                 "control, which needs a 1-D Box of actions (a MuJoCo task such as Ant-v4)"),
    ("env.id=reachtask:Pixels-v0", "error: reachtask:Pixels-v0 observes images (Box(0, 255, (48, 64, 3), uint8)): "
                                   "the agent is an MLP over vectors of numbers, and pixels need a convolutional "
                                   "encoder it does not have"),
])
def test_a_bad_gymnasium_task_is_refused_in_one_line_and_leaves_no_run_dir(task_dir, tmp_path, env, said):
    result = run(task_dir, "train.py", env, *TINY, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and result.stderr.strip() == said, result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not mjwarp_on_the_cpu(), reason="MuJoCo Warp on the CPU: not installed, or no CPU compiler")
@pytest.mark.parametrize(("task", "said"), [
    ("reachtask:Reach-v0", "error: env.backend=mjwarp has no task 'Reach-v0' ('reachtask' imports, but registered: "),
    ("warptask:NoModel-v0", "error: env.id=warptask:NoModel-v0: its model /no/such/model.xml does not load ("),
    ("warptask:NoSkip-v0", "error: env.id=warptask:NoSkip-v0: Task.frame_skip must be a positive integer, got 0"),
    ("warptask:BadObservation-v0", "error: env.id=warptask:BadObservation-v0: its task's observe fails on the model's "
                                   "first state (ValueError: it returned a torch.float32 tensor of shape (), not "
                                   "[W, obs_dim] floats)"),
])
def test_a_bad_mujoco_warp_task_is_refused_in_one_line_and_leaves_no_run_dir(task_dir, tmp_path, task, said):
    result = run(task_dir, "train.py", "env.backend=mjwarp", f"env.id={task}", *TINY,
                 f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and result.stderr.strip().startswith(said), result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not mjwarp_on_the_cpu(), reason="MuJoCo Warp on the CPU: not installed, or no CPU compiler")
def test_a_mujoco_warp_task_of_ones_own_trains_and_evaluates_by_module_id(task_dir, tmp_path):
    run_dir = tmp_path / "run"
    trained = run(task_dir, "train.py", "env.backend=mjwarp", "env.id=warptask:Balance-v0", *TINY,
                  "total_timesteps=128", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "training warptask:Balance-v0 (mjwarp, 4 envs)" in trained.stdout
    evaluated = run(task_dir, "scripts/evaluate.py", str(run_dir), "--episodes", "2", "--num-envs", "2",
                    "--device", "cpu")
    assert evaluated.returncode == 0 and "2 episodes: mean return" in evaluated.stdout, evaluated.stderr[-2000:]
