"""The optimizer and its learning-rate schedule (``optim=adamw|muon``, ``optim.schedule=...``).

Every update first clips the global gradient norm to ``optim.grad_clip`` (null: not clipped). Then

* ``adamw``: AdamW on every parameter; weight decay on matrices only (norm scales and biases are
  vectors and are left alone).
* ``muon``: Muon on the hidden matrices, AdamW (as above) on everything else. Muon keeps a Nesterov
  momentum of each matrix's gradient, ``m_t = beta m_{t-1} + (1 - beta) g_t`` and
  ``n_t = beta m_t + (1 - beta) g_t`` (each term bias-corrected), and steps along its orthogonalisation: ``U V^T`` for
  ``n_t = U S V^T``, approximated by ``optim.muon_ns_steps`` quintic Newton-Schulz iterations
  ``X <- a X + (b A + c A^2) X``, ``A = X X^T``, from ``X_0 = n_t / ||n_t||_F``
  (``optax.contrib.scale_by_muon``; its coefficients trade exactness for few iterations: singular values
  end near [0.7, 1.2] rather than at 1, and those far below the largest grow less). The step is scaled by
  ``sqrt(max(1, fan_out / fan_in))``, or with ``optim.muon_consistent_rms=r`` by
  ``r sqrt(max(fan_in, fan_out))``, which gives it AdamW's RMS so that both halves can share one
  learning rate; weight decay ``optim.muon_weight_decay`` is decoupled, scaled by Muon's learning rate.

A *hidden matrix* is the 2-D kernel of a projection between hidden widths: a parameter named
``kernel`` (what every dense layer calls its weight) with two dimensions, neither of them the
vocabulary (``lmzoo.sharding`` names each parameter's logical axes). So the embedding table and an
untied output head stay with AdamW, as do norms, gains, biases, depthwise filter taps
(``[taps, channels]``: the channels never mix, so there is no matrix to orthogonalise) and anything
not 2-D. Every mixer gets the split without listing its parameters.

Schedules (``optim.schedule``), each after a linear warm-up from 0 over ``optim.warmup_steps``; all but
``constant`` end at ``floor = lr * optim.min_lr_ratio`` and ``p`` is the fraction of their decay done:

* ``cosine``: ``floor + (lr - floor) (1 + cos(pi p)) / 2`` over the steps after the warm-up (the default);
* ``linear``: ``floor + (lr - floor) (1 - p)`` over the steps after the warm-up;
* ``constant``: ``lr`` to the end;
* ``wsd`` (warm-up, stable, decay): ``lr`` until ``optim.decay_start`` (null: the last
  ``optim.decay_fraction`` of ``train.steps``), then ``floor + (lr - floor) f(p)`` to the end, with
  ``f`` per ``optim.decay_shape``: ``linear`` ``1 - p``, ``cosine`` ``(1 + cos(pi p)) / 2``,
  ``1-sqrt`` ``1 - sqrt(p)``.

A schedule is a function of the optimizer's step count alone, so a run resumed with ``train.steps``
raised and ``optim.decay_start`` set continues its stable phase into a decay (``lmzoo.run.loop``);
``check_continuation`` names a learning rate that jumps at the resumed step.
"""

from __future__ import annotations

import logging
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from lmzoo.config import Config
from lmzoo.record.directory import RunDir
from lmzoo.schema import OptimConfig, to_dataclass
from lmzoo.sharding import VOCAB, logical_names

log = logging.getLogger("lmzoo.train")
MATRIX = MuonDimensionNumbers(reduction_axis=0, output_axis=1)  # a kernel W [in, out] maps x to x @ W

# ----------------------------------------------------------------------------- schedules

DECAY_CURVES = {  # p in [0, 1] (the decay's progress) -> the share of (lr - floor) left
    "linear": lambda p: 1.0 - p,
    "cosine": lambda p: 0.5 * (1.0 + jnp.cos(jnp.pi * p)),
    "1-sqrt": lambda p: 1.0 - jnp.sqrt(p),
}


def decay_start(cfg: OptimConfig, total_steps: int) -> int:
    """The step where a WSD decay begins: ``optim.decay_start``, else the last ``decay_fraction`` of the run."""
    if cfg.decay_start is not None:
        return cfg.decay_start
    return total_steps - round(cfg.decay_fraction * total_steps)


def decaying(peak: float, floor: float, shape: str, steps: int) -> optax.Schedule:
    """From ``peak`` at count 0 down to ``floor`` at count ``steps`` (and after), along ``shape``."""
    curve = DECAY_CURVES[shape]
    return lambda count: floor + (peak - floor) * curve(jnp.clip(count / max(steps, 1), 0.0, 1.0))


def learning_rate_schedule(cfg: OptimConfig, total_steps: int, peak: float | None = None) -> optax.Schedule:
    """The learning rate at each optimizer step (0-based) of a ``total_steps`` run; ``peak``: ``optim.lr`` if None."""
    peak = cfg.lr if peak is None else peak
    floor = peak * cfg.min_lr_ratio
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    if cfg.schedule == "cosine":  # optax's own, so runs trained before the other schedules existed stay the same
        return optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=peak, warmup_steps=warmup,
                                                  decay_steps=max(total_steps, warmup + 1), end_value=floor)
    if cfg.schedule == "wsd":
        start = decay_start(cfg, total_steps)
        warmup = min(warmup, start)
        decay = decaying(peak, floor, cfg.decay_shape, total_steps - start)
        after_warmup = optax.join_schedules([optax.constant_schedule(peak), decay], [start - warmup])
    elif cfg.schedule == "linear":
        after_warmup = decaying(peak, floor, "linear", total_steps - warmup)
    else:  # constant
        after_warmup = optax.constant_schedule(peak)
    if not warmup:
        return after_warmup
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after_warmup], [warmup])


# ----------------------------------------------------------------------------- a resume's schedule


def schedule_in_effect(run: RunDir) -> tuple[OptimConfig, int]:
    """The optimizer settings and step count the run trained with so far."""
    settings = run.settings_in_effect()
    return to_dataclass(OptimConfig, settings.optim, prefix="optim."), int(settings.train.steps)


def check_continuation(run: RunDir, cfg: Config, step: int) -> None:
    """Before a resume at ``step`` records its changes: a learning rate that jumps at ``step`` (a schedule
    changed mid-decay, say) is named in a warning; a WSD decay that goes on from ``step`` says where it decays."""
    before, steps_before = schedule_in_effect(run)
    was = float(learning_rate_schedule(before, steps_before)(step))
    now = float(learning_rate_schedule(cfg.optim, cfg.train.steps)(step))
    if not math.isclose(was, now, rel_tol=1e-6, abs_tol=1e-12):
        log.warning("warning: the learning rate jumps at step %d from %.4g to %.4g (the schedule's settings changed: "
                    "optim.* or train.steps)", step, was, now)
    elif cfg.optim.schedule == "wsd" and (before, steps_before) != (cfg.optim, cfg.train.steps):
        log.info("the schedule goes on from step %d at lr %.4g: %s", step, now,
                 describe_wsd(cfg.optim, cfg.train.steps))


def describe_wsd(optim: OptimConfig, steps: int) -> str:
    return f"stable until step {decay_start(optim, steps)}, then a {optim.decay_shape} decay to step {steps}"


# ----------------------------------------------------------------------------- which parameter gets which


def is_hidden_matrix(path, variable: nnx.Variable) -> bool:
    """Whether Muon updates this parameter: a 2-D projection kernel that does not touch the vocabulary."""
    return (getattr(path[-1], "key", None) == "kernel" and variable.ndim == 2
            and VOCAB not in (logical_names(variable) or ()))


def optimizer_labels(params):
    """``"muon"`` or ``"adamw"`` for each parameter of a state tree (parameters, gradients or updates)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, variable: "muon" if is_hidden_matrix(path, variable) else "adamw", params,
        is_leaf=lambda x: isinstance(x, nnx.Variable))


def decay_mask(params):
    """Decay matrices only: norm scales and biases (vectors) are left alone."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


# ----------------------------------------------------------------------------- optimizers


def adamw(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    return optax.adamw(learning_rate_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                       weight_decay=cfg.weight_decay, mask=decay_mask)


def shape_scale(fan_in: int, fan_out: int, consistent_rms: float | None) -> float:
    """Muon's step size per matrix shape: Keller Jordan's ``sqrt(max(1, out / in))``, or with ``consistent_rms``
    the scale that gives the orthogonal step that RMS (Liu et al., "Muon is scalable for LLM training")."""
    if consistent_rms is None:
        return math.sqrt(max(1.0, fan_out / fan_in))
    return consistent_rms * math.sqrt(max(fan_in, fan_out))


def scale_by_shape(consistent_rms: float | None) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        return jax.tree.map(lambda u: u * shape_scale(*u.shape, consistent_rms), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def muon(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    """Muon for the matrices it is given (every one 2-D)."""
    matrices = lambda updates: jax.tree.map(lambda _: MATRIX, updates)  # noqa: E731
    return optax.chain(
        scale_by_muon(ns_steps=cfg.muon_ns_steps, beta=cfg.muon_momentum, nesterov=True,
                      weight_dimension_numbers=matrices),
        scale_by_shape(cfg.muon_consistent_rms),
        optax.add_decayed_weights(cfg.muon_weight_decay),
        optax.scale_by_learning_rate(learning_rate_schedule(cfg, total_steps, peak=cfg.muon_lr)),
    )


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    clip = optax.identity() if cfg.grad_clip is None else optax.clip_by_global_norm(cfg.grad_clip)
    if cfg.name == "adamw":
        return optax.chain(clip, adamw(cfg, total_steps))
    return optax.chain(clip, optax.multi_transform(
        {"adamw": adamw(cfg, total_steps), "muon": muon(cfg, total_steps)}, optimizer_labels))
