"""How focused is an attention row, and where? Three measures, computed over the valid entries of each row.

``l1_l2_sparsity``: ``S(a) = mean|a| / sqrt(mean a^2)``. By Cauchy-Schwarz ``S <= 1`` with equality
for a row of equal magnitudes; a one-hot row of n entries gives ``1/sqrt(n)``, the minimum. It is
invariant to scaling the row and defined for signed, unnormalised weights, so it applies equally to
softmax probabilities and to the effective matrices of linear attention and state-space layers.

``attention_entropy``: Shannon entropy (nats) of a row after normalising it to sum to one (the
magnitudes are used, so signed effective matrices get the entropy of their |weights|).

``first_key_share``: the share of a row's |weights| on its first valid key, where attention sinks
form (heads that park weight on the first token when they have nothing to read); ``1/n`` uniform.

All take ``[..., T, S]`` arrays and an optional boolean mask broadcastable to them (True = a
valid entry, e.g. the causal lower triangle); they reduce ``axis`` and return one value per row.
A row with no valid entry, or all zeros, gives NaN.
"""

from __future__ import annotations

import jax.numpy as jnp


def _valid(weights, mask):
    weights = jnp.asarray(weights, jnp.float32)
    if mask is None:
        return weights, jnp.ones(weights.shape, bool)
    mask = jnp.broadcast_to(mask, weights.shape)
    return jnp.where(mask, weights, 0.0), mask


def l1_l2_sparsity(weights, mask=None, axis: int = -1):
    """``mean|a| / sqrt(mean a^2)`` over the valid entries of each row: 1 uniform, 1/sqrt(n) one-hot."""
    a, mask = _valid(weights, mask)
    n = mask.sum(axis)
    mean_abs = jnp.abs(a).sum(axis) / n
    rms = jnp.sqrt(jnp.square(a).sum(axis) / n)
    return mean_abs / rms  # 0/0 = NaN for empty or all-zero rows


def attention_entropy(weights, mask=None, axis: int = -1):
    """Entropy in nats of each row normalised to a distribution: 0 one-hot, log(n) uniform."""
    a, _ = _valid(weights, mask)
    p = jnp.abs(a) / jnp.abs(a).sum(axis, keepdims=True)
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis)


def first_key_share(weights, mask=None, axis: int = -1):
    """``|a_first| / sum|a|`` per row, ``a_first`` its first valid entry; NaN for rows of fewer than two keys,
    whose one key is the first by force."""
    a, mask = _valid(weights, mask)
    first = jnp.expand_dims(jnp.argmax(mask, axis=axis), axis)  # argmax of booleans: the first True
    on_first = jnp.take_along_axis(jnp.abs(a), first, axis=axis).squeeze(axis)
    return jnp.where(mask.sum(axis) > 1, on_first / jnp.abs(a).sum(axis), jnp.nan)
