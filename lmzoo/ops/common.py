"""Pieces every op shares: the causal mask, chunk padding, segment sums of log decays, the form check,
document segments (``segment_ids [B, T]``, equal within a document), and the softmax attentions' grouped
query heads and softmax over the visible keys only.

They live here, not in any one op, so that the general op and its special cases import from the
same place and none of them from a sibling.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax


def causal_mask(t: int, s: Optional[int] = None, *, window: Optional[int] = None) -> jax.Array:
    """[T, S] bool, True where query i may see key j; queries are the last T of S positions (S = T by default)."""
    s = t if s is None else s
    i = jnp.arange(t)[:, None] + (s - t)
    j = jnp.arange(s)[None, :]
    mask = j <= i
    if window is not None:  # a window of w keys: the query itself and the w - 1 before it
        mask &= j > i - window
    return mask


# A recurrence restarts at a segment start by forgetting with this log decay: exp(-40) ~ 4e-18 of
# the old state survives, far below float32's resolution of what the new document adds, while every
# sum of log decays stays finite (with -inf, differences of cumulative sums in the chunked forms
# would be NaN, and so would the gates' gradients).
RESET_LOG_DECAY = -40.0


def one_document(shape) -> jax.Array:
    """Segment ids [B, T] of one document. Behind a barrier: as a constant, XLA would fold the positions and masks
    computed from it at compile time, a cumulative sum over every step that takes seconds at an evaluation's
    shapes (and logs a "constant folding" alarm), where running it costs microseconds."""
    return lax.optimization_barrier(jnp.zeros(shape, jnp.int32))


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """[B, T] bool: True where step t opens a new segment (t > 0 and its id differs from step t - 1's).

    Step 0 is never a start: an initial state belongs to the segment the sequence begins in."""
    ids = jnp.asarray(segment_ids)
    return jnp.concatenate([jnp.zeros_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], axis=1)


def same_segment(q_ids: jax.Array, k_ids: Optional[jax.Array] = None) -> jax.Array:
    """[B, T, S] bool: True where query i and key j lie in one segment (ids [B, T] and [B, S])."""
    k_ids = q_ids if k_ids is None else k_ids
    return q_ids[:, :, None] == k_ids[:, None, :]


def grouped(q: jax.Array, n_kv: int) -> jax.Array:
    """[B, T, HQ, D] -> [B, T, H, G, D] float32: the G query heads of each kv head side by side."""
    b, t, hq, d = q.shape
    return q.astype(jnp.float32).reshape(b, t, n_kv, hq // n_kv, d)


def masked_softmax(logits: jax.Array, visible: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(probabilities, log-sum-exp) over the last axis of the visible entries; a row with none visible
    gives zeros and −inf, with finite gradients (masked logits never reach an exp)."""
    safe = jnp.where(visible, logits, 0.0)
    top = lax.stop_gradient(jnp.max(jnp.where(visible, logits, -jnp.inf), axis=-1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weights = jnp.where(visible, jnp.exp(safe - top), 0.0)
    total = weights.sum(-1, keepdims=True)
    probs = weights / jnp.where(total > 0, total, 1.0)
    lse = jnp.where(total > 0, top + jnp.log(jnp.where(total > 0, total, 1.0)), -jnp.inf)
    return probs, lse[..., 0]


def reset_gates(log_g, segment_ids, key_shape) -> jax.Array:
    """Log gates [B, T, H, Dg] float32 that also forget everything at each segment start.

    ``log_g``: None (no decay; the result has one gate per head), [B, T, H] or [B, T, H, Dg]."""
    gates = jnp.zeros((*key_shape[:3], 1), jnp.float32) if log_g is None else gate_layout(log_g, key_shape)
    reset = jnp.where(segment_starts(segment_ids), RESET_LOG_DECAY, 0.0)[:, :, None, None]
    return gates.astype(jnp.float32) + reset


def gates_float32(log_g, segment_ids, key_shape) -> Optional[jax.Array]:
    """The log gates a recurrence runs on, [B, T, H, Dg] float32: ``log_g`` laid out (None without a decay),
    and with ``segment_ids`` forgetting everything at each document start (``reset_gates``)."""
    if segment_ids is not None:
        return reset_gates(log_g, segment_ids, key_shape)
    return None if log_g is None else gate_layout(log_g, key_shape).astype(jnp.float32)


def state_float32(initial_state, shape) -> jax.Array:
    """The initial state as float32, zeros of ``shape`` where None: recurrences accumulate in float32."""
    return jnp.zeros(shape, jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)


class Forms(tuple):
    """An op's computation forms (its ``method`` values), one vocabulary across ops: ``"naive"`` the
    readable reference every other form is tested against; ``"parallel"`` the weights materialised over
    the whole sequence; ``"chunk"`` matmuls within chunks, a recurrence across them (``"chunk_recompute"``
    the same, recomputed in the backward pass: ``recompute_in_backward``); ``"blocked"``
    attention by blocks of queries; ``"scan"`` a fast ``lax.scan`` over time (never the reference);
    ``"assoc"`` an associative scan; ``"fft"``, ``"gather"``, ``"pallas"`` and the kernel providers'
    ``"xla"``, ``"cudnn"``, ``"jla"``, ``"auto"`` as their ops describe.

    Only today's names: the names older runs saved (``attn.method: scan`` where "scan" was a reference) are
    renamed where a saved run is read, ``lmzoo.record.migrate``. A tuple, so ``method in FORMS`` and listing
    the forms work as for any tuple."""

    def __new__(cls, *names: str):
        return super().__new__(cls, names)


def check_form(method: str, methods: tuple[str, ...], chunk_size: Optional[int] = None) -> str:
    """``method``, the form an op runs; the errors an op raises for a form it lacks or a chunk size that is not
    positive."""
    if method not in methods:
        raise ValueError(f"method={method!r} is not valid (choose from: {', '.join(methods)})")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be positive")
    return method


def gate_layout(log_g, key_shape) -> jax.Array:
    """log_g as [B, T, H, Dg] with Dg = Dk (per dimension) or 1 (per head)."""
    if log_g.ndim == 3:
        log_g = log_g[..., None]
    if log_g.shape[:3] != key_shape[:3] or log_g.shape[-1] not in (1, key_shape[-1]):
        raise ValueError(f"log_g has shape {log_g.shape}; expected {key_shape[:3]} + ({key_shape[-1]},) or (1,) or ()")
    return log_g


def to_chunks(x: jax.Array, size: int) -> jax.Array:
    """[B, T, ...] -> [B, N, size, ...], zero-padding T up to a multiple of ``size``.

    Zero padding is neutral for every recurrence here: a padded step has a zero key (or input)
    and a zero log decay, so it adds nothing and lets the state pass unchanged.
    """
    pad = -x.shape[1] % size
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(x.shape[0], -1, size, *x.shape[2:])


def from_chunks(x: jax.Array, length: int) -> jax.Array:
    """[B, N, C, ...] -> [B, length, ...]: undo ``to_chunks``."""
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def decay_since(log_g, axis: int) -> jax.Array:
    """Inclusive cumulative log decay along ``axis``: sum_{m<=t} log_g_m."""
    return jnp.cumsum(log_g, axis=axis)


def decay_until_end(log_g, axis: int) -> jax.Array:
    """Exclusive reverse cumulative log decay along ``axis``: sum_{m>t} log_g_m (0 at the last step).

    One step has nothing after it: zeros, with no cumulative sum whose gradient would be a reverse sum over a
    constant (XLA's GPU pipeline spends minutes constant-folding that reduce-window at training shapes)."""
    if log_g.shape[axis] == 1:
        return jnp.zeros_like(log_g)
    after = lax.cumsum(log_g, axis=axis, reverse=True)  # sum_{m>=t}
    later = lax.slice_in_dim(after, 1, None, axis=axis)  # sum_{m>t} for every step but the last
    return jnp.concatenate([later, jnp.zeros_like(lax.slice_in_dim(after, 0, 1, axis=axis))], axis=axis)


def segment_sums(log_g) -> jax.Array:
    """[..., T, H, Dg] -> [..., T(i), T(j), H, Dg]: ``sum_{j<m<=i} log_g_m`` for j <= i, -inf above.

    Built row by row (row i = row i-1 + log_g_i on the columns j < i), so each entry sums only its
    own steps; a cumulative sum along i would do the same in log T passes over the [T, T] array.
    """
    t = log_g.shape[-3]
    steps = jnp.moveaxis(log_g, -3, 0)  # (T, ..., H, Dg)
    columns = jnp.arange(t)[:, None, None]  # j, against (T(j), H, Dg)

    def next_row(row, step):
        i, log_g_i = step
        row = row + jnp.where(columns < i, log_g_i[..., None, :, :], 0.0)
        return row, row

    first = jnp.zeros(steps.shape[1:-2] + (t,) + steps.shape[-2:], log_g.dtype)  # (..., T(j), H, Dg)
    _, rows = lax.scan(next_row, first, (jnp.arange(t), steps))  # (T(i), ..., T(j), H, Dg)
    sums = jnp.moveaxis(rows, 0, -4)
    return jnp.where(causal_mask(t)[:, :, None, None], sums, -jnp.inf)


def in_float32(form):
    """``form(q, k, v, *rest, chunk_size)`` called with float32 copies of q, k and v, q scaled by ``scale``: keyword
    arguments ``scale`` and ``chunk_size``, the rest (gates, state) as given."""
    def run(q, k, v, *rest, scale, chunk_size):
        q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
        return form(q32 * scale, k32, v32, *rest, chunk_size)
    return run


def recompute_in_backward(form):
    """``form(*args)`` differentiated by running it again in the backward pass: only its inputs are kept between
    the passes, never its intermediates.

    Unlike ``jax.checkpoint``, whose recomputation depends on nothing the backward pass makes, so that XLA may
    schedule every layer's recomputation at once before the first layer's backward (XLA's CPU scheduler does: the
    step held as much as without it), the inputs pass through one ``optimization_barrier`` with the outputs'
    cotangents, so a layer recomputes only once its own backward begins. The gradients are autodiff's own of
    ``form``; ``args`` is a pytree of arrays (None for an absent one)."""
    @jax.custom_vjp
    def run(*args):
        return form(*args)

    def forward(*args):
        return form(*args), args

    def backward(args, cotangent):
        args, cotangent = lax.optimization_barrier((args, cotangent))
        return jax.vjp(form, *args)[1](cotangent)

    run.defvjp(forward, backward)
    return run


def halves(x, half: int) -> jax.Array:
    """[B, N, W, H, D] -> [B, N, W / (2 half), 2, half, H, D]: blocks of 2 half steps, split in two."""
    batch, chunks, width, heads, dim = x.shape
    return x.reshape(batch, chunks, width // (2 * half), 2, half, heads, dim)
