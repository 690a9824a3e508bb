"""Gated slot attention (Zhang et al., 2024): a bounded memory of M slots per head, written and read by two
passes of gated linear attention that share one forget gate per slot, with a softmax over the slots between.

Per head and step (``a_t = exp(log_g_t)`` [M], one forget gate per slot; s_t [M] how much each slot writes,
``1 - a_t`` in the layer):

    K_t = K_{t-1} diag(a_t) + k_t^T s_t          [Dk, M]: the slots' keys
    p_t = softmax(scale * q_t K_t)                [M]:     which slots the query reads
    V_t = diag(a_t) V_{t-1} + s_t^T v_t          [M, Dv]: the slots' values
    o_t = p_t V_t

The second pass is GLA with the slots as its keys: the slot weights p as queries, s as keys, the gate per key
channel, scale 1, so it runs on ``lmzoo.ops.gla`` in the matching form. The first pass gates the state's other
side (the slots are its values), which GLA cannot express without one head per slot; it has its own forms here,
GLA's written for a gate on the value side.

Forms (``method``), of the first pass and of the GLA call alike:

- ``"naive"``:    both passes step by step (``lax.scan``) -- the reference;
- ``"chunk"``:    matmuls within chunks of ``chunk_size`` steps, the states carried across chunks; the first pass
  within a chunk by halving (``_within_chunks``), every exponent taken <= 0;
- ``"parallel"``: the first pass as one chunk, the second GLA's parallel form (the [T, T, M] decays materialised).

The states are ``(K [B, H, Dk, M], V [B, H, M, Dv])``. With zero initial states the layer's effective weights on
the values exist: ``sum_m p_tm s_jm exp(L_tjm)``, GLA's weights of the second pass (``gsa_weights``). Documents
(``segment_ids``): both passes forget everything at a document's first step (``RESET_LOG_DECAY``, on the shared
gate). Everything accumulates in float32; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import (
    Forms, check_form, decay_since, decay_until_end, from_chunks, halves, gates_float32, state_float32, to_chunks,
)
from lmzoo.ops.gated import gla, gla_weights

METHODS = Forms("naive", "chunk", "parallel")
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def gsa(q, k, v, s, log_g, *, scale=None, initial_state=None, method="chunk", chunk_size=64, segment_ids=None):
    """q, k [B,T,H,Dk], v [B,T,H,Dv], s and log_g (<= 0) [B,T,H,M]; initial_state None or
    (K [B,H,Dk,M], V [B,H,M,Dv]).

    Returns (o [B,T,H,Dv] in v's dtype, (K_T, V_T) float32).
    """
    method = check_form(method, METHODS, chunk_size)
    check_shapes(q, k, s, log_g, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _gsa(q, k, v, s, log_g, scale=scale, initial_state=initial_state, method=method, chunk_size=chunk_size,
                segment_ids=segment_ids)


def check_shapes(q, k, s, log_g, v=None) -> None:
    """One-line errors for inputs whose shapes do not fit together."""
    if q.shape != k.shape:
        raise ValueError(f"q has shape {q.shape}; expected k's {k.shape}")
    if v is not None and v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v has shape {v.shape}; expected {k.shape[:3]} + (Dv,)")
    if s.shape[:3] != k.shape[:3]:
        raise ValueError(f"s has shape {s.shape}; expected {k.shape[:3]} + (slots,)")
    if log_g.shape != s.shape:
        raise ValueError(f"log_g has shape {log_g.shape}; expected s's {s.shape} (one gate per slot)")


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _gsa(q, k, v, s, log_g, *, scale, initial_state, method, chunk_size, segment_ids):
    batch, _, heads, d_key = k.shape
    k0, v0 = (None, None) if initial_state is None else initial_state
    k0 = state_float32(k0, (batch, heads, d_key, s.shape[-1]))
    v0 = state_float32(v0, (batch, heads, s.shape[-1], v.shape[-1]))
    log_g = gates_float32(log_g, segment_ids, s.shape)  # the resets once, for both passes
    q, k, s = (x.astype(jnp.float32) for x in (q, k, s))
    scores, k_final = _SLOT_FORMS[method](q * scale, k, s, log_g, k0, chunk_size)
    slots = jax.nn.softmax(scores, axis=-1)  # (B, T, H, M) which slots each query reads
    out, v_final = gla(slots, s, v, log_g, scale=1.0, initial_state=v0, method=method, chunk_size=chunk_size)
    return out, (k_final, v_final)


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size"))
def gsa_weights(q, k, s, log_g, *, scale=None, chunk_size=64, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``gsa`` applies to v from zero states:
    ``sum_m p_tm s_jm exp(L_tjm)``, p the slot weights of the first pass; exactly 0 across segments."""
    check_shapes(q, k, s, log_g)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    log_g = gates_float32(log_g, segment_ids, s.shape)
    q, k, s = (x.astype(jnp.float32) for x in (q, k, s))
    zero = jnp.zeros((k.shape[0], k.shape[2], k.shape[3], s.shape[-1]), jnp.float32)
    scores, _ = _slot_scores_chunk(q * scale, k, s, log_g, zero, chunk_size)
    return gla_weights(jax.nn.softmax(scores, axis=-1), s, log_g, scale=1.0, segment_ids=segment_ids)


# ----------------------------------------------------------------------------- the first pass
# Each takes float32 q (already scaled), k [B,T,H,Dk], s, log_g [B,T,H,M], K0 [B,H,Dk,M] and returns
# (q_t K_t [B,T,H,M], K_T).


def _slot_scores_naive(q, k, s, log_g, k0, chunk_size):
    def step(state, inputs):
        q_t, k_t, s_t, g_t = inputs  # (B, H, Dk) x2, (B, H, M) x2
        state = state * jnp.exp(g_t)[..., None, :] + k_t[..., :, None] * s_t[..., None, :]  # (B, H, Dk, M)
        return state, jnp.einsum("bhd,bhdm->bhm", q_t, state)

    final, scores = lax.scan(step, k0, tuple(a.swapaxes(0, 1) for a in (q, k, s, log_g)))
    return scores.swapaxes(0, 1), final


def _slot_scores_chunk(q, k, s, log_g, k0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    qc, kc, sc, gc = (to_chunks(a, size) for a in (q, k, s, log_g))  # (B, N, C, H, *); padding: k = 0, g = 1
    within = _within_chunks(qc, kc, sc, gc)
    added = jnp.einsum("bnchd,bnchm->nbhdm", kc, sc * jnp.exp(decay_until_end(gc, axis=2)))  # to each chunk's end

    def carry(state, chunk):  # K after the chunk from K before it
        log_decay, update = chunk
        return jnp.exp(log_decay)[..., None, :] * state + update, state

    total = jnp.sum(gc, axis=2).swapaxes(0, 1)  # (N, B, H, M) log decay across each chunk
    final, starts = lax.scan(carry, k0, (total, added))  # starts: K before each chunk
    scores = within + jnp.einsum("bnihd,nbhdm->bnihm", qc, starts) * jnp.exp(decay_since(gc, axis=2))
    return from_chunks(scores, length), final


def _slot_scores_parallel(q, k, s, log_g, k0, chunk_size):
    """The whole sequence as one chunk."""
    return _slot_scores_chunk(q, k, s, log_g, k0, q.shape[1])


def _within_chunks(q, k, s, log_g):
    """``sum_{j<=i} (q_i . k_j) exp(L_ij) * s_j`` per slot inside each chunk; q, k, s, log_g [B, N, C, H, *].

    The gate acts on the slots, the side the result keeps, so the decay multiplies the result rather than
    entering the scores. By halving, as GLA's chunks: in a block of 2h steps the second half sees the first
    through the gates between them, a late step carrying exp(decay from the boundary to i) on its result and an
    early one exp(decay from j to the boundary) on its s, both <= 1; halving down to single steps covers every
    j < i (j = i has no decay): log2(C) rounds.
    """
    size = q.shape[2]
    width = 1 << (size - 1).bit_length()  # the next power of two; padded steps neither decay nor add
    pad = [(0, 0), (0, 0), (0, width - size), (0, 0), (0, 0)]
    q, k, s, log_g = (jnp.pad(a, pad) for a in (q, k, s, log_g))
    out = jnp.sum(q * k, axis=-1, keepdims=True) * s  # (B, N, W, H, M) the j = i terms
    half = 1
    while half < width:
        qb, kb, sb, gb = (halves(a, half) for a in (q, k, s, log_g))  # (B, N, blocks, 2, half, H, *)
        scores = jnp.einsum("bnlihd,bnljhd->bnlhij", qb[:, :, :, 1], kb[:, :, :, 0])  # (B, N, blocks, H, h, h)
        s_early = sb[:, :, :, 0] * jnp.exp(decay_until_end(gb[:, :, :, 0], axis=3))
        gained = jnp.einsum("bnlhij,bnljhm->bnlihm", scores, s_early) * jnp.exp(decay_since(gb[:, :, :, 1], axis=3))
        out = out + jnp.stack([jnp.zeros_like(gained), gained], axis=3).reshape(out.shape)
        half *= 2
    return out[:, :, :size]


_SLOT_FORMS = {"naive": _slot_scores_naive, "chunk": _slot_scores_chunk, "parallel": _slot_scores_parallel}
