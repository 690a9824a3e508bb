"""Gated linear attention, the one core of the linear family: ``S_t = diag(exp(log_g_t)) S_{t-1} + k_t^T v_t``,
``o_t = scale q_t S_t``.

``log_g <= 0`` is the log of a forget gate, in one of three layouts, each with its own cheapest
computation:

- ``None``: no decay, plain causal linear attention (``lmzoo.ops.linear`` maps onto this); no
  decay tensor is built at all;
- one scalar per head and step, ``[B, T, H]`` or ``[B, T, H, 1]`` (simple GLA; RetNet when it is a
  constant ``log(gamma_h)``; Mamba-2's SSD, ``lmzoo.ops.ssd``): the decay between two steps is a
  [T, T] matrix per head;
- per key dimension, ``[B, T, H, Dk]`` (GLA, Yang et al. 2023): it needs more (see ``_within_chunks``).

Key j reaches query i >= j with weight ``scale * sum_d q_id k_jd exp(L_ijd)``, where
``L_ij = sum_{j<m<=i} log_g_m`` is the log decay between them. Forms (``method``):

- ``"naive"``:    the recurrence written out step by step (``lax.scan``) -- the reference the
  other forms are tested against;
- ``"parallel"``: those weights materialised, ``L`` as masked segment sums (per dimension it holds
  a [T, T, Dk] tensor: readable, not fast);
- ``"scan"``:     ``lax.scan`` over time, decaying the state only when there is a gate;
- ``"assoc"``:    ``lax.associative_scan`` on (log decay, update) pairs with the operator
  ``(a1, U1) . (a2, U2) = (a1 + a2, exp(a2) U1 + U2)`` (plain sums without gates);
- ``"chunk"``:    matmuls within chunks of ``chunk_size`` steps (per dimension by halving, see
  ``_within_chunks``), the state carried across chunks (without gates, a cumulative sum);
- ``"chunk_recompute"``: the chunk form keeping only its inputs for the backward pass, which recomputes
  the rest (``recompute_in_backward``): ~15x less held per layer in training, one more forward pass of the
  op. Its gradients equal the chunk form's to float32 rounding, not bit for bit;
- ``"pallas"``:   the chunk form as Pallas kernels with a custom VJP (``lmzoo.ops.pallas.gla``):
  compiled on a GPU or TPU, interpret mode on a CPU. q, k, v enter the kernels in their own
  dtype (bfloat16 matmuls on the tensor cores), gates and states in float32.

Log decays are summed from a nearby reference point (the start of a chunk or of a block), never
over the whole sequence, and every exponent taken is <= 0: exp(-L_j) alone would overflow once a
chunk decays by more than ~88 nats. Per dimension they are exact however strong the gates; one
gate per head takes differences of two sums from the chunk's start, which keep their rounding
(~1e-7 of the chunk's total log decay; measured cheaper than segment sums on a CPU). Gates,
decays and states are float32 whatever the input dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (
    Forms, causal_mask, check_form, decay_since, decay_until_end, from_chunks, gate_layout, gates_float32, halves,
    in_float32, recompute_in_backward, same_segment, segment_sums, state_float32, to_chunks,
)
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.pallas.gla import gla_pallas

METHODS = Forms("naive", "parallel", "scan", "assoc", "chunk", "chunk_recompute", "pallas", *PROVIDER_FORMS)
BEST = "chunk"  # the form ``auto`` runs where jla's kernel does not (``lmzoo.ops.kernels``)
STEP_FORM = "scan"  # the form mixers decode one token with (their ``step``): the state update alone, no chunk padding


def gla(q, k, v, log_g=None, *, scale=None, initial_state=None, method="chunk", chunk_size=64, segment_ids=None):
    """q, k [B,T,H,Dk], v [B,T,H,Dv], log_g None, [B,T,H], [B,T,H,1] or [B,T,H,Dk].

    ``segment_ids`` [B,T] (equal within a document): the state restarts at each segment start, a
    forget gate of zero (``RESET_LOG_DECAY``) that every form, the Pallas kernels too, already runs.
    ``method="auto"`` runs jla's Hopper kernel, or deltanet-tpu's on a TPU, where it takes the call and ``"chunk"``
    otherwise.
    Returns (o [B, T, H, Dv] in v's dtype, S_T [B, H, Dk, Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return kernels.dispatch(
        "gla", method, BEST, lambda: jla_call(q, k, v, log_g, scale, initial_state, segment_ids),
        lambda form: gla_form(q, k, v, log_g, scale=scale, initial_state=initial_state, method=form,
                              chunk_size=chunk_size, segment_ids=segment_ids), v.dtype)


def jla_call(q, k, v, log_g, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """``gla`` as jla's ``gla`` (a gate per key channel) or ``simple_gla`` (one per head; none is a zero gate)."""
    s0 = kernels.state_or_none(initial_state)
    options = {"scale": scale, "initial_state": s0, "segment_ids": segment_ids}
    if log_g is not None and log_g.ndim == 4 and log_g.shape[-1] > 1:
        return kernels.JlaCall("gla", q, k, v, {"g": log_g.astype(jnp.float32)}, options)
    g = jnp.zeros(k.shape[:3], jnp.float32) if log_g is None else gate_layout(log_g, k.shape)[..., 0]
    return kernels.JlaCall("simple_gla", q, k, v, {"g": g.astype(jnp.float32)}, options)


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def gla_form(q, k, v, log_g, *, scale, initial_state, method, chunk_size, segment_ids):
    """``gla`` in one of lmzoo's own forms."""
    batch, _, heads, d_key = k.shape
    s0 = state_float32(initial_state, (batch, heads, d_key, v.shape[-1]))
    g32 = gates_float32(log_g, segment_ids, k.shape)
    if method == "pallas":
        q_scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
        gates = jnp.zeros((*k.shape[:3], 1), jnp.float32) if g32 is None else g32
        out, state = gla_pallas(q_scaled, k, v, gates, s0, chunk_size=chunk_size)
    else:
        form = functools.partial(in_float32(_FORMS[method]), scale=scale, chunk_size=chunk_size)
        if method == "chunk_recompute":  # kept as autodiff saves them, the chunk form's intermediates
            # (``_within_chunks``' halving rounds, decayed float32 copies of q, k and v) are ~15x the inputs: 135 MiB
            # a sequence per layer at T = 2048 with 12 heads of Dk = 32, Dv = 64, against the inputs' 9 MiB
            form = recompute_in_backward(form)
        out, state = form(q, k, v, g32, s0)
    return out.astype(v.dtype), state


def decayed_scores(q, k, log_g) -> jax.Array:
    """[..., H, T, T] causal weights ``sum_d q_id k_jd exp(L_ijd)``.

    q, k [..., T, H, Dk]; log_g [..., T, H, Dg], or None for no decay.
    """
    if log_g is None:
        return jnp.where(causal_mask(q.shape[-3]), jnp.einsum("...ihd,...jhd->...hij", q, k), 0.0)
    decay = jnp.exp(segment_sums(log_g))  # (..., T, T, H, Dg), 0 above the diagonal
    if log_g.shape[-1] == 1:  # one decay per head: a [T, T] matrix times the plain scores
        return jnp.einsum("...ihd,...jhd,...ijh->...hij", q, k, decay[..., 0])
    return jnp.einsum("...jhd,...ijhd->...hij", k, q[..., :, None, :, :] * decay)  # XLA's CPU dot likes this order


@functools.partial(jax.jit, static_argnames=("scale",))
def gla_weights(q, k, log_g=None, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 of ``gla`` (no initial state):
    ``scale * (q_i * prod_{j<m<=i} g_m) . k_j`` for j <= i; exactly 0 across segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g32 = None if log_g is None else gate_layout(log_g, k.shape).astype(jnp.float32)
    weights = decayed_scores(q.astype(jnp.float32) * scale, k.astype(jnp.float32), g32)
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,H,Dv], log_g [B,T,H,Dg] or None, S0 [B,H,Dk,Dv].


def _naive(q, k, v, log_g, s0, chunk_size):
    """The definition, one step at a time, independent of the other forms."""
    gates = jnp.ones((*k.shape[:3], 1)) if log_g is None else jnp.exp(log_g)  # (B, T, H, Dg)

    def step(state, inputs):
        q_t, k_t, v_t, g_t = inputs  # (B, H, Dk), (B, H, Dk), (B, H, Dv), (B, H, Dg)
        state = g_t[..., :, None] * state + k_t[..., :, None] * v_t[..., None, :]  # (B, H, Dk, Dv)
        return state, jnp.sum(q_t[..., :, None] * state, axis=-2)  # o_t = q_t S_t

    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in (q, k, v, gates)))
    return out.swapaxes(0, 1), final


def _parallel(q, k, v, log_g, s0, chunk_size):
    out = jnp.einsum("bhts,bshe->bthe", decayed_scores(q, k, log_g), v)
    if log_g is None:
        out = out + jnp.einsum("bthd,bhde->bthe", q, s0)
        return out, s0 + jnp.einsum("bthd,bthe->bhde", k, v)
    out = out + jnp.einsum("bthd,bhde->bthe", q * jnp.exp(decay_since(log_g, axis=1)), s0)
    to_end = jnp.exp(decay_until_end(log_g, axis=1))  # (B, T, H, Dg) decay from each step to the last
    final = jnp.exp(jnp.sum(log_g, axis=1))[..., None] * s0 + jnp.einsum("bthd,bthe->bhde", k * to_end, v)
    return out, final


def _scan(q, k, v, log_g, s0, chunk_size):
    def step(s, inputs):
        q_t, k_t, v_t, *g_t = inputs  # (B, H, D) each; g_t [(B, H, Dg)] or []
        if g_t:
            s = jnp.exp(g_t[0])[..., None] * s
        s = s + k_t[..., :, None] * v_t[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = (q, k, v) if log_g is None else (q, k, v, log_g)
    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in steps))
    return out.swapaxes(0, 1), final


def _assoc(q, k, v, log_g, s0, chunk_size):
    updates = jnp.einsum("bthd,bthe->tbhde", k, v)  # (T, B, H, Dk, Dv)
    if log_g is None:
        states = lax.associative_scan(jnp.add, updates.at[0].add(s0))  # S_t for every t
        return jnp.einsum("bthd,tbhde->bthe", q, states), states[-1]
    log_decay = log_g.swapaxes(0, 1)  # (T, B, H, Dg)
    updates = updates.at[0].add(jnp.exp(log_decay[0])[..., None] * s0)

    def combine(earlier, later):
        (a1, u1), (a2, u2) = earlier, later
        return a1 + a2, jnp.exp(a2)[..., None] * u1 + u2

    _, states = lax.associative_scan(combine, (log_decay, updates))
    return jnp.einsum("bthd,tbhde->bthe", q, states), states[-1]


def _chunk(q, k, v, log_g, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    qc, kc, vc = (to_chunks(a, size) for a in (q, k, v))  # (B, N, C, H, *); padding: k = 0
    if log_g is None:
        out, final = _ungated_chunks(qc, kc, vc, s0)
    else:
        out, final = _gated_chunks(qc, kc, vc, to_chunks(log_g, size), s0)  # padding: g = 1
    return from_chunks(out, length), final


def _ungated_chunks(q, k, v, s0):
    """Without decay the states entering the chunks are a cumulative sum: no sequential carry."""
    scores = jnp.where(causal_mask(q.shape[2]), jnp.einsum("bnihd,bnjhd->bnhij", q, k), 0.0)
    within = jnp.einsum("bnhij,bnjhe->bnihe", scores, v)
    added = jnp.einsum("bnchd,bnche->nbhde", k, v)  # what each chunk adds to S
    ends = s0 + jnp.cumsum(added, axis=0)  # S after each chunk
    starts = jnp.concatenate([s0[None], ends[:-1]], axis=0)  # (N, B, H, Dk, Dv) S before each chunk
    return within + jnp.einsum("bnihd,nbhde->bnihe", q, starts), ends[-1]


def _gated_chunks(q, k, v, log_g, s0):
    within = _within_chunks(q, k, v, log_g)
    added = jnp.einsum("bnchd,bnche->nbhde", k * jnp.exp(decay_until_end(log_g, axis=2)), v)  # (N, B, H, Dk, Dv)

    def carry(s, chunk):  # S after the chunk from S before it
        log_decay, update = chunk
        return jnp.exp(log_decay)[..., None] * s + update, s

    total = jnp.sum(log_g, axis=2).swapaxes(0, 1)  # (N, B, H, Dg) log decay across each chunk
    final, starts = lax.scan(carry, s0, (total, added))  # starts: S before each chunk
    out = within + jnp.einsum("bnihd,nbhde->bnihe", q * jnp.exp(decay_since(log_g, axis=2)), starts)
    return out, final


def _within_chunks(q, k, v, log_g):
    """``sum_{j<=i} (q_i * exp(L_ij)) . k_j v_j`` inside each chunk; q, k, v, log_g [B, N, C, H, *].

    Per dimension, by halving: in a block of 2h steps the second half sees the first through the
    gates between them. Relative to the boundary, a late query carries exp(decay from the boundary
    to i) and an early key exp(decay from j to the boundary), both <= 1 and summed over only those
    steps, so that part is a plain matmul that neither overflows nor loses precision however long
    the chunk. Halving down to single steps covers every j < i (j = i has no decay): log2(C) rounds.
    """
    if log_g.shape[-1] == 1:
        return _within_chunks_per_head(q, k, v, log_g[..., 0])
    size = q.shape[2]
    width = 1 << (size - 1).bit_length()  # the next power of two; padded steps neither decay nor add
    pad = [(0, 0), (0, 0), (0, width - size), (0, 0), (0, 0)]
    q, k, v, log_g = (jnp.pad(a, pad) for a in (q, k, v, log_g))
    out = jnp.sum(q * k, axis=-1, keepdims=True) * v  # (B, N, W, H, Dv) the j = i terms
    half = 1
    while half < width:
        qb, kb, vb, gb = (halves(a, half) for a in (q, k, v, log_g))  # (B, N, blocks, 2, half, H, *)
        q_late = qb[:, :, :, 1] * jnp.exp(decay_since(gb[:, :, :, 1], axis=3))
        k_early = kb[:, :, :, 0] * jnp.exp(decay_until_end(gb[:, :, :, 0], axis=3))
        scores = jnp.einsum("bnlihd,bnljhd->bnlhij", q_late, k_early)  # (B, N, blocks, H, half, half)
        gained = jnp.einsum("bnlhij,bnljhe->bnlihe", scores, vb[:, :, :, 0])
        out = out + jnp.stack([jnp.zeros_like(gained), gained], axis=3).reshape(out.shape)
        half *= 2
    return out[:, :, :size]


def _within_chunks_per_head(q, k, v, log_g):
    """One decay per head (log_g [B, N, C, H]): the plain scores times a [C, C] decay matrix.

    Its log decays are differences of cumulative sums from the chunk's start: cheaper than segment
    sums on a CPU, and as exact while a chunk decays by few nats (the difference keeps the sums'
    rounding, ~1e-7 of the chunk's total log decay). Masked before exp, so no exponent is > 0.
    """
    cum = decay_since(log_g, axis=2).swapaxes(2, 3)  # (B, N, H, C)
    pair = jnp.where(causal_mask(q.shape[2]), cum[..., :, None] - cum[..., None, :], -jnp.inf)  # (B, N, H, Ci, Cj)
    scores = jnp.einsum("bnihd,bnjhd->bnhij", q, k) * jnp.exp(pair)
    return jnp.einsum("bnhij,bnjhe->bnihe", scores, v)


_FORMS = {"naive": _naive, "parallel": _parallel, "scan": _scan, "assoc": _assoc, "chunk": _chunk,
          "chunk_recompute": _chunk}  # recomputed in the backward pass by gla_form
