"""A run dir's records and its lock: `run_info.json` (what ran where), the overrides Hydra recorded in
`.hydra/overrides.yaml`, the command that resumes a run, and the lock that keeps two runs out of one
dir. Plain files and file locks: `hydra_edge.py` and the scripts read runs through this module."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import fnmatch
import json
import os
import platform
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import yaml

from ppo import distributed
from ppo.config import ConfigError, TrainSettings, learning_differences
from ppo.envs import env_groups, simulator_version
from ppo.run.checkpoint import CHECKPOINT_DIR, LAST, remove_stale_temporary, resolve_checkpoint

RUN_INFO = "run_info.json"
_IMPORTED = time.time()
_runs_started = 0  # runs this process has started (a sweep's jobs share one process)


class RunDirInUse(RuntimeError):
    """Another process trains in the run dir this one was sent to."""


class AnotherRunsDir(RuntimeError):
    """The run dir holds a checkpoint of another run, which this one does not resume."""


_claimed: dict[str, int] = {}  # run dir (absolute) -> the descriptor through which this process locks it
_new: set[str] = set()  # the claimed run dirs that held nothing of an earlier run (`discard_if_new`)
_kept_records: dict[Path, bytes] = {}  # a resumed run's `.hydra/` files before this command wrote its own


def claim(run_dir: str) -> None:
    """Lock `run_dir` (made if new) for this process. Two runs of one env and seed started in the same
    second get the same default dir, and a resume in place (`hydra.run.dir=`) may name a dir whose run
    still trains: unlocked, either pair would interleave its logs and overwrite the other's checkpoints.
    The kernel drops the lock when the process ends, however it ends. Under torchrun only rank 0 writes
    the dir, and only it locks. Raises `RunDirInUse`, or `OSError` where the dir cannot be made or opened."""
    run_dir = os.path.abspath(run_dir)
    if run_dir in _claimed or distributed.launched_rank() != 0:
        return
    new = not os.path.isdir(run_dir) or set(os.listdir(run_dir)) <= {".hydra"}  # Hydra's record of this command
    os.makedirs(run_dir, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY)
    if not locked(fd):
        os.close(fd)
        raise RunDirInUse(f"run dir {run_dir} is in use by a run still training there (runs of one env and seed "
                          "started in the same second get the same dir); give this one its own: "
                          f"hydra.run.dir={shlex.quote(run_dir + '_2')}")
    _claimed[run_dir] = fd
    if new:
        _new.add(run_dir)
    check_writable(run_dir)


def check_writable(run_dir: str) -> None:
    """Create and remove a file in `run_dir`: an `OSError` (read-only, no permission, no space) now,
    before anything starts, rather than from the first log line or checkpoint. Permission bits alone
    would not say it: root passes them, a read-only mount does not."""
    probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
    checkpoints = os.path.join(run_dir, CHECKPOINT_DIR)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.remove(probe)
        if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):  # else found at the first save
            raise NotADirectoryError(errno.ENOTDIR, f"{checkpoints} is not a dir, where its checkpoints go")
    except OSError:
        release(run_dir)
        raise


# What train.py writes into a run dir, relative to it: a tool that writes a file (an export, a video, an
# evaluation's record, a plot) may add files beside these but never write over one of them.
RUN_RECORDS = (f"{CHECKPOINT_DIR}/*", ".hydra/*", "wandb/*", "train.log", RUN_INFO, "wandb_id",
               "events.out.tfevents.*", "videos/step_*.mp4", ".write-test-*")


def check_tool_output(output: str | Path, reads: str | Path | None = None, option: str = "--output") -> None:
    """A ConfigError where a tool would write `output` (given by `option`) over a run's own records: the
    checkpoint it `reads`, or a file under a run dir (one holding `run_info.json` or a checkpoint) that
    `RUN_RECORDS` names. An existing directory is refused too: a file is asked for."""
    path = Path(output).expanduser().resolve()
    if path.is_dir():
        raise ConfigError(f"{option} {output} is a directory; give a file name")
    if reads is not None and path == Path(reads).expanduser().resolve():
        raise ConfigError(f"{option} {output} is the checkpoint this reads; write elsewhere")
    for run_dir in list(path.parents)[:3]:  # <run>/x, <run>/checkpoints/x, <run>/.hydra/x, ...
        if not ((run_dir / RUN_INFO).is_file() or (run_dir / CHECKPOINT_DIR).is_dir()):
            continue
        inside = path.relative_to(run_dir).as_posix()
        if any(fnmatch.fnmatchcase(inside, pattern) for pattern in RUN_RECORDS):
            raise ConfigError(f"{option} {output} would overwrite the run's own {inside} in {run_dir}; write it "
                              "elsewhere (a new file in the run dir is fine)")


def check_not_another_runs(run_dir: str, resume: str | None) -> None:
    """Refuse a run sent into a dir that holds a checkpoint it does not resume: it would overwrite that
    checkpoint, `run_info.json` and Hydra's record, and mix its logs and events with the other run's. A
    resume in place (`resume=` naming this dir or its checkpoint) is that run's own continuation, and
    clears what a crash mid-save left there. Raises `AnotherRunsDir` naming both ways on."""
    last = Path(run_dir) / CHECKPOINT_DIR / LAST
    if not last.is_file():
        return
    if resume:
        try:
            if resolve_checkpoint(resume).resolve() == last.resolve():
                remove_stale_temporary(run_dir)
                return
        except FileNotFoundError:
            pass  # said by the resume's own check
    run_dir = os.path.abspath(run_dir)
    raise AnotherRunsDir(f"run dir {run_dir} holds another run's checkpoint, which this run would overwrite; to "
                      f"continue that run add resume={shlex.quote(run_dir)}, to start a new one give it its own: "
                      f"hydra.run.dir={shlex.quote(run_dir + '_2')}")


def keep_record(run_dir: str) -> None:
    """Remember the Hydra record (`.hydra/*.yaml`) of the run a resume continues in place, before Hydra
    writes this command's over it: where the resume is refused, `restore_record` puts the run's own back
    (else its record, and the resume command built from it, would be of the refused command)."""
    for path in sorted((Path(os.path.abspath(run_dir)) / ".hydra").glob("*.yaml")):
        with contextlib.suppress(OSError):
            _kept_records[path] = path.read_bytes()


def restore_record() -> None:
    """Put back the record `keep_record` remembered: a resume was refused before it trained."""
    for path, data in _kept_records.items():
        with contextlib.suppress(OSError):
            path.write_bytes(data)
    _kept_records.clear()


def release(run_dir: str) -> None:
    fd = _claimed.pop(os.path.abspath(run_dir), None)
    if fd is not None:
        os.close(fd)


def new_dirs() -> list[str]:
    """The run dirs this process made (or found holding only Hydra's record of its command), held or
    since let go, that `discard_if_new` has not removed."""
    return sorted(_new)


def discard_if_new(run_dir: str) -> bool:
    """Remove a run dir this process made (or found holding only Hydra's record of its command) and
    wrote no checkpoint into, with what it wrote there (logs, events): a run ended before it trained
    leaves nothing behind. A dir that held an earlier run is kept whole. Returns whether it went."""
    run_dir = os.path.abspath(run_dir)
    if run_dir not in _new or (Path(run_dir) / CHECKPOINT_DIR / LAST).exists():
        return False
    _new.discard(run_dir)
    release(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    _remove_empty_parents(Path(run_dir))
    return True


@contextlib.contextmanager
def claimed(run_dir: str) -> Iterator[None]:
    """Hold `run_dir`'s lock (`claim`) while this process trains into it, and let it go after."""
    claim(run_dir)
    try:
        yield
    finally:
        release(run_dir)


def locked(fd: int) -> bool:
    """Take the run-dir lock through `fd`: False when another process holds it. On a file system
    without locks, True: the run trains unguarded."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


def remove_if_unused(run_dir: str) -> None:
    """Remove a run dir that holds nothing but Hydra's `.hydra/` record, unless another process trains
    there (its lock); then the parents this command made (runs/<env.id>/ for a mistyped id) while they
    are empty, inside the working directory only."""
    path = Path(run_dir).resolve()
    if not path.is_dir() or [p.name for p in path.iterdir()] not in ([], [".hydra"]):
        return
    if os.path.abspath(run_dir) not in _claimed:  # this process's lock aside, a lock held there is another run's
        fd = os.open(path, os.O_RDONLY)
        try:
            free = locked(fd)
        finally:
            os.close(fd)  # a probe only: the lock goes with the descriptor
        if not free:
            return
    shutil.rmtree(path)
    _remove_empty_parents(path)


def _remove_empty_parents(path: Path) -> None:
    """The parents of a removed run dir that this command made (runs/<env.id>/ for a mistyped id), while
    they are empty, inside the working directory only."""
    cwd, parent = Path.cwd().resolve(), path.resolve().parent
    while cwd in parent.parents and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def write_run_info(run_dir: str, settings: TrainSettings, device: torch.device, workers: int = 1,
                   resumed: dict | None = None) -> None:
    """What ran where, for scripts/summarize_results.py (the resolved config is in .hydra/); `resumed`:
    the checkpoint a resumed run continues and its step."""
    global _runs_started
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    cpu = cpu_name()
    # When the command started: the process's start for its first run (so a time to a score counts the
    # imports and compiles too), now for a sweep's later jobs.
    started = process_start_time() if _runs_started == 0 else time.time()
    _runs_started += 1
    hardware = f"{gpu} + {os.cpu_count()} CPU cores" if gpu else f"CPU only, {os.cpu_count()} cores ({cpu})"
    info = {"env_id": settings.env.id, "seed": settings.seed, "device": str(device), "gpu": gpu, "workers": workers,
            "cpus": os.cpu_count(), "cpu": cpu, "torch": torch.__version__,
            "simulator": simulator_version(settings.env.backend), "env_groups": env_groups(settings.env, device),
            "hardware": hardware if workers == 1 else f"{workers} workers x ({hardware})", "started": round(started, 2),
            "pid": os.getpid(),
            **(resumed or {})}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / RUN_INFO).write_text(json.dumps(info, indent=1))


def process_start_time() -> float:
    """When this process started, in Unix seconds: from /proc on Linux (to the second: the boot time
    is whole seconds), else when this module was imported."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def recorded_overrides(run_dir: str | Path) -> list[str]:
    """The command-line overrides Hydra recorded for a run (`<run dir>/.hydra/overrides.yaml`),
    without Hydra's own `hydra.*` ones; [] where it kept no record."""
    recorded = Path(run_dir) / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in yaml.safe_load(recorded.read_text()) or []] if recorded.is_file() else []
    return [o for o in overrides if not override_key(o).startswith("hydra.")]


def override_key(override: str) -> str:
    """The setting or config group a Hydra override names: `+ppo.x=1` -> `ppo.x`, `env=Ant-v4` -> `env`."""
    return override.lstrip("+~").partition("=")[0]


def command_value(value) -> str:
    """A setting's value as it would be written on the command line."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return f"[{','.join(map(str, value))}]" if isinstance(value, tuple) else str(value)


def resume_command(run_dir: str | Path, resume: str | None = None, total_timesteps: int | None = None) -> str:
    """`python train.py <the run's own overrides> resume=<resume, or the run dir> hydra.run.dir=<run dir>`:
    the run continued in place (without `hydra.run.dir` a resume writes a new run dir); `total_timesteps`
    replaces the run's own target."""
    dropped = {"resume"} | ({"total_timesteps"} if total_timesteps is not None else set())
    kept = [o for o in recorded_overrides(run_dir) if override_key(o) not in dropped]
    if total_timesteps is not None:
        kept.append(f"total_timesteps={total_timesteps}")
    return " ".join(["python train.py", *map(shlex.quote, kept), shlex.quote(f"resume={resume or run_dir}"),
                     shlex.quote(f"hydra.run.dir={os.path.abspath(run_dir)}")])


def resumed_changes(settings: TrainSettings, saved: dict, given: frozenset[str]) -> list[tuple]:
    """The learning settings a resume changes on purpose, as `(key, the run's value, this one)`, from the
    run's `saved` settings (a checkpoint's). `given`: the keys this command sets itself (`key=value`). Any
    other learning setting that differs from the run's is a ConfigError: a forgotten override (the env,
    the seed, a batch size) would silently train another configuration from this checkpoint, in a run
    dir named after the wrong one."""
    differences = learning_differences(saved, dataclasses.asdict(settings))
    forgotten = [d for d in differences if d[0] not in given]
    if forgotten:
        shown = ", ".join(f"{key} {command_value(old)} (here {command_value(new)})" for key, old, new in forgotten[:4])
        more = f" and {len(forgotten) - 4} more" if len(forgotten) > 4 else ""
        run_dir = resolve_checkpoint(settings.resume).parent.parent  # <run dir>/checkpoints/last.pt
        restore_record()  # refused: a resume in place gives the run its own record back, read just below
        # This command's step target where it gave one; else the run's own (the default would end a run
        # of 10M steps stopped at 3M at once: "already reaches total_timesteps").
        total = settings.total_timesteps if "total_timesteps" in given else None
        command = resume_command(run_dir, settings.resume, total)
        raise ConfigError(f"resume={settings.resume}: its run trained with other settings: {shown}{more}. Continue "
                          f"it with its own overrides: {command}; or set a key as key=value (to the run's value, "
                          f"or to a new one on purpose)")
    return differences
