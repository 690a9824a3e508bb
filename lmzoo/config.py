"""Structured configs: the schema every Hydra config group is validated against.

``validate`` turns a composed (Hydra) config into typed dataclasses and raises ``ConfigError``
with a single line naming the bad key and the valid choices. The ``attn`` group has no fixed
schema here: each registered mixer brings its own dataclass (see ``lmzoo.registry``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf import errors as oc_errors

from lmzoo import registry
from lmzoo.data import DataConfig


class ConfigError(ValueError):
    """A bad configuration; its message is one line meant for the user's terminal."""


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: Optional[int] = None  # SwiGLU hidden size; default ~8/3 d_model rounded up to 64
    tie_embeddings: bool = True
    dtype: str = "float32"  # compute dtype; parameters are always float32
    norm_eps: float = 1e-6
    init_std: float = 0.02


@dataclass
class PosConfig:
    kind: str = "rope"  # rope | none
    base: float = 10000.0


@dataclass
class OptimConfig:
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 600
    batch_size: int = 32
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 10
    progress: bool = True


@dataclass
class MixerConfig:
    """Fields every ``configs/attn/*.yaml`` has; mixers subclass this with their own knobs."""

    name: str = MISSING  # the variant's name in logs and comparisons (its YAML file name)
    mixer: str = MISSING  # registry key of the module that implements it

    def check(self, model: ModelConfig) -> None:
        """Raise ConfigError for settings that cannot work with ``model``."""


@dataclass
class Config:
    run_dir: str = MISSING
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    pos: PosConfig = field(default_factory=PosConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    attn: Any = None  # a registered mixer's config dataclass


DTYPES = ("float32", "bfloat16")
POSITIONS = ("rope", "none")
DATA_SOURCES = ("stdlib", "text_files", "hf")


def one_of(key: str, value: Any, choices: tuple | list) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid (choose from: {', '.join(map(str, choices))})")


def positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'non-negative' if allow_zero else 'positive'}")


def validate(raw: DictConfig | dict) -> Config:
    """Typed, checked config from a composed one; raises ConfigError with one line."""
    raw = dict(OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw)
    attn_raw = raw.pop("attn", None)
    if attn_raw is None:
        raise ConfigError(f"no attention variant given: add +attn=<name> (available: {', '.join(variant_names())})")
    cfg = _to_dataclass(Config, OmegaConf.create(raw), prefix="")
    _, mixer_schema = _mixer_schema(attn_raw)
    cfg.attn = _to_dataclass(mixer_schema, OmegaConf.create(attn_raw), prefix="attn.")
    check(cfg)
    return cfg


def _mixer_schema(attn_raw: dict) -> tuple[type, type]:
    mixer = attn_raw.get("mixer")
    if mixer is None:
        raise ConfigError("attn.mixer is missing: every configs/attn/*.yaml names its registered mixer")
    try:
        return registry.lookup(mixer)
    except KeyError:
        raise ConfigError(f"attn.mixer={mixer!r} is not a registered mixer (registered: {', '.join(registry.names())})") from None


def _to_dataclass(schema: type, raw: DictConfig, *, prefix: str) -> Any:
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), raw))
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(explain(e, prefix=prefix)) from None


def explain(error: oc_errors.OmegaConfBaseException, *, prefix: str = "") -> str:
    """One line for an OmegaConf error: the key, and the valid keys when it is unknown."""
    key = f"{prefix}{error.full_key}"
    if isinstance(error, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)):
        schema = error.object_type
        valid = f" (valid keys here: {', '.join(f.name for f in dataclasses.fields(schema))})" if dataclasses.is_dataclass(schema) else ""
        return f"unknown key '{key}'{valid}"
    if isinstance(error, oc_errors.MissingMandatoryValue):
        return f"'{key}' must be set"
    return f"'{key}': {str(error.msg).splitlines()[0]}"


def check(cfg: Config) -> None:
    """Cross-field checks the schema alone cannot express."""
    m, t, o = cfg.model, cfg.train, cfg.optim
    for key in ("d_model", "n_layers", "n_heads"):
        positive(f"model.{key}", getattr(m, key))
    if m.d_ff is not None:
        positive("model.d_ff", m.d_ff)
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}")
    one_of("model.dtype", m.dtype, DTYPES)
    one_of("pos.kind", cfg.pos.kind, POSITIONS)
    positive("pos.base", cfg.pos.base)
    for key in ("steps", "batch_size", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "log_every"):
        positive(f"train.{key}", getattr(t, key))
    positive("optim.lr", o.lr)
    positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    positive("optim.grad_clip", o.grad_clip)
    check_data(cfg.data)
    cfg.attn.check(m)


def check_data(d: DataConfig) -> None:
    positive("data.seq_len", d.seq_len)
    one_of("data.source", d.source, DATA_SOURCES)
    if not 0 < d.val_fraction < 1:
        raise ConfigError(f"data.val_fraction={d.val_fraction} must lie strictly between 0 and 1")
    if d.tokenizer != "byte" and not os.path.isfile(d.tokenizer):
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}: no such file (use 'byte' or a tokenizer.json path)")
    if d.source == "text_files":
        _check_globs("data.paths", d.paths, required=True)
    if d.source == "hf":
        if not d.hf_name:
            raise ConfigError("data.hf_name must be set for data.source=hf (a hub name, or 'json'/'text' with data.hf_data_files)")
        _check_globs("data.hf_data_files", d.hf_data_files, required=False)


def _check_globs(key: str, patterns: Any, *, required: bool) -> None:
    if patterns is None:
        if required:
            raise ConfigError(f"{key} must be set (a glob or a list of globs)")
        return
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        if "://" in pattern:  # remote files are the data library's business
            continue
        if not glob.glob(os.path.expanduser(pattern), recursive=True):
            raise ConfigError(f"{key}: no file matches {pattern!r}")


def variant_names(config_dir: str | None = None) -> list[str]:
    """The variants a user can pick with +attn=<name>: the YAML files of configs/attn."""
    attn_dir = os.path.join(config_dir or CONFIG_DIR, "attn")
    return sorted(f[:-5] for f in os.listdir(attn_dir) if f.endswith(".yaml"))


CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def register_schemas() -> None:
    """Make the dataclasses Hydra schemas: ``lmzoo_schema`` (root) and ``schema/attn/<mixer>``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="lmzoo_schema", node=Config)
    for name in registry.names():
        store.store(group="schema/attn", name=name, node=registry.lookup(name)[1])
