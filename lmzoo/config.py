"""Structured configs: the schema every Hydra config group is validated against.

``validate`` turns a composed (Hydra) config into typed dataclasses and raises ``ConfigError``
with a single line naming the bad key and the valid choices. The ``attn`` group has no fixed
schema here: each registered mixer brings its own dataclass (see ``lmzoo.registry``).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from lmzoo import registry
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, explain, one_of, positive, to_dataclass  # noqa: F401 (re-exported)
from lmzoo.data import SOURCES as DATA_SOURCES, DataConfig


@dataclass
class PosConfig:
    """Position method (see lmzoo/positions.py); any of it can be overridden when evaluating a checkpoint."""

    kind: str = "rope"  # rope | pi | ntk | yarn | rerope | leaky_rerope | alibi | none
    base: float = 10000.0  # RoPE base
    factor: float = 1.0  # pi / ntk / yarn: context extension factor s (1: plain RoPE)
    original_len: Optional[int] = None  # yarn: the trained length its ramp refers to; None: data.seq_len
    window: Optional[int] = None  # rerope / leaky_rerope: relative distances kept exact; None: data.seq_len
    leak: float = 16.0  # leaky_rerope: beyond the window, distances grow this many times slower
    yarn_alpha: float = 1.0  # yarn: frequencies turning fewer times than this over original_len are interpolated
    yarn_beta: float = 32.0  # yarn: ... more times than this are kept

    def check(self) -> None:
        one_of("pos.kind", self.kind, POSITIONS)
        positive("pos.base", self.base)
        if self.factor < 1:
            raise ConfigError(f"pos.factor={self.factor} must be at least 1 (1: no extension)")
        for key in ("original_len", "window"):
            if getattr(self, key) is not None:
                positive(f"pos.{key}", getattr(self, key))
        if self.leak <= 1:
            raise ConfigError(f"pos.leak={self.leak} must be greater than 1")
        if not 0 <= self.yarn_alpha < self.yarn_beta:
            raise ConfigError(f"pos.yarn_alpha={self.yarn_alpha} and pos.yarn_beta={self.yarn_beta} need 0 <= alpha < beta")


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
    batch_size: int = 16
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 10
    progress: bool = True
    probe_batch: int = 2  # sequences whose attention sparsity/entropy is logged at each validation; 0: off
    distributed: bool = False  # multi-host: jax.distributed.initialize() (reads SLURM/cloud settings)


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=list)  # empty: 1x, 2x, 4x, 8x the training length
    batch_size: int = 8
    batches: int = 4  # validation batches per length
    step: Optional[int] = None  # checkpoint step; None: the latest
    position_buckets: int = 16  # per-position loss is averaged over this many equal spans
    probe_batch: int = 1  # sequences whose attention sparsity/entropy is measured at each length; 0: off
    probe_max_len: int = 4096  # longer lengths skip the probes ([B, H, T, T] matrices grow as T^2)
    tag: Optional[str] = None  # results go to <run_dir>/eval/<tag>; None: named after the overrides
    progress: bool = True

    def check(self) -> None:
        for key in ("batch_size", "batches", "position_buckets", "probe_max_len"):
            positive(f"eval.{key}", getattr(self, key))
        positive("eval.probe_batch", self.probe_batch, allow_zero=True)
        for length in self.lengths:
            positive("eval.lengths[]", length)


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
POSITIONS = ("rope", "pi", "ntk", "yarn", "rerope", "leaky_rerope", "alibi", "none")


def validate(raw: DictConfig | dict) -> Config:
    """Typed, checked config from a composed one; raises ConfigError with one line."""
    raw = dict(OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw)
    attn_raw = raw.pop("attn", None)
    if attn_raw is None:
        raise ConfigError(f"no attention variant given: add +attn=<name> (available: {', '.join(variant_names())})")
    cfg = to_dataclass(Config, OmegaConf.create(raw), prefix="")
    cfg.attn = to_dataclass(mixer_spec(attn_raw.get("mixer")), OmegaConf.create(attn_raw), prefix="attn.")
    check(cfg)
    return cfg


def mixer_spec(mixer: str | None, prefix: str = "attn.") -> type:
    """The registered spec named by an attn config's ``mixer`` key; ConfigError if there is none."""
    if mixer is None:
        raise ConfigError(f"{prefix}mixer is missing: every configs/attn/*.yaml names its registered mixer")
    try:
        return registry.lookup(mixer)
    except KeyError:
        raise ConfigError(f"{prefix}mixer={mixer!r} is not a registered mixer (registered: {', '.join(registry.names())})") from None


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
    cfg.pos.check()
    for key in ("steps", "batch_size", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "log_every"):
        positive(f"train.{key}", getattr(t, key))
    positive("train.probe_batch", t.probe_batch, allow_zero=True)
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
    for key in ("task_vocab", "num_pairs", "num_marked"):
        positive(f"data.{key}", getattr(d, key))
    if d.num_queries is not None:
        positive("data.num_queries", d.num_queries)
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
        store.store(group="schema/attn", name=name, node=registry.lookup(name))
