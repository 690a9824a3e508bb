"""Native sparse attention (NSA; Yuan et al., 2025): three attention branches per query, gated.

Blocks of ``bs`` tokens, block c = [c·bs, (c+1)·bs); G = HQ / H query heads share a key/value head
(query head hq reads kv head hq // G). For a query t:

- compression: ``k̄_c, v̄_c`` = mean of block c's keys and values (a partial last block averages
  its valid tokens); t sees block c iff it is complete, ``(c+1)·bs − 1 <= t``:
  ``p_c = softmax_c(scale · q_t·k̄_c)``, ``o_cmp = Σ_c p_c v̄_c``; with no block visible o_cmp = 0
  and lse = −inf;
- top-k: per kv head, the mean over its G query heads of ``p_c`` (0 where not visible); blocks
  0, ⌊t/bs⌋ and ⌊t/bs⌋ − 1 are forced (score 1); the S highest allowed blocks (c <= ⌊t/bs⌋) are
  kept, the row padded with −1 (the order within a row is unspecified; ties go to the lower block);
- selection: softmax attention over the tokens ``c·bs + r <= t`` of the selected blocks c >= 0;
- sliding window (``window = w > 0``): softmax attention over the keys (t − w, t];

``o = g_slc ⊙ o_slc + g_cmp ⊙ o_cmp + g_win ⊙ o_win``, gates [B, T, HQ] in (0, 1).

Documents (``segment_ids [B, T]``): each document is cut into blocks from its own first token, as
if it were alone, so a block never holds two documents' tokens. Positions and block indices count
from the query's document start; ``k_cmp``/``v_cmp`` hold every document's *complete* blocks in
order (document d's block c in slot ``J_d + c``, J_d the complete blocks of earlier documents) and
then the last document's partial block: at most ⌈T/bs⌉ slots, the layout without documents when
there is one. A partial block of an earlier document is seen by no query, so it has no slot.

Forms (``method``): "naive" computes each branch on its own, with its [T, T] mask materialised from
the lines above; "parallel" ("dense" in older runs, which lmzoo.record.migrate renames) adds the branches'
weights into one [T, T] matrix per head (one score product and one value product, like a single dense attention: the
fastest on a CPU at a few hundred tokens); "gather" gathers the ``S·bs`` selected keys of every query
and computes the window by query blocks (cost T·(S·bs + w + T/bs) instead of T², for long sequences).
Compression and top-k read ⌈T/bs⌉ block scores per query in every form. Scores, softmax and gates accumulate in float32;
outputs come back in v's dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.attention import softmax_attention
from lmzoo.ops.common import Forms, check_form, grouped, masked_softmax, segment_starts

METHODS = Forms("naive", "parallel", "gather")


class Layout(NamedTuple):
    """Where each query stands, [B, Tq] int32: ``pos`` in its document, ``start`` the array index of its
    document's first token, ``slot0`` the compressed slot of its document's block 0. The keys a query
    may see are the array indices ``start ... start + pos``."""

    pos: jax.Array
    start: jax.Array
    slot0: jax.Array


def query_layout(batch: int, length: int, block_size: int, segment_ids=None) -> Layout:
    """The layout of a whole sequence: one document, or the documents of ``segment_ids``."""
    steps = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if segment_ids is None:
        zeros = jnp.zeros_like(steps)
        return Layout(steps, zeros, zeros)
    start = lax.cummax(jnp.where(segment_starts(segment_ids), steps, 0), axis=1)
    pos = steps - start
    ends_block = (pos % block_size == block_size - 1).astype(jnp.int32)  # each complete block ends on one
    before = jnp.cumsum(ends_block, axis=1) - ends_block  # complete blocks before each token
    return Layout(pos, start, jnp.take_along_axis(before, start, axis=1))


def decode_layout(batch: int, t) -> Layout:
    """One query at position ``t`` of a single document, reading a cache indexed by position."""
    pos = jnp.full((batch, 1), t, jnp.int32)
    return Layout(pos, jnp.zeros_like(pos), jnp.zeros_like(pos))


def n_blocks(length: int, block_size: int) -> int:
    return math.ceil(length / block_size)


def pooling_matrix(batch: int, length: int, block_size: int, segment_ids=None) -> jax.Array:
    """[B, NC, T] float32: row j averages the tokens of compressed slot j (see the module docstring)."""
    lay = query_layout(batch, length, block_size, segment_ids)
    nc = n_blocks(length, block_size)
    slot = lay.slot0 + lay.pos // block_size
    if segment_ids is not None:  # complete blocks, and the last document's partial one
        steps = jnp.arange(length)
        block_end = jnp.minimum(steps + block_size - 1 - lay.pos % block_size, length - 1)
        complete = (steps + block_size - 1 - lay.pos % block_size < length) & (
            jnp.take_along_axis(segment_ids, block_end, axis=1) == segment_ids)
        slot = jnp.where(complete | (segment_ids == segment_ids[:, -1:]), slot, nc)
    members = (slot[:, None, :] == jnp.arange(nc)[None, :, None]).astype(jnp.float32)  # (B, NC, T)
    return members / jnp.maximum(members.sum(-1, keepdims=True), 1.0)


def nsa_block_means(x: jax.Array, block_size: int, segment_ids=None) -> jax.Array:
    """[B, T, H, D] -> [B, ⌈T/bs⌉, H, D]: the compressed keys or values, in x's dtype."""
    pool = pooling_matrix(x.shape[0], x.shape[1], block_size, segment_ids)
    return jnp.einsum("bct,bthd->bchd", pool, x.astype(jnp.float32)).astype(x.dtype)


# ----------------------------------------------------------------------------- branches on a layout


def compression_probs(q, k_cmp, lay: Layout, *, block_size: int, scale: float):
    """(p [B, T, H, G, NC], lse [B, T, H, G]): each query's softmax over its visible compressed slots."""
    qg = grouped(q, k_cmp.shape[2])
    logits = jnp.einsum("bthgd,bchd->bthgc", qg, k_cmp.astype(jnp.float32)) * scale
    slots = jnp.arange(k_cmp.shape[1])
    first, complete = lay.slot0[..., None], (lay.pos[..., None] + 1) // block_size
    visible = (slots >= first) & (slots < first + complete)  # (B, T, NC)
    return masked_softmax(logits, visible[:, :, None, None, :])


def compression_output(probs, v_cmp) -> jax.Array:
    """[B, T, HQ, Dv] float32 from the compression probabilities [B, T, H, G, NC]."""
    o = jnp.einsum("bthgc,bchd->bthgd", probs, v_cmp.astype(jnp.float32))
    return o.reshape(*o.shape[:2], -1, o.shape[-1])


def top_blocks(probs, lay: Layout, *, block_counts: int, block_size: int) -> jax.Array:
    """[B, T, H, S] int32 block indices (from the document start) of the S highest-scoring allowed blocks."""
    scores = probs.mean(axis=3)  # (B, T, H, NC) by slot
    nc = scores.shape[-1]
    blocks = jnp.arange(nc)
    slot = jnp.clip(lay.slot0[..., None] + blocks, 0, nc - 1)  # (B, T, NC): the slot of block c
    by_block = jnp.take_along_axis(scores, jnp.broadcast_to(slot[:, :, None], scores.shape), axis=-1)
    current = (lay.pos // block_size)[..., None, None]
    visible = blocks < ((lay.pos + 1) // block_size)[..., None, None]
    forced = (blocks == 0) | (blocks == current) | (blocks == current - 1)
    scores = jnp.where(forced, 1.0, jnp.where(visible, by_block, -jnp.inf))
    kept, index = lax.top_k(scores, min(block_counts, nc))
    index = jnp.where(jnp.isfinite(kept), index, -1).astype(jnp.int32)
    return jnp.pad(index, [(0, 0)] * 3 + [(0, block_counts - index.shape[-1])], constant_values=-1)


def attend(qg, k, v, visible, scale):
    """Dense masked attention: qg [B,T,H,G,D], k/v [B,S,H,*], visible [B,T,H,S] -> [B,T,HQ,Dv] float32."""
    logits = jnp.einsum("bthgd,bshd->bthgs", qg, k.astype(jnp.float32)) * scale
    probs, _ = masked_softmax(logits, visible[:, :, :, None, :])
    o = jnp.einsum("bthgs,bshd->bthgd", probs, v.astype(jnp.float32))
    return o.reshape(*o.shape[:2], -1, o.shape[-1])


def reachable(lay: Layout, n_keys: int) -> tuple[jax.Array, jax.Array]:
    """(key index [1, 1, S], visible [B, T, S]): the keys of the query's document up to itself."""
    keys = jnp.arange(n_keys)[None, None, :]
    start = lay.start[..., None]
    return keys, (keys >= start) & (keys <= start + lay.pos[..., None])


def selection_mask(block_indices, lay: Layout, n_keys: int, block_size: int) -> jax.Array:
    """[B, T, H, S] bool: key s lies in a selected block of the query's document, at or before it."""
    keys, visible = reachable(lay, n_keys)
    nc = n_blocks(n_keys, block_size)
    chosen = (block_indices[..., None] == jnp.arange(nc)).any(axis=3)  # (B, T, H, NC)
    block_of_key = jnp.clip((keys - lay.start[..., None]) // block_size, 0, nc - 1)  # (B, T, S)
    by_key = jnp.broadcast_to(block_of_key[:, :, None, :], (*chosen.shape[:3], n_keys))
    return jnp.take_along_axis(chosen, by_key, axis=-1) & visible[:, :, None, :]


def selection_naive(q, k, v, block_indices, lay, *, block_size, scale):
    mask = selection_mask(block_indices, lay, k.shape[1], block_size)
    return attend(grouped(q, k.shape[2]), k, v, mask, scale)


def selection_gather(q, k, v, block_indices, lay, *, block_size, scale):
    """Each query against the S·bs keys of its selected blocks, gathered per kv head."""
    b, t, h, s = block_indices.shape
    offsets = jnp.arange(block_size)
    in_doc = block_indices[..., None] * block_size + offsets  # (B, T, H, S, bs) from the document start
    valid = (block_indices[..., None] >= 0) & (in_doc <= lay.pos[:, :, None, None, None])
    index = jnp.clip(lay.start[:, :, None, None, None] + in_doc, 0, k.shape[1] - 1)
    index = index.reshape(b, t, h, s * block_size).transpose(0, 2, 1, 3).reshape(b, h, -1, 1)  # (B, H, T*n, 1)

    def pick(x):  # [B, S, H, D] -> [B, T, H, n, D]
        picked = jnp.take_along_axis(x.astype(jnp.float32).transpose(0, 2, 1, 3), index, axis=2)
        return picked.reshape(b, h, t, s * block_size, -1).transpose(0, 2, 1, 3, 4)

    qg = grouped(q, h)
    logits = jnp.einsum("bthgd,bthnd->bthgn", qg, pick(k)) * scale
    probs, _ = masked_softmax(logits, valid.reshape(b, t, h, 1, -1))
    o = jnp.einsum("bthgn,bthnd->bthgd", probs, pick(v))
    return o.reshape(b, t, -1, o.shape[-1])


def window_mask(lay: Layout, n_keys: int, window: int) -> jax.Array:
    """[B, T, S] bool: the keys (t − w, t] of the query's document."""
    keys, visible = reachable(lay, n_keys)
    return visible & (keys > (lay.start + lay.pos)[..., None] - window)


def window_naive(q, k, v, lay, *, window, scale):
    mask = window_mask(lay, k.shape[1], window)[:, :, None, :]
    return attend(grouped(q, k.shape[2]), k, v, jnp.broadcast_to(mask, (*mask.shape[:2], k.shape[2], k.shape[1])),
                  scale)


SELECTION = {"naive": selection_naive, "gather": selection_gather}  # nsa_selection's forms


def gated_sum(branches) -> jax.Array:
    """Σ g ⊙ o over (gate [B, T, HQ], output [B, T, HQ, Dv]) pairs, float32."""
    return sum(g.astype(jnp.float32)[..., None] * o for g, o in branches)


# ----------------------------------------------------------------------------- the ops


def nsa_compression(q, k_cmp, v_cmp, *, block_size: int, scale: Optional[float] = None, segment_ids=None):
    """Attention over complete compressed blocks: (o [B, T, HQ, Dv] in v_cmp's dtype, lse [B, T, HQ] float32).

    One form: it reads ⌈T/bs⌉ slots per query, already the sparse cost."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay = query_layout(q.shape[0], q.shape[1], block_size, segment_ids)
    probs, lse = compression_probs(q, k_cmp, lay, block_size=block_size, scale=scale)
    return compression_output(probs, v_cmp).astype(v_cmp.dtype), lse.reshape(*q.shape[:3])


def nsa_topk(q, k_cmp, *, block_counts: int, block_size: int, scale: Optional[float] = None, segment_ids=None):
    """[B, T, H, S] int32 selected block indices, padded with −1 (see the module docstring)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay = query_layout(q.shape[0], q.shape[1], block_size, segment_ids)
    probs, _ = compression_probs(q, k_cmp, lay, block_size=block_size, scale=scale)
    return top_blocks(probs, lay, block_counts=block_counts, block_size=block_size)


def nsa_selection(q, k, v, block_indices, *, block_size: int, scale: Optional[float] = None, segment_ids=None,
                  method: str = "gather"):
    """Softmax attention over the selected blocks' tokens up to the query: [B, T, HQ, Dv] in v's dtype.
    The indices of a row must be distinct (−1 aside). Forms: "naive" (masked [T, T]) and "gather"."""
    method = check_form(method, tuple(SELECTION))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay = query_layout(q.shape[0], q.shape[1], block_size, segment_ids)
    return SELECTION[method](q, k, v, block_indices, lay, block_size=block_size, scale=scale).astype(v.dtype)


def compress_and_choose(q, k, *, block_counts: int, block_size: int, scale: float, segment_ids=None,
                        block_indices=None):
    """What every branch of a whole sequence builds on: its layout, the pooling matrix [B, NC, T] of
    the block means, the compression probabilities and the chosen blocks (``block_indices`` given: kept)."""
    b, t = q.shape[:2]
    lay = query_layout(b, t, block_size, segment_ids)
    pool = pooling_matrix(b, t, block_size, segment_ids)  # (B, NC, T)
    k_cmp = jnp.einsum("bct,bthd->bchd", pool, k.astype(jnp.float32)).astype(k.dtype)
    probs, _ = compression_probs(q, k_cmp, lay, block_size=block_size, scale=scale)
    if block_indices is None:
        block_indices = top_blocks(probs, lay, block_counts=block_counts, block_size=block_size)
    return lay, pool, probs, block_indices


def nsa(q, k, v, g_cmp, g_slc, g_win=None, *, block_counts: int, block_size: int, window: int = 0,
        scale: Optional[float] = None, segment_ids=None, method: str = "parallel", block_indices=None):
    """Native sparse attention: q [B,T,HQ,D], k [B,T,H,D], v [B,T,H,Dv], gates [B,T,HQ] ->
    (o [B,T,HQ,Dv] in v's dtype, block_indices [B,T,H,S]). ``g_win`` is needed when ``window > 0``;
    ``block_indices`` given replaces the top-k choice."""
    method = check_form(method, METHODS)
    if window > 0 and g_win is None:
        raise ValueError(f"window={window} needs g_win, the sliding window branch's gate")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay, pool, probs, block_indices = compress_and_choose(q, k, block_counts=block_counts, block_size=block_size,
                                                          scale=scale, segment_ids=segment_ids,
                                                          block_indices=block_indices)
    v_cmp = jnp.einsum("bct,bthd->bchd", pool, v.astype(jnp.float32)).astype(v.dtype)
    if method == "parallel":
        o = nsa_parallel(q, k, v, (g_cmp, g_slc, g_win), probs, v_cmp, block_indices, lay, block_size=block_size,
                      window=window, scale=scale)
        return o.astype(v.dtype), block_indices
    branches = [(g_cmp, compression_output(probs, v_cmp)),
                (g_slc, SELECTION[method](q, k, v, block_indices, lay, block_size=block_size, scale=scale))]
    if window > 0:
        if method == "naive":
            o_win = window_naive(q, k, v, lay, window=window, scale=scale)
        else:  # by query blocks, each against the keys its window reaches
            o_win = softmax_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                                      scale=scale, window=window, method="blocked", segment_ids=segment_ids)
        branches.append((g_win, o_win))
    return gated_sum(branches).astype(v.dtype), block_indices


def nsa_step(q, k_cache, v_cache, g_cmp, g_slc, g_win, t, *, block_counts: int, block_size: int, window: int = 0,
             scale: Optional[float] = None):
    """One decoding query q [B, 1, HQ, D] at position ``t`` against caches [B, L, H, *] holding positions
    0..t in slots 0..t (later slots are never read): o [B, 1, HQ, Dv] as ``nsa`` gives token t."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay = decode_layout(q.shape[0], t)
    k_cmp, v_cmp = nsa_block_means(k_cache, block_size), nsa_block_means(v_cache, block_size)
    probs, _ = compression_probs(q, k_cmp, lay, block_size=block_size, scale=scale)
    block_indices = top_blocks(probs, lay, block_counts=block_counts, block_size=block_size)
    branches = [(g_cmp, compression_output(probs, v_cmp)),
                (g_slc, selection_naive(q, k_cache, v_cache, block_indices, lay, block_size=block_size, scale=scale))]
    if window > 0:
        branches.append((g_win, window_naive(q, k_cache, v_cache, lay, window=window, scale=scale)))
    return gated_sum(branches).astype(v_cache.dtype)


def token_weights(q, k, g_slc, g_win, block_indices, lay: Layout, *, block_size, window, scale):
    """[B, H, G, T, S] float32 (heads first, as dense attention lays out its scores): the selection and
    window branches' weights on the keys times their gates, from one score product."""
    b, t, h, n = k.shape[0], q.shape[1], k.shape[2], k.shape[1]
    logits = jnp.einsum("bthgd,bshd->bhgts", grouped(q, h), k.astype(jnp.float32)) * scale
    per_head = lambda g: g.astype(jnp.float32).reshape(b, t, h, -1).transpose(0, 2, 3, 1)[..., None]  # noqa: E731
    selected = selection_mask(block_indices, lay, n, block_size).transpose(0, 2, 1, 3)[:, :, None]  # (B, H, 1, T, S)
    weights = per_head(g_slc) * masked_softmax(logits, selected)[0]
    if window > 0:
        near = window_mask(lay, n, window)[:, None, None]  # (B, 1, 1, T, S)
        weights = weights + per_head(g_win) * masked_softmax(logits, near)[0]
    return weights


def nsa_parallel(q, k, v, gates, probs, v_cmp, block_indices, lay, **options):
    """The compressed branch on its own (⌈T/bs⌉ slots), selection and window as one weighted sum of v."""
    g_cmp, g_slc, g_win = gates
    weights = token_weights(q, k, g_slc, g_win, block_indices, lay, **options)
    o = jnp.einsum("bhgts,bshd->bthgd", weights, v.astype(jnp.float32))
    return o.reshape(*o.shape[:2], -1, o.shape[-1]) + gated_sum([(g_cmp, compression_output(probs, v_cmp))])


def nsa_weights(q, k, g_cmp, g_slc, g_win=None, *, block_counts: int, block_size: int, window: int = 0,
                scale: Optional[float] = None, segment_ids=None) -> jax.Array:
    """[B, HQ, T, T] float32: the weights ``nsa`` applies to v, its three branches summed, the
    compressed one spread evenly over each block's tokens (rows sum to the gates' sum)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, t = k.shape[:2]
    lay, pool, probs, block_indices = compress_and_choose(q, k, block_counts=block_counts, block_size=block_size,
                                                          scale=scale, segment_ids=segment_ids)
    weights = token_weights(q, k, g_slc, g_win, block_indices, lay, block_size=block_size, window=window, scale=scale)
    g = g_cmp.astype(jnp.float32).reshape(b, t, k.shape[2], -1)
    weights = weights + jnp.einsum("bthg,bthgc,bcs->bhgts", g, probs, pool)  # each block's share to its tokens
    return weights.reshape(b, -1, t, t)
