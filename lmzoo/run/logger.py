"""Where metrics go: metrics.jsonl (one JSON object per logged step), TensorBoard and a tracker.

A run that resumes from step S redoes the steps after S, so both logs are cut back to S when they
open: the metrics log loses its later rows (and any line a kill tore), and TensorBoard is told to
purge events after S (its purge-step mechanism). Each metrics row is synced as it is appended;
``flush`` makes TensorBoard's events durable too; the trainer calls it before each checkpoint, so a
killed process loses at most the steps the resumed run redoes. ``logger=wandb`` adds a tracker
(``lmzoo.record.tracking``) that gets the same scalars and config.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams

from lmzoo.record.directory import RunDir
from lmzoo.record.tracking import open_tracker


def open_in_a_later_second(tb_dir: Path) -> None:
    """Wait, if need be, until the clock has passed the second of the newest event file already in
    ``tb_dir``. TensorBoard reads event files in name order and a name starts with the second the
    file was opened in, so a process resuming a run within a second of the last one (whose files
    may sort after its own by process id) would otherwise have its purge read before the events
    it purges."""
    opened = [int(p.name.split(".")[3]) for p in tb_dir.glob("events.out.tfevents.*") if p.name.split(".")[3].isdigit()]
    delay = max(opened, default=0) + 1 - time.time()
    if delay > 0:
        time.sleep(delay)


class MetricsLogger:
    """Writes only when ``enabled`` (the first process of a multi-host run), for steps after ``start_step``."""

    def __init__(self, run: RunDir, *, start_step: int = 0, enabled: bool = True, logger: str = "tensorboard",
                 label: Optional[str] = None):
        self.enabled = enabled
        if enabled:
            self.run = run
            self.tracker = open_tracker(logger, run, label=label)  # first: a missing package stops it before any write
            run.truncate_metrics(start_step)
            self.segment, self._tb = 0, None
            self.purge_step: Optional[int] = start_step + 1  # the first event file of this process purges

    @property
    def tb(self) -> SummaryWriter:
        """The open writer; a new event file after each ``flush`` (named to sort in the order written)."""
        if self._tb is None:
            if self.segment == 0:
                open_in_a_later_second(self.run.tensorboard)
            self.segment += 1
            suffix = f".{os.getpid()}.{self.segment:06d}"
            self._tb = SummaryWriter(str(self.run.tensorboard), purge_step=self.purge_step, filename_suffix=suffix)
            self.purge_step = None
        return self._tb

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self.run.append_metrics(row)
        scalars = {tensorboard_tag(k): v for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        for tag, value in scalars.items():
            self.tb.add_scalar(tag, value, step)
        if self.tracker is not None and scalars:
            self.tracker.log(step, scalars)

    def log_config(self, config_yaml: str, hparam_dict: dict[str, Any], metric_names: list[str]) -> None:
        """The resolved config as text, and hyper-parameters for TensorBoard's HPARAMS tab."""
        if not self.enabled:
            return
        self.tb.add_text("config", "```\n" + config_yaml + "\n```", 0)
        experiment, session_start, session_end = hparams(hparam_dict, {f"val/{m}": 0.0 for m in metric_names})
        for summary in (experiment, session_start, session_end):
            self.tb.file_writer.add_summary(summary)
        if self.tracker is not None:
            self.tracker.log_config(hparam_dict)

    def flush(self) -> None:
        """Put everything logged so far on disk.

        tensorboardX's ``flush`` leaves events still queued for its writer thread unwritten; ``close``
        drains the queue, so the event file is closed and logging goes on in a new one.
        """
        if not self.enabled:
            return
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def close(self) -> None:
        self.flush()
        if self.enabled and self.tracker is not None:
            self.tracker.close()
            self.tracker = None


def tensorboard_tag(key: str) -> str:
    """val_loss -> val/loss, loss -> train/loss; keys with a slash (probe/..., aux/...) as they are."""
    if "/" in key:
        return key
    return key.replace("val_", "val/", 1) if key.startswith("val_") else f"train/{key}"


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, "item"):
        return value.item()
    return value
