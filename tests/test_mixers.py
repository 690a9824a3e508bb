"""The mixer protocol, checked for every registered variant (found through configs/attn) and every
layer of its model: a hybrid's model has enough layers to build each of its sub-configs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.mixers.softmax import SoftmaxAttention, SoftmaxConfig
from lmzoo.model import LM

from conftest import VARIANTS, covering_layers, layer_specs, tiny_config

VOCAB = 259
WITH_SOFTMAX_LAYERS = [v for v in VARIANTS if any(isinstance(spec, SoftmaxConfig) for spec in layer_specs(v))]


def build(variant: str, *overrides: str, seed: int = 0):
    """The tiny model of ``variant`` with a layer of every kind its spec builds."""
    cfg = tiny_config(variant, f"model.n_layers={covering_layers(variant)}", *overrides)
    return cfg, LM(cfg, VOCAB, rngs=nnx.Rngs(seed))


def random_tokens(batch: int, length: int, seed: int = 1):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


@nnx.jit
def mixer_forward(mixer, x):
    return mixer(x)


@nnx.jit
def model_step(model, token, state):
    return model.step(token, state)


@nnx.jit
def mixer_step(mixer, x_t, state):  # compiled: op-by-op dispatch of every layer's steps is slow
    return mixer.step(x_t, state)


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_decoding_equals_forward(variant):
    _, model = build(variant)
    tokens = random_tokens(2, 11)
    logits = model(tokens)
    state, stepped = model.init_state(2, 16), []
    for t in range(tokens.shape[1]):
        step_logits, state = model_step(model, tokens[:, t], state)
        stepped.append(step_logits)
    np.testing.assert_allclose(jnp.stack(stepped, axis=1), logits, rtol=1e-4, atol=1e-4)


@functools.partial(nnx.jit, static_argnames="max_len")
def mixer_prefill(mixer, x, max_len):
    return mixer.prefill(x, max_len)


def assert_same_state(state, expected, message):
    """Same structure, shapes and dtypes, and the same values up to float rounding."""
    assert jax.tree.structure(state) == jax.tree.structure(expected), message
    for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
        assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype), message
        np.testing.assert_allclose(leaf, want, rtol=1e-5, atol=1e-5, err_msg=message)


def step_through(mixer, x, state):
    outputs = []
    for t in range(x.shape[1]):
        y_t, state = mixer_step(mixer, x[:, t], state)
        outputs.append(y_t)
    return jnp.stack(outputs, axis=1), state


@pytest.mark.parametrize("variant", [*VARIANTS, "softmax attn.window=4"])
def test_prefill_equals_forward_and_stepping_then_decodes_on(variant):
    """Stepping from the initial state gives the forward's outputs; prefill's output is the forward's
    and its state the one stepping leaves (at an odd length, past a window's ring buffer); stepping on
    from it gives the forward's outputs on the longer sequence."""
    _, model = build(*variant.split())
    x = jax.random.normal(jax.random.key(0), (2, 17, 32))
    prompt, max_len = 13, 20
    for layer, block in enumerate(model.blocks):
        mixer, message = block.mixer, f"layer {layer}"
        forward = mixer_forward(mixer, x[:, :prompt])
        y, state = mixer_prefill(mixer, x[:, :prompt], max_len)
        np.testing.assert_allclose(y, forward, rtol=1e-5, atol=1e-5, err_msg=message)
        y_stepped, stepped = step_through(mixer, x[:, :prompt], mixer.init_state(2, max_len))
        np.testing.assert_allclose(y_stepped, forward, rtol=1e-5, atol=1e-5, err_msg=message)
        assert_same_state(state, stepped, message)
        continued, _ = step_through(mixer, x[:, prompt:], state)
        full = mixer_forward(mixer, x)
        np.testing.assert_allclose(continued, full[:, prompt:], rtol=1e-5, atol=1e-5, err_msg=message)


def test_model_prefill_then_steps_equal_the_forward():
    _, model = build("gla_softmax")
    tokens = random_tokens(2, 12)
    logits, state = model.prefill(tokens[:, :7], 12)
    np.testing.assert_allclose(logits, model(tokens[:, :7]), rtol=1e-5, atol=1e-5)
    stepped = []
    for t in range(7, 12):
        step_logits, state = model.step(tokens[:, t], state)
        stepped.append(step_logits)
    np.testing.assert_allclose(jnp.stack(stepped, axis=1), model(tokens)[:, 7:], rtol=1e-4, atol=1e-4)
    _, exact = model.prefill(tokens[:, :7])  # no max_len: a cache for the prompt alone
    assert_same_state(exact, model.prefill(tokens[:, :7], 7)[1], "max_len=None")


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


@pytest.mark.parametrize("variant", WITH_SOFTMAX_LAYERS)
def test_softmax_attention_matrix_rows_sum_to_one_and_reproduce_output(variant):
    _, model = build(variant)
    x = jax.random.normal(jax.random.key(2), (2, 9, 32))
    mixers = [block.mixer for block in model.blocks if isinstance(block.mixer, SoftmaxAttention)]
    assert mixers
    for mixer in mixers:
        weights = mixer.attention_matrix(x)  # (B, H, T, T)
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
        _, _, v = mixer.project(x, jnp.broadcast_to(jnp.arange(9), (2, 9)))
        v = jnp.repeat(v, mixer.n_heads // mixer.n_kv_heads, axis=2)  # (B, T, H, D)
        mixed = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(2, 9, -1)
        np.testing.assert_allclose(mixer.o_proj(mixed), mixer(x), rtol=1e-5, atol=1e-6)


def test_a_hybrid_model_builds_each_of_its_sub_configs():
    specs = layer_specs("gla_softmax")  # pattern [gla, gla, gla, softmax]
    assert [spec.mixer for spec in specs] == ["gla", "gla", "gla", "softmax"]


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


@pytest.mark.parametrize("variant", ["softmax", "vq"])
def test_rematerialised_blocks_and_mixers_give_the_same_loss_and_gradients(variant):
    """``model.remat``: recomputing activations in the backward pass changes no number (vq sows an
    auxiliary loss inside the recomputed mixer)."""
    from lmzoo.train import init_train_state, loss_and_extra

    tokens = random_tokens(2, 17)
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    results = []
    for remat in ("none", "block", "mixer"):
        cfg = tiny_config(variant, f"model.remat={remat}")
        graphdef, state, _ = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))
        grad_fn = jax.jit(jax.value_and_grad(loss_and_extra, has_aux=True), static_argnums=2)
        (objective, _), grads = grad_fn(state["params"], state["extra"], graphdef, batch)
        results.append((objective, grads))
    (objective, grads), *others = results
    for other_objective, other_grads in others:
        np.testing.assert_allclose(other_objective, objective, rtol=1e-6)
        for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads)):
            np.testing.assert_allclose(h, g, rtol=1e-5, atol=1e-7)


def test_remat_setting_is_checked(capsys):
    with pytest.raises(SystemExit):
        tiny_config("softmax", "model.remat=layer")
    assert "model.remat='layer' is not valid (choose from: none, block, mixer)" in capsys.readouterr().err
