"""The vocabulary of configuration: one-line errors, value checks, and the bases of every spec.

A leaf module: it imports nothing of lmzoo, so mixers, data sources and ``lmzoo.config`` can all
build on it without import cycles. A *spec* is a config dataclass that is also the recipe for what
it configures: ``MixerConfig`` is validated against an attn option (``configs/attn/*.yaml``), checks itself
against the model (``check``), builds its mixer (``build``) and reports its cost (``flops_per_token``);
``DataConfig`` is validated against a data option (``configs/data/*.yaml``), checks itself and builds its data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf import errors as oc_errors


class ConfigError(ValueError):
    """A bad configuration; its message is one line meant for the user's terminal."""


def one_of(key: str, value: Any, choices: tuple | list) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid (choose from: {', '.join(map(str, choices))})")


def positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    finite(key, value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'non-negative' if allow_zero else 'positive'}")


def finite(key: str, value: float) -> None:
    """NaN and inf pass every comparison check unnoticed (``nan < 0`` is false), so they are refused first."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value} must be a finite number")


def all_finite(key: str, value: Any) -> None:
    """``finite`` for every float in a settings object, its nested dataclasses, dicts and lists included."""
    if isinstance(value, (list, tuple)):
        for item in value:
            all_finite(f"{key}[]", item)
        return
    if dataclasses.is_dataclass(value):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        items = list(value.items())
    else:
        return finite(key, value)
    parent = key.rstrip(".")
    for name, item in items:
        all_finite(f"{parent}.{name}" if parent else str(name), item)


def to_dataclass(schema: type, raw: DictConfig | dict, *, prefix: str = "") -> Any:
    """``raw`` merged over ``schema``'s defaults, as a ``schema`` instance; ConfigError if it does not fit
    or holds a number that is not finite."""
    try:
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), raw))
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(explain(e, prefix=prefix)) from None
    all_finite(prefix, settings)
    return settings


def explain(error: oc_errors.OmegaConfBaseException, *, prefix: str = "") -> str:
    """One line for an OmegaConf error: the key, and the valid keys when it is unknown."""
    key = f"{prefix}{error.full_key}"
    if isinstance(error, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)):
        schema = error.object_type
        valid = (f" (valid keys here: {', '.join(f.name for f in dataclasses.fields(schema))})"
                 if dataclasses.is_dataclass(schema) else "")
        return f"unknown key '{key}'{valid}"
    if isinstance(error, oc_errors.MissingMandatoryValue):
        return f"'{key}' must be set"
    return f"'{key}': {str(error.msg).splitlines()[0]}"


@dataclass
class ModelConfig:
    d_model: int = 128  # width of the residual stream
    n_layers: int = 4  # blocks, each a mixer and (with mlp) a SwiGLU MLP
    n_heads: int = 4  # the mixer's heads
    d_ff: Optional[int] = None  # SwiGLU hidden size; default ~8/3 d_model rounded up to 64
    tie_embeddings: bool = True  # the output layer reuses the embedding matrix
    dtype: str = "float32"  # compute dtype; parameters are always float32
    norm_eps: float = 1e-6  # RMSNorm's epsilon
    init_std: float = 0.02  # standard deviation of the initial weights
    mlp: bool = True  # false: blocks are the mixer alone (e.g. GAU models, whose mixer has its own gating)
    remat: str = "none"  # recompute activations in the backward pass: none | block | mixer | light (memory for compute)


SCHEDULES = ("cosine", "wsd", "linear", "constant")  # optim.schedule (lmzoo.run.optim)
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")  # optim.decay_shape of a WSD schedule
OPTIMIZERS = ("adamw", "muon")  # optim.name: configs/optim/<name>.yaml


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule (``lmzoo.run.optim``)."""

    name: str = "adamw"  # adamw | muon (Muon for the hidden matrices, AdamW for the rest)
    lr: float = 3e-3  # peak learning rate (AdamW's), reached after warmup_steps
    warmup_steps: int = 50  # linear warmup from 0
    schedule: str = "cosine"  # cosine | wsd | linear | constant (each after the warmup)
    min_lr_ratio: float = 0.1  # cosine, linear and wsd decay to lr * min_lr_ratio at the last step
    decay_fraction: float = 0.2  # wsd: the share of train.steps spent decaying (when decay_start is null)
    decay_start: Optional[int] = None  # wsd: the step the decay begins; null: train.steps * (1 - decay_fraction)
    decay_shape: str = "1-sqrt"  # wsd: linear | cosine | 1-sqrt
    weight_decay: float = 0.1  # AdamW's decoupled weight decay
    b1: float = 0.9  # Adam's first-moment decay
    b2: float = 0.95  # Adam's second-moment decay
    eps: float = 1e-8  # Adam's denominator floor
    grad_clip: Optional[float] = 1.0  # the global gradient norm is clipped to this; null: not clipped
    muon_lr: float = 0.02  # muon: the hidden matrices' peak learning rate (same schedule)
    muon_momentum: float = 0.95  # muon: Nesterov momentum
    muon_ns_steps: int = 5  # muon: Newton-Schulz iterations
    muon_weight_decay: float = 0.0  # muon: decoupled weight decay of the hidden matrices (times muon's lr)
    muon_consistent_rms: Optional[float] = None  # muon: null: steps scaled sqrt(max(1, out/in)); r: to RMS r
                                                 # (0.2 ~ AdamW's)

    def check(self, total_steps: int) -> None:
        one_of("optim.name", self.name, OPTIMIZERS)
        one_of("optim.schedule", self.schedule, SCHEDULES)
        one_of("optim.decay_shape", self.decay_shape, DECAY_SHAPES)
        for key in ("lr", "muon_lr", "muon_ns_steps"):
            positive(f"optim.{key}", getattr(self, key))
        if self.grad_clip is not None:
            positive("optim.grad_clip", self.grad_clip)
        for key in ("warmup_steps", "weight_decay", "muon_weight_decay"):
            positive(f"optim.{key}", getattr(self, key), allow_zero=True)
        for key in ("min_lr_ratio", "decay_fraction", "muon_momentum"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"optim.{key}={getattr(self, key)} must lie in [0, 1]")
        if self.muon_consistent_rms is not None:
            positive("optim.muon_consistent_rms", self.muon_consistent_rms)
        if self.decay_start is not None and not 0 <= self.decay_start <= total_steps:
            raise ConfigError(f"optim.decay_start={self.decay_start} must lie in [0, train.steps={total_steps}]")


@dataclass
class MixerConfig:
    """The spec of a sequence mixer: fields every attn option has, and what a spec does.

    A mixer module subclasses this with its own knobs, registers the subclass with
    ``@lmzoo.registry.register("<name>")`` and implements ``build``.
    """

    # Whether the mixer this spec builds has ``carry`` (a forward from a given recurrent state, the base
    # of ``train.state_passing``); a class attribute, not a config key.
    carries_state = False
    # The forms ``attn.method`` may name (``lmzoo.ops.common.Forms``) where the spec has a method; a class
    # attribute, not a config key.
    forms: ClassVar[tuple[str, ...]] = ()
    # Whether the defaults alone make a variant, so the registry offers ``+attn=<mixer>`` without a YAML file
    # (``lmzoo.config.options_made``); a class attribute, not a config key.
    complete_by_default: ClassVar[bool] = True

    name: str = MISSING  # the variant's name in logs and comparisons (+attn=<name>)
    mixer: str = MISSING  # registry key of the spec that builds it

    def check(self, model: ModelConfig) -> None:
        """Raise ConfigError for settings that cannot work with ``model``."""

    def for_layer(self, layer: int, n_layers: int) -> "MixerConfig":
        """The spec of the mixer in ``layer`` (0 = bottom); per-layer patterns override this."""
        return self

    def build(self, ctx, *, rngs):
        """The mixer module for one layer (``ctx``: a ``MixerContext``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define build()")

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Training FLOPs per token (forward and backward) of this layer's sequence mixing that the
        ``6 * parameters`` rule does not count: the token-token interactions (0 where there are none)."""
        return 0.0


PER_POSITION, LAST_STATE = "per_position", "last_state"  # DataConfig.readout: where a position's logits come from


@dataclass
class DataConfig:
    """The spec of a data source or synthetic task: fields every data option has, and what a spec does.

    A data module subclasses this with its own settings (and ``source`` defaulting to its name), registers
    the subclass with ``@lmzoo.registry.SOURCES.register("<name>")`` and implements ``build``.
    """

    # Whether the defaults alone make a data option, so the registry offers ``data=<source>`` without a YAML file
    # (``lmzoo.config.options_made``); a class attribute, not a config key.
    complete_by_default: ClassVar[bool] = True

    source: str = MISSING  # registry key of the spec that builds the data
    seq_len: int = 256  # tokens per training sequence
    allow_changed: bool = False  # resume although the data differ from those the run trained on (recorded)

    def check(self) -> None:
        """Raise ConfigError for settings that cannot work."""
        positive("data.seq_len", self.seq_len)

    def build(self, *, seed: int, shard_index: int, shard_count: int):
        """The data: a tokenizer, training batches and fixed validation batches (see ``lmzoo.data.Data``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define build()")

    def readout(self) -> str:
        """Where the model reads each position's logits from: ``per_position`` (its own state: next-token
        prediction) or ``last_state`` (the last position's state decoded at every position, ``lmzoo.model``'s
        ``LastStateReadout``: a task whose targets are its own inputs, recovered from one vector)."""
        return PER_POSITION

    def extra_evaluation(self, forward, lengths, out_dir, *, seed: int = 0, batch_size: int = 8) -> Optional[dict]:
        """Evaluations of its own a source offers beyond loss and accuracy (e.g. a retrieval grid), or None.

        ``forward`` maps tokens ``[B, T]`` to logits ``[B, T, V]``; ``lengths`` are the input lengths to
        evaluate (None: the source's own choice), ``seed`` the run's data seed; plots go into ``out_dir``.
        Returns JSON-ready results by name, e.g. ``{"passkey": {...}}``.
        """
        return None


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping as dotted keys: ``{"optim": {"lr": 1e-3}}`` -> ``{"optim.lr": 1e-3}``."""
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


# Which settings can change the trained model (``changes_trained_model``). Runs that differ only in settings
# that cannot are seeds of one experiment (``lmzoo.compare`` pools them into one arm); every other difference
# makes another arm. A key is classified by its longest entry below (a whole group, or one key); a new key
# matching none must be added to one list (tests/measure/test_compare.py checks every key of every spec).
CANNOT_CHANGE_TRAINED_MODEL = (
    "run_dir", "label", "logger",  # where it is written, what it is called, where its metrics also go
    "data.allow_changed",  # whether a resume may proceed; the change itself is recorded in resumes.jsonl
    "model.remat",  # recomputes activations in the backward pass: the same values
    "attn.method",  # the computation form: every form is tested equal to the reference (kernels are named apart)
    "train.progress", "train.log_every", "train.eval_every", "train.eval_tokens", "train.probe_batch",
    "train.checkpoint_every", "train.keep_checkpoints",  # what is shown, logged, validated and saved
    "train.grad_accum", "train.steps_per_call",  # the same update, split or fused differently
    "train.pack_state",  # how the state's arrays travel to each jitted call: the same numbers
    "train.seeds",  # several seeds trained in one step: each seed's own run holds its own seed (and no seeds)
    "train.lrs",  # several learning rates trained in one step: each run holds its own optim.lr (and no lrs)
    "train.distributed", "train.coordinator_address", "train.num_processes", "train.process_id", "train.mesh",
)  # placement over processes and devices: the same model, rounding apart
CAN_CHANGE_TRAINED_MODEL = (
    "seed", "model", "pos", "data", "optim", "attn",
    "train.steps", "train.batch_size", "train.max_nonfinite", "train.state_passing", "train.z_loss",
)


def _classifying_entry(key: str) -> str | None:
    entries = [e for e in CANNOT_CHANGE_TRAINED_MODEL + CAN_CHANGE_TRAINED_MODEL
               if key == e or key.startswith(e + ".")]
    return max(entries, key=len, default=None)


def changes_trained_model(key: str) -> bool:
    """Whether the dotted setting ``key`` can change the trained model; an unclassified key counts as one that
    can (two runs that differ in it stay apart)."""
    return _classifying_entry(key) not in CANNOT_CHANGE_TRAINED_MODEL


def is_classified(key: str) -> bool:
    return _classifying_entry(key) is not None
