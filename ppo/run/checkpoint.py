"""Checkpoints: everything needed to continue a run, written atomically (temporary file, rename)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ppo.config import ConfigError

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
# What `training_state` writes and a resume or an evaluation reads. "value_normalizer" is left out:
# checkpoints from before value normalisation lack it, and a resume of one does without it.
KEYS = ("settings", "iteration", "global_step", "agent", "optimizer", "obs_normalizer", "reward_scaler",
        "generator", "torch_rng", "cuda_rng", "numpy_rng", "python_rng")


class CheckpointError(ValueError):
    """A file that is not a checkpoint train.py wrote: another file given by mistake, or a torn copy."""


class NonFiniteState(ValueError):
    """A run's state holds NaN or inf: `save_checkpoint` refuses to write it over the last good one."""


def training_state(settings, iteration: int, global_step: int, agent: torch.nn.Module,
                   optimizer: torch.optim.Optimizer, normalizers: dict[str, Any], generator: torch.Generator,
                   observation_layout: list[list], recent_episodes: list[tuple[float, float]] = ()) -> dict[str, Any]:
    """Everything a resume needs to continue the run exactly (`KEYS`): its settings and position, the
    model, the optimiser, the normalisers (by checkpoint key), the minibatch generator and every global
    RNG stream; and `recent_episodes`, the `(episodes, mean return)` of the iterations behind the run's
    score (CleanRL's last 100 episodes), so a resumed run's score counts the episodes before the resume.
    Only tensors, numbers, strings and containers of them, so a weights-only load reads it."""
    return {
        "settings": dataclasses.asdict(settings), "iteration": iteration, "global_step": global_step,
        "observation_layout": observation_layout, "recent_episodes": [list(pair) for pair in recent_episodes],
        "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
        **{name: normalizer.state_dict() for name, normalizer in normalizers.items()},
        "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": numpy_rng_state(), "python_rng": random.getstate(),
    }


def restore_training_state(checkpoint: dict[str, Any], agent: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           normalizers: dict[str, Any], generator: torch.Generator) -> None:
    """Load `training_state`'s checkpoint into a freshly built run; a model that does not fit, or a part
    that torch or numpy refuses (a damaged file), is a ConfigError naming the part."""
    load_agent_weights(agent, checkpoint["agent"], "resume: the checkpoint's model does not fit this env/model config")
    parts = [("optimizer", lambda: optimizer.load_state_dict(checkpoint["optimizer"]))]
    for name, normalizer in normalizers.items():
        # Only a checkpoint from before value normalisation existed may lack one (of "value_normalizer").
        if name in checkpoint or name != "value_normalizer":
            parts.append((name, lambda normalizer=normalizer, name=name: normalizer.load_state_dict(checkpoint[name])))
    parts += [
        ("generator", lambda: generator.set_state(checkpoint["generator"].cpu())),
        ("torch_rng", lambda: torch.set_rng_state(checkpoint["torch_rng"].cpu())),
        ("cuda_rng", lambda: checkpoint["cuda_rng"] is None or not torch.cuda.is_available()
         or torch.cuda.set_rng_state_all([s.cpu() for s in checkpoint["cuda_rng"]])),
        ("numpy_rng", lambda: set_numpy_rng_state(checkpoint["numpy_rng"])),
        ("python_rng", lambda: random.setstate(checkpoint["python_rng"])),
    ]
    for name, restore in parts:
        try:
            restore()
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(f"resume: the checkpoint's `{name}` does not restore ({reason}): a damaged or "
                              f"edited file") from error


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to `<run_dir>/checkpoints/last.pt` so that neither a crash nor a power cut leaves a
    torn file: written to a temporary file, flushed to disk, renamed over the last one, and the rename
    flushed too (without the two fsyncs a power cut after the rename can leave an empty `last.pt`).
    A state holding NaN or inf is not written (`NonFiniteState`): the last good checkpoint stays."""
    non_finite = non_finite_part(state)
    if non_finite:  # a NaN model must never replace the last good checkpoint, nor pass as one
        raise NonFiniteState(f"{non_finite} holds NaN or inf")
    directory = Path(run_dir) / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LAST
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:  # a full disk, a second signal: `last.pt` is untouched, no half-written copy stays
        tmp.unlink(missing_ok=True)
        if isinstance(error, RuntimeError) and isinstance(error.__context__, OSError):
            # A write that fails inside torch.save (a full disk) fails again as its zip writer closes, with a
            # RuntimeError of the writer's internals ("unexpected pos ..."): the OSError before it says why.
            error = error.__context__
        if isinstance(error, OSError) and error.filename is None:  # a failed write names no file
            error.filename = str(tmp)
        raise error
    _fsync_dir(directory)
    return path


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync a directory: the rename is as durable as it allows
        pass
    finally:
        os.close(fd)


def remove_stale_temporary(run_dir: str | Path) -> None:
    """Remove the temporary file a crash in the middle of `save_checkpoint` left (`last.pt` itself is
    whole: the rename never happened)."""
    (Path(run_dir) / CHECKPOINT_DIR / LAST).with_suffix(".tmp").unlink(missing_ok=True)


def run_dir_of(checkpoint: Path) -> Path:
    """The run dir a checkpoint file belongs to: `<run dir>/checkpoints/last.pt`'s, else the file's own dir."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINT_DIR else checkpoint.parent


def resolve_checkpoint(location: str) -> Path:
    """`location` may name a checkpoint file or a run directory that holds `checkpoints/last.pt`.
    The error names the path tried; callers say which argument gave it."""
    given = Path(location).expanduser()
    path = given / CHECKPOINT_DIR / LAST if given.is_dir() else given
    if not path.is_file():
        below = runs_below(given) if given.is_dir() else []
        hint = (f"; run dirs below it, newest first: {_listed(below)}" if below else
                f" (give a checkpoint file or a run dir holding {CHECKPOINT_DIR}/{LAST})")
        raise FileNotFoundError(f"no checkpoint at {path}{hint}")
    return path


def runs_below(directory: Path, depth: int = 2) -> list[Path]:
    """Run dirs (holding checkpoints/last.pt) up to `depth` levels below `directory`, newest checkpoint first:
    `runs` holds `<env>/<run>`, a sweep's `multirun` holds `<date>/<job>`. Deeper trees are not searched, so
    a mistaken `resume=~` stays quick."""
    found = [last for level in range(1, depth + 1)
             for last in directory.glob("/".join(["*"] * level + [CHECKPOINT_DIR, LAST]))]
    return [last.parent.parent for last in sorted(found, key=lambda last: last.stat().st_mtime, reverse=True)]


def _listed(paths: list[Path], shown: int = 3) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(str(p) for p in paths[:shown]) + more


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """The checkpoint at `path`, or a CheckpointError that says in one line why `path` is not one (torch's
    own errors for such files are pickle's or the zip reader's, a screen of traceback).

    Read with torch's weights-only unpickler, which rebuilds tensors and plain containers and nothing
    else: a full unpickler runs whatever code a file names, and a checkpoint handed to evaluate.py may
    come from anyone. Everything train.py writes is tensors, numbers, strings and containers of them."""
    if not _is_torch_archive(path):
        raise CheckpointError(f"{path} is not a checkpoint: not a file torch.save wrote (a log, say), or a "
                              f"copy of one cut short")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:  # an object other than tensors, numbers, strings and containers
        checkpoint = _load_older_checkpoint(path, device, error)
    except (EOFError, RuntimeError, ValueError) as error:
        raise _unreadable(path, error) from error
    missing = [key for key in KEYS if key not in checkpoint] if isinstance(checkpoint, dict) else list(KEYS)
    if missing:
        shown = ", ".join(f"`{key}`" for key in missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise CheckpointError(f"{path} is not a checkpoint of train.py: a torch file without {shown} (it "
                              f"writes <run dir>/{CHECKPOINT_DIR}/{LAST})")
    wrong = wrong_contents(checkpoint)
    if wrong:
        raise CheckpointError(f"{path} is not a whole checkpoint of train.py: its {wrong} (a damaged or edited "
                              f"file; an earlier copy of the run, if any, is the one to use)")
    non_finite = non_finite_part(checkpoint)
    if non_finite:
        raise CheckpointError(f"{path} holds NaN or inf in {non_finite}: no policy or resume can come of it (a "
                              f"damaged or edited file; an earlier copy of the run, if any, is the one to use)")
    return checkpoint


# The parts of a checkpoint that hold the numbers training made: each must be finite.
NUMBER_PARTS = ("agent", "optimizer", "obs_normalizer", "reward_scaler", "value_normalizer")


def non_finite_part(state: dict[str, Any]) -> str | None:
    """Where a checkpoint's state holds a NaN or inf, as `` `agent` (actor_mean.0.weight) ``, or None: the
    model, the optimiser's moments and the normalisers' statistics (not the RNG states, which are bytes)."""
    def walk(value: Any, where: str) -> str | None:
        if isinstance(value, torch.Tensor):
            finite = not value.is_floating_point() or bool(torch.isfinite(value).all())
            return None if finite else where
        if isinstance(value, float):
            return None if np.isfinite(value) else where
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            found = walk(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None

    for part in NUMBER_PARTS:
        found = walk(state.get(part), "")
        if found:
            return f"`{part}` ({found})"
    return None


def wrong_contents(checkpoint: dict[str, Any]) -> str | None:
    """What is not what train.py writes under a checkpoint's keys (`key` is ..., not ...), or None. Of the
    parts a resume restores by handing them to torch, only their form: torch's own checks say the rest."""
    def is_state(x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.dim() == 1 and x.numel() > 0

    expected = {
        "settings": (lambda x: isinstance(x, dict) and isinstance(x.get("env"), dict), "a dict of settings"),
        "iteration": (lambda x: type(x) is int and x >= 0, "a count of iterations"),
        "global_step": (lambda x: type(x) is int and x >= 0, "a count of steps"),
        "agent": (lambda x: isinstance(x, dict) and bool(x) and all(isinstance(v, torch.Tensor) for v in x.values()),
                  "the model's weights"),
        "optimizer": (lambda x: isinstance(x, dict) and isinstance(x.get("state"), dict)
                      and isinstance(x.get("param_groups"), list) and bool(x["param_groups"]), "an optimiser state"),
        "obs_normalizer": (lambda x: isinstance(x, dict), "a normaliser state"),
        "reward_scaler": (lambda x: isinstance(x, dict), "a normaliser state"),
        "generator": (is_state, "a generator state"),
        "torch_rng": (is_state, "a generator state"),
    }
    for key, (ok, what) in expected.items():
        if not ok(checkpoint[key]):
            return f"`{key}` is {_kind(checkpoint[key])}, not {what}"
    return None


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    if isinstance(x, (dict, list, tuple, str)) and not x:
        return f"an empty {type(x).__name__}"
    return f"{type(x).__name__} {x!r}"[:80]


def _is_torch_archive(path: Path) -> bool:
    """torch.save writes a zip archive with a `<name>/data.pkl`; a cut-short copy has lost the zip's end."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/data.pkl") for name in archive.namelist())


# An older checkpoint's numpy array (of uint32: the RNG's keys), under the names numpy 1 and 2 pickle it by.
_NUMPY_ARRAY_NAMES = {"numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
                      "numpy.dtype", "numpy.dtypes.UInt32DType"}


def _load_older_checkpoint(path: Path, device: torch.device, error: pickle.UnpicklingError) -> dict[str, Any]:
    """A checkpoint written before 2026-12-04, which holds numpy's RNG state as a numpy array: loaded with
    numpy's array classes allowed, and nothing else. Any other object is refused."""
    try:
        unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as garbled:  # a pickle no unpickler reads
        raise _unreadable(path, garbled) from error
    if not unsafe:  # refused, yet no object named: the weights-only unpickler's own limits
        raise _unreadable(path, error) from error
    if not unsafe <= _NUMPY_ARRAY_NAMES:
        raise CheckpointError(f"{path} is not a checkpoint of train.py: it holds objects a checkpoint does not "
                              f"({', '.join(sorted(unsafe))}), which loading would run code to rebuild") from error
    reconstruct = (np._core if hasattr(np, "_core") else np.core).multiarray._reconstruct
    allowed = [(reconstruct, "numpy.core.multiarray._reconstruct"),
               (reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location=device, weights_only=True)


def _unreadable(path: Path, error: Exception) -> CheckpointError:
    """A file torch.load cannot read, with the first sentence of its reason: torch's messages for such
    files go on for several (the zip reader's for five)."""
    text = str(error).strip()
    reason = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(error).__name__
    return CheckpointError(f"{path} is not a checkpoint: torch.load cannot read it ({reason})")


def load_agent_weights(agent: torch.nn.Module, weights: dict[str, Any], what: str) -> None:
    """`agent.load_state_dict(weights)`; a mismatch raises ConfigError("{what} ({its first line})"):
    torch lists every mismatched tensor over many lines, and the first says enough."""
    try:
        agent.load_state_dict(weights)
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = next((line for line in lines if line.startswith(("size mismatch", "Missing", "Unexpected"))), lines[0])
        raise ConfigError(f"{what} ({detail})") from error


def check_observation_layout(checkpoint: dict[str, Any], layout: list[list], what: str) -> None:
    """Refuse a checkpoint whose agent saw as many observation numbers as `layout` (`observation_layout`'s)
    lays out, in another order or under other keys: its weights would load and read every feature as
    another (a Dict task whose keys another simulator build lists in another order). A different count is
    left to load_agent_weights, whose size mismatch says so. Checkpoints written before this check came
    (2026-12-04) hold no layout and are not checked."""
    saved = checkpoint.get("observation_layout")
    if saved is None or saved == layout or _numbers(saved) != _numbers(layout):
        return
    raise ConfigError(f"{what}: its agent saw observations as {_described(saved)}; here they come as "
                      f"{_described(layout)}: the same {_numbers(layout)} numbers laid out otherwise, which it "
                      f"would read as other features")


def _numbers(layout: list[list]) -> int:
    return sum(int(np.prod(shape)) for _, shape in layout)


def _described(layout: list[list]) -> str:
    return ", ".join(f"{key} {tuple(shape)}" if key else f"one array {tuple(shape)}" for key, shape in layout)


def numpy_rng_state() -> dict[str, Any]:
    """numpy's global RNG state in tensors and numbers, which a weights-only load reads back (its own
    form holds a numpy array)."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "position": position,
            "has_gauss": has_gauss, "cached_gaussian": cached_gaussian}


def set_numpy_rng_state(state: dict[str, Any] | tuple) -> None:
    """Restore numpy's global RNG from numpy_rng_state's form, or from numpy's own tuple."""
    if isinstance(state, tuple):  # numpy's own form, in checkpoints written before 2026-12-04
        np.random.set_state(state)
        return
    np.random.set_state((state["name"], state["keys"].cpu().numpy().astype(np.uint32), state["position"],
                         state["has_gauss"], state["cached_gaussian"]))
