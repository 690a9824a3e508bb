"""Softmax attention: a readable reference, a blocked causal form, and the fused XLA/cuDNN path,
selected by ``method``.

- ``"naive"``: the reference: the [T, S] scores materialised in float32, masked and normalised;
- ``"blocked"``: the reference computed in blocks of ``QUERY_BLOCK`` queries, each against only the
  keys it can see, so the masked blocks above the diagonal (and, with a window, those left of it)
  are never computed: about half the score work of a causal square. For CPUs, where the fused
  path builds and normalises the whole masked square;
- ``"xla"`` / ``"cudnn"``: ``jax.nn.dot_product_attention``.

``"auto"`` (the default on a GPU) runs cuDNN's fused kernel where it takes the call, jax-linear-attention's
Hopper kernel (the ``gpu`` extra) where cuDNN does not but that kernel does (documents: it reads the segment
ids per tile, where cuDNN would need a dense [T, T] mask), and ``"xla"`` otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lmzoo.ops import kernels
from lmzoo.ops.common import Forms, causal_mask, check_form, same_segment
from lmzoo.ops.kernels import AUTO

METHODS = Forms("naive", "blocked", "xla", "cudnn", AUTO)
QUERY_BLOCK = 64  # queries per block of the blocked form


def repeat_kv(x: jax.Array, n_rep: int) -> jax.Array:
    """[B, S, K, D] -> [B, S, K * n_rep, D]: each key/value head serves n_rep query heads."""
    return x if n_rep == 1 else jnp.repeat(x, n_rep, axis=2)


def attention_weights(q, k, *, scale=None, causal=True, window=None, bias=None, segment_ids=None,
                      key_segment_ids=None) -> jax.Array:
    """Softmax probabilities [B, H, T, S] in float32 (the reference path, and what probes read).

    Queries are the last T of the S positions. ``segment_ids`` [B, T] (and ``key_segment_ids``
    [B, S] when S != T): a query sees only keys of its own segment."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = repeat_kv(k, q.shape[2] // k.shape[2])
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        scores = scores + bias
    if causal or window is not None:
        scores = jnp.where(causal_mask(q.shape[1], k.shape[1], window=window), scores, -jnp.inf)
    if segment_ids is not None:
        scores = jnp.where(same_segment(segment_ids, key_segment_ids)[:, None], scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1)


def softmax_attention(q, k, v, *, scale=None, causal=True, window=None, bias=None, method="xla", segment_ids=None):
    """Multi-head softmax attention. q [B,T,H,D], k/v [B,S,K,D] with H a multiple of K -> [B,T,H,D].

    ``bias`` broadcasts to [B, H, T, S] and is added to the scaled scores (e.g. ALiBi or a
    padding mask of -inf). ``segment_ids`` [B, T] (T = S, equal within a document): no query
    sees a key of another segment. ``method``: "naive" (einsum + softmax, float32 scores), "blocked"
    (the same by blocks of queries, causal only), "xla" or "cudnn" (``jax.nn.dot_product_attention``,
    the segments as its boolean mask); "auto" is "cudnn" where its fused kernel takes the call
    (``cudnn_refusal``) and "xla" otherwise, recorded as ``lmzoo.ops.kernels`` records every choice.
    """
    method = check_form(method, METHODS)
    if method == AUTO:
        method = _auto_form(q, k, v, causal=causal, bias=bias, segment_ids=segment_ids)
    else:
        kernels.note("softmax_attention", method)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if method == kernels.JLA:
        return kernels.jla_attention()(q, k, v, segment_ids=segment_ids, sliding_window=window, scale=scale)
    if method == "naive":
        return _weighted_values(q, k, v, scale=scale, causal=causal, window=window, bias=bias, segment_ids=segment_ids)
    if q.shape[1] != k.shape[1] and causal:
        raise ValueError(f"method={method!r} needs as many queries as keys when causal; use method='naive'")
    if method == "blocked":
        if not causal:
            raise ValueError("method='blocked' skips the blocks a causal mask hides; use method='naive' without it")
        return _blocked(q, k, v, scale=scale, window=window, bias=bias, segment_ids=segment_ids)
    if bias is not None:
        bias = jnp.broadcast_to(bias, (q.shape[0], q.shape[2], q.shape[1], k.shape[1])).astype(q.dtype)
    local = None if window is None else (window - 1, 0)
    mask = None if segment_ids is None else same_segment(segment_ids)[:, None]  # (B, 1, T, S)
    return jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, scale=scale, is_causal=causal, local_window_size=local, implementation=method
    )


# cuDNN as JAX 0.11 ships it returns wrong attention gradients, without an error, once one call's query holds more
# than 2**31 elements; its backward also rejects odd lengths. Such calls never go to it.
CUDNN_MAX_QUERY_ELEMENTS = 2**31


def _auto_form(q, k, v, *, causal, bias, segment_ids) -> str:
    """The form ``auto`` runs, recorded with why the faster ones did not take the call."""
    refusal = cudnn_refusal(q, k, bias, segment_ids)
    if not refusal:
        kernels.note("softmax_attention", "cudnn")
        return "cudnn"
    jla_refusal = kernels.attention_refusal(q, k, v, causal=causal, bias=bias)
    if not jla_refusal:
        kernels.record("softmax_attention", "jla.mosaic_gpu:attention")
        return kernels.JLA
    kernels.note("softmax_attention", "xla", f"{refusal}; {jla_refusal}")
    return "xla"


def cudnn_refusal(q, k, bias, segment_ids) -> str:
    """Why cuDNN's fused attention would not take this call ("" when it would): it runs on an NVIDIA GPU, in
    bf16 or fp16, with head sizes up to 128 in multiples of 8, even lengths, and at most
    ``CUDNN_MAX_QUERY_ELEMENTS`` query elements (counted over all devices: fail-closed). Documents and biases
    are refused too: cuDNN would take documents only as a dense [T, T] mask."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return f"the device is {device.platform}, not an NVIDIA GPU"
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"cuDNN's fused attention takes bf16 or fp16, not {q.dtype}"
    if q.shape[-1] > 128 or q.shape[-1] % 8:
        return f"head size {q.shape[-1]} (cuDNN: a multiple of 8 up to 128)"
    if bias is not None or segment_ids is not None or q.shape[1] != k.shape[1]:
        return "a bias, documents or a query/key length mismatch are not given to cuDNN"
    if q.shape[1] % 2:
        return f"odd length {q.shape[1]} (cuDNN's backward takes even lengths)"
    if q.size > CUDNN_MAX_QUERY_ELEMENTS:
        return f"{q.size} query elements (cuDNN's gradients are wrong past {CUDNN_MAX_QUERY_ELEMENTS})"
    return ""


def _weighted_values(q, k, v, *, segment_ids=None, key_segment_ids=None, **options):
    probs = attention_weights(q, k, segment_ids=segment_ids, key_segment_ids=key_segment_ids, **options)
    v = repeat_kv(v, q.shape[2] // v.shape[2])
    return jnp.einsum("bhts,bshd->bthd", probs.astype(v.dtype), v)


def _blocked(q, k, v, *, scale, window, bias, segment_ids):
    """Causal attention, one block of queries at a time against the keys from the first one its
    window reaches (position 0 without a window) to its last query: the reference's arithmetic
    for every row, without the blocks the mask hides."""
    length = q.shape[1]
    if bias is not None:
        bias = jnp.broadcast_to(bias, (q.shape[0], q.shape[2], length, length))
    blocks = []
    for start in range(0, length, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, length)
        first = 0 if window is None else max(0, start - window + 1)
        rows, keys = slice(start, stop), slice(first, stop)
        blocks.append(_weighted_values(
            q[:, rows], k[:, keys], v[:, keys], scale=scale, causal=True, window=window,
            bias=None if bias is None else bias[:, :, rows, keys],
            segment_ids=None if segment_ids is None else segment_ids[:, rows],
            key_segment_ids=None if segment_ids is None else segment_ids[:, keys],
        ))
    return jnp.concatenate(blocks, axis=1)


def logn_scale(n_keys: jax.Array, base: float, *, clamp: bool = False) -> jax.Array:
    """Entropy-invariant logit factor ``log(n) / log(base)`` for a query that sees ``n_keys`` keys.

    Multiplying a query's logits by it keeps the attention entropy from growing with the number of
    keys; ``base`` is usually the training length, where the factor is 1. ``clamp``: ``max(1, .)``,
    which leaves every query inside the training length unchanged (for switching it on after training).
    """
    factor = jnp.log(jnp.asarray(n_keys, jnp.float32)) / jnp.log(jnp.float32(base))
    return jnp.maximum(factor, 1.0) if clamp else factor
