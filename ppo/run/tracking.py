"""Weights & Biases beside TensorBoard (`logger.wandb=true`): the same scalars against `global_step`, the
resolved settings as the run's config, and the videos. W&B is optional: where it is missing, not logged in
or failing, the run says so once and trains on without it.

A run keeps its W&B id in `<run dir>/wandb_id`, so a resume (in the same dir or a new one) continues the
same W&B run. `WANDB_MODE=offline` keeps everything in `<run dir>/wandb/` for `wandb sync` later.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from ppo.run.checkpoint import run_dir_of

EXTRA = 'pip install -e ".[wandb]"'
ID_FILE = "wandb_id"


class WandbMirror:
    def __init__(self, settings, run_dir: str, say: Callable[[str], None], resumed_from: Path | None = None):
        """`say` prints a line (the run's logger); `resumed_from`: the checkpoint a resume continues, whose
        run dir holds the W&B id to continue."""
        self.say, self.run = say, None
        try:
            import wandb
        except ImportError:
            say(f"logger.wandb: W&B is not installed ({EXTRA}); the run goes on without it")
            return
        self._wandb = wandb
        offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
        if not offline and not _logged_in(wandb):
            say("logger.wandb: not logged in to W&B (`wandb login`, or WANDB_MODE=offline to keep the run in the run "
                "dir); the run goes on without it")
            return
        run_dir = Path(run_dir)
        run_id = _saved_id(run_dir, resumed_from) or secrets.token_hex(4)  # W&B ids: lowercase letters, digits
        try:
            self.run = wandb.init(
                project=settings.logger.project, entity=settings.logger.entity, group=settings.logger.group,
                name=run_dir.name, dir=str(run_dir), id=run_id, resume="allow",
                config=dataclasses.asdict(settings),
                settings=wandb.Settings(silent=True, console="off", init_timeout=60))
            self.run.define_metric("global_step")
            self.run.define_metric("*", step_metric="global_step")
            (run_dir / ID_FILE).write_text(run_id + "\n")
        except Exception as error:
            self._failed(error)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._log({"global_step": step, **values})

    def video(self, step: int, path: str) -> None:
        if self.run is not None:
            self._log({"global_step": step, "videos/evaluation": self._wandb.Video(path, format="mp4")})

    def finish(self, failed: bool = False) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except Exception as error:
            self._failed(error)
        self.run = None

    def _log(self, values: dict) -> None:
        if self.run is None:
            return
        try:
            self.run.log(values)
        except Exception as error:
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        self.say(f"logger.wandb: W&B failed ({first}); the run goes on without it")
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish(exit_code=1, quiet=True)
            except Exception:
                pass


def _logged_in(wandb) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return bool(wandb.Api(timeout=5).api_key)
    except Exception:
        return False


def _saved_id(run_dir: Path, resumed_from: Path | None) -> str | None:
    """The W&B id this run dir, or the resumed checkpoint's run dir, recorded."""
    for directory in [run_dir] + ([run_dir_of(resumed_from)] if resumed_from is not None else []):
        path = directory / ID_FILE
        if path.is_file():
            return path.read_text().strip() or None
    return None
