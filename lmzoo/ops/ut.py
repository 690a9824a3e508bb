"""The UT representation of a chunk of delta-rule steps (derived in ``lmzoo.ops.delta``): what the
chunk form and its Pallas kernels (``lmzoo.ops.pallas.delta``) share.

Everything here works on one chunk per leading index, ``[..., C, D]``, in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import decay_since, decay_until_end


class ChunkTerms(NamedTuple):
    """What a chunk contributes to the recurrence across chunks, whatever state it starts from.

    The chunk writes ``U = w_v - w_k S`` from the state S before it, and leaves
    ``across * S + keys_to_end^T U``; its queries read ``from_start * q`` from S.
    """

    w_v: jax.Array  # [..., C, Dv]
    w_k: jax.Array  # [..., C, Dk]
    keys_to_end: jax.Array  # [..., C, Dk]: k decayed to the chunk's end
    across: jax.Array  # [..., Dg]: the decay across the whole chunk
    from_start: jax.Array  # [..., C, Dg]: the decay from the chunk's start to each step


def chunk_terms(k, v, beta, log_g, written=None) -> ChunkTerms:
    """k [..., C, Dk], v [..., C, Dv], beta [..., C], log_g [..., C, Dg] or None (no decay).

    ``written`` [..., C, Dk]: the keys each step writes its value under, where they differ from the keys k it
    erases under (the preconditioned delta rule's, ``lmzoo.ops.precond_delta``); None: k."""
    written = k if written is None else written
    steps = k.ndim - 2
    if log_g is None:
        from_start = to_end = jnp.ones_like(k[..., :1])
        across = jnp.ones(k.shape[:-2] + (1,))
    else:
        from_start = jnp.exp(decay_since(log_g, axis=steps))  # decay since the chunk's start
        to_end = jnp.exp(decay_until_end(log_g, axis=steps))  # decay from each step to the chunk's end
        across = jnp.exp(jnp.sum(log_g, axis=steps))
    d_value = v.shape[-1]
    weighted = beta[..., None] * jnp.concatenate([v, k * from_start], axis=-1)  # (..., C, Dv + Dk)
    solved = invert_unit_lower(unit_lower(k, beta, log_g, written)) @ weighted
    return ChunkTerms(solved[..., :d_value], solved[..., d_value:], written * to_end, across, from_start)


def ut_chunks(q, k, v, beta, log_g, s0, written=None):
    """q, k [B,N,H,C,Dk], v [B,N,H,C,Dv], beta [B,N,H,C], log_g [B,N,H,C,Dg] or None, s0 [B,H,Dk,Dv]; ``written``
    the keys written under where they differ from k (``chunk_terms``).

    Returns (o [B,N,H,C,Dv], S after the last chunk).
    """
    terms = chunk_terms(k, v, beta, log_g, written)

    def carry(s, chunk):  # S before a chunk -> S after it, and the values the chunk writes
        w_v, w_k, keys_to_end, decay = chunk  # (B, H, C, Dv), (B, H, C, Dk), (B, H, C, Dk), (B, H, Dg)
        u = w_v - w_k @ s  # (B, H, C, Dv)
        return decay[..., None] * s + jnp.swapaxes(keys_to_end, -1, -2) @ u, (s, u)

    # chunk axis first
    chunks = tuple(a.swapaxes(0, 1) for a in (terms.w_v, terms.w_k, terms.keys_to_end, terms.across))
    final, (starts, u) = lax.scan(carry, s0, chunks)
    starts, u = starts.swapaxes(0, 1), u.swapaxes(0, 1)  # (B, N, H, Dk, Dv), (B, N, H, C, Dv)
    reads = decayed_pairs(q, k if written is None else written, log_g, diagonal=True)
    return (q * terms.from_start) @ starts + reads @ u, final


def decayed_pairs(x, y, log_g, *, diagonal: bool, before_decay: bool = False) -> jax.Array:
    """``P(x, y)_ij = sum_d x_id y_jd exp(sum_{j<m<=i} log_g_md)`` for j < i (and j = i when
    ``diagonal``), 0 above: x, y [..., C, D], log_g [..., C, Dg] or None -> [..., C, C].

    ``before_decay``: row i reads before its own step's decay, ``exp(sum_{j<m<i} log_g_md)``
    (the DPLR rule's low-rank read, ``lmzoo.ops.dplr``); strictly lower, so not with ``diagonal``.

    Built by halving, as GLA's chunks are: in a block of 2h steps, a late row i reaches an early
    row j through the gates of the early half after j and of the late half up to i, so the block's
    lower-left quarter is the matmul ``(x_i exp(since the middle)) . (y_j exp(until the middle))``,
    both factors <= 1 and summed over at most h steps. Blocks of 1 (the diagonal) grow to the whole
    chunk in log2(C) rounds, each placing that quarter beside the two halves' own blocks.
    """
    if before_decay and diagonal:
        raise ValueError("decayed_pairs: a read before the decay has no diagonal "
                         "(diagonal=True with before_decay=True)")
    size = x.shape[-2]
    if log_g is None:
        tril = jnp.tril(jnp.ones((size, size), bool), 0 if diagonal else -1)
        return jnp.where(tril, x @ jnp.swapaxes(y, -1, -2), 0.0)
    width = 1 << (size - 1).bit_length()  # padded rows are zero: they add nothing
    pad = [(0, 0)] * (x.ndim - 2) + [(0, width - size), (0, 0)]
    x, y, log_g = (jnp.pad(a, pad) for a in (x, y, log_g))
    same_step = jnp.sum(x * y, axis=-1) if diagonal else jnp.zeros(x.shape[:-1])
    blocks = same_step[..., None, None]  # (..., W, 1, 1): W blocks of one step
    half = 1
    while half < width:
        xb, yb, gb = (a.reshape(*a.shape[:-2], width // (2 * half), 2, half, a.shape[-1]) for a in (x, y, log_g))
        steps = gb.ndim - 2  # the axis of the h steps in each half
        since_middle = (decay_before if before_decay else decay_since)(gb[..., 1, :, :], axis=steps - 1)
        late = xb[..., 1, :, :] * jnp.exp(since_middle)
        early = yb[..., 0, :, :] * jnp.exp(decay_until_end(gb[..., 0, :, :], axis=steps - 1))
        across = late @ jnp.swapaxes(early, -1, -2)  # (..., L, h, h) late rows against early columns
        halves = blocks.reshape(*blocks.shape[:-3], width // (2 * half), 2, half, half)
        upper = jnp.concatenate([halves[..., 0, :, :], jnp.zeros_like(across)], axis=-1)
        lower = jnp.concatenate([across, halves[..., 1, :, :]], axis=-1)
        blocks = jnp.concatenate([upper, lower], axis=-2)  # (..., L / 2, 2h, 2h)
        half *= 2
    return blocks[..., 0, :size, :size]


def decay_matrix(log_g) -> jax.Array:
    """[..., C] -> [..., C, C]: ``exp(sum_{j<m<=t} log_g_m)`` for j <= t, 0 above: the decayed pairs of unit
    vectors under one gate per step (built by halving, every exponent <= 0)."""
    ones = jnp.ones(log_g.shape + (1,), log_g.dtype)
    return decayed_pairs(ones, ones, log_g[..., None], diagonal=True)


def decay_before(log_g, axis: int) -> jax.Array:
    """Exclusive cumulative log decay along ``axis``: sum_{m<t} log_g_m (0 at the first step),
    summed directly rather than as an inclusive sum minus log_g_t, which would round like the sum."""
    before = lax.slice_in_dim(jnp.cumsum(log_g, axis=axis), 0, log_g.shape[axis] - 1, axis=axis)
    return jnp.concatenate([jnp.zeros_like(lax.slice_in_dim(log_g, 0, 1, axis=axis)), before], axis=axis)


def unit_lower(k, beta, log_g, written=None) -> jax.Array:
    """``I + diag(beta) P_<(k, w)`` [..., C, C]: k [..., C, Dk], beta [..., C], the written keys w = k where None."""
    eye = jnp.eye(k.shape[-2], dtype=k.dtype)
    return eye + beta[..., :, None] * decayed_pairs(k, k if written is None else written, log_g, diagonal=False)


def invert_unit_lower(lower) -> jax.Array:
    """The inverse of a unit lower-triangular ``lower`` [..., C, C], by halving:
    ``[[A, 0], [B, D]]^{-1} = [[A^{-1}, 0], [-D^{-1} B A^{-1}, D^{-1}]]`` from blocks of one step up,
    log2(C) rounds of batched matmuls. (XLA's CPU triangular solve, a LAPACK call, stalled inside
    the compiled training step; matmuls also suit accelerators better than forward substitution.)
    """
    size = lower.shape[-1]
    width = 1 << (size - 1).bit_length()
    padded = jnp.pad(lower, [(0, 0)] * (lower.ndim - 2) + [(0, width - size)] * 2)
    padded = padded + jnp.diag(jnp.arange(width) >= size).astype(lower.dtype)  # padded steps: identity
    inverse = jnp.ones(lower.shape[:-2] + (width, 1, 1), lower.dtype)  # the inverses of 1 x 1 unit blocks
    half = 1
    while half < width:
        blocks = width // (2 * half)
        grid = padded.reshape(*padded.shape[:-2], blocks, 2, half, blocks, 2, half)
        across = jnp.moveaxis(jnp.diagonal(grid[..., :, 1, :, :, 0, :], axis1=-4, axis2=-2), -1, -3)  # (..., L, h, h)
        halves = inverse.reshape(*inverse.shape[:-3], blocks, 2, half, half)
        early, late = halves[..., 0, :, :], halves[..., 1, :, :]
        upper = jnp.concatenate([early, jnp.zeros_like(early)], axis=-1)
        lower_half = jnp.concatenate([-(late @ across @ early), late], axis=-1)
        inverse = jnp.concatenate([upper, lower_half], axis=-2)  # (..., L / 2, 2h, 2h)
        half *= 2
    return inverse[..., 0, :size, :size]
