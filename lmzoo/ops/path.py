"""PaTH attention (Yang et al., 2025): softmax attention whose keys are carried to the query through
the data-dependent Householder reflections of the tokens between them.

    H_s = I - beta_s w_s w_s^T            (w_s a unit vector, beta_s in (0, 2): eigenvalue 1 - beta_s in (-1, 1))
    G_i = sum_{s<=i} log_g_s              (optional forget gates, per query head)
    l_ij = scale (q_i^T H_i H_{i-1} ... H_{j+1} k_j + G_i - G_j)        for j <= i
    o_i = sum_j softmax_j(l_ij) v_j

The product is empty for j = i; the scale multiplies the gate term too (unlike FoX). The reflections
act as a position encoding that depends on the content between query and key, where RoPE's
rotations depend on the distance alone. Decoding keeps transformed keys
``k~_j = H_i ... H_{j+1} k_j``: on token i every cached key is reflected once,
``k~_j <- k~_j - beta_i (w_i . k~_j) w_i``, then ``k~_i = k_i`` joins them.

Forms (``method``), both float32 inside whatever the inputs' dtype:
- ``"naive"``: the products of the K x K reflection matrices written out, one query at a time;
- ``"chunk"``: the UT representation of the reflections within chunks of C tokens. For a chunk's
  reflections in time order (rows w_a of W, betas beta_a), ``H_s ... H_{s+m} = I - W^T U W`` restricted
  to its first m+1 rows, with ``U = (I + diag(beta) striu(W W^T))^{-1} diag(beta)`` upper triangular
  (every contiguous diagonal block of a triangular inverse is the inverse of the block, so one U
  serves every sub-product). Hence, with ``D = Q W^T`` masked to a <= i and ``E = K W^T`` masked to a > j,
  the logits inside a chunk are ``Q K^T - (D U^T) E^T``; queries seen from the chunk start are
  ``q^ = q - (D U^T) W``; keys carried to the chunk end are ``k - (E U) W``. A scan over chunks keeps
  every earlier key carried to the current chunk start (reflecting them by the chunk's whole product,
  formed once as a K x K matrix: ``K~ <- K~ (I - W^T U W)``) and scores the chunk's queries q^ against
  them: O(T^2 K (1 + K / C)) work, about attention's.

Both forms also return the transformed keys ``H_{T-1} ... H_{j+1} k_j`` [B,T,H,K] float32: the cache
decoding continues from (with documents, keys of earlier documents are reflected by later ones too;
no query of those ever sees them).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.attention import repeat_kv
from lmzoo.ops.common import Forms, check_form, same_segment, to_chunks
from lmzoo.ops.ut import invert_unit_lower

METHODS = Forms("naive", "chunk")


def reflect_keys(keys: jax.Array, w: jax.Array, beta: jax.Array) -> jax.Array:
    """One decoding step's reflection of every cached key: keys [B,S,H,K], w [B,H,K], beta [B,H] ->
    ``keys - beta (w . keys) w`` in float32."""
    keys, w = keys.astype(jnp.float32), w.astype(jnp.float32)
    along = jnp.einsum("bshk,bhk->bsh", keys, w)
    return keys - (beta.astype(jnp.float32)[:, None] * along)[..., None] * w[:, None]


def path_attention(q, k, v, w, beta, log_g=None, *, scale: Optional[float] = None, segment_ids=None,
                   method: str = "chunk", chunk_size: int = 64):
    """PaTH attention. q [B,T,HQ,D]; k, w [B,T,H,D] (w unit); v [B,T,H,Dv]; beta [B,T,H]; log_g [B,T,HQ]
    or None (query head h reads kv head h // (HQ/H)). ``scale`` None: D^-1/2. ``segment_ids`` [B,T]: no
    query sees another document. Returns (o [B,T,HQ,Dv] in v's dtype, transformed keys [B,T,H,D] float32)."""
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits, keys = (_naive_logits if method == "naive" else _chunk_logits)(q, k, w, beta, chunk_size=chunk_size)
    weights = path_weights(logits, log_g, scale=scale, segment_ids=segment_ids)
    values = repeat_kv(v, q.shape[2] // v.shape[2]).astype(jnp.float32)
    return jnp.einsum("bhts,bshd->bthd", weights, values).astype(v.dtype), keys


def path_matrix(q, k, w, beta, log_g=None, *, scale: Optional[float] = None, segment_ids=None,
                method: str = "chunk", chunk_size: int = 64) -> jax.Array:
    """The softmax weights [B,HQ,T,T] float32 of ``path_attention`` (what the probes read)."""
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits, _ = (_naive_logits if method == "naive" else _chunk_logits)(q, k, w, beta, chunk_size=chunk_size)
    return path_weights(logits, log_g, scale=scale, segment_ids=segment_ids)


def path_weights(content, log_g, *, scale, segment_ids=None) -> jax.Array:
    """softmax_j(scale (content_ij + G_i - G_j)) over visible j: content [B,HQ,T,T] float32."""
    t = content.shape[-1]
    logits = content
    if log_g is not None:
        g = jnp.cumsum(log_g.astype(jnp.float32), axis=1).swapaxes(1, 2)  # (B, HQ, T)
        logits = logits + g[..., :, None] - g[..., None, :]
    visible = jnp.tril(jnp.ones((t, t), bool))
    if segment_ids is not None:
        visible = visible & same_segment(segment_ids)[:, None]
    return jax.nn.softmax(jnp.where(visible, logits * scale, -jnp.inf), axis=-1)


def _per_query_head(q, k, w, beta):
    """Float32 k, w [B,T,HQ,D] and beta [B,T,HQ], repeated so each query head has its kv head's."""
    n_rep = q.shape[2] // k.shape[2]
    k, w = (repeat_kv(x, n_rep).astype(jnp.float32) for x in (k, w))
    beta = jnp.repeat(beta, n_rep, axis=2) if n_rep > 1 else beta
    return q.astype(jnp.float32), k, w, beta.astype(jnp.float32)


def _kv_heads(keys, n_kv_heads):
    """Transformed keys [B,T,HQ,D] of repeated heads back to one per kv head."""
    return keys[:, :, :: keys.shape[2] // n_kv_heads]


def _naive_logits(q, k, w, beta, *, chunk_size=None):
    """Content logits [B,HQ,T,T] (unscaled; above the diagonal 0) and transformed keys, by products
    ``P_ij = H_i ... H_{j+1}`` of explicit reflection matrices, one query i at a time."""
    del chunk_size
    n_kv = k.shape[2]
    q, k, w, beta = _per_query_head(q, k, w, beta)
    b, t, h, d = q.shape
    eye = jnp.eye(d, dtype=jnp.float32)
    reflections = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # (B, T, H, D, D)
    earlier = jnp.arange(t)[None, :, None, None, None]  # j, against (B, T(j), H, D, D)

    def next_query(products, inputs):
        i, reflection, q_i = inputs  # (), (B, H, D, D), (B, H, D)
        products = jnp.where(earlier < i, jnp.einsum("bhde,bjhef->bjhdf", reflection, products), eye)
        row = jnp.einsum("bhd,bjhde,bjhe->bhj", q_i, products, k)  # q_i^T P_ij k_j
        return products, row

    start = jnp.broadcast_to(eye, (b, t, h, d, d))
    xs = (jnp.arange(t), reflections.swapaxes(0, 1), q.swapaxes(0, 1))
    products, rows = lax.scan(next_query, start, xs)
    logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), jnp.moveaxis(rows, 0, 2), 0.0)  # (B, H, T, T)
    keys = jnp.einsum("bjhde,bjhe->bjhd", products, k)  # P_{T-1, j} k_j
    return logits, _kv_heads(keys, n_kv)


def _chunk_logits(q, k, w, beta, *, chunk_size):
    """``_naive_logits`` by the UT representation within chunks and a scan over chunks (module docstring)."""
    n_kv = k.shape[2]
    q, k, w, beta = _per_query_head(q, k, w, beta)
    t, c = q.shape[1], chunk_size
    # (B, H, N, C, D): padded steps have w = 0, beta = 0, i.e. H = I, and zero queries and keys
    q, k, w = (to_chunks(x, c).transpose(0, 3, 1, 2, 4) for x in (q, k, w))
    beta = to_chunks(beta, c).transpose(0, 3, 1, 2)  # (B, H, N, C)
    n = q.shape[2]
    ut = _ut_transform(w, beta)  # (B, H, N, C, C) upper triangular
    at_or_before = jnp.tril(jnp.ones((c, c), bool))  # [i, a]: a <= i
    d = jnp.where(at_or_before, jnp.einsum("...id,...ad->...ia", q, w), 0.0)
    e = jnp.where(~at_or_before, jnp.einsum("...jd,...ad->...ja", k, w), 0.0)  # a > j
    du = jnp.einsum("...ib,...ab->...ia", d, ut)  # D U^T
    intra = jnp.einsum("...id,...jd->...ij", q, k) - jnp.einsum("...ia,...ja->...ij", du, e)
    q_hat = q - jnp.einsum("...ia,...ad->...id", du, w)  # queries as seen from the chunk start
    k_end = k - jnp.einsum("...jb,...bd->...jd", jnp.einsum("...ja,...ab->...jb", e, ut), w)  # carried to the chunk end

    # the chunk's whole product H_e ... H_s, transposed to act on row keys: I - W^T U W (D x D)
    product_t = jnp.eye(q.shape[-1]) - jnp.einsum("...ad,...ab,...be->...de", w, ut, w)

    def next_chunk(carried, inputs):
        index, q_hat_n, k_end_n, product_t_n = inputs  # (B, H, C, D), (B, H, C, D), (B, H, D, D)
        inter = jnp.einsum("bhid,bhsd->bhis", q_hat_n, carried)  # keys before the chunk (later rows are 0)
        carried = jnp.einsum("bhsd,bhde->bhse", carried, product_t_n)
        carried = lax.dynamic_update_slice_in_dim(carried, k_end_n, index * c, axis=2)
        return carried, inter

    at_chunk = lambda x: jnp.moveaxis(x, 2, 0)  # noqa: E731  (N first, for the scan)
    start = jnp.zeros(q.shape[:2] + (n * c, q.shape[-1]), jnp.float32)
    keys, inter = lax.scan(next_chunk, start, (jnp.arange(n), *map(at_chunk, (q_hat, k_end, product_t))))
    blocks = jnp.moveaxis(inter, 0, 2).reshape(*q.shape[:2], n, c, n, c)  # (B, H, N(i), C, N(j), C)
    blocks = blocks + intra[:, :, :, :, None, :] * jnp.eye(n)[:, None, :, None]  # the diagonal blocks
    logits = blocks.reshape(*q.shape[:2], n * c, n * c)[:, :, :t, :t]
    logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, 0.0)
    return logits, _kv_heads(keys.swapaxes(1, 2)[:, :t], n_kv)


def _ut_transform(w, beta):
    """U = (I + diag(beta) striu(W W^T))^{-1} diag(beta) per chunk: w [..., C, D], beta [..., C] -> [..., C, C],
    through the transpose, a unit lower-triangular matrix, which the delta rule's chunks invert too."""
    c = w.shape[-2]
    gram = jnp.einsum("...ad,...bd->...ab", w, w)
    lower = jnp.eye(c) + jnp.tril(beta[..., None, :] * gram, k=-1)  # (I + diag(beta) striu(W W^T))^T
    return jnp.swapaxes(invert_unit_lower(lower), -1, -2) * beta[..., None, :]
