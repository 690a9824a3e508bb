"""What older lmzoo wrote, read as today's: the one place where an old run directory's config and an old name of a
computation form are translated.

A run directory keeps the config it started with, and lmzoo has renamed things since. ``saved_config`` reads a saved
``config.yaml`` (``lmzoo.record.directory.RunDir.read_config``), and ``current_forms`` every mixer config validated
(``lmzoo.config.validate``: a new run's command line too), so an old run loads, evaluates, resumes and compares as
what it trained as:

- the one flat data config of runs saved before each source had its own spec, which held every source's settings,
  loses those its source does not have while they hold their defaults (``FLAT_DATA_DEFAULTS``); data settings added
  since the run was saved hold their defaults (the run trained as they describe);
- a form (``attn.method``) named by its name before the ops took one vocabulary runs under today's name, with a
  one-line note (``ATTN_METHODS_RENAMED``; ``OP_METHODS_RENAMED`` for a caller naming an op's form directly);
- a setting a run's checkpoints are made for, added since older runs were saved, holds the value those runs trained
  with when a resume checks it (``VALUES_BEFORE_ADDED``).

Imports only the schema and the registry, so ``lmzoo.config`` can use it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from lmzoo import registry

log = logging.getLogger("lmzoo.migrate")

# ----------------------------------------------------------------------------- the flat data config

# Run directories written before each source had its own spec saved one flat data config holding every
# source's settings, these defaults included; a source ignores those it does not have.
FLAT_DATA_DEFAULTS = {
    "tokenizer": "byte",
    "val_fraction": 0.05,
    "paths": None,
    "text_field": "text",
    "hf_name": None,
    "hf_config": None,
    "hf_data_files": None,
    "hf_train_split": "train",
    "hf_val_split": None,
    "task_vocab": 64,
    "num_pairs": 8,
    "num_queries": None,
    "num_marked": 8,
}


def drop_flat_leftovers(raw: dict, spec: type) -> dict:
    """``raw`` (a data config for ``spec``) without the settings of other sources that an older run
    directory's flat data config holds at their defaults."""
    own = {f.name for f in dataclasses.fields(spec)}
    return {k: v for k, v in raw.items() if k in own or k not in FLAT_DATA_DEFAULTS or v != FLAT_DATA_DEFAULTS[k]}


def current_data(data: dict) -> dict:
    """A saved data config as its source's spec reads it today: flat leftovers dropped, settings added since filled
    with their defaults."""
    spec = registry.SOURCES.choose("data.source", data.get("source"))
    added = {f.name: f.default for f in dataclasses.fields(spec)
             if f.name not in data and f.default is not dataclasses.MISSING}
    return {**drop_flat_leftovers(data, spec), **added}


# ----------------------------------------------------------------------------- old names of forms

# Forms renamed when every op took one vocabulary ("naive" the reference everywhere, "scan" always a fast form;
# lmzoo.ops.common.Forms), old name -> today's: by the registered mixer whose ``attn.method`` named them ...
ATTN_METHODS_RENAMED = {
    **dict.fromkeys(("comba", "deltanet", "deltaproduct", "gated_deltanet", "gdn2", "kda", "rwkv7"), {"scan": "naive"}),
    "h3": {"quadratic": "parallel", "scan": "naive"},
    "nsa": {"dense": "parallel"},
    "vq": {"blockwise": "blocked"},
}
# ... and by the op (``lmzoo.ops.<module>``) whose ``method`` named them (scripts/benchmark.py's cases keep the
# labels of their day).
OP_METHODS_RENAMED = {
    **dict.fromkeys(("comba", "delta", "delta_product", "dplr", "lti"), {"scan": "naive"}),
    "nsa": {"dense": "parallel"},
    "vq": {"blockwise": "blocked"},
}

_NOTED: set = set()  # (setting, old name, new name) already noted: one line per name and process


def renamed_form(method: str, renamed: dict, key: str, forms) -> str:
    """``method``, or today's name of the form it names by an old name (``renamed``: old -> new), noted once per name
    (``key`` names the setting in the note, e.g. ``attn.method``; ``forms`` are today's)."""
    if method not in renamed:
        return method
    new = renamed[method]
    if (key, method, new) not in _NOTED:
        _NOTED.add((key, method, new))
        log.warning("note: %s=%r is the old name of %r; running %r (the forms: %s)",
                    key, method, new, new, ", ".join(forms))
    return new


def current_forms(attn: Mapping, key: str = "attn") -> dict:
    """A mixer config (plain values) with every form it names by an old name renamed to today's, in its sub-configs
    too (a hybrid's ``layers``)."""
    attn = {k: current_forms(v, f"{key}.{k}") if isinstance(v, Mapping) else v for k, v in attn.items()}
    renamed = ATTN_METHODS_RENAMED.get(attn.get("mixer"), {})
    if isinstance(attn.get("method"), str) and attn["method"] in renamed:
        forms = registry.MIXERS.lookup(attn["mixer"]).forms
        attn["method"] = renamed_form(attn["method"], renamed, f"{key}.method", forms)
    return attn


# ----------------------------------------------------------------------------- settings older runs did not save

# Settings added since older runs were saved, and the value those runs trained with (``lmzoo.record.resuming`` checks
# that a resume keeps it; read where it is checked, so a resume records the setting as it always did).
VALUES_BEFORE_ADDED = {"optim.name": "adamw", "train.state_passing": False}


# ----------------------------------------------------------------------------- a saved config.yaml


def saved_config(saved: DictConfig) -> DictConfig:
    """A run directory's ``config.yaml`` (as loaded) as today's lmzoo reads it (the module docstring)."""
    saved.data = current_data(OmegaConf.to_container(saved.data))
    if "attn" in saved and isinstance(saved.attn, Mapping):
        saved.attn = current_forms(OmegaConf.to_container(saved.attn))
    return saved
