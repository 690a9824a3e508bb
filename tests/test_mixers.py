"""The mixer protocol, checked for every registered variant (found through configs/attn)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.model import LM

from conftest import VARIANTS, tiny_config

VOCAB = 259
SOFTMAX_FAMILY = [v for v in VARIANTS if tiny_config(v).attn.mixer == "softmax"]


def build(variant: str, *overrides: str, seed: int = 0):
    cfg = tiny_config(variant, *overrides)
    return cfg, LM(cfg, VOCAB, rngs=nnx.Rngs(seed))


def random_tokens(batch: int, length: int, seed: int = 1):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


@pytest.mark.parametrize("variant", VARIANTS)
def test_mixer_step_equals_forward(variant):
    _, model = build(variant)
    mixer = model.blocks[0].mixer
    x = jax.random.normal(jax.random.key(0), (2, 13, 32))
    full = mixer(x)
    state, outputs = mixer.init_state(2, 13), []
    for t in range(13):
        y_t, state = mixer.step(x[:, t], state)
        outputs.append(y_t)
    np.testing.assert_allclose(jnp.stack(outputs, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_decoding_equals_forward(variant):
    _, model = build(variant)
    tokens = random_tokens(2, 11)
    logits = model(tokens)
    state, stepped = model.init_state(2, 16), []
    for t in range(tokens.shape[1]):
        step_logits, state = model.step(tokens[:, t], state)
        stepped.append(step_logits)
    np.testing.assert_allclose(jnp.stack(stepped, axis=1), logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_causality(variant):
    _, model = build(variant)
    tokens = random_tokens(2, 17)
    changed = tokens.at[:, 9].set((tokens[:, 9] + 1) % VOCAB)
    before, after = model(tokens), model(changed)
    np.testing.assert_array_equal(before[:, :9], after[:, :9])
    assert not np.allclose(before[:, 9:], after[:, 9:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_matrix_is_causal_per_head(variant):
    cfg, model = build(variant)
    weights = model.attention_matrices(random_tokens(2, 15))
    assert len(weights) == cfg.model.n_layers
    for w in weights:
        assert w.shape == (2, cfg.model.n_heads, 15, 15)
        upper = np.triu(np.ones((15, 15), bool), k=1)
        assert np.all(np.asarray(w)[..., upper] == 0)


@pytest.mark.parametrize("variant", SOFTMAX_FAMILY)
def test_softmax_attention_matrix_rows_sum_to_one_and_reproduce_output(variant):
    _, model = build(variant)
    mixer = model.blocks[0].mixer
    x = jax.random.normal(jax.random.key(2), (2, 9, 32))
    weights = mixer.attention_matrix(x)  # (B, H, T, T)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    _, _, v = mixer.project(x, jnp.broadcast_to(jnp.arange(9), (2, 9)))
    v = jnp.repeat(v, mixer.n_heads // mixer.n_kv_heads, axis=2)  # (B, T, H, D)
    mixed = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(2, 9, -1)
    np.testing.assert_allclose(mixer.o_proj(mixed), mixer(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant, kv_heads", [("softmax", 4), ("gqa", 2), ("mqa", 1)])
def test_kv_heads_and_cache_size(variant, kv_heads):
    _, model = build(variant)
    mixer = model.blocks[0].mixer
    assert mixer.n_kv_heads == kv_heads
    assert mixer.state_size(100) == 2 * 100 * kv_heads * 8
    assert model.state_size(100) == 2 * mixer.state_size(100)


def test_bfloat16_compute_stays_close_to_float32():
    _, model32 = build("softmax")
    _, model16 = build("softmax", "model.dtype=bfloat16")
    tokens = random_tokens(2, 16)
    logits16 = model16(tokens)
    assert logits16.dtype == jnp.float32  # logits are always float32
    assert jax.tree.leaves(nnx.state(model16, nnx.Param))[0].dtype == jnp.float32
    np.testing.assert_allclose(logits16, model32(tokens), atol=5e-2)
