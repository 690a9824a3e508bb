"""MesaNet's layer (von Oswald et al., 2025): at every step, the output of the ridge regression of the values on
the keys seen so far, solved in context by conjugate gradients with a fixed number of steps.

Per head and step, two decayed sums (``g_t = exp(log_g_t)`` one per head, beta_t a step size):

    H_t = g_t H_{t-1} + beta_t k_t k_t^T        [Dk, Dk]: the keys' (decayed) second moment
    G_t = g_t G_{t-1} + beta_t k_t v_t^T        [Dk, Dv]: keys against values
    x_t ~ (H_t + diag(lamb))^{-1} q_t           ``cg_steps`` conjugate-gradient steps from x = 0
    o_t = scale * G_t^T x_t

``lamb`` [H, Dk] > 0 is the ridge penalty (it keeps the system positive definite). Conjugate gradients
follow the textbook recurrence from x = 0 with 1e-5 added to both of its denominators (so a converged
residual of zero divides safely), the same fixed count in every form, so the forms agree to rounding and
decoding equals the forward. The states are ``(H, G)``. ``scale`` defaults to 1: the solve already
normalises the query by the keys' second moment.

Forms (``method``):

- ``"naive"``:    both sums step by step, each step's system solved on its own -- the reference;
- ``"chunk"``:    the sums at each chunk's start by a short recurrence across chunks, and every step's
  product ``(H_t + diag(lamb)) p = (p exp(b_t)) H_0 + sum_{j<=t} beta_j exp(b_t - b_j) (p . k_j) k_j + lamb p``
  as matmuls inside its chunk (b the log decay since the chunk's start), so conjugate gradients run on
  every step of the sequence at once; the read-out is GLA's with x in place of the query;
- ``"parallel"``: the same with the whole sequence as one chunk.

With zero initial states the layer's effective weights on the values exist: ``A_tj = scale beta_j
exp(b_t - b_j) (x_t . k_j)`` (``mesa_net_weights``); x_t depends on q and the keys only. Documents
(``segment_ids``): both sums forget everything at a document's first step (``RESET_LOG_DECAY``).
Everything runs in float32; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import (
    Forms, check_form, from_chunks, gates_float32, same_segment, state_float32, to_chunks,
)
from lmzoo.ops.ut import decay_matrix

METHODS = Forms("naive", "chunk", "parallel")
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form
GUARD = 1e-5  # added to conjugate gradients' denominators


def mesa_net(q, k, v, beta, log_g, lamb, *, cg_steps=30, scale=None, initial_state=None, method="chunk",
             chunk_size=64, segment_ids=None):
    """q, k [B,T,H,Dk], v [B,T,H,Dv], beta, log_g [B,T,H], lamb [H,Dk] (> 0); initial_state None or
    (H [B,H,Dk,Dk] symmetric, G [B,H,Dk,Dv]).

    Returns (o [B,T,H,Dv] in v's dtype, (H_T, G_T) float32).
    """
    method = check_form(method, METHODS, chunk_size)
    if cg_steps < 1:
        raise ValueError(f"cg_steps={cg_steps} must be positive")
    if q.shape != k.shape:
        raise ValueError(f"q has shape {q.shape}; expected {k.shape}")
    for name, x in (("beta", beta), ("log_g", log_g)):
        if x.shape != k.shape[:3]:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape[:3]}")
    if lamb.shape != (k.shape[2], k.shape[3]):
        raise ValueError(f"lamb has shape {lamb.shape}; expected {(k.shape[2], k.shape[3])}")
    return _mesa_net(q, k, v, beta, log_g, lamb, cg_steps=cg_steps, scale=1.0 if scale is None else scale,
                     initial_state=initial_state, method=method, chunk_size=chunk_size, segment_ids=segment_ids)


@functools.partial(jax.jit, static_argnames=("cg_steps", "scale", "method", "chunk_size"))
def _mesa_net(q, k, v, beta, log_g, lamb, *, cg_steps, scale, initial_state, method, chunk_size, segment_ids):
    batch, _, heads, d_key = k.shape
    h0, g0 = (None, None) if initial_state is None else initial_state
    h0 = state_float32(h0, (batch, heads, d_key, d_key))
    g0 = state_float32(g0, (batch, heads, d_key, v.shape[-1]))
    log_g = gates_float32(log_g, segment_ids, k.shape)[..., 0]
    q, k, v, beta, lamb = (x.astype(jnp.float32) for x in (q, k, v, beta, lamb))
    out, states = _FORMS[method](q, k, v, beta, log_g, lamb, h0, g0, cg_steps, chunk_size)
    return (scale * out).astype(v.dtype), states


@functools.partial(jax.jit, static_argnames=("cg_steps", "scale"))
def mesa_net_weights(q, k, beta, log_g, lamb, *, cg_steps=30, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``mesa_net`` applies to v from zero states:
    ``scale beta_j exp(b_t - b_j) (x_t . k_j)``, x_t the step's solve; exactly 0 across segments."""
    scale = 1.0 if scale is None else scale
    log_g = gates_float32(log_g, segment_ids, k.shape)[..., 0]
    q, k, beta, lamb = (x.astype(jnp.float32) for x in (q, k, beta, lamb))
    q, k = (jnp.swapaxes(x, 1, 2) for x in (q, k))  # (B, H, T, Dk)
    beta, log_g = beta.swapaxes(1, 2), log_g.swapaxes(1, 2)  # (B, H, T)
    pairs = decay_matrix(log_g) * beta[..., None, :]  # (B, H, T, S)
    zero = jnp.zeros(q.shape[:2] + (q.shape[-1],) * 2, jnp.float32)
    x = conjugate_gradients(lambda p: chunk_product(p, k, pairs, jnp.exp(jnp.cumsum(log_g, -1)), zero, lamb[:, None]),
                            q, cg_steps)
    weights = scale * pairs * (x @ jnp.swapaxes(k, -1, -2))
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


def conjugate_gradients(product, rhs, steps: int) -> jax.Array:
    """x ~ A^{-1} rhs [..., D] after ``steps`` steps of conjugate gradients from x = 0, A symmetric positive
    definite given by ``product(p) = A p``; every system along the leading axes at once."""
    def step(carry, _):
        x, r, p, size = carry  # size: |r|^2
        ap = product(p)
        alpha = size / (jnp.sum(p * ap, axis=-1) + GUARD)
        x, r = x + alpha[..., None] * p, r - alpha[..., None] * ap
        new_size = jnp.sum(r * r, axis=-1)
        p = r + (new_size / (size + GUARD))[..., None] * p
        return (x, r, p, new_size), None

    start = (jnp.zeros_like(rhs), rhs, rhs, jnp.sum(rhs * rhs, axis=-1))
    return lax.scan(step, start, None, length=steps)[0][0]


def chunk_product(p, k, pairs, from_start, h0, lamb) -> jax.Array:
    """``(H_t + diag(lamb)) p_t`` for every step of a chunk: p, k [..., C, Dk], pairs [..., C, C] (beta_j exp(b_t -
    b_j), j <= t), from_start exp(b) [..., C], h0 the sum H before the chunk [..., Dk, Dk], lamb [..., 1, Dk]."""
    return (p * from_start[..., None]) @ h0 + ((p @ jnp.swapaxes(k, -1, -2)) * pairs) @ k + lamb * p


# ----------------------------------------------------------------------------- forms
# Each takes float32 q, k [B,T,H,Dk], v [B,T,H,Dv], beta, log_g [B,T,H], lamb [H,Dk], H0, G0 and returns
# (o unscaled, (H, G)).


def _naive(q, k, v, beta, log_g, lamb, h0, g0, cg_steps, chunk_size):
    def step(states, inputs):
        h, g = states  # (B, H, Dk, Dk), (B, H, Dk, Dv)
        q_t, k_t, v_t, beta_t, log_g_t = inputs  # (B, H, Dk) x2, (B, H, Dv), (B, H) x2
        decay, written = jnp.exp(log_g_t)[..., None, None], beta_t[..., None] * k_t
        h = decay * h + written[..., :, None] * k_t[..., None, :]
        g = decay * g + written[..., :, None] * v_t[..., None, :]
        x = conjugate_gradients(lambda p: jnp.einsum("bhd,bhde->bhe", p, h) + lamb * p, q_t, cg_steps)
        return (h, g), jnp.einsum("bhd,bhde->bhe", x, g)

    final, out = lax.scan(step, (h0, g0), tuple(a.swapaxes(0, 1) for a in (q, k, v, beta, log_g)))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, beta, log_g, lamb, h0, g0, cg_steps, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    # (B, N, H, C, *); padded steps have k = 0, beta = 0, log_g = 0: they neither write nor decay
    qc, kc, vc = (jnp.swapaxes(to_chunks(a, size), 2, 3) for a in (q, k, v))
    beta, log_g = (to_chunks(a, size).swapaxes(2, 3) for a in (beta, log_g))  # (B, N, H, C)
    pairs = decay_matrix(log_g) * beta[..., None, :]  # beta_j exp(b_t - b_j), j <= t
    from_start = jnp.exp(jnp.cumsum(log_g, axis=-1))
    written = kc * pairs[..., -1, :, None]  # each step's key, weighted and decayed to the chunk's end

    def carry(states, chunk):  # (H, G) before a chunk -> after it
        h, g = states
        k, v, w, across = chunk
        return (across[..., None, None] * h + jnp.swapaxes(w, -1, -2) @ k,
                across[..., None, None] * g + jnp.swapaxes(w, -1, -2) @ v), states

    across = from_start[..., -1]
    final, (h_starts, g_starts) = lax.scan(carry, (h0, g0), tuple(a.swapaxes(0, 1) for a in (kc, vc, written, across)))
    h_starts, g_starts = h_starts.swapaxes(0, 1), g_starts.swapaxes(0, 1)  # (B, N, H, Dk, D*)
    lamb = lamb[:, None]  # (H, 1, Dk)
    x = conjugate_gradients(lambda p: chunk_product(p, kc, pairs, from_start, h_starts, lamb), qc, cg_steps)
    out = (x * from_start[..., None]) @ g_starts + ((x @ jnp.swapaxes(kc, -1, -2)) * pairs) @ vc
    return from_chunks(jnp.swapaxes(out, 2, 3), length), final


def _parallel(q, k, v, beta, log_g, lamb, h0, g0, cg_steps, chunk_size):
    """The whole sequence as one chunk."""
    return _chunk(q, k, v, beta, log_g, lamb, h0, g0, cg_steps, q.shape[1])


_FORMS = {"naive": _naive, "chunk": _chunk, "parallel": _parallel}
