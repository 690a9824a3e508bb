"""Mamba-2's state-space duality (SSD): a scalar decay per head makes the scan a masked matmul.

    h_t = exp(dt_t A) h_t-1 + dt_t x_t B_t^T  ([P, N] per head)        y_t = h_t C_t + D x_t

That is gated linear attention with one gate per head (``lmzoo.ops.gated.gla``): q = C, k = B,
v = dt x, log_g = dt A, scale 1, and h the transpose of GLA's state ``[N, P]``. The op maps its
arguments onto it, so it has GLA's forms except the per-dimension ones (``method``):
- "naive":  the recurrence above written out step by step in SSD's own terms (the reference; it
  does not go through GLA, so it also checks the mapping);
- "scan":   GLA's ``lax.scan`` over time;
- "chunk":  GLA's chunk form, whose one-gate-per-head path is the [C, C] decay matrix per chunk;
- "pallas": GLA's Pallas kernels (one gate per head);
- "jla", "auto": jax-linear-attention's ``simple_gla`` on the same mapping, inputs in x's dtype
  (``lmzoo.ops.kernels``); ``auto`` runs "chunk" where jla's Hopper kernel does not take the call (on a TPU:
  deltanet-tpu's kernels, the same ``simple_gla`` as a case of GDN-2, where they take it).

Documents: with ``segment_ids [B,T]`` the state restarts at each document start: the op adds
``RESET_LOG_DECAY`` to the log decay ``dt A`` there (exp(-40): nothing of the old state survives in
float32, and every sum of log decays stays finite), in every form, before the mapping onto GLA, so it
needs nothing of GLA beyond its gates. ``ssd_attention`` zeroes the weights between documents.

Axes: B batch, T time, H heads, P head size, G groups sharing B and C (head h reads group
h // (H / G)), N state size. Computed in float32; ``y`` comes back in ``x``'s dtype and the
state ``[B, H, P, N]`` in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import RESET_LOG_DECAY, Forms, check_form, same_segment, segment_starts
from lmzoo.ops.gated import gla_form, gla_weights
from lmzoo.ops.kernels import PROVIDER_FORMS

METHODS = Forms("naive", "scan", "chunk", "chunk_recompute", "pallas", *PROVIDER_FORMS)
BEST = "chunk"  # the form ``auto`` runs where jla's kernel does not
STEP_FORM = "scan"  # the form mixers decode one token with (their ``step``): GLA's state update alone, no chunk padding


def per_head(x: jax.Array, heads: int, dtype=jnp.float32) -> jax.Array:
    """B or C ``[B,T,G,N]`` as ``[B,T,H,N]`` in ``dtype``."""
    groups = x.shape[2]
    if heads % groups:
        raise ValueError(f"B/C have {groups} groups, which does not divide the {heads} heads")
    return jnp.repeat(x.astype(dtype), heads // groups, axis=2)


def ssd(x, dt, A, B, C, *, D=None, initial_state=None, method="chunk", chunk_size=64, segment_ids=None):
    """x ``[B,T,H,P]``; dt ``[B,T,H]`` (positive); A ``[H]`` (negative); B, C ``[B,T,G,N]``; D ``[H]``.

    Returns ``(y [B,T,H,P], final_state [B,H,P,N] float32)``; ``initial_state`` is ``[B,H,P,N]``;
    ``segment_ids [B,T]`` (int) restart the state at every document start.
    """
    method = check_form(method, METHODS, chunk_size)
    form, mapped = kernels.resolve("ssd", method, BEST, lambda: jla_call(x, dt, A, B, C, initial_state, segment_ids))
    if mapped is None:
        return _ssd(x, dt, A, B, C, D=D, initial_state=initial_state, method=form, chunk_size=chunk_size,
                    segment_ids=segment_ids)
    y, state = kernels.run(mapped)
    if D is not None:
        y = y.astype(jnp.float32) + D.astype(jnp.float32)[:, None] * x.astype(jnp.float32)
    return y.astype(x.dtype), state.swapaxes(-1, -2)


def jla_call(x, dt, A, B, C, initial_state, segment_ids) -> kernels.JlaCall:
    """SSD as jla's ``simple_gla``: q = C, k = B (per head), v = dt x in x's dtype, g = dt A, scale 1;
    the state is jla's [N, P] per head."""
    heads = x.shape[2]
    c, b = per_head(C, heads, C.dtype), per_head(B, heads, B.dtype)
    dt32 = dt.astype(jnp.float32)
    v = (dt32[..., None] * x.astype(jnp.float32)).astype(x.dtype)
    s0 = None if initial_state is None else initial_state.astype(jnp.float32).swapaxes(-1, -2)
    options = {"scale": 1.0, "initial_state": s0, "segment_ids": segment_ids}
    return kernels.JlaCall("simple_gla", c, b, v, {"g": dt32 * A.astype(jnp.float32)}, options)


@functools.partial(jax.jit, static_argnames=("method", "chunk_size"))
def _ssd(x, dt, A, B, C, *, D, initial_state, method, chunk_size, segment_ids):
    """``ssd`` in one of lmzoo's own forms."""
    batch, _, heads, p = x.shape
    x32, dt = x.astype(jnp.float32), dt.astype(jnp.float32)
    b, c = per_head(B, heads), per_head(C, heads)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, p, b.shape[-1]), jnp.float32)
    h0 = initial_state.astype(jnp.float32)
    log_a = dt * A.astype(jnp.float32)  # (B, T, H)
    if segment_ids is not None:  # forget the state where a document starts
        log_a = log_a + jnp.where(segment_starts(segment_ids), RESET_LOG_DECAY, 0.0)[..., None]
    if method == "naive":
        y, h = _naive(dt[..., None] * x32, log_a, b, c, h0)
    else:
        y, state = gla_form(c, b, dt[..., None] * x32, log_a, scale=1.0, initial_state=h0.swapaxes(-1, -2),
                        method=method, chunk_size=chunk_size, segment_ids=None)
        h = state.swapaxes(-1, -2)  # GLA's [N, P] -> SSD's [P, N]
    if D is not None:
        y = y + D.astype(jnp.float32)[:, None] * x32
    return y.astype(x.dtype), h


def _naive(x, log_a, b, c, h0):
    """x = dt x ``[B,T,H,P]``, log_a ``[B,T,H]``, b, c ``[B,T,H,N]``: the recurrence, one step at a time."""

    def step(h, inputs):
        x_t, log_a_t, b_t, c_t = inputs  # (B, H, P), (B, H), (B, H, N), (B, H, N)
        h = jnp.exp(log_a_t)[..., None, None] * h + x_t[..., None] * b_t[:, :, None, :]  # (B, H, P, N)
        return h, jnp.sum(h * c_t[:, :, None, :], axis=-1)

    h, y = lax.scan(step, h0, tuple(a.swapaxes(0, 1) for a in (x, log_a, b, c)))
    return y.swapaxes(0, 1), h


@jax.jit
def ssd_attention(dt, A, B, C, *, segment_ids=None) -> jax.Array:
    """The causal weights ``[B,H,T,T]`` with ``y_i = Σ_j α_ij x_j`` per head (before the D skip).

    ``α_ij[h] = (C_i · B_j) exp(Σ_{j<m≤i} dt_m A_h) dt_j`` for j ≤ i, zero above: GLA's weights
    with q = C, k = B and log_g = dt A, times dt_j (which v = dt x carries in the op). With
    ``segment_ids`` the weights between two documents are zero.
    """
    heads = dt.shape[-1]
    dt = dt.astype(jnp.float32)
    weights = gla_weights(per_head(C, heads), per_head(B, heads), dt * A.astype(jnp.float32), scale=1.0)
    weights = weights * dt.swapaxes(1, 2)[:, :, None, :]
    if segment_ids is not None:
        weights = jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)
    return weights
