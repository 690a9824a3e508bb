"""Mixture of block attention (MoBA; Lu et al., 2025): causal softmax attention in which each query reads its own
block and the ``topk - 1`` earlier blocks whose mean key it scores highest.

Blocks of ``bs`` tokens cut from each document's first token (block c = positions [c bs, (c+1) bs) of the
document); G = HQ / H query heads per key/value head (query head hq reads kv head hq // G). For a query t in
block c_t:

    gate_c = mean over the G query heads of q_t . kbar_c      for every earlier block c < c_t (all complete),
                                                               kbar_c the mean of block c's keys
    chosen = {c_t} plus the topk - 1 earlier blocks of highest gate (fewer when fewer exist)
    o_t    = softmax attention over the tokens j <= t of the chosen blocks

The choice is discrete (no gradient reaches the gate through it; the keys train through the attention), made
once per kv head (each query head's own choice when G = 1, the paper's). Ties go to the earlier block.
``topk = 1`` is attention within the block.

Forms (``method``): ``"naive"`` the [T, S] mask of the chosen tokens, materialised, and one masked softmax (the
reference); ``"gather"`` each query against the ``topk bs`` keys of its chosen blocks only, gathered per kv head
(cost T topk bs instead of T^2). Both read the blocks' mean keys (T / bs per query) to choose. The masks, block
means and gathers are NSA's selection branch (``lmzoo.ops.nsa``), which MoBA is with its own choice of blocks.
Scores and softmax in float32; o in v's dtype.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, check_form, grouped, masked_softmax
from lmzoo.ops.nsa import (SELECTION, Layout, decode_layout, nsa_block_means, query_layout, selection_mask,
                           selection_naive)

METHODS = Forms("naive", "gather")


def moba_blocks(q, k, *, topk: int, block_size: int, segment_ids=None) -> jax.Array:
    """[B, T, H, topk] int32: each query's chosen blocks (indices from its document's start) per kv head, its
    own block first, the rest by falling gate, padded with -1."""
    check_blocks(topk, block_size)
    lay = query_layout(q.shape[0], q.shape[1], block_size, segment_ids)
    return choose_blocks(q, nsa_block_means(k, block_size, segment_ids), lay, topk=topk, block_size=block_size)


def check_blocks(topk: int, block_size: int) -> None:
    if topk < 1:
        raise ValueError(f"topk={topk} must be at least 1 (the query's own block)")
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be positive")


def choose_blocks(q, k_means, lay: Layout, *, topk: int, block_size: int) -> jax.Array:
    """The choice of ``moba_blocks`` from the block means [B, NC, H, D] by slot (``nsa_block_means``)."""
    nc = k_means.shape[1]
    gates = jnp.einsum("bthgd,bchd->bthc", grouped(q, k_means.shape[2]), k_means.astype(jnp.float32))
    gates = gates / (q.shape[2] // k_means.shape[2])  # the mean over the group's query heads
    blocks = jnp.arange(nc)
    slot = jnp.clip(lay.slot0[..., None] + blocks, 0, nc - 1)  # (B, T, NC): the slot of the document's block c
    by_block = jnp.take_along_axis(gates, jnp.broadcast_to(slot[:, :, None], gates.shape), axis=-1)
    current = lay.pos // block_size  # (B, T)
    earlier = blocks < current[..., None, None]  # (B, T, 1, NC)
    rest = max(min(topk - 1, nc), 0)
    kept, index = lax.top_k(jnp.where(earlier, by_block, -jnp.inf), rest)
    index = jnp.where(jnp.isfinite(kept), index, -1).astype(jnp.int32)
    own = jnp.broadcast_to(current[..., None, None], index.shape[:3] + (1,)).astype(jnp.int32)
    return jnp.pad(jnp.concatenate([own, index], axis=-1), [(0, 0)] * 3 + [(0, topk - 1 - rest)], constant_values=-1)


def moba(q, k, v, *, topk: int, block_size: int, scale: Optional[float] = None, segment_ids=None,
         method: str = "gather", block_indices=None):
    """MoBA: q [B,T,HQ,D], k [B,T,H,D], v [B,T,H,Dv] -> (o [B,T,HQ,Dv] in v's dtype, block_indices [B,T,H,topk]).
    ``segment_ids`` [B,T]: blocks and attention within each document; ``block_indices`` given replaces the choice."""
    method = check_form(method, METHODS)
    check_blocks(topk, block_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay = query_layout(q.shape[0], q.shape[1], block_size, segment_ids)
    if block_indices is None:
        block_indices = choose_blocks(q, nsa_block_means(k, block_size, segment_ids), lay, topk=topk,
                                      block_size=block_size)
    o = SELECTION[method](q, k, v, block_indices, lay, block_size=block_size, scale=scale)
    return o.astype(v.dtype), block_indices


def moba_step(q, k_cache, v_cache, t, *, topk: int, block_size: int, scale: Optional[float] = None):
    """One decoding query q [B, 1, HQ, D] at position ``t`` against caches [B, L, H, *] holding positions 0..t in
    slots 0..t (later slots are never read): o [B, 1, HQ, Dv] as ``moba`` gives token t."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lay = decode_layout(q.shape[0], t)
    block_indices = choose_blocks(q, nsa_block_means(k_cache, block_size), lay, topk=topk, block_size=block_size)
    return selection_naive(q, k_cache, v_cache, block_indices, lay, block_size=block_size,
                           scale=scale).astype(v_cache.dtype)


def moba_weights(q, k, *, topk: int, block_size: int, scale: Optional[float] = None, segment_ids=None) -> jax.Array:
    """[B, HQ, T, T] float32: the softmax weights ``moba`` applies to v, 0 outside the chosen blocks."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, t, n_kv = k.shape[0], k.shape[1], k.shape[2]
    lay = query_layout(b, t, block_size, segment_ids)
    chosen = choose_blocks(q, nsa_block_means(k, block_size, segment_ids), lay, topk=topk, block_size=block_size)
    mask = selection_mask(chosen, lay, t, block_size).transpose(0, 2, 1, 3)[:, :, None]  # (B, H, 1, T, S)
    logits = jnp.einsum("bthgd,bshd->bhgts", grouped(q, n_kv), k.astype(jnp.float32)) * scale
    return masked_softmax(logits, mask)[0].reshape(b, -1, t, t)

