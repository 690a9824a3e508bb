"""The jitted step math of training and validation, and the training state it acts on.

The objective, its gradients (with micro-batches), one guarded optimizer step and per-token
validation scores, each a pure function.

The objective is the mean next-token cross-entropy over the scored targets, plus the auxiliary losses
mixers sow, plus with ``train.z_loss=c`` the z-loss ``c * mean_t(logsumexp(logits_t)^2)`` (PaLM), which
keeps the softmax normaliser near 1 so that logits do not drift; each is logged apart from the loss.

With ``train.state_passing`` the training state also holds ``carried``, the model's recurrent state after
the last batch (``LM.carry``): each batch row continues from its row of it, gradients stopped there
(truncated backpropagation through time), and a row whose batch says it does not continue
(``continues`` False: a new document, or a new pass over the data) starts from zeros. A step skipped as
non-finite restarts every row too: its data has moved one window on, and the state it would carry is
the one the step refused.

Pure functions of (graphdef, state, batch); ``lmzoo.run.loop`` jits them, and benchmarks and tests
call them directly.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

from lmzoo.config import Config
from lmzoo.scoring.lengths import logit_scores, token_scores
from lmzoo.mixers.base import AuxLoss
from lmzoo.model import LM, restart_rows
from lmzoo.record.checkpoints import split_model
from lmzoo.run.optim import make_optimizer


def scored_mean(values: jax.Array, batch) -> jax.Array:
    """Mean over the scored positions: all of them, or those a synthetic task weights."""
    weights = batch.get("weights")
    if weights is None:
        return values.mean()
    return (values * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def next_token_loss(model: LM, batch, z_loss: float = 0.0, carried=None, terms=None):
    """Next-token cross-entropy, its accuracy, the auxiliary losses mixers sowed in the forward,
    (``z_loss`` > 0) the z-loss term and the data source's own ``terms(token_loss, batch)``
    (``lmzoo.data.base.SourceMetrics.step_terms``): ``(loss, metrics)``; given the ``carried`` state,
    the batch continues from it and ``(loss, metrics, carried after the batch)``."""
    logits, sown, carried = forward(model, batch, carried)  # (B, T, V)
    scores = logit_scores(logits, batch["targets"])
    loss, accuracy = scored_mean(scores["loss"], batch), scored_mean(scores["correct"], batch)
    metrics = {"accuracy": accuracy, **sum_by_name(sown)}
    if z_loss:
        metrics["z_loss"] = z_loss_term(logits, batch, z_loss)
    if terms is not None:
        metrics.update(terms(scores["loss"], batch))
    return (loss, metrics) if carried is None else (loss, metrics, carried)


def forward(model: LM, batch, carried=None):
    """(logits, sown auxiliary losses, the carried state after the batch or None): the parallel forward, or
    with ``carried`` the batch continuing from it (no gradient flows into it: truncated backpropagation)."""
    segment_ids = batch.get("segment_ids")
    if carried is None:
        logits, sown = nnx.capture(model, AuxLoss)(batch["inputs"], segment_ids=segment_ids)
        return logits, sown, None
    (logits, carried), sown = nnx.capture(model.carry, AuxLoss)(
        batch["inputs"], lax.stop_gradient(carried), segment_ids=segment_ids, continues=batch["continues"])
    return logits, sown, carried


def z_loss_term(logits: jax.Array, batch, coefficient: float) -> jax.Array:
    """``coefficient * mean(logsumexp(logits)^2)`` over the scored positions."""
    log_normaliser = jax.nn.logsumexp(logits, axis=-1)  # (B, T), logits are float32
    return coefficient * scored_mean(jnp.square(log_normaliser), batch)


def sum_by_name(sown) -> dict[str, jax.Array]:
    """Sown AuxLoss values summed over layers by name: {"aux/<name>": scalar}."""
    totals: dict[str, jax.Array] = {}
    for path, value in nnx.to_flat_state(sown):
        for v in jax.tree.leaves(value):  # sow keeps a tuple of the values sown
            totals[f"aux/{path[-1]}"] = totals.get(f"aux/{path[-1]}", 0.0) + jnp.mean(v)
    return totals


def loss_and_extra(params, extra, graphdef, batch, z_loss: float = 0.0, carried=None, terms=None):
    """(objective, (metrics, after)): ``after`` is the non-parameter state the forward updated, and with a
    ``carried`` state ``{"extra": that state, "carried": the carried state after the batch}``."""
    model = nnx.merge(graphdef, params, extra, copy=True)  # fresh Variables: in-place writes stay traceable
    model = nnx.view(model, training=True)  # mixers' training-time behaviour on (see Mixer.training)
    loss, metrics, *after_batch = next_token_loss(model, batch, z_loss, carried, terms)
    objective = loss + sum(v for k, v in metrics.items() if k.startswith("aux/") or k == "z_loss")
    metrics = {"loss": loss, **metrics}
    extra = nnx.state(model, nnx.Not(nnx.Param))
    return objective, (metrics, extra if carried is None else {"extra": extra, "carried": after_batch[0]})


def scored_count(batch) -> jax.Array:
    """How many target positions a batch scores (the weights' sum for synthetic tasks)."""
    weights = batch.get("weights")
    return jnp.asarray(batch["targets"].size if weights is None else weights.sum(), jnp.float32)


def gradients(params, extra, graphdef, batch, micro_batches: int = 1, z_loss: float = 0.0, carried=None,
              terms=None):
    """(grads, metrics, extra, carried) of the objective on ``batch``, over ``micro_batches`` slices of its rows in
    turn.

    Each slice's loss is a mean over its scored tokens, so weighting the slices by their share of
    the batch's scored tokens gives the whole batch's gradient with one slice's activations in
    memory. Slice i takes rows i, i + m, i + 2m, ... so that every device's rows feed every slice.
    Non-parameter state the forward updates (``extra``) passes from slice to slice; the ``carried``
    state's rows (None without state passing) go with their batch rows, and come back in their places.
    """
    grad_fn = jax.value_and_grad(partial(loss_and_extra, z_loss=z_loss, terms=terms), has_aux=True)

    def objective_of(extra, piece, rows):
        (_, (metrics, after)), grads = grad_fn(params, extra, graphdef, piece, carried=rows)
        return (grads, metrics, after, None) if rows is None else (grads, metrics, after["extra"], after["carried"])

    if micro_batches == 1:
        return objective_of(extra, batch, carried)
    to_slices = lambda x: x.reshape(-1, micro_batches, *x.shape[1:]).swapaxes(0, 1)  # noqa: E731  (row j m + i -> i, j)
    slices, carried_slices = jax.tree.map(to_slices, (batch, carried))
    counts = jax.vmap(scored_count)(slices)
    shares = counts / counts.sum()

    def one_slice(carry, inputs):
        grads_sum, metrics_sum, extra = carry
        piece, share, rows = inputs
        grads, metrics, extra, rows = objective_of(extra, piece, rows)
        weighted_add = lambda total, x: total + share * x  # noqa: E731
        sums = (jax.tree.map(weighted_add, grads_sum, grads), jax.tree.map(weighted_add, metrics_sum, metrics))
        return (*sums, extra), rows

    first = jax.tree.map(lambda x: x[0], (slices, carried_slices))
    grads_shape, metrics_shape, _, _ = jax.eval_shape(objective_of, extra, *first)
    zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)  # noqa: E731
    (grads, metrics, extra), carried_slices = lax.scan(
        one_slice, (zeros(grads_shape), zeros(metrics_shape), extra), (slices, shares, carried_slices))
    from_slices = lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:])  # noqa: E731  (i, j -> row j m + i)
    return grads, metrics, extra, jax.tree.map(from_slices, carried_slices)


def train_step(graphdef, tx, state, batch, *, micro_batches: int = 1, z_loss: float = 0.0, terms=None):
    """One optimizer step; a step whose loss, gradient norm or new state is not finite keeps the old state
    (and restarts any carried state from zeros).

    The guard only selects between the updated and the old state (``jnp.where``): it adds no arithmetic
    to a finite step, whose numbers stay those of the unguarded step. (``optax.apply_if_finite`` would
    guard the parameters only, not the non-parameter state the forward updates, and would change the
    checkpoint layout.)
    """
    grads, metrics, extra, carried = gradients(state["params"], state["extra"], graphdef, batch, micro_batches, z_loss,
                                               state.get("carried"), terms)
    updates, opt = tx.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    grad_norm = optax.tree.norm(grads)
    updated = {"params": params, "extra": extra, "opt": opt}
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & all_finite((updated, carried))
    kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, {k: state[k] for k in updated})
    new_state = {**kept, "step": state["step"] + 1}
    if carried is not None:  # the data moves one window on either way: after a skipped step, rows start afresh
        new_state["carried"] = restart_rows(carried, finite)
    return new_state, {**metrics, "grad_norm": grad_norm, "finite": finite}


def all_finite(tree) -> jax.Array:
    """Whether every floating-point value of ``tree`` is finite: a scalar bool."""
    checks = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def eval_step(graphdef, state, inputs, targets, segment_ids=None):
    return token_scores(nnx.merge(graphdef, state["params"], state["extra"]), inputs, targets, segment_ids)


def init_train_state(cfg: Config, model: LM):
    """(graphdef, state, optimizer): the state pytree is what checkpoints hold (with ``train.state_passing``,
    the carried state of every batch row too)."""
    graphdef, model_state = split_model(model)
    tx = make_optimizer(cfg.optim, cfg.train.steps)
    state = {**model_state, "opt": tx.init(model_state["params"]), "step": jnp.zeros((), jnp.int32)}
    if cfg.train.state_passing:
        state["carried"] = model.carry_start(cfg.train.batch_size, cfg.data.seq_len)
    return graphdef, state, tx
