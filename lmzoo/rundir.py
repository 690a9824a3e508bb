"""What a run directory holds about its run's settings, and the checks before a trainer uses it.

``config.yaml`` is the config the run started with and stays so. Resuming with any key outside
the identity sections changed (``optim.lr``, ``train.steps`` ...) is allowed and recorded: one row
per changed key in ``resumes.jsonl`` (step, key, old, new), so the run's history says how it was
trained. The config in effect is ``config.yaml`` with those rows applied in order.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lmzoo.config import Config, ConfigError, load_run_config
from lmzoo.faults import probe_writable

# Sections that define what a run is; resuming with any of them changed would be a different run.
IDENTITY_SECTIONS = ("model", "attn", "pos", "data", "seed")
# Keys that may differ between two invocations of one run without changing how it trains.
NOT_SETTINGS = ("run_dir",)
RESUMES = "resumes.jsonl"


def check_run_dir(run_dir: Path) -> None:
    """The run directory and its ``checkpoints/`` exist and take files: checked before any compute is spent."""
    probe_writable(run_dir, "run_dir")
    probe_writable(run_dir / "checkpoints", "checkpoints folder")


def prepare_run_dir(cfg: Config) -> Path:
    """Create the run directory, refusing to resume a run whose defining config differs."""
    run_dir = Path(cfg.run_dir)
    saved_path = run_dir / "config.yaml"
    if saved_path.exists() and (run_dir / "checkpoints").exists():
        saved, current = load_run_config(saved_path), OmegaConf.structured(cfg)
        for key in IDENTITY_SECTIONS:
            if OmegaConf.select(saved, key) != OmegaConf.select(current, key):
                raise ConfigError(
                    f"run_dir {str(run_dir)!r} holds a run with a different '{key}' config; "
                    "pick another run_dir to start a new run"
                )
    check_run_dir(run_dir)
    return run_dir


def read_resumes(run_dir: Path | str) -> list[dict]:
    """The recorded setting changes of a run: ``{"step", "key", "old", "new"}`` rows, oldest first."""
    path = Path(run_dir) / RESUMES
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def settings_in_effect(run_dir: Path) -> DictConfig:
    """``config.yaml`` with every recorded change applied."""
    config = load_run_config(run_dir / "config.yaml")
    for change in read_resumes(run_dir):
        OmegaConf.update(config, change["key"], change["new"], force_add=True)
    return config


def flat_settings(config: DictConfig) -> dict:
    flat = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(OmegaConf.to_container(config, resolve=True), "")
    return {k: v for k, v in flat.items() if k not in NOT_SETTINGS}


def record_settings(cfg: Config, step: int) -> list[dict]:
    """Write down the settings the run continues with at ``step``; the changes recorded (none at a start).

    Starting at step 0 the run is new: ``config.yaml`` is written and earlier history dropped.
    """
    run_dir = Path(cfg.run_dir)
    current = OmegaConf.structured(cfg)
    if step == 0 or not (run_dir / "config.yaml").exists():
        OmegaConf.save(current, run_dir / "config.yaml")
        (run_dir / RESUMES).unlink(missing_ok=True)
        return []
    before, now = flat_settings(settings_in_effect(run_dir)), flat_settings(current)
    changes = [{"step": step, "key": key, "old": before.get(key), "new": now.get(key)}
               for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]
    with open(run_dir / RESUMES, "a") as f:
        f.writelines(json.dumps(change) + "\n" for change in changes)
    return changes


def describe_changes(changes: list[dict]) -> str:
    return ", ".join(f"{c['key']} {c['old']} -> {c['new']}" for c in changes)
