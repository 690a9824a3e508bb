"""The DPLR (diagonal plus low rank) rule: RWKV-7's generalized delta rule, and GDN-2 on top of it.

Per head and step, with a per-channel log decay ``log_g`` and two key-side vectors alpha, beta:

    S_t = diag(exp(log_g_t)) S_{t-1} + beta_t (alpha_t^T S_{t-1}) + k_t v_t^T
        = (diag(exp(log_g_t)) + beta_t alpha_t^T) S_{t-1} + k_t v_t^T
    o_t = scale * S_t^T q_t

S is ``[Dk, Dv]`` per head (key dimension first). The low-rank term reads the state *before* the
step's decay. Special cases (``as_dplr`` maps delta-rule inputs over):

- the delta rule with decay g (KDA with per-channel g; Gated DeltaNet with one g per head):
  ``S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T``, i.e.
  ``alpha = exp(g) * k``, ``beta -> -beta k``, ``k -> beta k``;
- GDN-2 (``gdn2``): ``S_t = (I - k_t (erase_t * k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (write_t * v_t)^T``,
  i.e. ``alpha = exp(g) * erase * k``, ``beta = -k``, ``v -> write * v``;
- RWKV-7: ``alpha = -kappa_hat``, ``beta = kappa_hat * a``, ``exp(g) = w``.

Forms (``method``): ``"naive"``, the recurrence step by step (the reference; ``"scan"`` in older
runs, which lmzoo.record.migrate renames); ``"chunk"``, the representation below inside chunks of
``chunk_size`` steps and a short recurrence across them; ``"parallel"``, the whole sequence as one chunk (also how
``dplr_weights`` gets the effective attention matrix). Gradients are JAX's own.

The chunk form. Inside a chunk that starts from state S_0, let b_t = sum_{m<=t} log_g_m (per
channel, inclusive) and c_t = b_t - log_g_t (exclusive), and name the low-rank read
``r_t = S_{t-1}^T alpha_t`` ([Dv]). Then ``S_t = diag(exp(g_t)) S_{t-1} + beta_t r_t^T + k_t v_t^T``
is a gated linear recurrence with two writes per step, so

    S_t = exp(b_t) * S_0 + sum_{j<=t} exp(b_t - b_j) * (beta_j r_j^T + k_j v_j^T).

Putting S_{t-1} into r_t's definition gives, with ``P(x, y)_tj = sum_d x_td y_jd exp(b_td - b_jd)``
(inclusive, j <= t) and the read-side ``R(x, y)_tj = sum_d x_td y_jd exp(c_td - b_jd)`` (j < t),

    r_t - sum_{j<t} R(alpha, beta)_tj r_j = S_0^T (exp(c_t) * alpha_t) + sum_{j<t} R(alpha, k)_tj v_j,

a unit lower-triangular system ``(I - R_<(alpha, beta)) Rd = (alpha exp(c)) S_0 + R_<(alpha, k) V``:
the DPLR analogue of the delta rule's UT transform (``lmzoo.ops.delta``), where alpha = -k and
beta = beta k make ``I - R_<`` the delta rule's ``I + P_<(k, k) diag(beta)`` (beta on the write side).
One triangular inverse gives ``Rd = W_s S_0 + W_v`` with

    W_s = (I - R_<(alpha, beta))^{-1} (alpha exp(c)),    W_v = (I - R_<(alpha, beta))^{-1} R_<(alpha, k) V,

and then, with reads and writes both matmuls,

    O   = scale * ((Q exp(b)) S_0 + P_<=(q, beta) Rd + P_<=(q, k) V)
    S_C = exp(b_C) * S_0 + (beta exp(b_C - b))^T Rd + (K exp(b_C - b))^T V.

Across chunks only ``Rd = W_s S + W_v`` and ``S_C`` are sequential. From a zero state the weights on
the values follow (``o = A v``, ``dplr_weights``):
``A = scale * (P_<=(q, k) + P_<=(q, beta) (I - R_<(alpha, beta))^{-1} R_<(alpha, k))``.

Numerics as in the delta rule: every decay is an exponent <= 0 of a sum over nearby steps only --
``exp(b_t)``, ``exp(c_t)`` and ``exp(b_C - b_t)`` from the chunk's edges, pair decays by halving
(``lmzoo.ops.ut.decayed_pairs``, with ``before_decay`` for R) -- so any chunk size is exact however
strong the gates. Everything accumulates in float32; o has v's dtype.

Documents (``segment_ids``): at a segment start the decay is ``RESET_LOG_DECAY`` *and* alpha is 0,
because the low-rank term reads the state before the decay would have cleared it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (Forms, check_form, decay_since, decay_until_end, from_chunks, gate_layout, reset_gates,
                              same_segment, segment_starts, to_chunks)
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.ut import decay_before, decayed_pairs, invert_unit_lower

METHODS = Forms("naive", "parallel", "chunk", *PROVIDER_FORMS)

STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def dplr(q, k, v, alpha, beta, log_g=None, *, scale=None, initial_state=None, method="chunk", chunk_size=64,
         segment_ids=None):
    """q, k, alpha, beta [B,T,H,Dk], v [B,T,H,Dv], log_g None (no decay), [B,T,H] or [B,T,H,Dk].

    ``segment_ids`` [B,T]: the state restarts at each segment start. ``method="auto"`` runs jla's Hopper
    kernel (its ``rwkv7``, the same recurrence) where it takes the call and ``"chunk"`` otherwise.
    Returns (o [B, T, H, Dv] in v's dtype, S_T [B, H, Dk, Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return kernels.dispatch(
        "dplr", method, "chunk", lambda: dplr_jla_call(q, k, v, alpha, beta, log_g, scale, initial_state, segment_ids),
        lambda form: _dplr(q, k, v, alpha, beta, log_g, scale=scale, initial_state=initial_state, method=form,
                           chunk_size=chunk_size, segment_ids=segment_ids), v.dtype)


def dplr_jla_call(q, k, v, alpha, beta, log_g, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """``dplr`` as jla's ``rwkv7``: ``S_t = diag(exp(w_t)) S + b_t (a_t^T S) + k_t v_t^T`` with w = log_g (spread
    over the key channels; zero without a decay), a = alpha, b = beta; jla zeroes the state at a segment start."""
    s0 = kernels.state_or_none(initial_state)
    w = jnp.zeros(k.shape, jnp.float32) if log_g is None else jnp.broadcast_to(gate_layout(log_g, k.shape), k.shape)
    return kernels.JlaCall("rwkv7", q, k, v, {"w": w.astype(jnp.float32), "a": alpha, "b": beta},
                           {"scale": scale, "initial_state": s0, "segment_ids": segment_ids})


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _dplr(q, k, v, alpha, beta, log_g, *, scale, initial_state, method, chunk_size, segment_ids):
    """``dplr`` in one of lmzoo's own forms."""
    alpha, beta, g32 = _checked(k, alpha, beta, log_g, segment_ids)
    batch, _, heads, d_key = k.shape
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, d_key, v.shape[-1]), jnp.float32)
    q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
    out, state = _FORMS[method](q32 * scale, k32, v32, alpha, beta, g32, initial_state.astype(jnp.float32), chunk_size)
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def dplr_weights(q, k, alpha, beta, log_g=None, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``dplr`` applies to v from a zero state:
    ``scale * (P_<=(q, k) + P_<=(q, beta) (I - R_<(alpha, beta))^{-1} R_<(alpha, k))``; 0 across segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    alpha, beta, g32 = _checked(k, alpha, beta, log_g, segment_ids)
    # (B, H, T, *)
    q, k, alpha, beta, g32 = (jnp.swapaxes(a.astype(jnp.float32), 1, 2) for a in (q, k, alpha, beta, g32))
    q = q * scale
    terms = _read_terms(k, alpha, beta, g32)
    weights = decayed_pairs(q, k, g32, diagonal=True) + decayed_pairs(q, beta, g32, diagonal=True) @ terms.reads_values
    if segment_ids is None:
        return weights
    return jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


def gdn2(q, k, v, log_g, erase, write, *, scale=None, initial_state=None, method="chunk", chunk_size=64,
         segment_ids=None):
    """GDN-2: ``S' = diag(exp(g_t)) S_{t-1};  S_t = S' + k_t (write_t * v_t - S'^T (erase_t * k_t))^T``.

    q, k, log_g, erase [B,T,H,Dk] (log_g also [B,T,H]), v, write [B,T,H,Dv]. With erase = write =
    beta it is the delta rule (KDA for per-channel gates). Runs as ``dplr`` with
    ``alpha = exp(g) * erase * k``, ``beta = -k`` and values ``write * v``.
    Returns (o [B, T, H, Dv] in v's dtype, S_T [B, H, Dk, Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return kernels.dispatch(
        "gdn2", method, "chunk", lambda: gdn2_jla_call(q, k, v, log_g, erase, write, scale, initial_state, segment_ids),
        lambda form: _gdn2(q, k, v, log_g, erase, write, scale=scale, initial_state=initial_state, method=form,
                           chunk_size=chunk_size, segment_ids=segment_ids), v.dtype)


def gdn2_jla_call(q, k, v, log_g, erase, write, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """``gdn2`` as jla's ``gdn2``, the same recurrence with its gates named g, b (erase) and w (write); a gate
    per head is spread over the key channels."""
    s0 = kernels.state_or_none(initial_state)
    g = jnp.broadcast_to(gate_layout(log_g, k.shape), k.shape).astype(jnp.float32)
    return kernels.JlaCall("gdn2", q, k, v, {"g": g, "b": erase, "w": write},
                           {"scale": scale, "initial_state": s0, "segment_ids": segment_ids, "use_qk_l2norm": False})


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _gdn2(q, k, v, log_g, erase, write, *, scale, initial_state, method, chunk_size, segment_ids):
    """``gdn2`` in one of lmzoo's own forms."""
    alpha, beta, written = gdn2_as_dplr(k, v, log_g, erase, write)
    out, state = _dplr(q, k, written, alpha, beta, log_g, scale=scale, initial_state=initial_state, method=method,
                       chunk_size=chunk_size, segment_ids=segment_ids)
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def gdn2_weights(q, k, log_g, erase, *, scale=None, segment_ids=None) -> jax.Array:
    """[B, H, T, S] float32: the weights ``gdn2`` applies to the *written* values ``write * v`` from a
    zero state (a write gate per value channel leaves no one matrix on v itself)."""
    return dplr_weights(q, k, *_erasing(k, log_g, erase), log_g, scale=scale, segment_ids=segment_ids)


def gdn2_as_dplr(k, v, log_g, erase, write):
    """GDN-2's inputs as ``dplr``'s (alpha, beta, v), float32."""
    return *_erasing(k, log_g, erase), write.astype(jnp.float32) * v.astype(jnp.float32)


def _erasing(k, log_g, erase):
    """GDN-2's erase as DPLR's low-rank pair: alpha = exp(g) * erase * k (the decayed state's read at
    erase * k), beta = -k (removed along k)."""
    k32 = k.astype(jnp.float32)
    return jnp.exp(gate_layout(log_g, k.shape).astype(jnp.float32)) * erase.astype(jnp.float32) * k32, -k32


def delta_as_dplr(k, beta, log_g=None, written=None):
    """The delta rule's (k, beta, log_g) as ``dplr``'s (k, alpha, beta), float32: the delta rule's
    step ``(I - beta k k^T) diag(exp(g)) S + beta k v^T`` is ``alpha = exp(g) * k``, ``beta -> -beta k``,
    ``k -> beta k`` (v, q and log_g unchanged). beta [B,T,H]; log_g None, [B,T,H] or [B,T,H,Dk].

    ``written`` [B,T,H,Dk] (default k): the key the step writes under where it differs from the one it erases
    along (the preconditioned delta rule's ``(I - beta w k^T) diag(exp(g)) S + beta w v^T``): ``beta -> -beta w``,
    ``k -> beta w``, alpha still ``exp(g) * k``."""
    k32, beta32 = k.astype(jnp.float32), beta.astype(jnp.float32)[..., None]
    w32 = k32 if written is None else written.astype(jnp.float32)
    decay = 1.0 if log_g is None else jnp.exp(gate_layout(log_g, k.shape).astype(jnp.float32))
    return beta32 * w32, decay * k32, -beta32 * w32


def _checked(k, alpha, beta, log_g, segment_ids):
    """alpha, beta and log_g [B,T,H,Dg] in float32, with every segment start's decay and read reset."""
    for name, x in (("alpha", alpha), ("beta", beta)):
        if x.shape != k.shape:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape} (the keys')")
    alpha, beta = alpha.astype(jnp.float32), beta.astype(jnp.float32)
    if segment_ids is None:
        g32 = jnp.zeros((*k.shape[:3], 1), jnp.float32) if log_g is None else gate_layout(log_g, k.shape)
        return alpha, beta, g32.astype(jnp.float32)
    alpha = jnp.where(segment_starts(segment_ids)[:, :, None, None], 0.0, alpha)  # no read of the last document
    return alpha, beta, reset_gates(log_g, segment_ids, k.shape)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k, alpha, beta [B,T,H,Dk], v [B,T,H,Dv], log_g [B,T,H,Dg], S0.


def _naive(q, k, v, alpha, beta, log_g, s0, chunk_size):
    def step(s, inputs):
        q_t, k_t, v_t, a_t, b_t, g_t = inputs  # (B, H, Dk) but v_t (B, H, Dv), g_t (B, H, Dg)
        read = jnp.einsum("bhd,bhde->bhe", a_t, s)  # alpha_t^T S_{t-1}, before the decay
        s = jnp.exp(g_t)[..., None] * s + b_t[..., :, None] * read[..., None, :] + k_t[..., :, None] * v_t[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = tuple(a.swapaxes(0, 1) for a in (q, k, v, alpha, beta, log_g))
    final, out = lax.scan(step, s0, steps)
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, alpha, beta, log_g, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    # (B, N, H, C, *); padded steps have k = alpha = beta = 0 and log_g = 0: they neither write, read nor decay
    q, k, v, alpha, beta, log_g = (jnp.swapaxes(to_chunks(a, size), 2, 3) for a in (q, k, v, alpha, beta, log_g))
    out, final = dplr_chunks(q, k, v, alpha, beta, log_g, s0)
    return from_chunks(jnp.swapaxes(out, 2, 3), length), final


def _parallel(q, k, v, alpha, beta, log_g, s0, chunk_size):
    """The whole sequence as one chunk: no recurrence."""
    return _chunk(q, k, v, alpha, beta, log_g, s0, q.shape[1])


class _ReadTerms(NamedTuple):
    """What a chunk's reads need, whatever state it starts from: ``Rd = W_s S_0 + W_v``."""

    reads_state: jax.Array  # W_s [..., C, Dk]
    reads_values: jax.Array  # [..., C, C]: W_v = reads_values @ V


def _read_terms(k, alpha, beta, log_g) -> _ReadTerms:
    """k, alpha, beta [..., C, Dk], log_g [..., C, Dg]: ``(I - R_<(alpha, beta))^{-1}`` applied to
    ``alpha exp(c)`` (the reads of S_0) and to ``R_<(alpha, k)`` (the reads of the chunk's values)."""
    solve = invert_unit_lower(jnp.eye(k.shape[-2])
                              - decayed_pairs(alpha, beta, log_g, diagonal=False, before_decay=True))
    before = jnp.exp(decay_before(log_g, axis=log_g.ndim - 2))
    reads_keys = decayed_pairs(alpha, k, log_g, diagonal=False, before_decay=True)
    return _ReadTerms(solve @ (alpha * before), solve @ reads_keys)


def dplr_chunks(q, k, v, alpha, beta, log_g, s0):
    """q, k, alpha, beta [B,N,H,C,Dk], v [B,N,H,C,Dv], log_g [B,N,H,C,Dg], s0 [B,H,Dk,Dv].

    Returns (o [B,N,H,C,Dv], S after the last chunk).
    """
    steps = log_g.ndim - 2
    terms = _read_terms(k, alpha, beta, log_g)
    reads_values = terms.reads_values @ v  # W_v (B, N, H, C, Dv)
    to_end = jnp.exp(decay_until_end(log_g, axis=steps))  # decay from each step to the chunk's end
    across = jnp.exp(jnp.sum(log_g, axis=steps))  # (B, N, H, Dg)

    def carry(s, chunk):  # S before a chunk -> S after it, and the chunk's reads
        w_s, w_v, beta_to_end, keys_to_end, values, decay = chunk
        reads = w_v + w_s @ s  # (B, H, C, Dv)
        after = (decay[..., None] * s + jnp.swapaxes(beta_to_end, -1, -2) @ reads
                 + jnp.swapaxes(keys_to_end, -1, -2) @ values)
        return after, (s, reads)

    chunks = (terms.reads_state, reads_values, beta * to_end, k * to_end, v, across)
    final, (starts, reads) = lax.scan(carry, s0, tuple(a.swapaxes(0, 1) for a in chunks))  # chunk axis first
    starts, reads = starts.swapaxes(0, 1), reads.swapaxes(0, 1)  # (B, N, H, Dk, Dv), (B, N, H, C, Dv)
    from_start = jnp.exp(decay_since(log_g, axis=steps))
    out = ((q * from_start) @ starts + decayed_pairs(q, beta, log_g, diagonal=True) @ reads
           + decayed_pairs(q, k, log_g, diagonal=True) @ v)
    return out, final


_FORMS = {"naive": _naive, "parallel": _parallel, "chunk": _chunk}
