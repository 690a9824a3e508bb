"""Comba (Hu et al., 2025): a delta rule whose prediction reads the state before the decay, through a
prediction key of its own.

Per head and step, with a log-space decay ``log_g`` (none, one per head, or one per key channel):

    S_t = diag(exp(log_g_t)) S_{t-1} + beta_t k_t (v_t - S_{t-1}^T p_t)^T
    o_t = scale * S_t^T q_t

The error term compares v_t with what the *undecayed* previous state recalls for p_t (the gated
delta rule decays first). S is ``[Dk, Dv]`` per head (key dimension first); the op neither
normalises q, k, p nor squashes beta.

Forms (``method``):

- ``"naive"``:    the recurrence written out, one step at a time -- the reference (``"scan"`` in
  older runs, which lmzoo.record.migrate renames);
- ``"chunk"``:    the UT representation inside chunks of ``chunk_size`` steps, a short recurrence
  across them (derived below);
- ``"parallel"``: the same over the whole sequence as one chunk (no recurrence at all).
- ``"jla"``, ``"auto"``: jax-linear-attention's ``rwkv7`` (the DPLR rule, which reads the state before
  the decay too: ``jla_call``; ``lmzoo.ops.kernels``); ``auto`` runs ``"chunk"`` where jla's Hopper kernel
  does not take the call.

The UT representation. Inside a chunk that starts from state S_0, let b_t = sum_{m<=t} log_g_m
(from the chunk's start; b_{-1} = 0) and ``u_t = beta_t (v_t - S_{t-1}^T p_t)`` the value written
at step t, so that ``S_t = exp(b_t) S_0 + sum_{j<=t} exp(b_t - b_j) k_j u_j^T``. Putting S_{t-1}
into u_t's definition gives

    u_t + beta_t sum_{j<t} (p_t . k_j) exp(b_{t-1} - b_j) u_j = beta_t (v_t - S_0^T (exp(b_{t-1}) p_t)),

the unit lower-triangular system ``(I + diag(beta) L) U = diag(beta) (V - (P exp(b_{t-1})) S_0)``,
where ``L_tj = sum_d p_td k_jd exp(b_{t-1,d} - b_{j,d})`` for j < t. That decay stops one step short
of t, so row t of L is row t - 1 of the delta rule's pair matrix ``P_<=(p_next, k)`` with
``p_next_m = p_{m+1}`` (``lmzoo.ops.ut.decayed_pairs``, built by halving from nearby sums: every
exponent <= 0, exact however strong the gates). One triangular inverse then gives
``U = W_v - W_k S_0`` with ``[W_v, W_k] = (I + diag(beta) L)^{-1} diag(beta) [V, P exp(b_{t-1})]``, and

    O   = scale * ((Q exp(b)) S_0 + P_<=(q, k) U)
    S_C = exp(b_C) S_0 + (K exp(b_C - b))^T U,

the delta rule's chunk recurrence with these W's. From a zero state the weights on the values are
``A = scale * P_<=(q, k) (I + diag(beta) L)^{-1} diag(beta)`` (``comba_weights``).

Documents (``segment_ids``): at a document's first step the decay forgets everything
(``RESET_LOG_DECAY``) and the prediction key is zeroed, since the prediction reads the undecayed
state, which still holds the previous document. Gates, decays, states and every product are
float32 whatever the input dtype; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (
    Forms, check_form, decay_since, decay_until_end, from_chunks, gates_float32, same_segment, segment_starts,
    to_chunks,
)
from lmzoo.ops.dplr import dplr_jla_call
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.ut import ChunkTerms, decayed_pairs, invert_unit_lower

METHODS = Forms("naive", "chunk", "parallel", *PROVIDER_FORMS)

STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def comba(q, k, v, p, beta, log_g=None, *, scale=None, initial_state=None, method="chunk", chunk_size=64,
          segment_ids=None):
    """q, k, p [B,T,H,Dk], v [B,T,H,Dv], beta [B,T,H], log_g None, [B,T,H] or [B,T,H,Dk].

    ``method="auto"`` runs jla's Hopper kernel (its ``rwkv7``, through ``jla_call``) where it takes the call
    and ``"chunk"`` otherwise. Returns (o [B,T,H,Dv] in v's dtype, S_T [B,H,Dk,Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if p.shape != k.shape:
        raise ValueError(f"p has shape {p.shape}; expected {k.shape}")
    if beta.shape != k.shape[:3]:
        raise ValueError(f"beta has shape {beta.shape}; expected {k.shape[:3]}")
    return kernels.dispatch(
        "comba", method, "chunk", lambda: jla_call(q, k, v, p, beta, log_g, scale, initial_state, segment_ids),
        lambda form: _comba(q, k, v, p, beta, log_g, scale=scale, initial_state=initial_state, method=form,
                            chunk_size=chunk_size, segment_ids=segment_ids), v.dtype)


def jla_call(q, k, v, p, beta, log_g, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """Comba as the DPLR rule (``lmzoo.ops.dplr``) and so jla's ``rwkv7``: ``S_t = diag(exp(w_t)) S + b_t (a_t^T S)
    + k'_t v_t^T`` reads S before the decay, as Comba's prediction does, with ``a = p``, ``b = -beta k`` and
    ``k' = beta k`` (in k's dtype). jla zeroes the state at a segment start, which is what lmzoo's forgetting
    decay and zeroed p there compute."""
    written = (beta.astype(jnp.float32)[..., None] * k.astype(jnp.float32)).astype(k.dtype)
    return dplr_jla_call(q, written, v, p.astype(k.dtype), -written, log_g, scale, initial_state, segment_ids)


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _comba(q, k, v, p, beta, log_g, *, scale, initial_state, method, chunk_size, segment_ids):
    """``comba`` in one of lmzoo's own forms."""
    batch, _, heads, d_key = k.shape
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, d_key, v.shape[-1]), jnp.float32)
    q32, k32, v32, p32, g32 = inputs_float32(q, k, v, p, log_g, segment_ids)
    out, state = _FORMS[method](q32 * scale, k32, v32, p32, beta.astype(jnp.float32), g32,
                                initial_state.astype(jnp.float32), chunk_size)
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def comba_weights(q, k, p, beta, log_g=None, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``comba`` applies to v (zero initial
    state): ``scale * P_<=(q, k) (I + diag(beta) L)^{-1} diag(beta)``; exactly 0 across segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, _, p, log_g = (None if a is None else heads_first(a)
                         for a in inputs_float32(q, k, None, p, log_g, segment_ids))
    beta = beta.astype(jnp.float32).swapaxes(1, 2)  # (B, H, T)
    weights = decayed_pairs(q * scale, k, log_g, diagonal=True) @ (invert_unit_lower(unit_lower(k, p, beta, log_g))
                                                                   * beta[..., None, :])
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


def inputs_float32(q, k, v, p, log_g, segment_ids):
    """float32 q, k, v, p and log gates [B,T,H,Dg] (or None); with documents, gates that forget at
    each document start and p zeroed there."""
    g32 = gates_float32(log_g, segment_ids, k.shape)
    p32 = p.astype(jnp.float32)
    if segment_ids is not None:
        p32 = jnp.where(segment_starts(segment_ids)[:, :, None, None], 0.0, p32)
    return q.astype(jnp.float32), k.astype(jnp.float32), None if v is None else v.astype(jnp.float32), p32, g32


def heads_first(x):
    """[B, T, H, D] -> [B, H, T, D] (and [B, N, C, H, D] -> [B, N, H, C, D])."""
    return jnp.swapaxes(x, -3, -2)


def unit_lower(k, p, beta, log_g) -> jax.Array:
    """``I + diag(beta) L`` [..., C, C] with ``L_tj = p_t . k_j exp(b_{t-1} - b_j)`` for j < t."""
    p_next = jnp.concatenate([p[..., 1:, :], jnp.zeros_like(p[..., :1, :])], axis=-2)
    pairs = decayed_pairs(p_next, k, log_g, diagonal=True)  # row m: p_{m+1} against k_j, j <= m
    below = jnp.concatenate([jnp.zeros_like(pairs[..., :1, :]), pairs[..., :-1, :]], axis=-2)  # row t <- row t - 1
    return jnp.eye(k.shape[-2], dtype=k.dtype) + beta[..., :, None] * below


def chunk_terms(k, v, p, beta, log_g) -> ChunkTerms:
    """What a chunk [..., C, D] contributes across chunks, in the delta rule's terms (``lmzoo.ops.ut``)."""
    steps = k.ndim - 2
    if log_g is None:
        from_start = before = to_end = jnp.ones_like(k[..., :1])
        across = jnp.ones(k.shape[:-2] + (1,))
    else:
        since = decay_since(log_g, axis=steps)
        until_before = jnp.concatenate([jnp.zeros_like(since[..., :1, :]), since[..., :-1, :]], axis=-2)
        from_start, before = jnp.exp(since), jnp.exp(until_before)  # decays to steps t and t - 1
        to_end = jnp.exp(decay_until_end(log_g, axis=steps))
        across = jnp.exp(jnp.sum(log_g, axis=steps))
    weighted = beta[..., None] * jnp.concatenate([v, p * before], axis=-1)  # (..., C, Dv + Dk)
    solved = invert_unit_lower(unit_lower(k, p, beta, log_g)) @ weighted
    d_value = v.shape[-1]
    return ChunkTerms(solved[..., :d_value], solved[..., d_value:], k * to_end, across, from_start)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k, p [B,T,H,Dk], v [B,T,H,Dv], beta [B,T,H], log_g [B,T,H,Dg] or None, S0.


def _naive(q, k, v, p, beta, log_g, s0, chunk_size):
    def step(s, inputs):
        # (B, H, Dk) x2, (B, H, Dv), (B, H, Dk), (B, H); g_t [(B, H, Dg)] or []
        q_t, k_t, v_t, p_t, beta_t, *g_t = inputs
        error = v_t - jnp.einsum("bhd,bhde->bhe", p_t, s)  # against the state before the decay
        if g_t:
            s = jnp.exp(g_t[0])[..., None] * s
        s = s + (beta_t[..., None] * k_t)[..., :, None] * error[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = (q, k, v, p, beta) if log_g is None else (q, k, v, p, beta, log_g)
    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in steps))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, p, beta, log_g, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    # (B, N, H, C, *); padded steps have k = p = 0, beta = 0, log_g = 0: they neither write nor decay
    qc, kc, vc, pc = (heads_first(to_chunks(a, size)) for a in (q, k, v, p))
    beta_c = to_chunks(beta, size).swapaxes(2, 3)  # (B, N, H, C)
    g_c = None if log_g is None else heads_first(to_chunks(log_g, size))
    terms = chunk_terms(kc, vc, pc, beta_c, g_c)

    def carry(s, chunk):  # S before a chunk -> S after it, and the values the chunk writes
        w_v, w_k, keys_to_end, decay = chunk  # (B, H, C, Dv), (B, H, C, Dk), (B, H, C, Dk), (B, H, Dg)
        u = w_v - w_k @ s
        return decay[..., None] * s + jnp.swapaxes(keys_to_end, -1, -2) @ u, (s, u)

    chunks = tuple(a.swapaxes(0, 1) for a in (terms.w_v, terms.w_k, terms.keys_to_end, terms.across))
    final, (starts, u) = lax.scan(carry, s0, chunks)
    starts, u = starts.swapaxes(0, 1), u.swapaxes(0, 1)  # (B, N, H, Dk, Dv), (B, N, H, C, Dv)
    out = (qc * terms.from_start) @ starts + decayed_pairs(qc, kc, g_c, diagonal=True) @ u
    return from_chunks(heads_first(out), length), final


def _parallel(q, k, v, p, beta, log_g, s0, chunk_size):
    """The whole sequence as one chunk: the UT representation with no recurrence."""
    return _chunk(q, k, v, p, beta, log_g, s0, q.shape[1])


_FORMS = {"naive": _naive, "chunk": _chunk, "parallel": _parallel}
