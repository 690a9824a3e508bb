"""DeepSeek sparse attention (DSA; DeepSeek-V3.2): a lightning indexer picks top-k keys per query.

The indexer scores every causal key with HI small heads reading one shared key per token
(q_idx [B, T, HI, DI], k_idx [B, T, DI], w_idx [B, T, HI], 1 when None):

    I[t, s] = Σ_j w_idx[t, j] · relu(DI^−½ · q_idx[t, j] · k_idx[s])        for s <= t,

keeps the min(topk, t + 1) highest s (indices [B, T, topk], padded with −1, the order within a row
unspecified, ties to the earlier key), and every head then attends over those keys only:
``o_t = Σ_{s ∈ S_t} softmax_s(scale · q_t · k_s) v_s`` (GQA: query head hq reads kv head hq // G).
The selection is an integer choice: no gradient reaches the indexer through it (the DSA mixer
trains the indexer with its own loss).

Documents (``segment_ids [B, T]``): the indexer sees only the query's document, so a query at
position p of its document keeps min(topk, p + 1) keys, and indices count from the document's first
token (fla's varlen layout), exactly as the document alone would give them.

Forms (``method``): "naive" scatters the indices into a [T, T] mask; "gather" gathers the topk keys
of every query (cost T·topk instead of T² in the attention; the indexer is T² in both, as in
DeepSeek-V3.2, where it is cheap by having few narrow heads). float32 scores; outputs in v's dtype.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, check_form, grouped, segment_starts

METHODS = Forms("naive", "gather")


def document_starts(batch: int, length: int, segment_ids=None) -> jax.Array:
    """[B, T] int32: the array index where each token's document begins (0 without documents)."""
    if segment_ids is None:
        return jnp.zeros((batch, length), jnp.int32)
    steps = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return lax.cummax(jnp.where(segment_starts(segment_ids), steps, 0), axis=1)


def causal_in_document(start, last, n_keys: int) -> jax.Array:
    """[B, Tq, S] bool: key s lies in [start, last] (the query's document, up to the query)."""
    keys = jnp.arange(n_keys)[None, None, :]
    return (keys >= start[..., None]) & (keys <= last[..., None])


def indexer_scores(q_idx, k_idx, w_idx, visible) -> jax.Array:
    """[B, Tq, S] float32 index scores, −inf where not ``visible`` [B, Tq, S]."""
    dots = jnp.einsum("btjd,bsd->btjs", q_idx.astype(jnp.float32), k_idx.astype(jnp.float32))
    dots = jax.nn.relu(dots * q_idx.shape[-1] ** -0.5)
    w = jnp.ones(q_idx.shape[:3], jnp.float32) if w_idx is None else w_idx.astype(jnp.float32)
    return jnp.where(visible, jnp.einsum("btj,btjs->bts", w, dots), -jnp.inf)


def top_keys(scores, start, *, topk: int) -> jax.Array:
    """[B, Tq, topk] int32: the highest visible keys, counted from the document start, −1 padded."""
    kept, index = lax.top_k(scores, min(topk, scores.shape[-1]))
    index = jnp.where(jnp.isfinite(kept), index - start[..., None], -1).astype(jnp.int32)
    return jnp.pad(index, [(0, 0), (0, 0), (0, topk - index.shape[-1])], constant_values=-1)


def dsa_indexer(q_idx, k_idx, w_idx=None, *, topk: int, segment_ids=None):
    """(index scores [B, T, T] float32 with −inf where not visible, indices [B, T, topk])."""
    b, t = q_idx.shape[:2]
    start = document_starts(b, t, segment_ids)
    scores = indexer_scores(q_idx, k_idx, w_idx, causal_in_document(start, jnp.arange(t)[None], t))
    return scores, top_keys(scores, start, topk=topk)


def selected_mask(indices, start, last, n_keys: int) -> jax.Array:
    """[B, Tq, S] bool: key s is among the query's indices (counted from ``start``) and at most ``last``."""
    chosen = jnp.zeros((*indices.shape[:2], n_keys + 1), bool)
    columns = jnp.where(indices >= 0, start[..., None] + indices, n_keys)  # −1 into a spare column
    rows = jnp.arange(indices.shape[1])[None, :, None]
    chosen = chosen.at[jnp.arange(indices.shape[0])[:, None, None], rows, columns].set(True)[..., :n_keys]
    return chosen & causal_in_document(start, last, n_keys)


def selected_probs(q, k, mask, scale) -> jax.Array:
    """[B, Tq, H, G, S] float32 softmax of the scores over the keys of ``mask`` [B, Tq, S]."""
    logits = jnp.einsum("bthgd,bshd->bthgs", grouped(q, k.shape[2]), k.astype(jnp.float32)) * scale
    logits = jnp.where(mask[:, :, None, None, :], logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)  # a row keeps min(topk, p + 1) >= 1 keys: never empty


def attend_naive(q, k, v, indices, start, last, scale):
    probs = selected_probs(q, k, selected_mask(indices, start, last, k.shape[1]), scale)
    o = jnp.einsum("bthgs,bshd->bthgd", probs, v.astype(jnp.float32))
    return o.reshape(*o.shape[:2], -1, o.shape[-1])


def gathered(q, k, indices, start, last, scale):
    """Scores of each query against its selected keys: (logits [B,T,H,G,n] float32, valid [B,T,n],
    the gather index [B, T*n, 1, 1] into the key axis)."""
    b, t, n = indices.shape
    columns = start[..., None] + indices
    valid = (indices >= 0) & (columns <= last[..., None])
    flat = jnp.clip(columns, 0, k.shape[1] - 1).reshape(b, t * n, 1, 1)
    logits = jnp.einsum("bthgd,btnhd->bthgn", grouped(q, k.shape[2]), pick(k, flat, n)) * scale
    return jnp.where(valid[:, :, None, None, :], logits, -jnp.inf), valid, flat


def pick(x, flat, n) -> jax.Array:
    """[B, S, H, D] at the gather index [B, T*n, 1, 1] -> [B, T, n, H, D] float32."""
    b = x.shape[0]
    return jnp.take_along_axis(x.astype(jnp.float32), flat, axis=1).reshape(b, -1, n, *x.shape[2:])


def attend_gather(q, k, v, indices, start, last, scale):
    """Each query against its topk gathered keys (one choice for all heads)."""
    logits, _, flat = gathered(q, k, indices, start, last, scale)
    probs = jax.nn.softmax(logits, axis=-1)
    o = jnp.einsum("bthgn,btnhd->bthgd", probs, pick(v, flat, indices.shape[-1]))
    return o.reshape(*o.shape[:2], -1, o.shape[-1])


ATTEND = {"naive": attend_naive, "gather": attend_gather}


def dsa(q, k, v, q_idx, k_idx, w_idx=None, *, topk: int, indices=None, scale: Optional[float] = None,
        segment_ids=None, method: str = "gather"):
    """DeepSeek sparse attention: q [B,T,HQ,D], k [B,T,H,D], v [B,T,H,Dv] -> (o [B,T,HQ,Dv] in v's
    dtype, indices [B,T,topk]); ``indices`` given skips the indexer."""
    method = check_form(method, METHODS)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, t = q.shape[:2]
    start = document_starts(b, t, segment_ids)
    if indices is None:
        _, indices = dsa_indexer(q_idx, k_idx, w_idx, topk=topk, segment_ids=segment_ids)
    last = jnp.broadcast_to(jnp.arange(t), (b, t))
    return ATTEND[method](q, k, v, indices, start, last, scale).astype(v.dtype), indices


def dsa_step(q, k_cache, v_cache, q_idx, k_idx_cache, w_idx, t, *, topk: int, scale: Optional[float] = None):
    """One decoding query (q [B,1,HQ,D], q_idx [B,1,HI,DI], w_idx [B,1,HI]) at position ``t`` against
    caches [B, L, ...] holding positions 0..t in slots 0..t: (o [B,1,HQ,Dv], indices [B,1,topk])."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b = q.shape[0]
    start, last = jnp.zeros((b, 1), jnp.int32), jnp.full((b, 1), t, jnp.int32)
    scores = indexer_scores(q_idx, k_idx_cache, w_idx, causal_in_document(start, last, k_cache.shape[1]))
    indices = top_keys(scores, start, topk=topk)
    return attend_naive(q, k_cache, v_cache, indices, start, last, scale).astype(v_cache.dtype), indices


def dsa_weights(q, k, indices, *, scale: Optional[float] = None, segment_ids=None) -> jax.Array:
    """[B, HQ, T, T] float32: each head's softmax over its query's selected keys (0 elsewhere)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, t = q.shape[:2]
    start = document_starts(b, t, segment_ids)
    mask = selected_mask(indices, start, jnp.broadcast_to(jnp.arange(t), (b, t)), t)
    probs = selected_probs(q, k, mask, scale)
    return probs.reshape(b, t, -1, t).transpose(0, 2, 1, 3)


def dsa_indexer_loss(q, k, index_scores, indices, *, scale: Optional[float] = None, segment_ids=None) -> jax.Array:
    """DeepSeek-V3.2's indexer objective (its sparse stage), a scalar: the mean over queries of
    ``KL(p_t || softmax(I[t, S_t]))`` over the selected keys S_t, where p_t is the main attention over
    S_t averaged over heads. p_t is held fixed (no gradient): the loss trains the indexer alone."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, t = q.shape[:2]
    start = document_starts(b, t, segment_ids)
    logits, valid, flat = gathered(q, k, indices, start, jnp.broadcast_to(jnp.arange(t), (b, t)), scale)
    target = lax.stop_gradient(jax.nn.softmax(logits, axis=-1).mean(axis=(2, 3)))  # (B, T, n)
    picked = jnp.take_along_axis(index_scores, flat.reshape(b, t, -1), axis=-1)
    log_q = jax.nn.log_softmax(jnp.where(valid, picked, -jnp.inf), axis=-1)
    log_p = jnp.log(jnp.where(target > 0, target, 1.0))
    terms = jnp.where(target > 0, target * (log_p - jnp.where(valid, log_q, 0.0)), 0.0)  # target > 0 only if valid
    return terms.sum(-1).mean()
