"""RWKV-6 ("Finch") time mixing: gated linear attention that reads its state *before* the step's decay and write,
plus a bonus ``u`` on the token's own key.

Per head, with a per-key-channel log decay ``log_w <= 0`` and a bonus ``u [H, Dk]``:

    o_t = scale * q_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(exp(log_w_t)) S_{t-1} + k_t^T v_t

So key j < i reaches query i with weight ``scale * sum_d q_id k_jd exp(sum_{j<m<i} log_w_md)`` (the decays of
the steps strictly between them: GLA's weights, ``lmzoo.ops.gated``, with the query's own gate left out), and the
token itself with ``scale * sum_d q_id u_d k_id``. The state is GLA's: the same final state from the same inputs.

Forms (``method``):

- ``"naive"``: the recurrence above, step by step (the reference);
- ``"chunk"``: within chunks of ``chunk_size`` steps the strictly lower weights are the DPLR rule's read-side pairs
  (``lmzoo.ops.ut.decayed_pairs`` with ``before_decay``: built by halving, every exponent <= 0 and summed over
  nearby steps only), queries read the state entering their chunk through ``exp(decay_before)``, and the state is
  carried across chunks as GLA carries it;
- ``"parallel"``: the whole sequence as one chunk (no recurrence; how ``rwkv6_weights`` gets its matrix).

Documents (``segment_ids``): the naive form zeroes the state at each segment start, before the query reads it.
The other forms forget through the segment start's decay (``RESET_LOG_DECAY``), which acts only on later queries
(a query reads before its own decay), so the query at a segment start also reads no state: it sees its own token
alone. Everything accumulates in float32; o has v's dtype.

Kernel providers (``lmzoo.ops.kernels``): ``"jla"`` runs jax-linear-attention's ``rwkv6`` kind (``jla_call``: the
same read before the step's decay and write, the same bonus); ``"auto"`` would run a jla Mosaic GPU kernel for it
where jla had one, and ``"chunk"`` otherwise. jla 0.1 has only its reference and chunked JAX ops for ``rwkv6``, so
today ``auto`` runs ``"chunk"`` on every device, recorded with that reason.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (RESET_LOG_DECAY, Forms, check_form, decay_until_end, from_chunks, gate_layout,
                              reset_gates, same_segment, segment_starts, state_float32, to_chunks)
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.ut import decay_before, decayed_pairs

METHODS = Forms("naive", "parallel", "chunk", *PROVIDER_FORMS)
BEST = "chunk"  # the form ``auto`` runs where jla's kernel does not (``lmzoo.ops.kernels``)
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def rwkv6(q, k, v, log_w, u, *, scale=None, initial_state=None, method="chunk", chunk_size=64, segment_ids=None):
    """q, k, log_w [B,T,H,Dk] (log_w also [B,T,H]: one decay per head), v [B,T,H,Dv], u [H,Dk].

    ``segment_ids`` [B,T]: the state restarts at each segment start. ``method="jla"`` runs jax-linear-attention's
    ``rwkv6``; ``"auto"`` a jla Hopper kernel where jla has one, ``"chunk"`` otherwise.
    Returns (o [B, T, H, Dv] in v's dtype, S_T [B, H, Dk, Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if u.shape != k.shape[2:]:
        raise ValueError(f"u has shape {u.shape}; expected {k.shape[2:]} (heads, key width)")
    return kernels.dispatch(
        "rwkv6", method, BEST, lambda: jla_call(q, k, v, log_w, u, scale, initial_state, segment_ids),
        lambda form: _rwkv6(q, k, v, log_w, u, scale=scale, initial_state=initial_state, method=form,
                            chunk_size=chunk_size, segment_ids=segment_ids), v.dtype)


def jla_call(q, k, v, log_w, u, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """``rwkv6`` as jla's ``rwkv6``: the same read of the state before the step's decay and write and the same bonus
    u on the token's own key, g = log_w (one per head spread over the key channels); jla zeroes the state at a
    segment start before that step's query reads it, as the naive form does."""
    g = jnp.broadcast_to(gate_layout(log_w, k.shape), k.shape).astype(jnp.float32)
    return kernels.JlaCall("rwkv6", q, k, v, {"g": g, "u": u},
                           {"scale": scale, "initial_state": kernels.state_or_none(initial_state),
                            "segment_ids": segment_ids})


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _rwkv6(q, k, v, log_w, u, *, scale, initial_state, method, chunk_size, segment_ids):
    batch, length, heads, d_key = k.shape
    s0 = state_float32(initial_state, (batch, heads, d_key, v.shape[-1]))
    starts = jnp.zeros((batch, length), bool) if segment_ids is None else segment_starts(segment_ids)
    q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
    log_w = gate_layout(log_w, k.shape).astype(jnp.float32)
    out, state = _FORMS[method](q32 * scale, k32, v32, log_w, u.astype(jnp.float32), starts, s0, chunk_size)
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def rwkv6_weights(q, k, log_w, u, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``rwkv6`` applies to v from a zero state:
    ``scale * q_i . (k_j * exp(sum_{j<m<i} log_w_m))`` below the diagonal, ``scale * q_i . (u * k_i)`` on it;
    exactly 0 across segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q32, k32 = q.astype(jnp.float32) * scale, k.astype(jnp.float32)
    log_w = gate_layout(log_w, k.shape).astype(jnp.float32)
    g = log_w if segment_ids is None else log_w + reset_gates(None, segment_ids, k.shape)
    to_heads = lambda a: jnp.swapaxes(a, 1, 2)  # noqa: E731  (B, T, H, *) -> (B, H, T, *)
    weights = decayed_pairs(to_heads(q32), to_heads(k32), to_heads(g), diagonal=False, before_decay=True)
    own = jnp.sum(q32 * u.astype(jnp.float32) * k32, axis=-1)  # (B, T, H)
    weights = weights + jnp.eye(k.shape[1]) * to_heads(own)[..., None]
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,H,Dv], log_w [B,T,H,Dg], u [H,Dk], the segment starts
# [B,T] bool and S0 [B,H,Dk,Dv].


def _naive(q, k, v, log_w, u, starts, s0, chunk_size):
    """The definition, one step at a time, independent of the other forms."""
    def step(state, inputs):
        q_t, k_t, v_t, w_t, start = inputs  # (B, H, Dk), (B, H, Dk), (B, H, Dv), (B, H, Dg), (B,)
        state = jnp.where(start[:, None, None, None], 0.0, state)  # a new document reads no earlier state
        written = k_t[..., :, None] * v_t[..., None, :]  # (B, H, Dk, Dv)
        o_t = jnp.sum(q_t[..., :, None] * (state + u[..., None] * written), axis=-2)  # q_t (S_{t-1} + diag(u) k^T v)
        return jnp.exp(w_t)[..., None] * state + written, o_t

    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in (q, k, v, log_w, starts)))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, log_w, u, starts, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    g = log_w + jnp.where(starts, RESET_LOG_DECAY, 0.0)[:, :, None, None]  # forgets earlier documents for later queries
    reads = jnp.where(starts[:, :, None, None], 0.0, q)  # the query at a segment start reads no state
    # (B, N, H, C, *); padded steps have q = k = 0 and log_w = 0: they neither read, write nor decay
    qc, kc, vc, gc = (jnp.swapaxes(to_chunks(a, size), 2, 3) for a in (reads, k, v, g))
    entering, final = _chunk_states(kc, vc, gc, s0)  # (B, N, H, Dk, Dv): S before each chunk
    within = decayed_pairs(qc, kc, gc, diagonal=False, before_decay=True) @ vc  # j < i inside the chunk
    before = qc * jnp.exp(decay_before(gc, axis=3))  # each query's decay since the chunk's start, its own excluded
    out = from_chunks(jnp.swapaxes(within + before @ entering, 2, 3), length)
    own = jnp.sum(q * u * k, axis=-1, keepdims=True) * v  # (B, T, H, Dv): the bonus on the token's own value
    return out + own, final


def _parallel(q, k, v, log_w, u, starts, s0, chunk_size):
    """The whole sequence as one chunk: no recurrence."""
    return _chunk(q, k, v, log_w, u, starts, s0, q.shape[1])


def _chunk_states(k, v, log_g, s0):
    """GLA's state across chunks: k, v, log_g [B, N, H, C, *] -> (S before each chunk [B, N, H, Dk, Dv], S after
    the last)."""
    to_end = jnp.exp(decay_until_end(log_g, axis=3))  # decay from each step to the chunk's end
    added = jnp.swapaxes(k * to_end, -1, -2) @ v  # (B, N, H, Dk, Dv) what each chunk leaves
    across = jnp.exp(jnp.sum(log_g, axis=3))  # (B, N, H, Dg)

    def carry(s, chunk):  # S before a chunk -> S after it
        decay, update = chunk
        return decay[..., None] * s + update, s

    final, entering = lax.scan(carry, s0, (across.swapaxes(0, 1), added.swapaxes(0, 1)))
    return entering.swapaxes(0, 1), final


_FORMS = {"naive": _naive, "parallel": _parallel, "chunk": _chunk}
