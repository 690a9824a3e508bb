"""The checks a saved run passes when training opens it again, in the order the trainer makes them, and what a
resume records.

Training a run directory that holds a run resumes it. Before anything is built, ``prepare_run_dir``
refuses a run whose identity (model, attn, pos, data, seed) differs; before restoring,
``check_checkpoints_fit`` refuses a change of a setting the checkpoints are made for (the optimizer,
whose state they hold; ``train.state_passing``, whose carried state they hold). After restoring,
``check_resume_step`` refuses a step that calls of ``train.steps_per_call`` steps cannot reach,
``check_data`` refuses data other than those the run trained on (unless ``data.allow_changed=true``,
then the change is recorded), and ``record_settings`` writes the changed keys to ``resumes.jsonl``, so the run's
history says how it was trained: the settings in effect are ``config.yaml`` with those rows applied in order.
(The trainer's own check, a learning rate that jumps at the resumed step, is ``lmzoo.run.optim.check_continuation``.)
"""

from __future__ import annotations

import json
import logging
from operator import attrgetter
from typing import NamedTuple

from omegaconf import DictConfig, OmegaConf

from lmzoo.config import Config, ConfigError
from lmzoo.faults import RunFault
from lmzoo.record.directory import DATA_CHANGED, RunDir, check_run_dir, flat_settings
from lmzoo.record.migrate import VALUES_BEFORE_ADDED
from lmzoo.schema import changes_trained_model

log = logging.getLogger("lmzoo.train")

# Sections that define what a run is; resuming with any of them changed would be a different run. Keys inside
# them that cannot change the trained model (``lmzoo.schema.CANNOT_CHANGE_TRAINED_MODEL``: ``model.remat``,
# ``attn.method``, ``data.allow_changed``) say how to go on, not what the run is: a resume may change them, recorded.
IDENTITY_SECTIONS = ("model", "attn", "pos", "data", "seed")


# ----------------------------------------------------------------------------- before anything is built


def identity(config: DictConfig) -> dict:
    """The settings that define what a run is, flattened; keys that only say how to go on left out."""
    flat = flat_settings(config)
    return {k: v for k, v in flat.items() if k.split(".")[0] in IDENTITY_SECTIONS and changes_trained_model(k)}


def prepare_run_dir(cfg: Config) -> RunDir:
    """The run directory, refusing to resume a run whose defining config differs."""
    run = RunDir(cfg.run_dir)
    if not run.config_path.exists() and saved_steps(run):
        raise ConfigError(f"run_dir {str(run.path)!r} has checkpoints (steps {', '.join(map(str, saved_steps(run)))}) "
                          f"but no {run.config_path.name}: the settings they were trained with are gone, so it cannot "
                          f"resume; put {run.config_path.name} back, or pick another run_dir")
    if run.config_path.exists() and run.checkpoints.exists():
        saved, current = identity(run.read_config()), identity(OmegaConf.structured(cfg))
        for key in sorted(set(saved) | set(current)):
            if saved.get(key) != current.get(key):
                raise ConfigError(
                    f"run_dir {str(run.path)!r} holds a run with a different '{key.split('.')[0]}' config "
                    f"({key}: {saved.get(key)} there, {current.get(key)} here); pick another run_dir to start a new run"
                )
    check_run_dir(run)
    return run


def saved_steps(run: RunDir) -> list[int]:
    """The steps with a finished checkpoint folder (Orbax's temporary ones left out), read without Orbax."""
    if not run.checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in run.checkpoints.iterdir() if p.name.isdigit() and p.is_dir())


# ----------------------------------------------------------------------------- before restoring


class CheckpointSetting(NamedTuple):
    """A setting a run's checkpoints are made for, which a resume must keep."""

    held: str  # what the checkpoints hold, as the error line says it
    keep: str  # the override that keeps it, ``{}`` standing for the value


CHECKPOINT_SETTINGS = {
    "optim.name": CheckpointSetting("whose state its checkpoints hold", "optim={}"),
    "train.state_passing": CheckpointSetting("which its checkpoints are saved for",  # carried state
                                             "train.state_passing={}"),
}


def check_checkpoints_fit(run: RunDir, cfg: Config) -> None:
    """Before restoring: every setting in ``CHECKPOINT_SETTINGS`` is what the run trained with."""
    settings = run.settings_in_effect()
    for key, setting in CHECKPOINT_SETTINGS.items():
        before, now = OmegaConf.select(settings, key, default=VALUES_BEFORE_ADDED[key]), attrgetter(key)(cfg)
        if before != now:
            raise ConfigError(f"{key}={quoted(now)}: run_dir {str(run.path)!r} trained with {key}={quoted(before)}, "
                              f"{setting.held}; resume with {setting.keep.format(plain(before))} "
                              "or pick another run_dir")


def plain(value) -> str:
    """A setting as the command line writes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def quoted(value) -> str:
    """A setting as an error line names it (strings quoted)."""
    return repr(value) if isinstance(value, str) else plain(value)


# ----------------------------------------------------------------------------- after restoring


def check_resume_step(run: RunDir, step: int, steps_per_call: int) -> None:
    """A run resumes only at a step its calls of ``steps_per_call`` steps reach (say, a run saved at step 6
    with one step a call cannot go on four at a time)."""
    if step % steps_per_call:
        raise ConfigError(f"train.steps_per_call={steps_per_call}: run_dir {str(run.path)!r} resumes at step {step}, "
                          f"not a multiple of {steps_per_call}; resume with a steps_per_call that divides {step} "
                          f"(e.g. train.steps_per_call=1)")


def fingerprint_in_effect(run: RunDir) -> dict | None:
    """The data fingerprint the run last trained on: the start's, or the newest change allowed since."""
    changed = [row["new"] for row in run.read_resumes() if row.get("key") == DATA_CHANGED]
    return changed[-1] if changed else run.read_fingerprint()


def fingerprint_changes(before: dict, now: dict) -> list[str]:
    """The keys in which two data fingerprints differ, sorted."""
    now = json.loads(json.dumps(now))  # as JSON holds it: tuples become lists
    return sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))


def data_changes(run: RunDir, fingerprint: dict) -> list[str]:
    """How the data a process reads now differ from those the run last trained on ([] if they do not, or
    the run predates fingerprints): what an evaluation checks before it scores anything."""
    before = fingerprint_in_effect(run)
    return [] if before is None else fingerprint_changes(before, fingerprint)


def check_data(run: RunDir, fingerprint: dict, *, step: int, allow_changed: bool) -> None:
    """Record the data at a start; on resume, refuse data that differs from what the run trained on
    (unless ``allow_changed``, then the change is recorded in ``resumes.jsonl``)."""
    fingerprint = json.loads(json.dumps(fingerprint))  # as JSON holds it: tuples become lists
    before = fingerprint_in_effect(run) if step else None
    if before is None:
        if step == 0 or run.read_fingerprint() is None:
            run.write_fingerprint(fingerprint)
        return
    if before == fingerprint:
        return
    differ = fingerprint_changes(before, fingerprint)
    if not allow_changed:
        raise RunFault(f"the data differ from those run_dir {str(run.path)!r} trained on "
                       f"({', '.join(differ)} changed); restore them, pick another run_dir, "
                       "or add data.allow_changed=true to go on")
    log.warning("warning: the data changed since step %d (%s); going on as data.allow_changed=true asks "
                "(recorded in %s)", step, ", ".join(differ), run.resumes_path)
    run.append_resumes([{"step": step, "key": DATA_CHANGED, "old": before, "new": fingerprint}])


def record_settings(cfg: Config, step: int) -> list[dict]:
    """Write down the settings the run continues with at ``step``; the changes recorded (none at a start).

    Starting at step 0 the run is new: ``config.yaml`` is written and earlier history dropped.
    """
    run = RunDir(cfg.run_dir)
    if step == 0 or not run.config_path.exists():
        run.write_config(cfg)
        run.start_afresh()
        return []
    before, now = flat_settings(run.settings_in_effect()), flat_settings(OmegaConf.structured(cfg))
    changes = [{"step": step, "key": key, "old": before.get(key), "new": now.get(key)}
               for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]
    run.append_resumes(changes)
    return changes
