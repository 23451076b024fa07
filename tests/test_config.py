"""Every config composes into valid settings; bad values fail early with a message naming the key."""

import dataclasses
import re

import pytest

from ppo.config import (
    ConfigError,
    PPOSettings,
    TrainSettings,
    check_setting_key,
    flat_settings,
    learning_differences,
    resolve_device,
)
from tests.conftest import ROOT, compose_settings

CONFIGS = ROOT / "configs"
ENV_FILES = sorted(p.stem for p in (CONFIGS / "env").glob("*.yaml"))


def test_there_is_a_file_per_task_and_version():
    tasks = ["Ant", "HalfCheetah", "Hopper", "Walker2d", "Humanoid", "InvertedPendulum"]
    assert ENV_FILES == sorted(f"{t}-{v}" for t in tasks for v in ("v4", "v5"))


@pytest.mark.parametrize("env_file", ENV_FILES)
def test_every_env_file_composes(env_file):
    settings = compose_settings(f"env={env_file}")
    assert settings.env.id == env_file
    assert settings.batch_size % settings.ppo.num_minibatches == 0
    assert settings.batch_size == 2048, "CleanRL's batch, whatever the layout of envs x steps"
    text = (CONFIGS / "env" / f"{env_file}.yaml").read_text()
    assert "CleanRL" in text, "each env file names the source of its PPO values"


def test_any_env_id_without_a_file():
    assert compose_settings("env.id=Pusher-v5").env.id == "Pusher-v5"


@pytest.mark.parametrize("override,message", [
    ("env.num_envs=0", "`env.num_envs` must be positive, got 0"),
    ("seed=-1", r"`seed` must be in \[0, 2\*\*32 - 1\], got -1"),  # numpy's seeding range
    ("seed=4294967296", r"`seed` must be in \[0, 2\*\*32 - 1\], got 4294967296"),
    ("env.groups=3", r"`env.groups` \(3\) must divide `env.num_envs` \(64\); the nearest that do: 2 and 4$"),
    ("env.groups=100", r"`env.groups` \(100\) must divide `env.num_envs` \(64\); the nearest that does: 64$"),
    ("env.groups=0", "`env.groups` must be a positive integer or auto, got 0"),
    ("env.groups=two", "`env.groups` must be a positive integer or auto, got 'two'"),
    ("ppo.num_minibatches=7", r"`ppo.num_minibatches` \(7\) must divide the batch, env.num_envs x ppo.num_steps = "
                              r"64 x 32 = 2048; the nearest that do: 4 and 8$"),
    ("ppo.num_minibatches=48 ppo.num_steps=10", r"= 64 x 10 = 640; the nearest that do: 40 and 64$"),
    ("env.backend=isaac", "`env.backend` must be envpool, gymnasium, mjwarp or auto, got 'isaac'"),
    ("checkpoint.every=-1", "`checkpoint.every` must be non-negative, got -1"),
    ("video.every=-1", "`video.every` must be non-negative, got -1"),
    ("video.width=0", "`video.width` must be positive, got 0"),
    ("logger.wandb=yes", "`logger.wandb` must be true or false"),
    ("ppo.vf_coef=-0.5", "`ppo.vf_coef` must be non-negative, got -0.5"),
    ("device=tpu", "`device` must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ("device=cuda:x", "`device` must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    ("ppo.gamma=1.5", r"`ppo.gamma` must be in \[0, 1\], got 1.5"),
    ("ppo.learning_rate=-1", "`ppo.learning_rate` must be positive"),
    ("total_timesteps=abc", "`total_timesteps` must be an integer"),
    ("total_timesteps=1.5", r"`total_timesteps` must be an integer, got 1.5"),  # not a whole number of steps
    ("model.hidden_sizes=[]", "`model.hidden_sizes` must be a non-empty list"),
    ("+ppo.clip_cof=0.1", "unknown setting `ppo.clip_cof`"),
    ("ppo.compile=yes", "`ppo.compile` must be true, false or auto, got 'yes'"),
    ("model.activation=gelu", "`model.activation` must be one of tanh, elu, relu, got 'gelu'"),
    ("ppo.norm_adv=global", "`ppo.norm_adv` must be one of minibatch, batch, off, got 'global'"),
    ("env.pin_threads=maybe", "`env.pin_threads` must be true, false or auto, got 'maybe'"),
    ("env.pin_threads=true env.backend=gymnasium", r"`env.pin_threads=true` pins envpool's threads"),
])
def test_invalid_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_settings(*override.split())


@pytest.mark.parametrize("key, message", [
    ("ppo.lerning_rate", "did you mean `ppo.learning_rate`?"),  # a misspelling
    ("learning_rate", "did you mean `ppo.learning_rate`?"),  # a setting's name, out of its group (CleanRL's flags)
    ("env.learning_rate", "did you mean `ppo.learning_rate`?"),
    ("seeed", "did you mean `seed`?"),
    ("ppo.lr", r"\(known in `ppo`: adaptive_lr_kl, anneal_lr, clip_coef, .*, vf_coef\)$"),  # nothing close
    ("model.x.y", r"\(known in `model`: activation, hidden_sizes, init_log_std, shared_trunk\)$"),
    ("foo", r"\(known: checkpoint, device, env, log_every_s, logger, model, ppo, resume, seed, .*, total_timesteps, "
            r"video\)$"),
])
def test_an_unknown_key_names_what_it_most_likely_meant(key, message):
    with pytest.raises(ConfigError, match=rf"^unknown setting `{re.escape(key)}`:? .*{message}"):
        check_setting_key(key)


def test_every_setting_and_group_is_a_known_key():
    for key in flat_settings(dataclasses.asdict(TrainSettings())):
        check_setting_key(key)
        check_setting_key(key.rpartition(".")[0] or key)


def test_whole_numbers_written_as_floats_count_as_integers():
    # YAML reads `1e6` as a float; a whole number of steps is meant, and the settings hold an int.
    settings = compose_settings("total_timesteps=1e6", "env.num_envs=8.0")
    assert (settings.total_timesteps, settings.env.num_envs) == (1_000_000, 8)
    assert all(type(v) is int for v in (settings.total_timesteps, settings.env.num_envs))


def test_a_resume_compares_learning_settings_only():
    # Execution keys may differ, a list equals the tuple the settings hold, and keys that only one
    # side knows (a checkpoint of older or newer code) are not compared.
    saved = {"device": "cpu", "total_timesteps": 10, "seed": 1,
             "ppo": {"gamma": 0.99, "gone": 1, "compile": "auto"}, "model": {"hidden_sizes": [64, 64]}}
    current = {"device": "cuda", "total_timesteps": 20, "seed": 2,
               "ppo": {"gamma": 0.9, "new": 2, "compile": True}, "model": {"hidden_sizes": (64, 64)}}
    assert learning_differences(saved, current) == [("ppo.gamma", 0.99, 0.9), ("seed", 1, 2)]


@pytest.mark.parametrize("cuda_devices, name, expected", [
    (0, "auto", "cpu"), (0, "cpu", "cpu"), (0, "cuda", "CUDA is not available here"),
    (2, "auto", "cuda"), (2, "cuda:1", "cuda:1"), (2, "cuda:2", "this machine has 2 CUDA device"),
])
def test_the_device_resolves_or_names_what_is_missing(monkeypatch, cuda_devices, name, expected):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
    if expected in ("cpu", "cuda", "cuda:1"):
        assert str(resolve_device(name)) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            resolve_device(name)


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", True), ("false", False)])
def test_compile_takes_auto_or_a_boolean(value, expected):
    assert compose_settings(f"ppo.compile={value}").ppo.compile == expected


@pytest.mark.parametrize("value, expected", [("minibatch", "minibatch"), ("batch", "batch"), ("off", "off"),
                                             ("true", "minibatch"), ("false", "off")])
def test_norm_adv_takes_a_scope_or_cleanrl_boolean(value, expected):
    # CleanRL's --norm-adv True normalises per minibatch: `true` means the same here.
    assert compose_settings(f"ppo.norm_adv={value}").ppo.norm_adv == expected


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml")))
def test_every_experiment_file_composes_into_valid_settings(experiment):
    # A preset that no longer composes (a renamed key, a removed env file) fails here, not in a
    # user's 10M-step run; each changes the run away from the defaults it starts from.
    settings = compose_settings(f"+experiment={experiment}")
    assert settings != compose_settings(f"env={settings.env.id}")
    assert settings.batch_size % settings.ppo.num_minibatches == 0


@pytest.mark.parametrize("task, preset, shape, rate, epochs, minibatches", [
    ("Walker2d-v4", "mjwarp_walker2d", (256, 32), 3e-4, 4, 2),  # the shared values, longer rollouts
    ("Hopper-v4", "mjwarp_hopper", (1024, 8), 5e-4, 5, 4),      # rl_games' Hopper values over them
])
def test_mjwarp_presets_win_over_the_env_file_given_on_the_command_line(task, preset, shape, rate, epochs,
                                                                         minibatches):
    # As scripts/reproduce_baselines.py runs them: `+experiment=mjwarp_<task> env=<Task>-v4`; the env file's
    # own PPO values (Hopper-v4: 8 envs x 256 steps, 32 minibatches x 10 epochs) must not leak in.
    settings = compose_settings(f"+experiment={preset}", f"env={task}")
    assert (settings.env.id, settings.env.backend, settings.env.num_envs, settings.ppo.num_steps) == (
        task, "mjwarp", *shape)
    assert (settings.ppo.learning_rate, settings.ppo.update_epochs, settings.ppo.num_minibatches) == (
        rate, epochs, minibatches)
    assert settings.ppo.adaptive_lr_kl == 0.008 and settings.model.hidden_sizes == (256, 128, 64)


def test_the_mjwarp_ant_preset_takes_every_sample_factory_value_over_the_shared_ones():
    # mjwarp_ant stacks sample_factory_ppo on mjwarp_ppo (rl_games' values): none of rl_games' may show
    # through, and the presets' shape and TF32 stay.
    ant = compose_settings("+experiment=mjwarp_ant", "env=Ant-v4")
    sf = compose_settings("+experiment=sample_factory_ppo", "env=Ant-v4")
    assert dataclasses.replace(ant.ppo, num_steps=sf.ppo.num_steps, num_minibatches=sf.ppo.num_minibatches,
                               matmul_precision=sf.ppo.matmul_precision) == sf.ppo
    assert ant.model == sf.model and ant.ppo.norm_adv == "minibatch"
    assert (ant.env.backend, ant.env.num_envs, ant.ppo.num_steps, ant.ppo.num_minibatches) == ("mjwarp", 1024, 8, 8)
    assert ant.ppo.matmul_precision == "tf32" and sf.ppo.matmul_precision == "ieee"


def test_the_ant_10m_experiment_normalises_over_the_batch_as_rl_games():
    assert compose_settings("+experiment=ant_10m").ppo.norm_adv == "batch"
    assert compose_settings().ppo.norm_adv == "minibatch"


def test_norm_adv_means_the_same_when_settings_are_built_in_code():
    assert PPOSettings(norm_adv=True).norm_adv == "minibatch" and PPOSettings(norm_adv=False).norm_adv == "off"
    with pytest.raises(ConfigError, match="`ppo.norm_adv` must be one of"):
        PPOSettings(norm_adv="global")


def test_env_groups_auto_pipelines_two_groups_on_cuda_only():
    import torch

    from ppo.envs import env_groups

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compose_settings().env.groups == "auto"
    assert env_groups(compose_settings().env, cuda) == 2
    assert env_groups(compose_settings().env, cpu) == 1
    assert env_groups(compose_settings("env.num_envs=9").env, cuda) == 1  # no even split
    assert env_groups(compose_settings("env.groups=4").env, cpu) == 4


def test_pin_threads_auto_pins_only_a_cpu_run_that_owns_every_core(monkeypatch):
    # envpool pins thread i to CPU i in every process, so `auto` pins only where this run's threads
    # are one per CPU and it may use them all: never a partial pool, a restricted CPU set or a GPU run.
    import os

    import torch

    from ppo.envs import pins_threads

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    env = compose_settings().env  # 64 envs, threads 0: one per CPU
    assert env.pin_threads == "auto"
    assert pins_threads(env, cpu) and not pins_threads(env, cuda)
    assert not pins_threads(compose_settings("env.num_threads=2").env, cpu)  # room left for other runs
    assert pins_threads(compose_settings("env.num_threads=4").env, cpu)
    assert not pins_threads(compose_settings("env.num_envs=2").env, cpu)  # 2 threads for 2 envs
    assert not pins_threads(compose_settings("env.backend=gymnasium").env, cpu)
    assert pins_threads(compose_settings("env.pin_threads=true").env, cuda)
    assert not pins_threads(compose_settings("env.pin_threads=false").env, cpu)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 4, 5}, raising=False)  # taskset elsewhere
    assert not pins_threads(env, cpu)
