"""Causal softmax attention over vector-quantised keys (Transformer-VQ), quadratic and linear-time.

Every key is one of S codewords, so the keys of all earlier blocks collapse into a cache of, per
codeword, how many keys chose it and the sum of their values: a query's weight on codeword s is
``count_s * exp(q . c_s)``. Per block of L queries this costs ``L^2`` (exact scores inside the block)
plus ``L * S`` (scores against codewords): linear in the length.

Inputs: q [B,T,H,D]; ``k_hat`` [B,T,H,D], the quantised keys (``codebook[codes]`` in value, with
straight-through gradients to the unquantised keys); ``codes`` [B,T,H] int; ``codebook`` [H,S,D];
v [B,T,H,Dv]. Keys in a query's own block enter as ``k_hat``; keys of earlier blocks enter through
the codebook, as they do through the compressed cache -- so both methods compute the same function,
gradients included, and in value both are softmax attention over the quantised keys. ``method``:
"naive" (the reference: the full [T, T] score matrix) or "blocked" (linear time; "blockwise" in older
runs, which lmzoo.record.migrate renames).

With ``segment_ids`` [B,T] (increasing along T, equal within a document) a query attends only to
its own document: inside its block by the mask, and through a cache that restarts with each
document. Blocks stay aligned to the sequence, not to each document, so in value a document attends
as it would alone; which of its keys enter as ``k_hat`` rather than through the codebook (and so
which get the straight-through gradient) depends on where it sits in the window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lmzoo.ops.common import Forms, causal_mask, check_form, from_chunks, same_segment, to_chunks

METHODS = Forms("naive", "blocked")


def vq_attention(q, k_hat, codes, codebook, v, *, scale=None, block_size: int, method: str = "blocked",
                 segment_ids=None):
    """Causal attention over quantised keys -> [B,T,H,Dv] in v's dtype; see the module docstring."""
    method = check_form(method, METHODS)
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be positive")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    form = _naive if method == "naive" else _blocked
    return form(q, k_hat, codes, codebook, v, scale, block_size, segment_ids).astype(v.dtype)


def gather_codewords(codebook: jax.Array, codes: jax.Array) -> jax.Array:
    """codebook [H,S,D], codes [B,T,H] -> codewords [B,T,H,D]."""
    return jnp.take_along_axis(codebook[None, None], codes[..., None, None], axis=3)[..., 0, :]


def _naive(q, k_hat, codes, codebook, v, scale, block_size, segment_ids):
    """The readable reference: a [T, T] score matrix, codewords outside the query's own block."""
    t = q.shape[1]
    block = jnp.arange(t) // block_size
    same_block = block[:, None] == block[None, :]  # (T, T)
    own = jnp.einsum("bthd,bshd->bhts", q, k_hat, preferred_element_type=jnp.float32)
    coded = jnp.einsum("bthd,bshd->bhts", q, gather_codewords(codebook, codes), preferred_element_type=jnp.float32)
    scores = jnp.where(same_block, own, coded) * scale
    visible = causal_mask(t) if segment_ids is None else causal_mask(t) & same_segment(segment_ids)[:, None]
    probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", probs, v.astype(jnp.float32))


def _blocked(q, k_hat, codes, codebook, v, scale, block_size, segment_ids):
    """Linear time: exact scores inside each block, the per-codeword cache of earlier blocks."""
    b, t, h, _ = q.shape
    n_codes, size = codebook.shape[1], block_size

    def blocks(x):  # padded keys come after every real query, so the causal mask hides them
        return to_chunks(x, size)  # (B, N, L, ...)

    qb, kb, vb = blocks(q), blocks(k_hat), blocks(v.astype(jnp.float32))  # (B, N, L, H, D)
    real = blocks(jnp.ones((b, t, h), jnp.float32))  # (B, N, L, H): 0 on padding
    onehot = jax.nn.one_hot(blocks(codes), n_codes, dtype=jnp.float32) * real[..., None]  # (B, N, L, H, S)

    own = jnp.einsum("bnlhd,bnmhd->bnhlm", qb, kb, preferred_element_type=jnp.float32) * scale  # (B, N, H, L, L)
    own = jnp.where(causal_mask(size), own, -jnp.inf)
    coded = jnp.einsum("bnlhd,hsd->bnhls", qb, codebook, preferred_element_type=jnp.float32) * scale  # (B, N, H, L, S)
    if segment_ids is None:
        counts, sums = _block_caches(onehot, vb)
        reads = counts[:, :, :, None, :] > 0  # (B, N, H, L, S): codewords an earlier key chose
    else:
        segments = to_chunks(segment_ids, size)  # (B, N, L); padding sits after every real query
        own = jnp.where((segments[..., :, None] == segments[..., None, :])[:, :, None], own, -jnp.inf)
        counts, sums, reads_cache = _block_caches_by_segment(onehot, vb, segments)
        reads = (counts[:, :, :, None, :] > 0) & reads_cache[:, :, None, :, None]
    coded = jnp.where(reads, coded, -jnp.inf)

    top = jax.lax.stop_gradient(jnp.maximum(own.max(-1), coded.max(-1)))[..., None]  # (B, N, H, L, 1)
    p_own, p_coded = jnp.exp(own - top), jnp.exp(coded - top)
    numerator = jnp.einsum("bnhlm,bnmhd->bnlhd", p_own, vb) + jnp.einsum("bnhls,bnhsd->bnlhd", p_coded, sums)
    denominator = p_own.sum(-1) + jnp.einsum("bnhls,bnhs->bnhl", p_coded, counts)  # (B, N, H, L)
    out = numerator / jnp.moveaxis(denominator, 2, 3)[..., None]  # (B, N, L, H, Dv)
    return from_chunks(out, t)


def _block_caches(onehot, vb):
    """Per block, the counts [B,N,H,S] and value sums [B,N,H,S,Dv] per codeword of all earlier blocks."""
    exclusive = lambda x: jnp.cumsum(x, axis=1) - x  # integer-valued counts: exact
    counts = exclusive(onehot.sum(2))  # (B, N, H, S)
    block_sums = jnp.einsum("bnlhs,bnlhd->bnhsd", onehot, vb)
    sums = jnp.concatenate([jnp.zeros_like(block_sums[:, :1]), jnp.cumsum(block_sums, axis=1)[:, :-1]], axis=1)
    return counts, sums


def _block_caches_by_segment(onehot, vb, segments):
    """The caches when documents restart them: each block's holds the earlier keys of the document
    open at its start, and only queries of that document read it ([B, N, L] bool).

    The cache entering block n + 1 is block n's keys of its last document, plus the cache entering
    block n when that document was already open before block n (a short scan over blocks)."""
    last = segments[:, :, -1]  # (B, N) the document open at each block's end
    in_last = (segments == last[..., None]).astype(jnp.float32)  # (B, N, L)
    tail_counts = jnp.einsum("bnlhs,bnl->bnhs", onehot, in_last)
    tail_sums = jnp.einsum("bnlhs,bnlhd,bnl->bnhsd", onehot, vb, in_last)
    open_before = jnp.concatenate([jnp.full_like(last[:, :1], -1), last[:, :-1]], axis=1)  # (B, N): at each start
    carried = (last == open_before).astype(jnp.float32)  # the block opens no document: its cache carries on

    def next_block(cache, block):
        keep, counts, sums = block
        entering = cache
        cache = (counts + keep[:, None, None] * cache[0], sums + keep[:, None, None, None] * cache[1])
        return cache, entering

    first = (jnp.zeros_like(tail_counts[:, 0]), jnp.zeros_like(tail_sums[:, 0]))
    blocks = (carried.swapaxes(0, 1), tail_counts.swapaxes(0, 1), tail_sums.swapaxes(0, 1))
    _, (counts, sums) = jax.lax.scan(next_block, first, blocks)
    return counts.swapaxes(0, 1), sums.swapaxes(0, 1), segments == open_before[..., None]


# ----------------------------------------------------------------------------- decoding


def init_vq_cache(batch: int, heads: int, n_codes: int, d_v: int) -> dict:
    """The compressive cache: per codeword, the count of keys that chose it and the sum of their values."""
    return {
        "counts": jnp.zeros((batch, heads, n_codes), jnp.float32),
        "sums": jnp.zeros((batch, heads, n_codes, d_v), jnp.float32),
    }


def vq_cache_fill(codes, v, n_codes: int) -> dict:
    """The cache after every token of a sequence (codes [B,T,H], values v [B,T,H,Dv]) from empty."""
    onehot = jax.nn.one_hot(codes, n_codes, dtype=jnp.float32)  # (B, T, H, S)
    return {"counts": onehot.sum(axis=1), "sums": jnp.einsum("bths,bthd->bhsd", onehot, v.astype(jnp.float32))}


def vq_step(cache: dict, q, codes, codebook, v, *, scale=None):
    """Add one token (codes [B,H], values v [B,H,Dv]) to the cache, then attend with q [B,H,D]
    over every key so far -> ([B,H,Dv] in v's dtype, cache). Equals the last row of ``vq_attention``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    onehot = jax.nn.one_hot(codes, codebook.shape[1], dtype=jnp.float32)  # (B, H, S)
    counts = cache["counts"] + onehot
    sums = cache["sums"] + onehot[..., None] * v.astype(jnp.float32)[:, :, None, :]
    scores = jnp.einsum("bhd,hsd->bhs", q, codebook, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(counts > 0, scores, -jnp.inf)
    p = jnp.exp(scores - scores.max(-1, keepdims=True))
    out = jnp.einsum("bhs,bhsd->bhd", p, sums) / jnp.einsum("bhs,bhs->bh", p, counts)[..., None]
    return out.astype(v.dtype), {"counts": counts, "sums": sums}
