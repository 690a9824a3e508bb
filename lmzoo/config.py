"""Structured configs: the schema every Hydra config group is validated against.

``validate`` turns a composed (Hydra) config into typed dataclasses and raises ``ConfigError``
with a single line naming the bad key and the valid choices. The ``attn`` and ``data`` groups have
no fixed schema here: each registered mixer, data source and synthetic task brings its own spec
dataclass (see ``lmzoo.registry``), picked by ``attn.mixer`` and ``data.source``; each registered spec is
also an option of its group (``+attn=gla``, ``data=stdlib``) wherever no YAML file of that name sets more
(``options_made``, ``register_schemas``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from lmzoo import registry
from lmzoo.positions import PosConfig
from lmzoo.record.migrate import current_forms
from lmzoo.schema import (  # noqa: F401 (re-exported)
    PER_POSITION, ConfigError, DataConfig, MixerConfig, ModelConfig, OptimConfig, explain, one_of, positive,
    to_dataclass,
)
from lmzoo.sharding import MeshConfig
from lmzoo.stats import BLOCKS, RESAMPLES, SEED


@dataclass
class TrainConfig:
    steps: int = 600  # optimizer steps in all (a resume continues to this)
    batch_size: int = 16  # sequences per step, over all devices
    grad_accum: int = 1  # micro-batches per step: the same update, batch_size / grad_accum rows in memory at once
    steps_per_call: int = 1  # optimizer steps per jitted call (a scan over as many batches): host costs once a call
    pack_state: str = "auto"  # auto|true|false: the state packed in a buffer per dtype for each call (run.packing)
    seeds: list[int] = field(default_factory=list)  # several seeds as one jitted step, each a run in
                                                    # run_dir/seed<s>; empty: seed
    lrs: list[float] = field(default_factory=list)  # several optim.lr as one jitted step, each a run in
                                                    # run_dir/lr<lr>[/seed<s>]
    eval_every: int = 100  # steps between validations
    eval_tokens: int = 32768  # validation targets scored at each validation (spans spread over every document)
    checkpoint_every: int = 200  # steps between checkpoints (and at the last step)
    keep_checkpoints: int = 3  # the newest this many are kept
    log_every: int = 10  # steps per metrics.jsonl row
    progress: bool = True  # a progress bar on the terminal
    probe_batch: int = 2  # sequences whose attention sparsity/entropy is logged at each validation; 0: off
    max_nonfinite: int = 5  # consecutive steps with a non-finite loss or gradient (each skipped) that stop the run
    state_passing: bool = False  # each batch row continues the last batch's row from its final recurrent state
    z_loss: float = 0.0  # adds z_loss * mean(logsumexp(logits)^2) to the objective (logged apart as z_loss); 0: off
    distributed: bool = False  # one run over several processes: jax.distributed.initialize() (reads SLURM's settings)
    coordinator_address: Optional[str] = None  # distributed: host:port of process 0; None: from the cluster
    num_processes: Optional[int] = None  # distributed: None: from the cluster
    process_id: Optional[int] = None  # distributed: this process's index; None: from the cluster
    mesh: MeshConfig = field(default_factory=MeshConfig)  # devices per mesh axis and where parameters go
                                                          # (lmzoo.sharding)


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=list)  # empty: 1x, 2x, 4x, 8x the training length (always added)
    tokens: Optional[int] = 2**18  # validation targets scored at every length (spread over every document);
                                   # None: the whole split
    batch_tokens: int = 16384  # tokens per forward batch: batch_tokens // L windows of length L
    blocks: int = BLOCKS  # fixed contiguous blocks of the scored targets, resampled by the bootstrap
    resamples: int = RESAMPLES  # bootstrap resamples behind every interval
    bootstrap_seed: int = SEED  # draws of the bootstrap: intervals are reproducible for a fixed seed
    step: Optional[int] = None  # checkpoint step; None: the latest
    position_buckets: int = 16  # per-position loss is averaged over this many equal spans
    probe_batch: int = 1  # sequences whose attention sparsity/entropy is measured at each length; 0: off
    probe_max_len: int = 4096  # longer lengths skip the probes ([B, H, T, T] matrices grow as T^2)
    tag: Optional[str] = None  # results go to <run_dir>/eval/<tag>; None: named after the overrides
    memory_budget_gb: Optional[float] = None  # what one forward may use; None: the device's memory
    progress: bool = True  # a progress bar on the terminal
    min_doc_tokens: Optional[int] = None  # score only windows inside one document at least this long; None: any

    def check(self) -> None:
        for key in ("batch_tokens", "position_buckets", "probe_max_len", "resamples"):
            positive(f"eval.{key}", getattr(self, key))
        if self.tokens is not None:
            positive("eval.tokens", self.tokens)
        if self.blocks < 2:
            raise ConfigError(f"eval.blocks={self.blocks} must be at least 2: the bootstrap resamples blocks")
        positive("eval.probe_batch", self.probe_batch, allow_zero=True)
        for length in self.lengths:
            positive("eval.lengths[]", length)
        if self.memory_budget_gb is not None:
            positive("eval.memory_budget_gb", self.memory_budget_gb)
        if self.min_doc_tokens is not None:
            positive("eval.min_doc_tokens", self.min_doc_tokens)
        if self.tag is not None and (set(self.tag) & {"/", "\\", "\0"} or self.tag in ("", ".", "..")):
            raise ConfigError(f"eval.tag={self.tag!r} must be a plain folder name (no path separators, not '.' or "
                              "'..'): results go to <run_dir>/eval/<tag>")


@dataclass
class Config:
    run_dir: str = MISSING  # where the run lives (default runs/<variant>-<time>); re-running on it resumes
    seed: int = 0  # parameters and data order
    # Recorded in config.yaml; it changes nothing in training.
    label: Optional[str] = None  # the arm this run belongs to: lmzoo.compare groups runs by it (by config otherwise)
    logger: str = "tensorboard"  # where metrics go besides metrics.jsonl: tensorboard, or wandb (TensorBoard and
                                 # Weights & Biases)
    model: ModelConfig = field(default_factory=ModelConfig)
    pos: PosConfig = field(default_factory=PosConfig)
    data: Any = None  # a registered data source's spec (a DataConfig subclass)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    attn: Any = None  # a registered mixer's spec (a MixerConfig subclass)


DTYPES = ("float32", "bfloat16")
LOGGERS = ("tensorboard", "wandb")  # lmzoo.record.tracking: wandb needs pip install -e '.[track]'
PACK_STATE = ("auto", "true", "false")  # lmzoo.run.packing: auto packs a state of at most 256 MiB
REMAT = ("none", "block", "mixer", "light")  # what lmzoo.model recomputes in the backward pass instead of storing


def validate(raw: DictConfig | dict) -> Config:
    """Typed, checked config from a composed one; raises ConfigError with one line."""
    raw = dict(OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw)
    attn_raw, data_raw = raw.pop("attn", None), raw.pop("data", None) or {}
    if attn_raw is None:
        raise ConfigError(f"no attention variant given: add +attn=<name> (available: {', '.join(variant_names())})")
    cfg = to_dataclass(Config, OmegaConf.create(raw), prefix="")
    spec = mixer_spec(attn_raw.get("mixer"))
    cfg.attn = to_dataclass(spec, OmegaConf.create(current_forms(attn_raw)), prefix="attn.")  # old form names: today's
    cfg.data = to_dataclass(data_spec(data_raw.get("source")), OmegaConf.create(data_raw), prefix="data.")
    check(cfg)
    return cfg


def mixer_spec(mixer: str | None, prefix: str = "attn.") -> type:
    """The registered spec named by an attn config's ``mixer`` key; ConfigError if there is none."""
    if mixer is None:
        raise ConfigError(f"{prefix}mixer is missing: every attn option names its registered mixer")
    return registry.MIXERS.choose(f"{prefix}mixer", mixer)


def data_spec(source: str | None) -> type:
    """The registered spec named by a data config's ``source`` key; ConfigError if there is none."""
    if source is None:
        raise ConfigError("data.source is missing: every data option names its registered source")
    return registry.SOURCES.choose("data.source", source)


# The train.* steps the loop logs, validates or saves at (and its last): with train.steps_per_call=k it stops
# only between calls, after steps k, 2k, ..., so each must be a multiple of k.
STEPS_BETWEEN_CALLS = ("steps", "log_every", "eval_every", "checkpoint_every")


def check_steps_per_call(train: TrainConfig) -> None:
    """``train.steps_per_call`` (k optimizer steps in one jitted call) is positive and divides every step count
    in ``STEPS_BETWEEN_CALLS``."""
    k = train.steps_per_call
    positive("train.steps_per_call", k)
    for key in STEPS_BETWEEN_CALLS:
        value = getattr(train, key)
        if value % k:
            raise ConfigError(f"train.{key}={value} is not a multiple of train.steps_per_call={k} (the loop stops "
                              f"only between calls of {k} steps): choose a multiple of {k}, or another steps_per_call")


def check_seeds(train: TrainConfig) -> None:
    """``train.seeds``: distinct non-negative seeds, trained by one process (lmzoo.run.seeds)."""
    seeds = list(train.seeds)
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ConfigError(f"train.seeds={seeds} must be distinct non-negative seeds (each trains its own run in "
                          f"run_dir/seed<s>)")
    if seeds and train.distributed:
        raise ConfigError(f"train.seeds={seeds} trains its seeds in one process: train.distributed=true is not "
                          f"supported with it (train each seed as a run of its own)")


def lr_folder(lr: float) -> str:
    """The folder a rate of ``train.lrs`` trains in, below run_dir: ``lr0.001`` (6 significant digits)."""
    return f"lr{lr:g}"


def check_lrs(train: TrainConfig, optim_name: str) -> None:
    """``train.lrs``: distinct positive learning rates of AdamW, trained by one process (lmzoo.run.seeds)."""
    lrs = list(train.lrs)
    if len(set(lrs)) != len(lrs) or any(not (math.isfinite(lr) and lr > 0) for lr in lrs):
        raise ConfigError(f"train.lrs={lrs} must be distinct positive learning rates (each trains its own run in "
                          f"run_dir/lr<lr>)")
    folders = [lr_folder(lr) for lr in lrs]
    if clash := next((name for name in folders if folders.count(name) > 1), None):
        same = " and ".join(f"{lr!r}" for lr, name in zip(lrs, folders) if name == clash)
        raise ConfigError(f"train.lrs={lrs}: {same} would both train in run_dir/{clash} (a folder is named by 6 "
                          f"significant digits of its rate); give rates that differ within those")
    if lrs and train.distributed:
        raise ConfigError(f"train.lrs={lrs} trains its runs in one process: train.distributed=true is not supported "
                          f"with it (train each learning rate as a run of its own)")
    if lrs and optim_name != "adamw":
        raise ConfigError(f"train.lrs={lrs} sets AdamW's optim.lr: optim.name={optim_name} is not supported with it "
                          f"(choose optim.name=adamw, or train each learning rate as a run of its own)")


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
    one_of("model.remat", m.remat, REMAT)
    one_of("logger", cfg.logger, LOGGERS)
    cfg.pos.check()
    for key in ("steps", "batch_size", "eval_every", "eval_tokens", "checkpoint_every", "keep_checkpoints",
                "log_every", "max_nonfinite"):
        positive(f"train.{key}", getattr(t, key))
    positive("train.probe_batch", t.probe_batch, allow_zero=True)
    positive("train.grad_accum", t.grad_accum)
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"train.batch_size={t.batch_size} does not split into train.grad_accum={t.grad_accum} "
                          "equal micro-batches")
    check_steps_per_call(t)
    t.pack_state = str(t.pack_state).lower()  # YAML and the command line read true/false as booleans
    one_of("train.pack_state", t.pack_state, PACK_STATE)
    check_seeds(t)
    check_lrs(t, o.name)
    t.mesh.check()
    positive("train.z_loss", t.z_loss, allow_zero=True)
    o.check(t.steps)
    cfg.data.check()
    cfg.attn.check(m)
    if t.state_passing:
        check_state_passing(cfg.attn, m.n_layers)
        if cfg.data.readout() != PER_POSITION:
            raise ConfigError(f"train.state_passing=true carries each row on position by position, and these data "
                              f"(data.source={cfg.data.source}) are read out from the last position's state "
                              f"({cfg.data.readout()}): train them with train.state_passing=false")


def check_state_passing(attn: MixerConfig, n_layers: int) -> None:
    """``train.state_passing`` needs every layer's mixer to continue from a given state (``Mixer.carry``)."""
    lacking = sorted({attn.for_layer(i, n_layers).name for i in range(n_layers)
                      if not attn.for_layer(i, n_layers).carries_state})
    if lacking:
        able = [name for name in registry.MIXERS.names() if registry.MIXERS.lookup(name).carries_state]
        raise ConfigError(f"train.state_passing=true needs recurrent mixers, and {', '.join(lacking)} carries no state "
                          f"between batches (choose from: {', '.join(able)})")


def variant_names() -> list[str]:
    """The variants a user can pick with +attn=<name>: the files of configs/attn and the options the registry makes."""
    return group_options("attn")


CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


# The groups whose options are registered specs: each registered name is an option of its group (``+attn=gla``,
# ``data=stdlib``) made from the spec with these keys set to the name, unless a YAML file of that name sets more.
SPEC_GROUPS = {"attn": (registry.MIXERS, ("name", "mixer")), "data": (registry.SOURCES, ("source",))}


def group_options(group: str) -> list[str]:
    """The options of a config group: its YAML files, and the registry's options where the group has them."""
    folder = os.path.join(CONFIG_DIR, group)
    return sorted({f[:-5] for f in os.listdir(folder) if f.endswith(".yaml")} | set(options_made(group)))


def options_made(group: str) -> list[str]:
    """The options of ``group`` made from a registered spec alone: its defaults make a whole option (a hybrid's
    layers, say, must be named in a file) and no ``configs/<group>/<name>.yaml`` sets anything else."""
    if group not in SPEC_GROUPS:
        return []
    specs = SPEC_GROUPS[group][0]
    return [name for name in specs.names() if specs.lookup(name).complete_by_default
            and not os.path.exists(os.path.join(CONFIG_DIR, group, f"{name}.yaml"))]


def made_option(group: str, name: str) -> dict:
    """The settings of an option the registry makes: the keys that say which spec it is (the schema fills the rest)."""
    return {key: name for key in SPEC_GROUPS[group][1]}


def group_option(group: str, option: str) -> DictConfig:
    """The settings ``group=option`` picks: ``configs/<group>/<option>.yaml`` without Hydra's defaults list, or
    those of an option the registry makes (the schema fills the rest); ConfigError naming the options."""
    path = os.path.join(CONFIG_DIR, group, f"{option}.yaml")
    if os.path.exists(path):
        loaded = OmegaConf.load(path)
        loaded.pop("defaults", None)
        return loaded
    if option in options_made(group):
        return OmegaConf.create(made_option(group, option))
    raise ConfigError(f"unknown {group} config {group}={option!r} (available: {', '.join(group_options(group))})")


def register_schemas() -> None:
    """Make the dataclasses Hydra schemas: ``lmzoo_schema`` (root), ``schema/attn/<mixer>`` and
    ``schema/data/<source>``; and each option the registry makes (``options_made``) an option of its group, as a
    YAML file naming only its schema would be."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="lmzoo_schema", node=Config)
    for group, (specs, _) in SPEC_GROUPS.items():
        for name in specs.names():
            store.store(group=f"schema/{group}", name=name, node=specs.lookup(name))
        for name in options_made(group):
            store.store(group=group, name=name, node=specs.lookup(name)(**made_option(group, name)))
