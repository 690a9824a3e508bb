"""The momentum delta rule (Momentum DeltaNet): the delta rule's state moved by a decaying momentum of its
update, as gradient descent with momentum moves weights.

Per head and step, with per-head decays ``alpha_t = exp(log_alpha_t)`` of the state and ``mu_t =
exp(log_mu_t)`` of the momentum, a step size ``beta_t`` and a gradient scale ``eta_t``:

    M_t = mu_t M_{t-1} - eta_t k_t (v_t - S_{t-1}^T p_t)^T      the momentum of the delta rule's update
    S_t = alpha_t S_{t-1} - beta_t M_t
    o_t = scale * S_t^T q_t

The error reads the previous state through a prediction key p (the delta rule's own key where p = k),
before any decay. Both states are ``[Dk, Dv]`` per head (key dimension first); the op returns them as
``(S, M)`` and takes an initial pair. With mu = 0 and eta = 1 it is Comba's rule (``lmzoo.ops.comba``)
with the decay alpha and step size beta. The op neither normalises q, k, p nor squashes the gates.

Forms (``method``):

- ``"naive"``:    the recurrence written out, one step at a time -- the reference;
- ``"chunk"``:    a UT representation inside chunks of ``chunk_size`` steps, a short recurrence
  across them (derived below);
- ``"parallel"``: the same over the whole sequence as one chunk (no recurrence at all).

The UT representation. Write N = -M, so that ``N_t = mu_t N_{t-1} + k_t u_t^T`` with the value
written at step t ``u_t = eta_t (v_t - S_{t-1}^T p_t)``, and ``S_t = alpha_t S_{t-1} + beta_t N_t``.
Inside a chunk that starts from (S_0, N_0), with a_t, m_t the sums of log_alpha, log_mu from the
chunk's start, unrolling both gives

    N_t = exp(m_t) N_0 + sum_{j<=t} exp(m_t - m_j) k_j u_j^T
    S_t = exp(a_t) S_0 + c_t N_0 + sum_{j<=t} G_tj k_j u_j^T,

where ``G = D_a diag(beta) D_m`` (``D_a[t, i] = exp(a_t - a_i)`` for i <= t, D_m likewise: every
exponent <= 0) sums the paths by which the write at j reaches the state at t through the momentum,
and ``c = D_a (beta exp(m))`` the same for N_0. Putting S_{t-1} into u_t gives the unit
lower-triangular system

    (I + diag(eta) L) U = diag(eta) (V - (P exp(a_{t-1})) S_0 - (P c_{t-1}) N_0),
    L_tj = (p_t . k_j) G_{t-1, j}   for j < t,

so one triangular inverse gives ``U = W_v - W_s S_0 - W_n N_0``, and

    O   = scale * ((Q exp(a)) S_0 + (Q c) N_0 + (G * Q K^T) U)
    S_C = exp(a_C) S_0 + c_C N_0 + (G_C * K)^T U,        N_C = exp(m_C) N_0 + (K exp(m_C - m))^T U.

From zero states the weights on the values are ``A = scale (G * Q K^T) (I + diag(eta) L)^{-1}
diag(eta)`` (``momentum_delta_rule_weights``).

Documents (``segment_ids``): at a document's first step both decays forget everything
(``RESET_LOG_DECAY``) and p is zeroed, since the error reads the state before the decay, which still
holds the previous document. Decays, states and every product are float32 whatever the input dtype;
o has v's dtype.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import (
    Forms, check_form, from_chunks, gates_float32, same_segment, segment_starts, state_float32, to_chunks,
)
from lmzoo.ops.ut import decay_matrix, invert_unit_lower

METHODS = Forms("naive", "chunk", "parallel")
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def momentum_delta_rule(q, k, v, p, beta, eta, log_alpha, log_mu, *, scale=None, initial_state=None,
                        method="chunk", chunk_size=64, segment_ids=None):
    """q, k, p [B,T,H,Dk], v [B,T,H,Dv]; beta, eta, log_alpha, log_mu [B,T,H]; initial_state None or
    (S, M), each [B,H,Dk,Dv].

    Returns (o [B,T,H,Dv] in v's dtype, (S_T, M_T) float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    for name, x in (("q", q), ("p", p)):
        if x.shape != k.shape:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape}")
    for name, x in (("beta", beta), ("eta", eta), ("log_alpha", log_alpha), ("log_mu", log_mu)):
        if x.shape != k.shape[:3]:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape[:3]}")
    return _momentum_delta_rule(q, k, v, p, beta, eta, log_alpha, log_mu, scale=scale, initial_state=initial_state,
                                method=method, chunk_size=chunk_size, segment_ids=segment_ids)


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _momentum_delta_rule(q, k, v, p, beta, eta, log_alpha, log_mu, *, scale, initial_state, method, chunk_size,
                         segment_ids):
    batch, _, heads, d_key = k.shape
    shape = (batch, heads, d_key, v.shape[-1])
    s0, m0 = (None, None) if initial_state is None else initial_state
    s0, m0 = state_float32(s0, shape), state_float32(m0, shape)
    q32, k32, v32, p32, gates = inputs_float32(q, k, v, p, beta, eta, log_alpha, log_mu, segment_ids)
    out, (s, n) = _FORMS[method](q32 * scale, k32, v32, p32, *gates, s0, -m0, chunk_size)
    return out.astype(v.dtype), (s, -n)


@functools.partial(jax.jit, static_argnames=("scale",))
def momentum_delta_rule_weights(q, k, p, beta, eta, log_alpha, log_mu, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``momentum_delta_rule`` applies to v from
    zero states: ``scale (G * Q K^T) (I + diag(eta) L)^{-1} diag(eta)``; exactly 0 across segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, _, p, gates = inputs_float32(q, k, None, p, beta, eta, log_alpha, log_mu, segment_ids)
    q, k, p = (heads_first(a) for a in (q, k, p))  # (B, H, T, Dk)
    beta, eta, log_alpha, log_mu = (g.swapaxes(1, 2) for g in gates)  # (B, H, T)
    paths = momentum_paths(beta, log_alpha, log_mu)
    reads = paths.through * ((q * scale) @ jnp.swapaxes(k, -1, -2))
    weights = reads @ (invert_unit_lower(unit_lower(k, p, eta, paths)) * eta[..., None, :])
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


def inputs_float32(q, k, v, p, beta, eta, log_alpha, log_mu, segment_ids):
    """float32 q, k, v (or None), p and the gates (beta, eta, log_alpha, log_mu [B,T,H]); with documents, decays
    that forget at each document start and p zeroed there."""
    key_shape = k.shape
    log_alpha, log_mu = (gates_float32(g, segment_ids, key_shape)[..., 0] for g in (log_alpha, log_mu))
    p32 = p.astype(jnp.float32)
    if segment_ids is not None:
        p32 = jnp.where(segment_starts(segment_ids)[:, :, None, None], 0.0, p32)
    gates = (beta.astype(jnp.float32), eta.astype(jnp.float32), log_alpha, log_mu)
    return q.astype(jnp.float32), k.astype(jnp.float32), None if v is None else v.astype(jnp.float32), p32, gates


def heads_first(x):
    """[B, T, H, D] -> [B, H, T, D] (and [B, N, C, H, D] -> [B, N, H, C, D])."""
    return jnp.swapaxes(x, -3, -2)


class Paths(NamedTuple):
    """How the writes of a chunk reach its states, from per-step gates [..., C] (derived in the module's doc)."""

    through: jax.Array  # G [..., C, C]: the write at j into the state at t, through the momentum
    from_start: jax.Array  # c [..., C]: N_0 into S_t
    state_decay: jax.Array  # exp(a) [..., C]: S_0 into S_t
    momentum_decay: jax.Array  # D_m [..., C, C]: exp(m_i - m_j), j <= i


def momentum_paths(beta, log_alpha, log_mu) -> Paths:
    """``Paths`` of a chunk: beta, log_alpha, log_mu [..., C]."""
    state_decay = decay_matrix(log_alpha)  # D_a[t, i] = exp(a_t - a_i), i <= t
    momentum_decay = decay_matrix(log_mu)
    through = state_decay @ (beta[..., :, None] * momentum_decay)
    from_start = (state_decay @ (beta * jnp.exp(jnp.cumsum(log_mu, axis=-1)))[..., None])[..., 0]
    return Paths(through, from_start, jnp.exp(jnp.cumsum(log_alpha, axis=-1)), momentum_decay)


def shifted(x, axis: int, first: float = 0.0) -> jax.Array:
    """x one step later along ``axis``, ``first`` before it: step t holds x's step t - 1."""
    start = jnp.full_like(lax.slice_in_dim(x, 0, 1, axis=axis), first)
    return jnp.concatenate([start, lax.slice_in_dim(x, 0, x.shape[axis] - 1, axis=axis)], axis=axis)


def unit_lower(k, p, eta, paths: Paths) -> jax.Array:
    """``I + diag(eta) L`` [..., C, C] with ``L_tj = (p_t . k_j) G_{t-1, j}`` for j < t."""
    pairs = (p @ jnp.swapaxes(k, -1, -2)) * shifted(paths.through, axis=-2)
    return jnp.eye(k.shape[-2], dtype=k.dtype) + eta[..., :, None] * pairs


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k, p [B,T,H,Dk], v [B,T,H,Dv], beta, eta, log_alpha, log_mu [B,T,H],
# S0 and N0 = -M0 [B,H,Dk,Dv], and returns (o, (S, N)).


def _naive(q, k, v, p, beta, eta, log_alpha, log_mu, s0, n0, chunk_size):
    def step(states, inputs):
        s, n = states  # (B, H, Dk, Dv) each; n = -M
        q_t, k_t, v_t, p_t, beta_t, eta_t, la_t, lm_t = inputs  # (B, H, D) x4, (B, H) x4
        error = v_t - jnp.einsum("bhd,bhde->bhe", p_t, s)  # against the state before the decay
        n = jnp.exp(lm_t)[..., None, None] * n + (eta_t[..., None] * k_t)[..., :, None] * error[..., None, :]
        s = jnp.exp(la_t)[..., None, None] * s + beta_t[..., None, None] * n
        return (s, n), jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = (q, k, v, p, beta, eta, log_alpha, log_mu)
    final, out = lax.scan(step, (s0, n0), tuple(a.swapaxes(0, 1) for a in steps))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, p, beta, eta, log_alpha, log_mu, s0, n0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    # (B, N, H, C, *); padded steps have k = p = 0, beta = eta = 0, zero log decays: they neither write nor decay
    qc, kc, vc, pc = (heads_first(to_chunks(a, size)) for a in (q, k, v, p))
    beta, eta, log_alpha, log_mu = (to_chunks(g, size).swapaxes(2, 3) for g in (beta, eta, log_alpha, log_mu))
    paths = momentum_paths(beta, log_alpha, log_mu)
    inverse = invert_unit_lower(unit_lower(kc, pc, eta, paths)) * eta[..., None, :]  # (I + diag(eta) L)^-1 diag(eta)
    w_v = inverse @ vc
    w_s = inverse @ (pc * shifted(paths.state_decay, axis=-1, first=1.0)[..., None])  # S_{t-1} is S_0 at t = 0
    w_n = inverse @ (pc * shifted(paths.from_start, axis=-1)[..., None])
    last = paths.through[..., -1, :, None]  # (B, N, H, C, 1): G_C, each write into the chunk's last state
    momentum_to_end = paths.momentum_decay[..., -1, :, None]  # exp(m_C - m_j)

    def carry(states, chunk):  # (S, N) before a chunk -> after it, and what the chunk reads and writes
        s, n = states
        w_v, w_s, w_n, k, last, to_end, a_end, c_end, m_end = chunk
        u = w_v - w_s @ s - w_n @ n  # (B, H, C, Dv)
        s_next = a_end[..., None, None] * s + c_end[..., None, None] * n + jnp.swapaxes(k * last, -1, -2) @ u
        n_next = m_end[..., None, None] * n + jnp.swapaxes(k * to_end, -1, -2) @ u
        return (s_next, n_next), (s, n, u)

    ends = (paths.state_decay[..., -1], paths.from_start[..., -1], jnp.exp(jnp.sum(log_mu, axis=-1)))
    chunks = tuple(a.swapaxes(0, 1) for a in (w_v, w_s, w_n, kc, last, momentum_to_end, *ends))
    final, (s_starts, n_starts, u) = lax.scan(carry, (s0, n0), chunks)
    s_starts, n_starts, u = (a.swapaxes(0, 1) for a in (s_starts, n_starts, u))
    reads = paths.through * (qc @ jnp.swapaxes(kc, -1, -2))
    out = ((qc * paths.state_decay[..., None]) @ s_starts + (qc * paths.from_start[..., None]) @ n_starts
           + reads @ u)
    return from_chunks(heads_first(out), length), final


def _parallel(q, k, v, p, beta, eta, log_alpha, log_mu, s0, n0, chunk_size):
    """The whole sequence as one chunk: the UT representation with no recurrence."""
    return _chunk(q, k, v, p, beta, eta, log_alpha, log_mu, s0, n0, q.shape[1])


_FORMS = {"naive": _naive, "chunk": _chunk, "parallel": _parallel}
