"""Checkpoints: everything needed to continue a run, written atomically (temporary file, rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"


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
    return torch.load(path, map_location=device, weights_only=False)
