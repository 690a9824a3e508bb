"""Softmax attention: the fused path against the readable reference (values and gradients)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops import attention_weights, causal_mask, softmax_attention
from lmzoo.positions import Positions, default_positions


def qkv(t=37, h=4, k=2, d=16, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (2, t, h, d), dtype)
    kk = jax.random.normal(keys[1], (2, t, k, d), dtype)
    v = jax.random.normal(keys[2], (2, t, k, d), dtype)
    return q, kk, v


def naive_attention(q, k, v, window=None):
    """Plain loops over batch, head and query: the definition, nothing clever."""
    b, t, h, d = q.shape
    rep = h // k.shape[2]
    out = np.zeros(q.shape, np.float64)
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                lo = 0 if window is None else max(0, i - window + 1)
                s = k[bi, lo : i + 1, hi // rep] @ q[bi, i, hi] / np.sqrt(d)
                p = np.exp(s - s.max())
                out[bi, i, hi] = (p / p.sum()) @ v[bi, lo : i + 1, hi // rep]
    return out


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("method", ["naive", "xla"])
def test_attention_matches_definition(method, window):
    q, k, v = qkv()
    out = softmax_attention(q, k, v, window=window, method=method)
    np.testing.assert_allclose(out, naive_attention(q, k, v, window), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_fused_gradients_match_reference(window):
    q, k, v = qkv(t=33)
    upstream = jax.random.normal(jax.random.key(9), q.shape)

    def loss(method, *args):
        return jnp.sum(softmax_attention(*args, window=window, method=method) * upstream)

    ref = jax.grad(lambda *a: loss("naive", *a), argnums=(0, 1, 2))(q, k, v)
    fused = jax.grad(lambda *a: loss("xla", *a), argnums=(0, 1, 2))(q, k, v)
    for r, f in zip(ref, fused):
        np.testing.assert_allclose(f, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window, with_bias, with_segments",
                         [(None, False, False), (40, True, False), (None, True, True)],
                         ids=["causal", "window_and_bias", "bias_and_documents"])
def test_blocked_form_matches_reference_values_and_gradients(window, with_bias, with_segments):
    """151 queries: blocks of 64, 64 and 23; a window of 40 reaches back across block edges."""
    q, k, v = qkv(t=151)
    bias = jax.random.normal(jax.random.key(3), (1, q.shape[2], 151, 151)) if with_bias else None
    segments = jnp.asarray(np.repeat([[0, 1, 2], [0, 0, 1]], [50, 70, 31], axis=1)) if with_segments else None
    upstream = jax.random.normal(jax.random.key(9), q.shape)

    @functools.partial(jax.jit, static_argnums=0)
    def out_and_grads(method, q, k, v):
        run = lambda *a: softmax_attention(*a, window=window, bias=bias, segment_ids=segments, method=method)  # noqa: E731
        out, vjp = jax.vjp(run, q, k, v)
        return out, vjp(upstream)

    for blocked, reference in zip(jax.tree.leaves(out_and_grads("blocked", q, k, v)),
                                  jax.tree.leaves(out_and_grads("naive", q, k, v))):
        np.testing.assert_allclose(blocked, reference, rtol=1e-5, atol=1e-6)


def test_blocked_form_needs_a_causal_mask():
    q, k, v = qkv(t=8)
    with pytest.raises(ValueError, match="causal"):
        softmax_attention(q, k, v, causal=False, method="blocked")


def test_bfloat16_inputs_close_to_float32():
    q, k, v = qkv()
    ref = softmax_attention(q, k, v, method="naive")
    low = softmax_attention(*(a.astype(jnp.bfloat16) for a in (q, k, v)), method="xla")
    np.testing.assert_allclose(low.astype(jnp.float32), ref, atol=3e-2)


def test_window_covering_sequence_is_full_attention():
    q, k, v = qkv(t=21)
    np.testing.assert_allclose(
        softmax_attention(q, k, v, window=21), softmax_attention(q, k, v), rtol=1e-6, atol=1e-6
    )


def test_causal_mask_for_cached_queries():
    mask = np.asarray(causal_mask(2, 5))  # two newest queries over five keys
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_weights_are_probabilities():
    q, k, _ = qkv()
    w = attention_weights(q, k)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
    assert float(w[..., 0, 1:].max()) == 0.0


def test_rope_is_relative():
    """Rotated q.k depends on positions only through their difference."""
    rope = Positions("rope", 10000.0)
    q, k, _ = qkv(t=1, h=1, k=1)

    def score(i, j):
        qi = rope.rotate(q, jnp.full((2, 1), i))
        kj = rope.rotate(k, jnp.full((2, 1), j))
        return jnp.sum(qi * kj, -1)

    np.testing.assert_allclose(score(7, 3), score(104, 100), rtol=1e-4)
    assert not np.allclose(score(7, 3), score(7, 5))
    np.testing.assert_array_equal(Positions("none").rotate(q, default_positions(2, 1)), q)
