"""DeltaFormer (Zhong et al., 2025): softmax attention over values that a delta rule with a softmax kernel
writes first.

Per key/value head, with P the strictly causal softmax of the write queries w against the keys and A the
causal softmax of the queries q against them (``scale`` on both; ``w`` None: the keys themselves):

    P_tj = softmax_{j<t}(scale w_t . k_j)            A_tj = softmax_{j<=t}(scale q_t . k_j)
    u_t  = v_t - beta_t sum_{j<t} P_tj u_j           each token writes what the memory of the earlier
                                                     ones does not already recall at its key
    o_t  = sum_{j<=t} A_tj u_j

so ``u = (I + diag(beta) P)^{-1} v`` and ``o = A (I + diag(beta) P)^{-1} v``: the delta rule's erase-then-write,
with a softmax in place of its linear kernel, and read by softmax attention. A token with no earlier key
(the first of a document) writes u = v. Query head h reads kv head h // (H / K).

Forms (``method``), float32 inside whatever the inputs' dtype:

- ``"naive"``:    token by token, each step the one-token update ``deltaformer_step`` (what decoding runs)
  against the keys and values u before it -- the reference;
- ``"chunk"``:    P and A as matrices; u by chunks of C tokens: within a chunk the unit lower-triangular
  block ``I + diag(beta) P_cc`` inverted by halving (``lmzoo.ops.ut.invert_unit_lower``, matmuls), across
  chunks a scan that subtracts what the earlier chunks' u recall: ``u_c = (I + diag(beta_c) P_cc)^{-1}
  (v_c - beta_c P_{c,<c} u_{<c})``. T S Dv + T C^2 work per head besides the scores;
- ``"parallel"``: the same with the whole sequence as one chunk (a T x T inverse: T^3 work, short sequences).

State: ``(keys [B,S,K,D], u [B,S,K,Dv] float32)`` of every token so far, a cache: the initial state's tokens
come before the sequence (its first document continues theirs) and the final state appends the sequence's.
Documents (``segment_ids``): no weight of P or A crosses a document boundary. ``deltaformer_weights``: the
effective causal weights ``A (I + diag(beta) P)^{-1}`` on v from an empty state, for the probes.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, check_form, grouped, masked_softmax, same_segment, to_chunks
from lmzoo.ops.ut import invert_unit_lower

METHODS = Forms("naive", "chunk", "parallel")


def deltaformer(q, k, v, beta, *, w=None, scale: Optional[float] = None, initial_state=None, segment_ids=None,
                method: str = "chunk", chunk_size: int = 64):
    """q [B,T,H,D]; k, w [B,T,K,D] (w None: k); v [B,T,K,Dv]; beta [B,T,K]; ``scale`` None: D^-1/2;
    initial_state None or (keys [B,S0,K,D], u [B,S0,K,Dv]) of the tokens before.

    Returns (o [B,T,H,Dv] in v's dtype, (keys [B,S0+T,K,D] in k's dtype, u [B,S0+T,K,Dv] float32)).
    """
    method = check_form(method, METHODS, chunk_size)
    w = k if w is None else w
    check_shapes(q, k, v, beta, w)
    if initial_state is not None and initial_state[0].shape[1] != initial_state[1].shape[1]:
        raise ValueError(f"initial_state holds {initial_state[0].shape[1]} keys but {initial_state[1].shape[1]} values")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _deltaformer(q, k, v, beta, w, initial_state, segment_ids, scale=scale, method=method,
                        chunk_size=chunk_size)


def check_shapes(q, k, v, beta, w) -> None:
    if w.shape != k.shape:
        raise ValueError(f"w has shape {w.shape}; expected the keys' {k.shape}")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1] or q.shape[2] % k.shape[2]:
        raise ValueError(f"q has shape {q.shape}; expected [B, T, a multiple of {k.shape[2]} heads, {k.shape[-1]}]")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v has shape {v.shape}; expected {k.shape[:3]} + (Dv,)")
    if beta.shape != k.shape[:3]:
        raise ValueError(f"beta has shape {beta.shape}; expected {k.shape[:3]}")


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _deltaformer(q, k, v, beta, w, initial_state, segment_ids, *, scale, method, chunk_size):
    batch, length, n_kv, _ = k.shape
    if initial_state is None:
        initial_state = (jnp.zeros((batch, 0, n_kv, k.shape[-1]), k.dtype),
                         jnp.zeros((batch, 0, n_kv, v.shape[-1]), jnp.float32))
    past_keys, past_u = initial_state
    keys = jnp.concatenate([past_keys.astype(k.dtype), k], axis=1)  # (B, S, K, D)
    past_u, out_dtype = past_u.astype(jnp.float32), v.dtype
    write_visible, read_visible = (visible_keys(length, past_u.shape[1], segment_ids, strict=strict)
                                   for strict in (True, False))
    q, w, v, beta = (x.astype(jnp.float32) for x in (q, w, v, beta))
    if method == "naive":
        o, u = _naive(q, w, v, beta, keys.astype(jnp.float32), past_u, write_visible, scale)
    else:
        size = length if method == "parallel" else min(chunk_size, length)
        o, u = _chunk(q, w, v, beta, keys.astype(jnp.float32), past_u, write_visible, read_visible, scale, size)
    return o.astype(out_dtype), (keys, jnp.concatenate([past_u, u], axis=1))


def visible_keys(length: int, n_past: int, segment_ids, *, strict: bool) -> jax.Array:
    """[B or 1, T, S] bool: which of the S = n_past + T keys query t (at n_past + t) sees: the earlier ones
    (``strict``) or those up to itself, in its own document; the past keys belong to the first one."""
    i = n_past + jnp.arange(length)[:, None]
    j = jnp.arange(n_past + length)[None, :]
    visible = ((j < i) if strict else (j <= i))[None]
    if segment_ids is None:
        return visible
    key_ids = jnp.concatenate([jnp.repeat(segment_ids[:, :1], n_past, axis=1), segment_ids], axis=1)
    return visible & same_segment(segment_ids, key_ids)


def deltaformer_step(q, k, v, beta, keys, values, visible, *, w=None, scale: Optional[float] = None):
    """One token: q [B,H,D]; k, w [B,K,D] (w None: k); v [B,K,Dv]; beta [B,K]; the earlier tokens' keys
    [B,S,K,D] and values u [B,S,K,Dv] (a cache), of which ``visible`` [B,S] are this token's past.

    Returns (o [B,H,Dv] float32, u [B,K,Dv] float32): the value it writes and its read over the visible
    slots and itself."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    w = k if w is None else w
    keys, values = keys.astype(jnp.float32), values.astype(jnp.float32)
    logits = jnp.einsum("bkd,bskd->bks", w.astype(jnp.float32), keys) * scale
    recall, _ = masked_softmax(logits, visible[:, None, :])  # (B, K, S)
    u = v.astype(jnp.float32) - beta.astype(jnp.float32)[..., None] * jnp.einsum("bks,bskd->bkd", recall, values)
    keys = jnp.concatenate([keys, k.astype(jnp.float32)[:, None]], axis=1)  # the token reads itself too
    values = jnp.concatenate([values, u[:, None]], axis=1)
    seen = jnp.concatenate([visible, jnp.ones_like(visible[:, :1])], axis=1)
    qg = grouped(q[:, None], k.shape[1])[:, 0]  # (B, K, G, D)
    weights, _ = masked_softmax(jnp.einsum("bkgd,bskd->bkgs", qg, keys) * scale, seen[:, None, None, :])
    o = jnp.einsum("bkgs,bskd->bkgd", weights, values)
    return o.reshape(o.shape[0], -1, o.shape[-1]), u


def deltaformer_weights(q, k, beta, *, w=None, scale: Optional[float] = None, segment_ids=None,
                        chunk_size: int = 64) -> jax.Array:
    """The effective causal weights [B,H,T,T] float32 that ``deltaformer`` applies to v from an empty state:
    ``A (I + diag(beta) P)^{-1}``; exactly 0 across documents (P and A never cross one, nor then the inverse)."""
    w = k if w is None else w
    check_shapes(q, k, k, beta, w)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    length, n_kv = k.shape[1], k.shape[2]
    k32, w32, beta32 = (x.astype(jnp.float32) for x in (k, w, beta))
    recall = write_probs(w32, k32, visible_keys(length, 0, segment_ids, strict=True), scale)  # (B, K, T, T)
    identity = jnp.broadcast_to(jnp.eye(length), recall.shape)
    inverse = solve_by_chunks(recall, beta32.swapaxes(1, 2), identity, min(chunk_size, length))
    read = read_probs(q, k32, visible_keys(length, 0, segment_ids, strict=False), scale)  # (B, K, G, T, T)
    weights = read @ inverse[:, :, None]
    return weights.reshape(weights.shape[0], n_kv * weights.shape[2], length, length)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q [B,T,H,D], w, v, beta, every key [B,S,K,D] and the past u [B,S0,K,Dv] and returns
# (o [B,T,H,Dv], u [B,T,K,Dv]) float32.


def write_probs(w, keys, visible, scale) -> jax.Array:
    """P [B,K,T,S]: each token's softmax over the keys before it."""
    return masked_softmax(jnp.einsum("btkd,bskd->bkts", w, keys) * scale, visible[:, None])[0]


def read_probs(q, keys, visible, scale) -> jax.Array:
    """A [B,K,G,T,S]: each query's softmax over the keys up to its own."""
    logits = jnp.einsum("btkgd,bskd->bkgts", grouped(q, keys.shape[2]), keys) * scale
    return masked_softmax(logits, visible[:, None, None])[0]


def _naive(q, w, v, beta, keys, past_u, write_visible, scale):
    n_past, length = past_u.shape[1], q.shape[1]
    start = jnp.concatenate([past_u, jnp.zeros(v.shape, jnp.float32)], axis=1)  # u's slots, filled in time order

    def step(values, inputs):
        t, q_t, w_t, v_t, beta_t, visible_t = inputs
        k_t = lax.dynamic_index_in_dim(keys, n_past + t, axis=1, keepdims=False)
        o_t, u_t = deltaformer_step(q_t, k_t, v_t, beta_t, keys, values, visible_t, w=w_t, scale=scale)
        return lax.dynamic_update_index_in_dim(values, u_t, n_past + t, axis=1), o_t

    visible = jnp.broadcast_to(write_visible, (q.shape[0],) + write_visible.shape[1:])
    time_first = tuple(x.swapaxes(0, 1) for x in (q, w, v, beta, visible))
    values, o = lax.scan(step, start, (jnp.arange(length), *time_first))
    return o.swapaxes(0, 1), values[:, n_past:]


def _chunk(q, w, v, beta, keys, past_u, write_visible, read_visible, scale, size):
    n_past = past_u.shape[1]
    recall = write_probs(w, keys, write_visible, scale)  # (B, K, T, S)
    beta = beta.swapaxes(1, 2)  # (B, K, T)
    known = v.swapaxes(1, 2) - beta[..., None] * (recall[..., :n_past] @ past_u.swapaxes(1, 2))  # (B, K, T, Dv)
    u = solve_by_chunks(recall[..., n_past:], beta, known, size).swapaxes(1, 2)  # (B, T, K, Dv)
    read = read_probs(q, keys, read_visible, scale)  # (B, K, G, T, S)
    values = jnp.concatenate([past_u, u], axis=1).swapaxes(1, 2)[:, :, None]  # (B, K, 1, S, Dv)
    o = jnp.moveaxis(read @ values, 3, 1)  # (B, T, K, G, Dv)
    return o.reshape(*o.shape[:2], -1, o.shape[-1]), u


def solve_by_chunks(pairs, beta, rhs, size: int) -> jax.Array:
    """x [..., T, N] with ``(I + diag(beta) pairs) x = rhs``: pairs [..., T, T] strictly lower, beta [..., T],
    rhs [..., T, N]; chunks of ``size`` rows, each block on the diagonal inverted by halving, the blocks left of
    it subtracted by a scan across chunks."""
    length = pairs.shape[-1]
    lead = pairs.ndim - 2
    rows = to_chunks(jnp.moveaxis(pairs, -2, 0)[None], size)[0]  # (N, C, ..., T): the rows of each chunk
    rows = jnp.moveaxis(rows, 1, -2)  # (N, ..., C, T)
    beta_c = jnp.moveaxis(to_chunks(jnp.moveaxis(beta, -1, 0)[None], size)[0], 1, -1)  # (N, ..., C)
    rhs_c = jnp.moveaxis(to_chunks(jnp.moveaxis(rhs, -2, 0)[None], size)[0], 1, -2)  # (N, ..., C, N)
    n = rows.shape[0]
    rows = jnp.pad(rows, [(0, 0)] * (lead + 2) + [(0, n * size - length)])  # padded steps: no pairs, beta 0
    blocks = jnp.stack([lax.dynamic_slice_in_dim(rows[i], i * size, size, axis=-1) for i in range(n)])
    inverse = invert_unit_lower(jnp.eye(size) + beta_c[..., None] * blocks)  # (N, ..., C, C)

    def next_chunk(x, chunk):  # x: the solution so far, 0 from this chunk on
        index, rows_c, inverse_c, beta_here, rhs_here = chunk
        earlier = rows_c @ x  # what the earlier chunks' x contribute to this chunk's rows
        x_c = inverse_c @ (rhs_here - beta_here[..., None] * earlier)
        return lax.dynamic_update_slice_in_dim(x, x_c, index * size, axis=-2), None

    start = jnp.zeros(rhs.shape[:-2] + (n * size, rhs.shape[-1]), jnp.float32)
    x, _ = lax.scan(next_chunk, start, (jnp.arange(n), rows, inverse, beta_c, rhs_c))
    return x[..., :length, :]
