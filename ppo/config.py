"""Typed, validated run settings. `hydra_edge.py` builds them from the composed Hydra config; nothing
below `train.py` and it imports Hydra or omegaconf."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import re
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A bad setting, reported as one line naming the key, before any environment starts."""


@dataclass(frozen=True)
class EnvSettings:
    id: str = "Ant-v4"
    num_envs: int = 64
    # envpool | gymnasium | mjwarp | auto: envpool where it is installed (pip installs it on Linux x86-64
    # only) and the id is not a `module:Id`, else gymnasium; resolved on construction (__post_init__), so the
    # settings name the simulator.
    # mjwarp: MuJoCo Warp worlds on the run's device (ppo.envs.mjwarp; pip install -e ".[mjwarp]")
    backend: str = "auto"
    num_threads: int = 0  # envpool worker threads; 0: one per env up to the CPU count
    # Split the envs into this many simulators, stepped as a pipeline: while one group simulates,
    # the policy acts for the next (ppo.collect). 1: one simulator, stepped in lockstep; auto: 2 on
    # CUDA where num_envs is even, else 1 (ppo.envs.env_groups says why)
    groups: int | str = "auto"
    # Pin envpool's worker threads, one per CPU (envpool's thread_affinity_offset). auto: on a CPU
    # run whose threads number the machine's CPUs, all usable by this one process (ppo.envs.pins_threads)
    pin_threads: bool | str = "auto"

    def __post_init__(self):
        # Here, so that no "auto" reaches code that picks a simulator by name, and a run's settings
        # (run_info.json, checkpoints, a resume's comparison) record the simulator it used. Looked up
        # without importing envpool: an envpool that is installed but fails to import gets
        # check_env_id's one-line error, as when asked for by name.
        if self.backend == "auto":  # a `module:Id` is a task its module registers with gymnasium, not envpool's
            found = importlib.util.find_spec("envpool") is not None and ":" not in self.id
            object.__setattr__(self, "backend", "envpool" if found else "gymnasium")


NORM_ADV_CHOICES = ("minibatch", "batch", "off")
# `model.activation`'s choices, each the name of its torch.nn module (ppo.agent builds it; torch-free here)
ACTIVATIONS = {"tanh": "Tanh", "elu": "ELU", "relu": "ReLU"}
FUSED_PRECISIONS = ("tf32", "tf32x3", "ieee")
MATMUL_PRECISIONS = ("ieee", "tf32")


@dataclass(frozen=True)
class PPOSettings:
    num_steps: int = 32  # steps per env per iteration; the batch is num_envs * num_steps
    learning_rate: float = 3e-4
    anneal_lr: bool = True
    # rl_games' adaptive schedule when set: after each epoch the rate is divided by 1.5 if that
    # epoch's mean approx KL exceeds twice this, multiplied by 1.5 below half of it; replaces anneal_lr
    adaptive_lr_kl: float | None = None
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 32
    update_epochs: int = 10
    # minibatch (CleanRL) | batch (once over the batch, rl_games) | off; CleanRL's boolean --norm-adv
    # is accepted too: true normalises per minibatch, false is off (see __post_init__)
    norm_adv: str | bool = "minibatch"
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    normalize_observations: bool = True
    normalize_rewards: bool = True
    normalize_values: bool = False  # the critic learns returns in units of their running mean/std (rl_games)
    observation_clip: float = 10.0
    reward_clip: float = 10.0
    compile: bool | str = "auto"  # torch.compile the update; auto: CUDA, and long CPU runs (ppo.update.compiles)
    cuda_graphs: bool = True  # on one CUDA device, replay collection steps and update epochs as CUDA graphs
    # each minibatch step as two Triton kernels (ppo.fused_update): auto (on one CUDA device wherever the
    # model allows it; see ppo.update.fused.fuses), true (an error where it cannot run) or false
    fused_update: bool | str = "auto"
    # the fused step's matrix products: tf32x3 (three tensor-core products of split inputs: fp32-like),
    # tf32 (one: the inputs read to 10 mantissa bits, as JAX's default float32 matmul on these GPUs)
    # or ieee (fp32 FMAs, as torch's default)
    fused_precision: str = "tf32x3"
    # torch's float32 matrix products on CUDA (the update's and the policy's, where not fused): ieee (fp32,
    # torch's default) or tf32 (tensor cores, inputs read to 10 mantissa bits: ~7x the fp32 peak on an H100)
    matmul_precision: str = "ieee"

    def __post_init__(self):
        # Here, not in the config parser, so that settings built in code mean the same: a bool that
        # slipped through would otherwise compare unequal to every name and silently turn it off.
        norm_adv = self.norm_adv
        if isinstance(norm_adv, bool):
            norm_adv = "minibatch" if norm_adv else "off"
        if norm_adv not in NORM_ADV_CHOICES:
            raise ConfigError(f"`ppo.norm_adv` must be one of {', '.join(NORM_ADV_CHOICES)}, got {norm_adv!r}")
        object.__setattr__(self, "norm_adv", norm_adv)
        if self.fused_update not in (True, False, "auto"):
            raise ConfigError(f"`ppo.fused_update` must be auto, true or false, got {self.fused_update!r}")
        if self.fused_precision not in FUSED_PRECISIONS:
            raise ConfigError(f"`ppo.fused_precision` must be one of {', '.join(FUSED_PRECISIONS)}, "
                              f"got {self.fused_precision!r}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(f"`ppo.matmul_precision` must be one of {', '.join(MATMUL_PRECISIONS)}, "
                              f"got {self.matmul_precision!r}")


@dataclass(frozen=True)
class ModelSettings:
    hidden_sizes: tuple[int, ...] = (64, 64)
    init_log_std: float = 0.0
    activation: str = "tanh"  # tanh | elu | relu
    shared_trunk: bool = False  # one MLP body for actor and critic, two linear heads (rl_games' separate: False)


@dataclass(frozen=True)
class CheckpointSettings:
    every: int = 50  # iterations; 0 turns periodic checkpoints off (the final one is still written)


@dataclass(frozen=True)
class VideoSettings:
    every: int = 0  # iterations between recorded evaluation episodes; 0: none
    width: int = 320
    height: int = 240
    max_steps: int = 1000  # frames of one video at most (an episode may end sooner)


@dataclass(frozen=True)
class LoggerSettings:
    wandb: bool = False  # mirror scalars, config and videos to Weights & Biases (pip install -e ".[wandb]")
    project: str = "ppo-triton"
    entity: str | None = None
    group: str | None = None  # default: a sweep's dir, so its jobs are grouped; none for a single run


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 1
    total_timesteps: int = 1_000_000
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    resume: str | None = None
    torch_threads: int = 0  # 0: one (see ppo.trainer)
    log_every_s: float = 2.0  # console progress line at most this often
    env: EnvSettings = field(default_factory=EnvSettings)
    ppo: PPOSettings = field(default_factory=PPOSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    video: VideoSettings = field(default_factory=VideoSettings)
    logger: LoggerSettings = field(default_factory=LoggerSettings)

    @property
    def batch_size(self) -> int:
        return self.env.num_envs * self.ppo.num_steps


# Settings that change how or where a run executes, not what it learns: a resumed run may change them
# freely (and scripts/summarize_results.py pools runs that differ only in these).
EXECUTION_KEYS = frozenset({
    "total_timesteps", "device", "resume", "torch_threads", "log_every_s", "checkpoint.every",
    "video.every", "video.width", "video.height", "video.max_steps",
    "logger.wandb", "logger.project", "logger.entity", "logger.group",
    "env.num_threads", "env.groups", "env.pin_threads", "ppo.compile", "ppo.cuda_graphs"})


def flat_settings(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"ppo.gamma": 0.99, ...}` from a nested settings dict, lists as tuples (as the settings hold them)."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return flat


def learning_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """`(key, saved value, current value)` for each setting outside EXECUTION_KEYS that differs
    between two nested settings dicts; keys only one of them knows (older or newer code) are skipped."""
    old, new = flat_settings(saved), flat_settings(current)
    return [(key, old[key], new[key]) for key in sorted(old.keys() & new.keys())
            if key not in EXECUTION_KEYS and old[key] != new[key]]


def settings_from_dict(config: dict[str, Any]) -> TrainSettings:
    """Build and validate `TrainSettings` from a plain nested dict; unknown keys are errors."""
    settings = _build(TrainSettings, config, "")
    _validate(settings)
    return settings


def setting_keys(cls: type = TrainSettings, prefix: str = "") -> list[str]:
    """The dotted name of every setting and group of settings: `seed`, `ppo`, `ppo.learning_rate`, ..."""
    keys = []
    for f in dataclasses.fields(cls):
        keys.append(f"{prefix}{f.name}")
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            keys += setting_keys(f.default_factory, f"{prefix}{f.name}.")
    return keys


def check_setting_key(key: str) -> None:
    """A ConfigError unless the dotted `key` names a setting or a group of settings."""
    if key not in setting_keys():
        raise unknown_setting(key)


def unknown_setting(key: str) -> ConfigError:
    """The error for a dotted key that names no setting, with the one it most likely meant: the setting
    of that name in another group (`learning_rate` -> `ppo.learning_rate`, as CleanRL's flags are
    flat), else the closest spelling (`ppo.lerning_rate`); without one, the group's settings."""
    keys = setting_keys()
    name = key.rpartition(".")[2]
    meant = [k for k in keys if k.rpartition(".")[2] == name] or difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    if meant:
        return ConfigError(f"unknown setting `{key}`: did you mean `{meant[0]}`?")
    groups = {k.rpartition(".")[0] for k in keys}  # "": the top level
    group = key.rpartition(".")[0]
    while group not in groups:  # the deepest group of settings the key starts in
        group = group.rpartition(".")[0]
    known = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == group)
    where = f" in `{group}`" if group else ""
    return ConfigError(f"unknown setting `{key}` (known{where}: {', '.join(known)})")


def _build(cls: type, values: dict[str, Any], prefix: str):
    if not isinstance(values, dict):
        raise ConfigError(f"`{prefix.rstrip('.')}` must be a group of settings, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise unknown_setting(f"{prefix}{unknown[0]}")
    kwargs = {}
    for name, value in values.items():
        f = fields[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(f"{prefix}{name}", value, default, f.type)
    return cls(**kwargs)


def _coerce(key: str, value: Any, default: Any, annotation: str = "") -> Any:
    """Check `value` against the field's type (its default's, or `annotation` where the default is
    None or a switch), converting lists to tuples."""
    if annotation == "bool | str":  # a switch: true, false, or auto (picks itself per device)
        if not (isinstance(value, bool) or value == "auto"):
            raise ConfigError(f"`{key}` must be true, false or auto, got {value!r}")
        return value
    if annotation == "int | str":  # a count, or auto (picks itself per device)
        if value != "auto" and not (_is_int(value) and value > 0):
            raise ConfigError(f"`{key}` must be a positive integer or auto, got {value!r}")
        return value
    if annotation == "str | bool":  # a named choice that also takes a boolean (the class maps it)
        if not isinstance(value, (str, bool)):
            raise ConfigError(f"`{key}` must be a name or true/false, got {value!r}")
        return value
    if value is None:
        if default is None:
            return None
        raise ConfigError(f"`{key}` must be set (default {default!r})")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` must be true or false, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, float) and value.is_integer():  # `total_timesteps=1e6`: YAML reads a float
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{key}` must be an integer, got {value!r}")
    elif isinstance(default, float) or annotation == "float | None":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"`{key}` must be a number, got {value!r}")
        if not math.isfinite(value):  # a NaN passes every comparison; an inf learning rate NaNs the weights
            raise ConfigError(f"`{key}` must be a finite number, got {value!r}")
        return float(value)
    elif isinstance(default, tuple):
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
            raise ConfigError(f"`{key}` must be a list of integers, got {value!r}")
        return tuple(value)
    elif isinstance(default, str) or default is None:
        if not isinstance(value, str):
            raise ConfigError(f"`{key}` must be a string, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(s: TrainSettings) -> None:
    def positive(key: str, value: float) -> None:
        if not value > 0:
            raise ConfigError(f"`{key}` must be positive, got {value}")

    def unit(key: str, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"`{key}` must be in [0, 1], got {value}")

    check_seed(s.seed)
    positive("total_timesteps", s.total_timesteps)
    positive("env.num_envs", s.env.num_envs)
    if s.env.groups != "auto" and s.env.num_envs % s.env.groups:
        raise ConfigError(f"`env.groups` ({s.env.groups}) must divide `env.num_envs` ({s.env.num_envs}); "
                          f"{nearest_divisors(s.env.num_envs, s.env.groups)}")
    positive("ppo.num_steps", s.ppo.num_steps)
    positive("ppo.num_minibatches", s.ppo.num_minibatches)
    positive("ppo.update_epochs", s.ppo.update_epochs)
    positive("ppo.learning_rate", s.ppo.learning_rate)
    positive("ppo.clip_coef", s.ppo.clip_coef)
    positive("ppo.max_grad_norm", s.ppo.max_grad_norm)
    positive("ppo.observation_clip", s.ppo.observation_clip)
    positive("ppo.reward_clip", s.ppo.reward_clip)
    positive("log_every_s", s.log_every_s)
    positive("video.width", s.video.width)
    positive("video.height", s.video.height)
    positive("video.max_steps", s.video.max_steps)
    if s.ppo.target_kl is not None:
        positive("ppo.target_kl", s.ppo.target_kl)
    if s.ppo.adaptive_lr_kl is not None:
        positive("ppo.adaptive_lr_kl", s.ppo.adaptive_lr_kl)
    unit("ppo.gamma", s.ppo.gamma)
    unit("ppo.gae_lambda", s.ppo.gae_lambda)
    for key, value in (("ppo.ent_coef", s.ppo.ent_coef), ("ppo.vf_coef", s.ppo.vf_coef),
                       ("env.num_threads", s.env.num_threads), ("torch_threads", s.torch_threads),
                       ("checkpoint.every", s.checkpoint.every), ("video.every", s.video.every)):
        if value < 0:
            raise ConfigError(f"`{key}` must be non-negative, got {value}")
    if not s.model.hidden_sizes or any(h <= 0 for h in s.model.hidden_sizes):
        raise ConfigError(
            f"`model.hidden_sizes` must be a non-empty list of positive sizes, got {list(s.model.hidden_sizes)}"
        )
    if s.batch_size % s.ppo.num_minibatches:
        raise ConfigError(
            f"`ppo.num_minibatches` ({s.ppo.num_minibatches}) must divide the batch, env.num_envs x ppo.num_steps "
            f"= {s.env.num_envs} x {s.ppo.num_steps} = {s.batch_size}; "
            f"{nearest_divisors(s.batch_size, s.ppo.num_minibatches)}"
        )
    if s.model.activation not in ACTIVATIONS:
        raise ConfigError(f"`model.activation` must be one of {', '.join(ACTIVATIONS)}, got {s.model.activation!r}")
    if s.env.backend not in ("envpool", "gymnasium", "mjwarp"):
        raise ConfigError(f"`env.backend` must be envpool, gymnasium, mjwarp or auto, got {s.env.backend!r}")
    if s.env.pin_threads is True and s.env.backend != "envpool":
        raise ConfigError("`env.pin_threads=true` pins envpool's threads; `env.backend` is "
                          f"{s.env.backend} (use auto or false)")
    check_device_name(s.device)


def nearest_divisors(total: int, value: int) -> str:
    """The divisors of `total` nearest `value` (which does not divide it), below and above: what to try."""
    divisors = {d for i in range(1, math.isqrt(total) + 1) if total % i == 0 for d in (i, total // i)}
    below = max(d for d in divisors if d < value)  # 1 at least
    above = min((d for d in divisors if d > value), default=None)
    return f"the nearest that do: {below} and {above}" if above else f"the nearest that does: {below}"


def check_seed(seed: int, setting: str = "seed") -> None:
    """numpy seeds its global generator from [0, 2**32) only; torch and Python take any of those."""
    if not 0 <= seed < 2**32:
        raise ConfigError(f"`{setting}` must be in [0, 2**32 - 1], got {seed}")


def check_device_name(name: str, setting: str = "device") -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", name):
        raise ConfigError(f"`{setting}` must be auto, cpu, cuda or cuda:N, got {name!r}")


def resolve_device(name: str, setting: str = "device"):
    """The `torch.device` a `device` setting names (`auto`: CUDA if available), or a ConfigError
    when it names a GPU this machine does not have. `setting`: how the caller's user spells the
    option in the error (train.py's `device`, a script's `--device`)."""
    import torch  # here, so that this module stays torch-free for the code that only checks settings

    check_device_name(name, setting)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"`{setting}={name}` but CUDA is not available here (try {setting}=cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"`{setting}={name}` but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device
