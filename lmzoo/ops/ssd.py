"""Mamba-2's state-space duality (SSD): a scalar decay per head makes the scan a masked matmul.

    h_t = exp(dt_t A) h_t-1 + dt_t x_t B_t^T  ([P, N] per head)        y_t = h_t C_t + D x_t

Because the decay is one number per head and step, the output is an attention-like product
``y_i = Σ_j (C_i · B_j) exp(cum_i - cum_j) dt_j x_j`` with a masked decay matrix. ``method``:
- "scan":  ``lax.scan`` over time (the reference);
- "chunk": within chunks of ``chunk_size`` tokens that product is computed as matmuls with the
  decay matrix built in log space; each chunk also summarises its effect on the state at its
  end, and those states are passed recurrently across chunks and read back by every position;
- "pallas": SSD is simple GLA with q = C, k = B, v = dt x and the log gate dt A (its state the
  transpose of h), so this runs ``lmzoo.ops.pallas.gla``'s one-gate-per-head kernels.

Axes: B batch, T time, H heads, P head size, G groups sharing B and C (head h reads group
h // (H / G)), N state size. Computed in float32; ``y`` comes back in ``x``'s dtype and the
state ``[B, H, P, N]`` in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.pallas.gla import gla_pallas

METHODS = ("scan", "chunk", "pallas")


def per_head(x: jax.Array, heads: int) -> jax.Array:
    """B or C ``[B,T,G,N]`` as ``[B,T,H,N]`` float32."""
    groups = x.shape[2]
    if heads % groups:
        raise ValueError(f"B/C have {groups} groups, which does not divide the {heads} heads")
    return jnp.repeat(x.astype(jnp.float32), heads // groups, axis=2)


def ssd(x, dt, A, B, C, *, D=None, initial_state=None, chunk_size=64, method="chunk"):
    """x ``[B,T,H,P]``; dt ``[B,T,H]`` (positive); A ``[H]`` (negative); B, C ``[B,T,G,N]``; D ``[H]``.

    Returns ``(y [B,T,H,P], final_state [B,H,P,N] float32)``; ``initial_state`` is ``[B,H,P,N]``.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be positive")
    batch, _, heads, p = x.shape
    x32, dt = x.astype(jnp.float32), dt.astype(jnp.float32)
    log_a = dt * A.astype(jnp.float32)  # (B, T, H)
    b, c = per_head(B, heads), per_head(C, heads)
    h0 = jnp.zeros((batch, heads, p, b.shape[-1]), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    form = {"scan": _scan, "chunk": _chunked, "pallas": _pallas}[method]
    y, h = form(dt[..., None] * x32, log_a, b, c, h0, chunk_size)
    if D is not None:
        y = y + D.astype(jnp.float32)[:, None] * x32
    return y.astype(x.dtype), h


def _scan(x, log_a, b, c, h0, chunk_size):
    def step(h, inputs):
        x_t, log_a_t, b_t, c_t = inputs  # (B, H, P), (B, H), (B, H, N), (B, H, N)
        h = jnp.exp(log_a_t)[..., None, None] * h + x_t[..., None] * b_t[:, :, None, :]
        return h, jnp.einsum("bhpn,bhn->bhp", h, c_t)

    h, y = lax.scan(step, h0, tuple(a.swapaxes(0, 1) for a in (x, log_a, b, c)))
    return y.swapaxes(0, 1), h


def _pallas(x, log_a, b, c, h0, chunk_size):
    y, state = gla_pallas(c, b, x, log_a[..., None], h0.swapaxes(-1, -2), chunk_size=chunk_size)
    return y, state.swapaxes(-1, -2)


def _chunked(x, log_a, b, c, h0, chunk_size):
    batch, length = x.shape[:2]
    pad = -length % chunk_size  # padded steps: dt = 0, so decay 1 and no input
    chunks = length // chunk_size + (pad > 0)

    def to_chunks(a):  # (B, T, ...) -> (B, chunks, L, ...)
        a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
        return a.reshape(batch, chunks, chunk_size, *a.shape[2:])

    x, log_a, b, c = map(to_chunks, (x, log_a, b, c))
    cum = jnp.cumsum(log_a, axis=2)  # (B, c, L, H) log decay from the chunk's start

    # 1. Within each chunk: an attention with the masked decay matrix.
    causal = jnp.tril(jnp.ones((chunk_size, chunk_size), bool))[:, :, None]
    pair = jnp.where(causal, cum[:, :, :, None] - cum[:, :, None, :], -jnp.inf)  # (B, c, L_t, L_s, H)
    scores = jnp.einsum("bcthn,bcshn->bctsh", c, b) * jnp.exp(pair)
    y = jnp.einsum("bctsh,bcshp->bcthp", scores, x)

    # 2. What each chunk adds to the state at its end.
    to_end = jnp.exp(cum[:, :, -1:] - cum)  # (B, c, L, H)
    added = jnp.einsum("bclhn,bclh,bclhp->bchpn", b, to_end, x)  # (B, c, H, P, N)

    # 3. States passed across chunks: the state entering chunk k, and the final one.
    def carry(h, inputs):
        decay, new = inputs  # (B, H), (B, H, P, N)
        return decay[..., None, None] * h + new, h

    h, entering = lax.scan(carry, h0, (jnp.exp(cum[:, :, -1]).swapaxes(0, 1), added.swapaxes(0, 1)))

    # 4. Every position reads the state that entered its chunk, decayed up to it.
    y = y + jnp.einsum("bclhn,bchpn,bclh->bclhp", c, entering.swapaxes(0, 1), jnp.exp(cum))
    return y.reshape(batch, chunks * chunk_size, *y.shape[3:])[:, :length], h


def ssd_attention(dt, A, B, C) -> jax.Array:
    """The causal weights ``[B,H,T,T]`` with ``y_i = Σ_j α_ij x_j`` per head (before the D skip).

    ``α_ij[h] = (C_i · B_j) exp(Σ_{j<m≤i} dt_m A_h) dt_j`` for j ≤ i, zero above.
    """
    heads, length = dt.shape[-1], dt.shape[1]
    dt = dt.astype(jnp.float32)
    cum = jnp.cumsum(dt * A.astype(jnp.float32), axis=1)  # (B, T, H)
    causal = jnp.tril(jnp.ones((length, length), bool))
    pair = jnp.where(causal, cum.swapaxes(1, 2)[..., :, None] - cum.swapaxes(1, 2)[..., None, :], -jnp.inf)  # (B, H, T_i, T_j)
    scores = jnp.einsum("bihn,bjhn->bhij", per_head(C, heads), per_head(B, heads))
    return scores * jnp.exp(pair) * dt.swapaxes(1, 2)[:, :, None, :]
