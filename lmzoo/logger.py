"""Where metrics go: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams


class MetricsLogger:
    """Writes only when ``enabled`` (the first process of a multi-host run)."""

    def __init__(self, run_dir: Path | str, *, enabled: bool = True):
        self.enabled = enabled
        if enabled:
            run_dir = Path(run_dir)
            self.jsonl = open(run_dir / "metrics.jsonl", "a", buffering=1)
            self.tb = SummaryWriter(str(run_dir / "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self.jsonl.write(json.dumps(row) + "\n")
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                self.tb.add_scalar(tensorboard_tag(key), value, step)

    def log_config(self, config_yaml: str, hparam_dict: dict[str, Any], metric_names: list[str]) -> None:
        """The resolved config as text, and hyper-parameters for TensorBoard's HPARAMS tab."""
        if not self.enabled:
            return
        self.tb.add_text("config", "```\n" + config_yaml + "\n```", 0)
        experiment, session_start, session_end = hparams(hparam_dict, {f"val/{m}": 0.0 for m in metric_names})
        for summary in (experiment, session_start, session_end):
            self.tb.file_writer.add_summary(summary)

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tb.close()


def tensorboard_tag(key: str) -> str:
    """val_loss -> val/loss, loss -> train/loss; keys with a slash (probe/..., aux/...) as they are."""
    if "/" in key:
        return key
    return key.replace("val_", "val/", 1) if key.startswith("val_") else f"train/{key}"


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, "item"):
        return value.item()
    return value


def read_metrics(run_dir: Path | str) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
