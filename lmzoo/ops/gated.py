"""Gated linear attention: ``S_t = diag(exp(log_g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t``.

``log_g <= 0`` is the log of a forget gate. It is either per key dimension, ``[B, T, H, Dk]`` (GLA,
Yang et al. 2023), or one scalar per head and step, ``[B, T, H, 1]`` or ``[B, T, H]`` (simple GLA;
RetNet when it is a constant ``log(gamma_h)``). The scalar case is a broadcast of the same op; its
parallel and chunk forms use a [T, T] decay matrix where the per-dimension case needs more.

Key j reaches query i >= j with weight ``scale * sum_d q_id k_jd exp(L_ijd)``, where
``L_ij = sum_{j<m<=i} log_g_m`` is the log decay between them. Forms (``method``):

- ``"parallel"``: those weights materialised, ``L`` as masked segment sums -- the reference
  (per dimension it holds a [T, T, Dk] tensor: a reference, not a fast path);
- ``"scan"``:     ``lax.scan`` over time;
- ``"assoc"``:    ``lax.associative_scan`` on (log decay, update) pairs with the operator
  ``(a1, U1) . (a2, U2) = (a1 + a2, exp(a2) U1 + U2)``;
- ``"chunk"``:    within a chunk, matmuls on gates taken relative to a reference step (see
  ``_within_chunks``); across chunks a ``lax.scan`` carries S;
- ``"pallas"``:   the chunk form as Pallas kernels with a custom VJP (``lmzoo.ops.pallas.gla``):
  compiled on a GPU or TPU, interpret mode on a CPU. q, k, v enter the kernels in their own
  dtype (bfloat16 matmuls on the tensor cores), gates and states in float32.

Log decays are always summed over exactly the steps between the two ends, from a nearby reference
point, never as the difference of two long running sums: such a difference loses precision as the
sums grow, and exp(-L_j) alone overflows once a chunk decays by more than ~88 nats. Every exponent
taken is <= 0. Gates, decays and states are float32 whatever the input dtype. Like
``linear_attention``, the op is jitted with its options static.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.linear import causal, check_method, from_chunks, to_chunks
from lmzoo.ops.pallas.gla import gla_pallas

METHODS = ("parallel", "scan", "assoc", "chunk", "pallas")


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def gla(q, k, v, log_g, *, scale=None, initial_state=None, method="chunk", chunk_size=64):
    """Gated linear attention. q, k [B,T,H,Dk], v [B,T,H,Dv], log_g [B,T,H,Dk | 1] or [B,T,H].

    Returns (o [B, T, H, Dv] in v's dtype, S_T [B, H, Dk, Dv] float32).
    """
    check_method(method, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    log_g = _gate_layout(log_g, k.shape)
    batch, _, heads, d_key = k.shape
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, d_key, v.shape[-1]), jnp.float32)
    s0, g32 = initial_state.astype(jnp.float32), log_g.astype(jnp.float32)
    if method == "pallas":
        q_scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
        out, state = gla_pallas(q_scaled, k, v, g32, s0, chunk_size=chunk_size)
    else:
        q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
        out, state = _FORMS[method](q32 * scale, k32, v32, g32, s0, chunk_size)
    return out.astype(v.dtype), state


def _gate_layout(log_g, key_shape) -> jax.Array:
    """log_g as [B, T, H, Dg] with Dg = Dk (per dimension) or 1 (per head)."""
    if log_g.ndim == 3:
        log_g = log_g[..., None]
    if log_g.shape[:3] != key_shape[:3] or log_g.shape[-1] not in (1, key_shape[-1]):
        raise ValueError(f"log_g has shape {log_g.shape}; expected {key_shape[:3]} + ({key_shape[-1]},) or (1,) or ()")
    return log_g


def decay_since(log_g, axis: int) -> jax.Array:
    """Inclusive cumulative log decay along ``axis``: sum_{m<=t} log_g_m."""
    return jnp.cumsum(log_g, axis=axis)


def decay_until_end(log_g, axis: int) -> jax.Array:
    """Exclusive reverse cumulative log decay along ``axis``: sum_{m>t} log_g_m (0 at the last step)."""
    after = lax.cumsum(log_g, axis=axis, reverse=True)  # sum_{m>=t}
    later = lax.slice_in_dim(after, 1, None, axis=axis)  # sum_{m>t} for every step but the last
    return jnp.concatenate([later, jnp.zeros_like(lax.slice_in_dim(after, 0, 1, axis=axis))], axis=axis)


def segment_sums(log_g) -> jax.Array:
    """[..., T, H, Dg] -> [..., T(i), T(j), H, Dg]: ``sum_{j<m<=i} log_g_m`` for j <= i, -inf above.

    Built row by row (row i = row i-1 + log_g_i on the columns j < i), so each entry sums only its
    own steps; a cumulative sum along i would do the same in log T passes over the [T, T] array.
    """
    t = log_g.shape[-3]
    steps = jnp.moveaxis(log_g, -3, 0)  # (T, ..., H, Dg)
    columns = jnp.arange(t)[:, None, None]  # j, against (T(j), H, Dg)

    def next_row(row, step):
        i, log_g_i = step
        row = row + jnp.where(columns < i, log_g_i[..., None, :, :], 0.0)
        return row, row

    first = jnp.zeros(steps.shape[1:-2] + (t,) + steps.shape[-2:], log_g.dtype)  # (..., T(j), H, Dg)
    _, rows = lax.scan(next_row, first, (jnp.arange(t), steps))  # (T(i), ..., T(j), H, Dg)
    sums = jnp.moveaxis(rows, 0, -4)
    return jnp.where(causal(t)[:, :, None, None], sums, -jnp.inf)


def decayed_scores(q, k, log_g) -> jax.Array:
    """[..., H, T, T] causal weights ``sum_d q_id k_jd exp(L_ijd)``; q, k [..., T, H, Dk], log_g [..., T, H, Dg]."""
    decay = jnp.exp(segment_sums(log_g))  # (..., T, T, H, Dg), 0 above the diagonal
    if log_g.shape[-1] == 1:  # one decay per head: a [T, T] matrix times the plain scores
        return jnp.einsum("...ihd,...jhd,...ijh->...hij", q, k, decay[..., 0])
    return jnp.einsum("...jhd,...ijhd->...hij", k, q[..., :, None, :, :] * decay)  # XLA's CPU dot likes this order


@functools.partial(jax.jit, static_argnames=("scale",))
def gla_weights(q, k, log_g, *, scale=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 of ``gla`` (no initial state):
    ``scale * (q_i * prod_{j<m<=i} g_m) . k_j`` for j <= i."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    log_g = _gate_layout(log_g, k.shape).astype(jnp.float32)
    return decayed_scores(q.astype(jnp.float32) * scale, k.astype(jnp.float32), log_g)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,H,Dv], log_g [B,T,H,Dg], S0 [B,H,Dk,Dv].


def _parallel(q, k, v, log_g, s0, chunk_size):
    out = jnp.einsum("bhts,bshe->bthe", decayed_scores(q, k, log_g), v)
    out = out + jnp.einsum("bthd,bhde->bthe", q * jnp.exp(decay_since(log_g, axis=1)), s0)
    to_end = jnp.exp(decay_until_end(log_g, axis=1))  # (B, T, H, Dg) decay from each step to the last
    final = jnp.exp(jnp.sum(log_g, axis=1))[..., None] * s0 + jnp.einsum("bthd,bthe->bhde", k * to_end, v)
    return out, final


def _scan(q, k, v, log_g, s0, chunk_size):
    def step(s, inputs):
        q_t, k_t, v_t, g_t = inputs  # (B, H, D) each; g_t (B, H, Dg)
        s = jnp.exp(g_t)[..., None] * s + k_t[..., :, None] * v_t[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in (q, k, v, log_g)))
    return out.swapaxes(0, 1), final


def _assoc(q, k, v, log_g, s0, chunk_size):
    log_decay = log_g.swapaxes(0, 1)  # (T, B, H, Dg)
    updates = jnp.einsum("bthd,bthe->tbhde", k, v)  # (T, B, H, Dk, Dv)
    updates = updates.at[0].add(jnp.exp(log_decay[0])[..., None] * s0)

    def combine(earlier, later):
        (a1, u1), (a2, u2) = earlier, later
        return a1 + a2, jnp.exp(a2)[..., None] * u1 + u2

    _, states = lax.associative_scan(combine, (log_decay, updates))  # S_t for every t
    return jnp.einsum("bthd,tbhde->bthe", q, states), states[-1]


def _chunk(q, k, v, log_g, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    qc, kc, vc, gc = (to_chunks(a, size) for a in (q, k, v, log_g))  # (B, N, C, H, *); padding: g = 1, k = 0
    within = _within_chunks(qc, kc, vc, gc)
    added = jnp.einsum("bnchd,bnche->nbhde", kc * jnp.exp(decay_until_end(gc, axis=2)), vc)  # (N, B, H, Dk, Dv)

    def carry(s, chunk):  # S after the chunk from S before it
        log_decay, update = chunk
        return jnp.exp(log_decay)[..., None] * s + update, s

    total = jnp.sum(gc, axis=2).swapaxes(0, 1)  # (N, B, H, Dg) log decay across each chunk
    final, starts = lax.scan(carry, s0, (total, added))  # starts: S before each chunk
    out = within + jnp.einsum("bnihd,nbhde->bnihe", qc * jnp.exp(decay_since(gc, axis=2)), starts)
    return from_chunks(out, length), final


def _within_chunks(q, k, v, log_g):
    """``sum_{j<=i} (q_i * exp(L_ij)) . k_j v_j`` inside each chunk; q, k, v, log_g [B, N, C, H, *].

    One decay per head: the [C, C] decay matrix is cheap and exact. Per dimension, by halving: in
    a block of 2h steps the second half sees the first through the gates between them. Relative to
    the boundary, a late query carries exp(decay from the boundary to i) and an early key
    exp(decay from j to the boundary), both <= 1 and summed over only those steps, so that part is
    a plain matmul that neither overflows nor loses precision however long the chunk. Halving down
    to single steps covers every j < i (j = i has no decay): log2(C) rounds of matmuls.
    """
    if log_g.shape[-1] == 1:
        return jnp.einsum("bnhij,bnjhe->bnihe", decayed_scores(q, k, log_g), v)
    size = q.shape[2]
    width = 1 << (size - 1).bit_length()  # the next power of two; padded steps neither decay nor add
    pad = [(0, 0), (0, 0), (0, width - size), (0, 0), (0, 0)]
    q, k, v, log_g = (jnp.pad(a, pad) for a in (q, k, v, log_g))
    out = jnp.sum(q * k, axis=-1, keepdims=True) * v  # (B, N, W, H, Dv) the j = i terms
    half = 1
    while half < width:
        qb, kb, vb, gb = (_halves(a, half) for a in (q, k, v, log_g))  # (B, N, blocks, 2, half, H, *)
        q_late = qb[:, :, :, 1] * jnp.exp(decay_since(gb[:, :, :, 1], axis=3))
        k_early = kb[:, :, :, 0] * jnp.exp(decay_until_end(gb[:, :, :, 0], axis=3))
        scores = jnp.einsum("bnlihd,bnljhd->bnlhij", q_late, k_early)  # (B, N, blocks, H, half, half)
        gained = jnp.einsum("bnlhij,bnljhe->bnlihe", scores, vb[:, :, :, 0])
        out = out + jnp.stack([jnp.zeros_like(gained), gained], axis=3).reshape(out.shape)
        half *= 2
    return out[:, :, :size]


def _halves(x, half: int) -> jax.Array:
    """[B, N, W, H, D] -> [B, N, W / (2 half), 2, half, H, D]: blocks of 2 half steps, split in two."""
    batch, chunks, width, heads, dim = x.shape
    return x.reshape(batch, chunks, width // (2 * half), 2, half, heads, dim)


_FORMS = {"parallel": _parallel, "scan": _scan, "assoc": _assoc, "chunk": _chunk}
