"""Checkpoints: everything needed to continue a run, written atomically (temporary file, rename)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
# What train.py's snapshot() writes and a resume or an evaluation reads. "value_normalizer" is left out:
# checkpoints from before value normalisation lack it, and a resume of one does without it.
KEYS = ("settings", "iteration", "global_step", "agent", "optimizer", "obs_normalizer", "reward_scaler",
        "generator", "torch_rng", "cuda_rng", "numpy_rng", "python_rng")


class CheckpointError(ValueError):
    """A file that is not a checkpoint train.py wrote: another file given by mistake, or a torn copy."""


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to `<run_dir>/checkpoints/last.pt` so that a crash never leaves a torn file."""
    directory = Path(run_dir) / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LAST
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def resolve_checkpoint(location: str) -> Path:
    """`location` may name a checkpoint file or a run directory that holds `checkpoints/last.pt`.
    The error names the path tried; callers say which argument gave it."""
    path = Path(location).expanduser()
    if path.is_dir():
        path = path / CHECKPOINT_DIR / LAST
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (give a checkpoint file or a run dir holding "
                                f"{CHECKPOINT_DIR}/{LAST})")
    return path


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """The checkpoint at `path`, or a CheckpointError that says in one line why `path` is not one (torch's
    own errors for such files are pickle's or the zip reader's, a screen of traceback)."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as error:
        text = str(error).strip()  # its first sentence: the zip reader's goes on for four more
        reason = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(error).__name__
        raise CheckpointError(f"{path} is not a checkpoint: torch.load cannot read it ({reason}); a copy cut "
                              f"short, or a file torch did not write") from error
    missing = [key for key in KEYS if key not in checkpoint] if isinstance(checkpoint, dict) else list(KEYS)
    if missing:
        shown = ", ".join(f"`{key}`" for key in missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise CheckpointError(f"{path} is not a checkpoint of train.py: a torch file without {shown} (it "
                              f"writes <run dir>/{CHECKPOINT_DIR}/{LAST})")
    return checkpoint
