"""Opening a trained run: its settings (with evaluation-time overrides), its data and its model.

``open_trained(run_dir, overrides, step)`` is what evaluation, generation, experiments and scripts
share; a run that trained a BPE tokenizer is read with its own copy of it (``tokenizer.json``).
Overrides take the training command's grammar: ``key=value`` for one setting
(``pos.factor=4``, ``attn.window=64``) and ``group=option`` for a config group
(``pos=ntk`` loads ``configs/pos/ntk.yaml`` in place of the run's position settings). Settings
that shape the parameters (``model``) cannot change, since the checkpoint holds those parameters.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from flax import nnx
from omegaconf import OmegaConf
from omegaconf import errors as oc_errors

from lmzoo.config import CONFIG_DIR, Config, ConfigError, explain, group_option, validate
from lmzoo.data import build_data
from lmzoo.data.corpus import with_saved_tokenizer
from lmzoo.faults import RunFault, lock_holder
from lmzoo.model import LM
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.record.directory import RunDir
from lmzoo.record.resuming import data_changes

log = logging.getLogger("lmzoo.trained")

# Overrides that would change parameter shapes cannot apply to a trained checkpoint.
FROZEN_SECTIONS = ("model",)


class Trained(NamedTuple):
    cfg: Config  # the run's settings with the overrides applied
    data: Any  # lmzoo.data's Data: tokenizer, validation windows
    model: LM  # the parameters saved at ``step``
    step: int


def open_trained(run_dir: Path | str | RunDir, overrides=(), step: int | None = None, *,
                 step_setting: str = "step") -> Trained:
    """The run's settings, data and model at ``step`` (the newest intact checkpoint if None).

    ConfigError or RunFault in one line for a directory without a trained run, an override it cannot
    take, or a missing checkpoint (named ``step_setting``, as the caller's command line spells it)."""
    run = trained_run(run_dir)
    cfg = trained_config(run, list(overrides))
    data = open_data(cfg, run)
    if not changes_data(list(overrides)):  # other data asked for by name: the results record them (eval)
        check_same_data(run, data.fingerprint, allow_changed=cfg.data.allow_changed)
    model, step = restore_model(cfg, data.tokenizer.vocab_size, run, step, step_setting=step_setting)
    return Trained(cfg, data, model, step)


def trained_run(run_dir: Path | str | RunDir) -> RunDir:
    """``run_dir`` as a run directory; ConfigError unless it holds a trained run."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    if not run.is_trained():
        raise ConfigError(f"run_dir={str(run.path)!r} holds no trained run "
                          f"(no {run.config_path.name} and {run.checkpoints.name})")
    return run


def open_data(cfg: Config, run: RunDir):
    """The run's data, tokenised as it trained: with its own copy of a BPE trained for it."""
    try:
        return build_data(with_saved_tokenizer(cfg.data, run.tokenizer_path), seed=cfg.seed)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None


def changes_data(overrides: list[str]) -> bool:
    """Whether the overrides ask for other data (``data.num_pairs=64`` on a task, or ``seed=`` whose data seed draws
    other examples, say): then the data differ as asked."""
    keys = [o.split("=")[0].lstrip("+") for o in overrides]
    return any((key in ("data", "seed") or key.startswith("data.")) and key != "data.allow_changed" for key in keys)


def check_same_data(run: RunDir, fingerprint: dict, *, allow_changed: bool) -> None:
    """RunFault when the data differ from those the run trained on (scores on them would not be the run's),
    unless ``data.allow_changed=true``: then a warning (an evaluation records the change in its results)."""
    differ = data_changes(run, fingerprint)
    if not differ:
        return
    if not allow_changed:
        raise RunFault(f"the data differ from those run_dir {str(run.path)!r} trained on ({', '.join(differ)} "
                       "changed), so its scores would not be comparable; restore them, or add "
                       "data.allow_changed=true to go on with these")
    log.warning("warning: the data differ from those %s trained on (%s changed); going on as data.allow_changed=true "
                "asks", run.path, ", ".join(differ))


# ----------------------------------------------------------------------------- settings


def check_overrides(overrides: list[str]) -> None:
    """ConfigError for an override of the run's config that a trained checkpoint cannot take."""
    for override in overrides:
        key = override.split("=")[0].lstrip("+")
        if key.split(".")[0] in FROZEN_SECTIONS:
            raise ConfigError(f"{key} cannot change at evaluation: it changes the trained parameters")


def trained_config(run: RunDir, overrides: list[str]) -> Config:
    """The settings the run trained with, then ``overrides``: group choices first, then single keys."""
    check_overrides(overrides)
    config = run.settings_in_effect()
    choices = [o for o in overrides if is_group_choice(o)]
    for choice in choices:
        group, option = choice.lstrip("+").split("=", 1)
        config[group] = group_option(group, option)
    try:
        config = OmegaConf.merge(config, OmegaConf.from_dotlist([o for o in overrides if o not in choices]))
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(explain(e) if getattr(e, "full_key", None) else first_line_of(e)) from None
    config.run_dir = str(run.path)
    return validate(config)


def first_line_of(error: Exception) -> str:
    return f"could not apply the overrides: {str(error).strip().splitlines()[0]}"


def config_groups() -> list[str]:
    return sorted(d for d in os.listdir(CONFIG_DIR) if d != "hydra" and os.path.isdir(os.path.join(CONFIG_DIR, d)))


def is_group_choice(override: str) -> bool:
    """``pos=ntk`` (a config group and one of its files), not ``pos.kind=ntk`` or ``seed=1``."""
    key = override.split("=")[0].lstrip("+")
    return "=" in override and "." not in key and key in config_groups()


# ----------------------------------------------------------------------------- model


def restore_model(cfg: Config, vocab_size: int, run: RunDir, step: int | None, *,
                  step_setting: str = "step") -> tuple[LM, int]:
    """The model saved at ``step`` (the newest intact one if None), and that step; no optimizer is built.

    A run still training (its lock held) is read as it stands: its newest finished checkpoint, named in a note."""
    trainer = lock_holder(run.lock_path)
    checkpointer = Checkpointer(run.checkpoints)  # it saves nothing, so it deletes nothing
    fresh = LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed))
    try:
        if step is not None:
            if step not in checkpointer.all_steps():
                raise ConfigError(f"{step_setting}={step} has no checkpoint in {run.path} "
                                  f"(available: {checkpointer.all_steps()})")
            return checkpointer.restore_model(step, fresh), step
        found = checkpointer.restore_newest_intact(
            lambda s: checkpointer.restore_model(s, fresh), trainer=trainer,
            on_damaged=lambda s, message: log.warning("warning: %s; using an older checkpoint", message))
        if found is None and trainer is not None:
            raise RunFault(f"run_dir {str(run.path)!r} has no finished checkpoint yet ({trainer} is training it); "
                           "evaluate it after its first checkpoint")
        if found is None:
            raise RunFault(f"run_dir {str(run.path)!r} has no checkpoint to restore")
        if trainer is not None:
            log.warning("note: run_dir %s is still training (%s); this reads its newest finished checkpoint, step %d",
                        run.path, trainer, found[0])
        return found[1], found[0]
    finally:
        checkpointer.close()
