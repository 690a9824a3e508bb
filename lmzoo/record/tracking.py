"""Experiment trackers beside metrics.jsonl and TensorBoard: a Weights & Biases run (``logger=wandb``).

A tracker gets what TensorBoard gets: each logged row's finite scalars under the same tags, the
resolved config, and an evaluation's results. A run directory keeps its tracker run's id in
``wandb_id``, so a resumed run and ``lmzoo.eval`` log to the same Weights & Biases run. Its files go
to ``<run_dir>/wandb`` unless ``WANDB_DIR`` says otherwise; ``WANDB_MODE=offline`` keeps everything on
disk (``wandb sync`` uploads it later), and ``WANDB_PROJECT``/``WANDB_ENTITY`` pick where it goes.
A resumed run redoes the steps after its checkpoint; Weights & Biases keeps the steps it already
has and drops those (metrics.jsonl and TensorBoard are cut back and rewritten).
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from typing import Any, Protocol

from lmzoo.config import ConfigError
from lmzoo.record.directory import RunDir

WANDB_ID = "wandb_id"  # the run directory's Weights & Biases run id, written by the first process to log
EXTRA = "track"  # pyproject.toml's extra that installs the trackers
DEFAULT_PROJECT = "lmzoo"
log = logging.getLogger("lmzoo.tracking")


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...
    def log_config(self, config: dict[str, Any]) -> None: ...
    def log_evaluation(self, tag: str, table: list[dict[str, Any]], scalars: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def open_tracker(logger: str, run: RunDir, *, job: str = "train", label: str | None = None) -> Tracker | None:
    """The tracker ``logger`` names for ``run``, or None for ``tensorboard`` (metrics.jsonl and TensorBoard only)."""
    if logger == "tensorboard":
        return None
    return WandbTracker(run, job=job, label=label)


def log_evaluation(run: RunDir, tag: str, rows: list[dict[str, Any]]) -> None:
    """An evaluation's rows (one per length, as results.csv) to the tracker the run trained with, if any:
    as a table, and each number as ``eval/<tag>/<column>@<length>`` in its summary. Without the tracker's
    package installed here, a warning: the results are on disk all the same."""
    if not (run.path / WANDB_ID).exists():
        return
    try:
        tracker = WandbTracker(run, job="eval")
    except ConfigError as e:
        log.warning("the evaluation is not logged to Weights & Biases: %s", e)
        return
    numbers = {f"eval/{tag}/{column}@{row['length']}": number(value)
               for row in rows for column, value in row.items() if column != "length" and number(value) is not None}
    with tracker:
        tracker.log_evaluation(tag, rows, numbers)


def display_name(run: RunDir) -> str:
    """The run directory's name; a seed's of a group (``<run_dir>/seed<s>``) with its group's in front."""
    name = run.path.name
    return f"{run.path.parent.name}/{name}" if name.startswith("seed") and name[4:].isdigit() else name


def number(value: Any) -> float | None:
    """A finite float of a table cell (results.csv holds text), else None."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def import_wandb():
    try:
        import wandb
    except ImportError:
        raise ConfigError(f"logger=wandb needs the wandb package: pip install -e \".[{EXTRA}]\" "
                             f"(or logger=tensorboard)") from None
    return wandb


class WandbTracker:
    """One Weights & Biases run per run directory; several may be open in one process (seeds trained together)."""

    def __init__(self, run: RunDir, *, job: str, label: str | None = None):
        wandb = import_wandb()
        logging.getLogger("wandb").setLevel(logging.WARNING)
        self.wandb = wandb
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), id=self.run_id(run), name=display_name(run),
                group=label, job_type=job, resume="allow", reinit="create_new",
                dir=os.environ.get("WANDB_DIR") or str(run.path), settings=wandb.Settings(silent=True, console="off"))
        except wandb.errors.Error as e:  # not logged in, no network: before any step, in one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"logger=wandb could not start a Weights & Biases run ({first}): run `wandb login`, "
                              f"or set WANDB_MODE=offline to keep it on disk") from None

    @staticmethod
    def run_id(run: RunDir) -> str:
        """The id in the run directory's ``wandb_id``, made and written there the first time."""
        path = run.path / WANDB_ID
        if path.exists():
            return path.read_text().strip()
        run_id = uuid.uuid4().hex[:12]  # letters and digits, as Weights & Biases ids are
        run.write_text(WANDB_ID, run_id + "\n")
        return run_id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)  # a resume may change a setting that changes nothing

    def log_evaluation(self, tag: str, table: list[dict[str, Any]], scalars: dict[str, float]) -> None:
        """An evaluation's rows as a table, and its scalars in the run's summary (a run's steps are training steps)."""
        if table:
            columns = list(table[0])
            cells = [[number(r.get(c)) for c in columns] for r in table]
            self.run.log({f"eval/{tag}/results": self.wandb.Table(columns=columns, data=cells)})
        self.run.summary.update(scalars)

    def close(self) -> None:
        self.run.finish()

    def __enter__(self) -> WandbTracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
