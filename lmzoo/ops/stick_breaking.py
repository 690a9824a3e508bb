"""Stick-breaking attention (Tan et al., 2025): each query breaks a unit stick over its keys, nearest first.

    z_ij = scale q_i . k_j,        V(i) = {j < i}  ({j <= i} with ``attend_current``)
    A_ij = sigmoid(z_ij) prod_{l in V(i), l > j} (1 - sigmoid(z_il))        for j in V(i), else 0
    o_i = sum_j A_ij v_j,          rem_i = 1 - sum_j A_ij = prod_{l in V(i)} (1 - sigmoid(z_il))

Key j takes the fraction sigmoid(z_ij) of what the keys nearer to the query left of the stick, so
weights need no softmax normaliser and favour recent keys without any position method. Computed in
log space, in float32 whatever the inputs:

    log A_ij = log sigmoid(z_ij) + sum_{l in V(i), l > j} log(1 - sigmoid(z_il))

the sum an exclusive reverse cumulative sum along the keys, in which keys outside V(i) (later ones,
other documents) add 0: they leave the stick unchanged. ``log(1 - sigmoid(z)) = log sigmoid(z) - z``
costs no second transcendental. ``rem`` is the telescoped product, exp of the whole sum, which is
``1 - sum_j A_ij`` without the cancellation of subtracting.

Forms (``method``):
- ``"naive"``: the whole [T, T] matrix of a sequence at once;
- ``"blocked"``: the same arithmetic for blocks of ``QUERY_BLOCK`` queries, each against the keys up
  to its last query only, so the masked blocks above the diagonal are never computed.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from lmzoo.ops.attention import repeat_kv
from lmzoo.ops.common import Forms, check_form, decay_until_end, same_segment

METHODS = Forms("naive", "blocked")
QUERY_BLOCK = 64  # queries per block of the blocked form


def stick_breaking_weights(logits: jax.Array, visible: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(A, log rem): the weights [..., T, S] float32 of ``logits`` [..., T, S] (keys along the last axis,
    in time order) where ``visible`` (broadcasting to them) allows, and each row's log of the stick left."""
    logits = logits.astype(jnp.float32)
    log_take = jax.nn.log_sigmoid(logits)  # log sigmoid(z): the share a key takes of what is left
    log_leave = jnp.where(visible, log_take - logits, 0.0)  # log(1 - sigmoid(z)); 0 leaves the stick as it is
    log_weights = log_take + decay_until_end(log_leave, axis=log_leave.ndim - 1)
    return jnp.where(visible, jnp.exp(log_weights), 0.0), jnp.sum(log_leave, axis=-1)


def stick_breaking_attention(q, k, v, *, scale: Optional[float] = None, attend_current: bool = False,
                             segment_ids=None, method: str = "blocked"):
    """Stick-breaking attention: q [B,T,HQ,D], k [B,T,H,D], v [B,T,H,Dv] (query head h reads kv head
    h // (HQ/H)) -> (o [B,T,HQ,Dv] in v's dtype, rem [B,T,HQ] float32). ``segment_ids`` [B,T]: keys of
    another document are outside V(i). ``method``: "naive" | "blocked" (same result)."""
    method = check_form(method, METHODS)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = (repeat_kv(x, q.shape[2] // x.shape[2]) for x in (k, v))
    length = q.shape[1]
    block = length if method == "naive" else QUERY_BLOCK
    outputs, rems = [], []
    for start in range(0, length, block):
        stop = min(start + block, length)
        ids = None if segment_ids is None else (segment_ids[:, start:stop], segment_ids[:, :stop])
        weights, log_rem = _rows(q[:, start:stop], k[:, :stop], start, scale=scale, attend_current=attend_current,
                                 ids=ids)
        outputs.append(jnp.einsum("bhts,bshd->bthd", weights, v[:, :stop].astype(jnp.float32)))
        rems.append(jnp.exp(log_rem).swapaxes(1, 2))  # (B, rows, HQ)
    return jnp.concatenate(outputs, axis=1).astype(v.dtype), jnp.concatenate(rems, axis=1)


def stick_breaking_matrix(q, k, *, scale: Optional[float] = None, attend_current: bool = False, segment_ids=None):
    """(A [B,HQ,T,T] float32, rem [B,T,HQ]) of a whole sequence: the weights the probes read."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ids = None if segment_ids is None else (segment_ids, segment_ids)
    weights, log_rem = _rows(q, repeat_kv(k, q.shape[2] // k.shape[2]), 0, scale=scale,
                             attend_current=attend_current, ids=ids)
    return weights, jnp.exp(log_rem).swapaxes(1, 2)


def _rows(q, k, first_query: int, *, scale, attend_current, ids):
    """Weights [B,HQ,R,S] and log rem [B,HQ,R] of the R queries from ``first_query`` on against keys 0..S-1."""
    logits = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    i = first_query + jnp.arange(q.shape[1])[:, None]
    j = jnp.arange(k.shape[1])[None, :]
    visible = (j <= i) if attend_current else (j < i)
    if ids is not None:
        visible = visible & same_segment(*ids)[:, None]  # (B, 1, R, S)
    return stick_breaking_weights(logits, visible)
