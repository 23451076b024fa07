"""`env.backend=gymnasium`: gymnasium's synchronous vector envs, on any machine, for any registered id whose
spaces PPO here trains (a 1-D Box of actions; a Box of observations, or a Dict of Boxes)."""

from __future__ import annotations

import torch

from ppo.config import ConfigError, EnvSettings
from ppo.envs.interface import NumpyVecEnv, VecEnv, check_spaces, import_task_module, print_mujoco_warnings_once


def known_ids(settings: EnvSettings, option: str) -> set[str]:
    """Every registered id, and `settings.id` itself where it is `module:Id` and its module, imported here,
    registers `Id` (a ConfigError in one line where the module does not import, or registers no `Id`)."""
    import gymnasium

    name = import_task_module(settings.id)
    known = set(gymnasium.registry.keys())
    if name != settings.id:
        if name not in known:
            module = settings.id.rpartition(":")[0]
            mine = sorted(key for key, spec in gymnasium.registry.items() if _module_of(spec).startswith(module))
            has = f"; it registers {', '.join(mine)}" if mine else "; it registers no gymnasium id"
            raise ConfigError(f"env.id={settings.id}: module {module!r} imports, but no {name!r} is registered{has}")
        known.add(settings.id)
    return known


def _module_of(spec) -> str:
    entry = spec.entry_point
    return entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")


def check(settings: EnvSettings, option: str) -> None:
    """That the package behind the id imports, and that PPO here can train the task's spaces (from one env,
    made and closed: gymnasium tells them no other way)."""
    _check_dependencies(settings.id)
    check_spaces(settings.id, *spaces(settings))


def spaces(settings: EnvSettings) -> tuple[object, object]:
    """From one env of the task, made and closed."""
    import gymnasium

    print_mujoco_warnings_once()
    try:
        env = gymnasium.make(settings.id)
    except gymnasium.error.DependencyNotInstalled as error:
        raise ConfigError(f"{settings.id} needs a package that is not installed here: {error}") from error
    except Exception as error:  # a user's task may raise anything as it is made
        detail = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(f"env.id={settings.id}: gymnasium.make fails ({type(error).__name__}: {detail})") from error
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def version() -> str:
    """e.g. "gymnasium 1.4.0, MuJoCo 3.3.7": the MuJoCo its tasks run on, where it is installed."""
    import gymnasium

    name = f"gymnasium {gymnasium.__version__}"
    try:
        import mujoco
    except ImportError:
        return name
    return f"{name}, MuJoCo {mujoco.mj_versionString()}"


def make(settings: EnvSettings, device: torch.device, seed: int, first_cpu: int) -> VecEnv:
    return GymnasiumEnvs(settings, device)


def _check_dependencies(env_id: str) -> None:
    """Import the module behind a gymnasium id, without making an env: a task whose package is missing
    (Box2D's BipedalWalker-v3) says so in one line here, rather than in a traceback from inside the run."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry_point = gymnasium.spec(env_id.rpartition(":")[2]).entry_point
    if isinstance(entry_point, str):  # else a callable: imported already
        try:
            load_env_creator(entry_point)
        except gymnasium.error.DependencyNotInstalled as error:
            raise ConfigError(f"{env_id} needs a package that is not installed here: {error}") from error


class GymnasiumEnvs(NumpyVecEnv):
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


