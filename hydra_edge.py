"""What train.py needs from Hydra, and only train.py imports: its config turned into typed settings,
the run dir's lock taken before Hydra writes there, the checks a command and a sweep pass before
anything trains, and the callbacks configs/train.yaml names (`Sweep`, `RunDirLock`)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import itertools
import logging
import math
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import hydra.core.utils as hydra_utils
import torch
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # how it lists a grid's jobs: public in all 1.x
from hydra._internal.utils import get_args_parser  # hydra.main's own command-line parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, Override, OverrideType
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ppo.config import ConfigError, TrainSettings, check_setting_key, resolve_device, settings_from_dict
from ppo.envs import check_env_id, observation_action_size
from ppo.run import records as run_records
from ppo.run.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from ppo.run.resources import check_resources
from ppo.run.signals import EXIT_REFUSED, StopOnSignal, interrupt_on_signals

ROOT = Path(__file__).resolve().parent


def _save_record_or_refuse(save):
    """Hydra's writer of a run dir's `.hydra/` record (config, hydra, overrides), wrapped: where the disk is
    full (or the dir unwritable) Hydra would end in a traceback of its own; here one line, the new run dir
    removed, and exit 2 (refused: nothing was trained)."""
    def saved(cfg, filename: str, output_dir: Path) -> None:
        try:
            save(cfg, filename, output_dir)
        except OSError as error:
            run_dir = str(Path(output_dir).parent)
            removed = run_records.discard_if_new(run_dir)
            print(f"error: cannot write the run's record {Path(output_dir) / filename}: {error.strerror or error}"
                  + (f"; its new run dir was removed ({run_dir})" if removed else ""), file=sys.stderr, flush=True)
            sys.exit(EXIT_REFUSED)

    return saved


if callable(getattr(hydra_utils, "_save_config", None)):  # Hydra 1.x; elsewhere its own traceback
    hydra_utils._save_config = _save_record_or_refuse(hydra_utils._save_config)

# Optuna imports alembic, whose INFO lines on its plugins Hydra's console logger would print at the
# start of every search (7 lines of `[HYDRA] setup plugin alembic...`).
logging.getLogger("alembic").setLevel(logging.WARNING)


def checked(cfg: DictConfig) -> tuple[TrainSettings, torch.device]:
    """A command's settings and device, after the checks that need no simulator: a ConfigError names
    the first key that fails. Every run passes them before it starts, and a sweep runs them on each of
    its jobs before the first one starts (`Sweep.on_multirun_start`)."""
    settings = settings_of(cfg)
    if settings.logger.wandb and settings.logger.group is None:  # a sweep's jobs: one W&B group
        settings = dataclasses.replace(settings, logger=dataclasses.replace(settings.logger, group=sweep_dir()))
    check_env_id(settings.env)
    device = resolve_device(settings.device)
    check_resources(settings, device, lambda: observation_action_size(settings.env))
    if settings.resume:
        try:
            # Read here as well as in train(): a file that is no checkpoint is refused before a run dir is
            # made, and before a sweep's first job. The default model's is about 0.2 MB (Ant-v4).
            load_checkpoint(resolve_checkpoint(settings.resume), torch.device("cpu"))
        except (FileNotFoundError, CheckpointError) as error:
            raise ConfigError(f"resume={settings.resume}: {error}") from error
    return settings, device


def sweep_dir() -> str | None:
    """The sweep's dir for one of its jobs, None for a single run."""
    from hydra.types import RunMode

    try:
        config = HydraConfig.get()
    except ValueError:  # no Hydra run (a test composing the config)
        return None
    return str(config.sweep.dir) if config.mode == RunMode.MULTIRUN else None


def settings_of(cfg: DictConfig) -> TrainSettings:
    """The settings of a composed config; a ConfigError names the first value that fails its check.
    These checks ask nothing of the machine: checked() adds those that do."""
    return settings_from_dict(OmegaConf.to_container(cfg, resolve=True))


def refuse(message: str, code: int) -> NoReturn:
    """A command that fails its checks before training: print `message`, remove the run dir Hydra
    made for it (it holds nothing but Hydra's `.hydra/` record of the command, so a typo leaves no
    empty run behind), and exit with `code`."""
    print(message, file=sys.stderr)
    run_records.restore_record()  # a refused resume in place leaves its run's record as it was
    run_records.remove_if_unused(HydraConfig.get().runtime.output_dir)
    sys.exit(code)


def command_line_keys() -> frozenset[str]:
    """The setting keys this command sets itself (`key=value`): a resume may change those on purpose."""
    return frozenset(map(run_records.override_key, HydraConfig.get().overrides.task))


def claim_run_dir(run_dir: str, resume: str | None) -> None:
    """Lock the run dir for this process (`ppo.run.records.claim`), or exit 2 (refused) with one line: where
    another run trains there, where it cannot be made or opened (Hydra's own mkdir would raise a traceback)
    or where it holds another run's checkpoint that this command does not resume
    (`check_not_another_runs`). The refused run exits without touching the dir: even one that holds
    nothing but `.hydra/` yet is the other run's."""
    try:
        run_records.claim(run_dir)
    except run_records.RunDirInUse as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    except OSError as error:
        print(f"error: run dir {run_dir} cannot be made or written: {error.strerror} (hydra.run.dir)", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    try:
        run_records.check_not_another_runs(run_dir, resume)
    except run_records.AnotherRunsDir as error:
        run_records.release(run_dir)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)


@contextlib.contextmanager
def run_dir_claimed(run_dir: str, resume: str | None) -> Iterator[None]:
    """Hold the run dir's lock while this process trains into it. A single run has claimed it already,
    in `RunDirLock`; a sweep's job claims its own here, and lets it go when done."""
    claim_run_dir(run_dir, resume)
    try:
        yield
    finally:
        run_records.release(run_dir)


class Sweep(Callback):
    """A sweep's checks, its last line (configs/train.yaml's `hydra.callbacks`), and the jobs it has begun,
    so that a sweep stopped by a signal can say which of its jobs never ran."""

    jobs: list[str] = []  # a grid sweep's jobs (`#<number> <overrides>`), in the order they run
    started = 0  # jobs begun (Hydra's on_job_start: after it wrote the job's .hydra/, before main)

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        Sweep.started += 1
        StopOnSignal.ended = False  # this job has not trained yet

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """Check a sweep's jobs before the first one starts. Each job checks itself anyway, but only when
        its turn comes: `ppo.num_minibatches=32,7 seed=1,2` would train both jobs with 32 (hours, maybe)
        and then stop the sweep at the first with 7, and the last job would never run.
        A grid's jobs are checked one by one. An Optuna search picks its trials as it goes, so its space
        is checked instead, at its corners (search_space_corners). Other sweepers' jobs check themselves.
        A launcher that runs the jobs elsewhere (SLURM) gets the value checks only: the GPU, envpool
        and the checkpoints the jobs need are on the machines that run them, not on this one."""
        if not str(config.hydra.sweep.dir).strip():
            print("error: hydra.sweep.dir is empty: give the sweep a dir of its own (or leave it to the default)",
                  file=sys.stderr)
            sys.exit(EXIT_REFUSED)
        sweeper = config.hydra.sweeper._target_
        grid = sweeper == f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
        if grid:
            jobs, what, first, none_started = grid_jobs(config), "jobs of this sweep", "first", "none was started"
            Sweep.jobs = swept_names(jobs)
        elif sweeper.endswith(".OptunaSweeper"):
            jobs, what = search_space_corners(config), "corners of this search space"
            first, none_started = "first trial", "no trial was started"
        else:
            return
        if not jobs:  # a sweep Hydra cannot expand: let it say why, as without this check
            return
        here = config.hydra.launcher._target_.rsplit(".", 1)[-1] in ("BasicLauncher", "JoblibLauncher", "LocalLauncher")
        check = checked if here else settings_of
        if len(jobs) >= 20:  # Hydra composes each job's config in 0.1-0.15 s (2-core CPU)
            print(f"checking the {len(jobs)} {what} before the {first} starts...", flush=True)
        loader = GlobalHydra.instance().config_loader()
        failed = []  # (job, why)
        for name, overrides in jobs:
            try:
                job_cfg = loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides))
            except HydraException:  # a job Hydra cannot compose (a sweep config's params name no file): Hydra says so
                return
            with open_dict(job_cfg):
                del job_cfg["hydra"]  # what the job's main() receives
            try:
                check(job_cfg)
            except ConfigError as error:
                failed.append((name, str(error)))
        if failed:
            if grid:  # each job, as each is one the sweep would run
                lines = [f"  {name}: {why}" for name, why in failed]
            else:  # one corner per reason: the rest differ only in values the reason does not depend on
                by_reason = {}
                for name, why in failed:
                    by_reason.setdefault(why, []).append(name)
                lines = [f"  {names[0]}: {why}" + f" (and {len(names) - 1} more corners)" * (len(names) > 1)
                         for why, names in by_reason.items()]
            shown = lines[:10] + [f"  ... and {len(lines) - 10} more"] * (len(lines) > 10)
            if not grid:
                what += (" (each choice, each integer of a short range, the ends of others, a value inside a float "
                         "range)")
            print(f"error: {len(failed)} of {len(jobs)} {what} fail their checks, so {none_started}:", *shown,
                  sep="\n", file=sys.stderr)
            sys.exit(EXIT_REFUSED)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """After the last job: where the runs are, and the command that ranks them. Hydra itself ends a
        sweep on the last job's last line."""
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = len(list(sweep_dir.glob("*/run_info.json")))
        script = ROOT / "scripts" / "summarize_sweep.py"
        if script.is_relative_to(Path.cwd()):  # as typed from the repo root; else a path that works from here
            script = script.relative_to(Path.cwd())
        print(f"sweep finished: {runs} run{'s' * (runs != 1)} in {sweep_dir}; one table and plot of them: "
              f"python {shlex.quote(str(script))} {shlex.quote(str(sweep_dir))}", flush=True)


def swept_names(jobs: list[tuple[str, list[str]]]) -> list[str]:
    """Each job as `#<number>` and the overrides that differ between the jobs (`#1 seed=2`): what tells
    one job from another, without the settings they share."""
    values: dict[str, set[str]] = {}
    for _, overrides in jobs:
        for override in overrides:
            values.setdefault(run_records.override_key(override), set()).add(override)
    swept = {key for key, seen in values.items() if len(seen) > 1}
    return [" ".join([name.split()[0], *(o for o in overrides if run_records.override_key(o) in swept)])
            for name, overrides in jobs]


def jobs_never_run(current_ran: bool) -> str | None:
    """For a grid sweep that a signal stops: the line naming its jobs that never ran (the current one too,
    unless `current_ran`: it trained, or ended); None outside a grid sweep, or where every job ran."""
    never = Sweep.jobs[Sweep.started - (0 if current_ran else 1):] if Sweep.jobs else []
    if not never:
        return None
    shown = "; ".join(never[:5]) + (f"; and {len(never) - 5} more" if len(never) > 5 else "")
    return f"the sweep stopped there; of its {len(Sweep.jobs)} jobs these never ran: {shown}"


class RunDirLock(Callback):
    """A single run claims its dir (`claim_run_dir`) before Hydra writes its `.hydra/` record there
    (configs/train.yaml's `hydra.callbacks`): from train.py's main(), a run refused because another still
    trains in that dir would already have overwritten that run's record with its own. A sweep's jobs
    each get a dir of their own and claim it in main() (`run_dir_claimed`)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        interrupt_on_signals()  # from here a signal may leave a run dir: train.py removes it if new
        HydraConfig.instance().set_config(config)  # as Hydra's run_job does first: `${hydra:...}` in the dir resolves
        try:
            run_dir = OmegaConf.select(config, "hydra.run.dir", throw_on_resolution_failure=True)
        except OmegaConfBaseException as error:  # Hydra would fail too, in a traceback of its own formatting
            print(f"error: hydra.run.dir={OmegaConf.to_container(config.hydra.run)['dir']} does not resolve: "
                  f"{str(error).splitlines()[0]}", file=sys.stderr)
            sys.exit(EXIT_REFUSED)
        if not str(run_dir).strip():  # else the run's files would land in the working directory, unannounced
            print("error: hydra.run.dir is empty: give the run a dir of its own (or leave it to the default)",
                  file=sys.stderr)
            sys.exit(EXIT_REFUSED)
        resume = OmegaConf.select(config, "resume", default=None)  # the settings' checks come later
        claim_run_dir(str(run_dir), None if resume is None else str(resume))
        if resume is not None:
            run_records.keep_record(str(run_dir))


def sweep_arguments(config: DictConfig) -> list[str]:
    """What a sweeper expands into jobs, in the order both Hydra's basic sweeper and its Optuna sweeper
    read it: `hydra.sweeper.params` (a config's), then the command's overrides."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.params or {}).items()]
    return params + list(config.hydra.overrides.task)


def grid_jobs(config: DictConfig) -> list[tuple[str, list[str]]]:
    """A grid sweep's jobs, each as (`#<number> <overrides>`, its overrides), listed as Hydra's
    BasicSweeper.sweep lists them; [] if Hydra cannot."""
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    try:
        overrides = parser.parse_overrides(sweep_arguments(config))
        jobs = [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except HydraException:
        return []
    return [(f"#{number} {' '.join(job)}", job) for number, job in enumerate(jobs)]


def search_space_corners(config: DictConfig, most: int = 128, whole: int = 64) -> list[tuple[str, list[str]]]:
    """An Optuna search's corners, each as (its swept values, its overrides). A value the checks refuse
    there would stop the search at the first trial that draws one, after the trials before it have trained.
    - Discrete keys: every value of a `choice(...)`, every integer of an integer range of at most `whole`
      of them (`int(interval(4, 64))` minibatches: only the powers of two may divide the batch), the two
      ends of a longer one or of a float `range(...)`; in every combination while there are at most
      `most` of them, else each value once, beside the first value of the others. Checks that read
      several keys read these (`ppo.num_minibatches` must divide `env.num_envs` x `ppo.num_steps`).
    - A float `interval(...)`: its two ends and one value between, each beside the first value of the
      others. The checks on a float are bounds on that key alone (`ppo.gamma` in [0, 1]), which the
      ends meet if any value does, so its values are not combined with the others': four such ranges
      would otherwise take 16 times the combinations. The value between catches an integer key swept
      over a float range (`total_timesteps=interval(1e5,1e6)`), which passes at its two whole ends and
      fails at nearly every draw between them.
    [] if the plugin cannot parse the space."""
    try:
        from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
        from optuna.distributions import CategoricalDistribution
    except ImportError:
        return []
    try:  # as the plugin's OptunaSweeperImpl.sweep parses them (its older `search_space` key is not read)
        space, fixed = create_params_from_overrides(sweep_arguments(config))
    except Exception:  # the plugin's own errors are plain exceptions: it says why when it parses them next
        return []

    def continuous(dist) -> bool:
        """A float interval without a grid (optuna 2's (Log)UniformDistribution, 3's FloatDistribution)."""
        grid = getattr(dist, "step", None) or getattr(dist, "q", None)  # q: optuna 2's DiscreteUniformDistribution
        return not isinstance(dist, CategoricalDistribution) and not grid

    def tried(dist) -> list:
        if isinstance(dist, CategoricalDistribution):
            return list(dist.choices)
        step = getattr(dist, "step", None)  # an int for integer ranges (all optuna versions), else None or a float
        if isinstance(step, int) and isinstance(dist.low, int) and (dist.high - dist.low) // step < whole:
            return list(range(dist.low, dist.high + 1, step))
        ends = sorted({dist.low, dist.high})
        if continuous(dist):  # (3 - sqrt 5) / 2 of the way up: no round fraction, so an integer key gets one
            ends.insert(1, dist.low + (dist.high - dist.low) * (3 - math.sqrt(5)) / 2)
        return ends

    values = {name: tried(dist) for name, dist in space.items() if name not in fixed}
    names = list(values)
    firsts = [v[0] for v in values.values()]

    def beside_firsts(i: int, value) -> tuple:
        return tuple(firsts[:i] + [value] + firsts[i + 1:])

    discrete = [i for i, name in enumerate(names) if not continuous(space[name])]
    if math.prod(len(values[names[i]]) for i in discrete) <= most:
        picks = []
        for combination in itertools.product(*(values[names[i]] for i in discrete)):
            pick = list(firsts)
            for i, value in zip(discrete, combination, strict=True):
                pick[i] = value
            picks.append(tuple(pick))
    else:
        picks = [beside_firsts(i, value) for i in discrete for value in values[names[i]]]
    picks += [beside_firsts(i, value) for i, name in enumerate(names) if i not in discrete for value in values[name]]
    corners = []
    for pick in dict.fromkeys(picks):
        swept = [f"{name}={value}" for name, value in zip(names, pick, strict=True)]
        corners.append((" ".join(swept), swept + [f"{name}={value}" for name, value in fixed.items()]))
    return corners


CONFIGS = ROOT / "configs"


def check_command_line(arguments: list[str]) -> None:
    """Refuse, in one line that names what was most likely meant, a command that changes a setting
    that does not exist (`ppo.lerning_rate=1`, CleanRL's flat `learning_rate=1`) or picks a config
    file that does not exist (`env=Hoper-v4`, `+experiment=ant10m`). Hydra would refuse both too: the
    first with advice to add the key (`+ppo.lerning_rate=1`) that leads only to the settings' own
    refusal, the second in a list of the files, with no word on `env.id`, which runs any id without
    one; a `glob(...)` that matches no file is refused too. `~key`, `key@package`, Hydra's own groups
    and keys, and `${...}` values are left to Hydra, and so is a command that reads configs from
    elsewhere (`--config-dir`, ...)."""
    try:
        # Quietly: what argparse prints and exits on (a flag it refuses, `--version`), Hydra prints next.
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = get_args_parser().parse_args(arguments)
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except (SystemExit, HydraException):
        return
    if args.config_path or args.config_dir or args.config_name or args.shell_completion:
        return
    if any(o.key_or_group.startswith("hydra.searchpath") for o in overrides):
        return
    groups = {path.name: sorted(p.stem for p in path.glob("*.yaml")) for path in CONFIGS.iterdir() if path.is_dir()}
    for override in overrides:
        key = override.key_or_group
        if override.type == OverrideType.DEL or override.package is not None:
            continue
        if "/" in key or key.split(".")[0] == "hydra":  # Hydra's own groups and keys
            continue
        try:
            if key in groups:
                check_config_file(key, groups[key], override)
            elif override.type == OverrideType.CHANGE:
                check_setting_key(key)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(EXIT_REFUSED)


def check_config_file(group: str, files: list[str], override: Override) -> None:
    """A ConfigError if `group=NAME` (each NAME of a `a,b` or `choice(a,b)` sweep) names no file of
    the group's."""
    if isinstance(override.value(), ChoiceSweep):
        names = list(override.sweep_string_iterator())
    elif isinstance(override.value(), Glob):
        if not override.value().filter(files):  # else Hydra would launch a sweep of no jobs
            raise ConfigError(f"{group}={override.get_value_string()} matches no file of configs/{group} "
                              f"(known: {', '.join(files)})")
        return
    elif override.is_sweep_override() or override.value() is None:  # range(...); `env=null` drops the group
        return
    else:
        names = [override.get_value_element_as_str()]
    for name in names:
        if name in files or "${" in name:
            continue
        meant = difflib.get_close_matches(name, files, n=1, cutoff=0.75)
        plus = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(override.type, "")
        hint = f"a task without a file runs as env.id={name}" if group == "env" else ""  # any id does
        if meant:
            raise ConfigError(f"no config file configs/{group}/{name}.yaml: did you mean `{plus}{group}={meant[0]}`?"
                              + f" ({hint})" * bool(hint))
        known = "; ".join(filter(None, [f"known: {', '.join(files)}", hint]))
        raise ConfigError(f"no config file configs/{group}/{name}.yaml ({known})")
