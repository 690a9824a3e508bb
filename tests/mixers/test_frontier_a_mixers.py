"""The variants of issue 57, part A (rwkv6, hgrn2, lightning, mlstm and the hybrid presets): what the generic protocol
tests (decoding equals the forward, documents, the attention matrix's shape and causality) leave out, and a short
training run of each (no generic test trains every variant)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.mixers.family.rwkv import group_norm
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train

from conftest import fewest_layers, tiny_config
from mixer_checks import compiled, first_mixer, inputs


def test_rwkv6_parametrisation_and_matrix():
    """w = exp(log w) in (0, 1) per key channel; the matrix times v is the op's mixing (scale 1, the bonus on its
    diagonal); the output is the op's group norm, gated by swish(g) and projected."""
    mixer = first_mixer("rwkv6")
    x = inputs(9, seed=5)

    def everything(m, x):
        heads, gate = m.project(x)
        o = m.mix(*heads)[0]
        mixed = jnp.einsum("bhts,bshd->bthd", m.attention_matrix(x), heads[2])
        by_hand = m.o_proj(group_norm(o, m.norm_scale[...], m.norm_bias[...], m.norm_eps) * jax.nn.silu(gate))
        return heads, o, mixed, by_hand, m(x)

    (r, k, v, log_w), o, mixed, by_hand, forward = compiled(everything, mixer)(x)
    assert r.shape == k.shape == log_w.shape == (2, 9, 4, 4) and v.shape == (2, 9, 4, 8)  # key_ratio 0.5
    assert bool(jnp.all((log_w < 0) & (log_w > -math.e - 1e-3)))  # tanh(.) A2 starts near 0: w0's range
    np.testing.assert_allclose(mixed, o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(forward, by_hand, rtol=1e-5, atol=1e-6)


def test_rwkv6_token_shift_reads_the_previous_token():
    """Changing token 5 changes r, k, v from token 5 on and, through the shift, at token 6; not after it."""
    mixer = first_mixer("rwkv6")
    x = inputs(9, seed=6)
    heads = compiled(lambda m, a: m.heads(a), mixer)
    (r0, k0, v0, w0), (r1, k1, v1, w1) = heads(x), heads(x.at[:, 5].add(1.0))
    for before, after in ((r0, r1), (k0, k1), (v0, v1), (w0, w1)):
        np.testing.assert_array_equal(before[:, :5], after[:, :5])
        assert not np.allclose(before[:, 6], after[:, 6])
        np.testing.assert_array_equal(before[:, 7:], after[:, 7:])


def test_hgrn2_ties_the_key_to_the_forget_gate():
    """k = 1 - f channel by channel, q = swish(x W_q), gates per key channel in (0, 1); the output is one RMSNorm over
    the width, projected (no gate)."""
    mixer = first_mixer("hgrn2")
    x = inputs(9, seed=7)

    def everything(m, x):
        q, k, v, log_f = m.heads(x)
        o = m.mix(q, k, v, log_f)[0]
        return q, k, log_f, m.o_proj(m.norm(o.reshape(2, 9, -1))), m(x), jax.nn.silu(m.q_proj(x))

    q, k, log_f, by_hand, forward, swished = compiled(everything, mixer)(x)
    assert k.shape == log_f.shape == (2, 9, 4, 8)
    np.testing.assert_allclose(k + jnp.exp(log_f), 1.0, rtol=1e-6)
    np.testing.assert_allclose(q.reshape(2, 9, -1), swished, rtol=1e-6)
    np.testing.assert_allclose(forward, by_hand, rtol=1e-5, atol=1e-6)


def test_lightning_decays_follow_minimax_schedule():
    """log lambda_h = -2^(-8 (h + 1) / H) (1 - l / (L - 1) + 1e-5): the first head of the bottom layer forgets
    fastest, every head slower in higher layers, the top layer almost not at all."""
    from lmzoo.mixers.lightning import lightning_log_decays

    bottom, top = lightning_log_decays(4, 0, 8), lightning_log_decays(4, 7, 8)
    np.testing.assert_allclose(bottom, -(2.0 ** (-2.0 * np.arange(1, 5))) * (1 + 1e-5), rtol=1e-6)
    assert bool(jnp.all(jnp.diff(bottom) > 0)) and bool(jnp.all(lightning_log_decays(4, 3, 8) > bottom))
    assert bool(jnp.all((top < 0) & (top > -1e-5)))
    mixer = first_mixer("lightning")
    q, k, v, log_g = compiled(lambda m, x: m.heads(x), mixer)(inputs(9, seed=8))
    np.testing.assert_allclose(log_g, jnp.broadcast_to(lightning_log_decays(4, 0, 2), (2, 9, 4)), rtol=1e-6)
    assert bool(jnp.all(q >= -0.2785)) and bool(jnp.all(k >= -0.2785))  # silu's minimum: q, k, v activated


NEW_VARIANTS = ["rwkv6", "hgrn2", "lightning", "qwen3_next_like", "kimi_linear_like", "minimax_like", "mlstm"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW_VARIANTS)
def test_each_new_variant_trains(variant, tmp_path):
    """Three steps of the tiny model (one layer of each kind the variant builds): finite, logged losses."""
    train(tiny_config(variant, *fewest_layers(variant), "train.steps=3", "train.log_every=1", "train.eval_every=3",
                      "train.checkpoint_every=3", "train.probe_batch=0", run_dir=tmp_path))
    losses = [row["loss"] for row in RunDir(tmp_path).read_metrics() if "loss" in row]
    assert len(losses) == 3 and all(np.isfinite(losses))
