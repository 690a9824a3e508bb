"""The mixer protocol, checked for every registered variant (found through configs/attn) and every
layer of its model: a hybrid's model has enough layers to build each of its sub-configs."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.mixers.softmax import SoftmaxAttention, SoftmaxConfig
from lmzoo.model import LM

from conftest import VARIANTS, covering_layers, layer_specs, tiny_config
from mixer_checks import compiled

VOCAB = 259
WITH_SOFTMAX_LAYERS = [v for v in VARIANTS if any(isinstance(spec, SoftmaxConfig) for spec in layer_specs(v))]


def build(variant: str, *overrides: str, seed: int = 0):
    """The tiny model of ``variant`` with a layer of every kind its spec builds."""
    cfg = tiny_config(variant, f"model.n_layers={covering_layers(variant)}", *overrides)
    return cfg, LM(cfg, VOCAB, rngs=nnx.Rngs(seed))


def random_tokens(batch: int, length: int, seed: int = 1):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


# Every call compiled (op-by-op dispatch of every layer's steps is slow), at XLA's lowest backend
# optimisation, which changes compile time, not results (mixer_checks.compiled).
def forward(module, *args):
    return module(*args)


def step(module, x_t, state):
    return module.step(x_t, state)


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_decoding_equals_forward(variant):
    _, model = build(variant)
    tokens = random_tokens(2, 11)
    logits = compiled(forward, model)(tokens)
    state, stepped, model_step = model.init_state(2, 16), [], compiled(step, model)
    for t in range(tokens.shape[1]):
        step_logits, state = model_step(tokens[:, t], state)
        stepped.append(step_logits)
    np.testing.assert_allclose(jnp.stack(stepped, axis=1), logits, rtol=1e-4, atol=1e-4)


def assert_same_state(state, expected, message):
    """Same structure, shapes and dtypes, and the same values up to float rounding."""
    assert jax.tree.structure(state) == jax.tree.structure(expected), message
    for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
        assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype), message
        np.testing.assert_allclose(leaf, want, rtol=1e-5, atol=1e-5, err_msg=message)


def step_through(mixer_step, x, state):
    outputs = []
    for t in range(x.shape[1]):
        y_t, state = mixer_step(x[:, t], state)
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
        mixer_forward, mixer_step = compiled(forward, mixer), compiled(step, mixer)
        expected = mixer_forward(x[:, :prompt])
        y, state = compiled(lambda m, x: m.prefill(x, max_len), mixer)(x[:, :prompt])
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5, err_msg=message)
        y_stepped, stepped = step_through(mixer_step, x[:, :prompt], mixer.init_state(2, max_len))
        np.testing.assert_allclose(y_stepped, expected, rtol=1e-5, atol=1e-5, err_msg=message)
        assert_same_state(state, stepped, message)
        continued, _ = step_through(mixer_step, x[:, prompt:], state)
        full = mixer_forward(x)
        np.testing.assert_allclose(continued, full[:, prompt:], rtol=1e-5, atol=1e-5, err_msg=message)


def test_model_prefill_then_steps_equal_the_forward():
    _, model = build("gla_softmax")
    tokens = random_tokens(2, 12)
    model_forward, model_step = compiled(forward, model), compiled(step, model)
    logits, state = compiled(lambda m, t: m.prefill(t, 12), model)(tokens[:, :7])
    np.testing.assert_allclose(logits, model_forward(tokens[:, :7]), rtol=1e-5, atol=1e-5)
    stepped = []
    for t in range(7, 12):
        step_logits, state = model_step(tokens[:, t], state)
        stepped.append(step_logits)
    np.testing.assert_allclose(jnp.stack(stepped, axis=1), model_forward(tokens)[:, 7:], rtol=1e-4, atol=1e-4)
    _, exact = compiled(lambda m, t: m.prefill(t), model)(tokens[:, :7])  # no max_len: a cache for the prompt alone
    assert_same_state(exact, compiled(lambda m, t: m.prefill(t, 7), model)(tokens[:, :7])[1], "max_len=None")


@pytest.mark.parametrize("variant", VARIANTS)
def test_causality(variant):
    _, model = build(variant)
    tokens = random_tokens(2, 17)
    changed = tokens.at[:, 9].set((tokens[:, 9] + 1) % VOCAB)
    model_forward = compiled(forward, model)
    before, after = model_forward(tokens), model_forward(changed)
    np.testing.assert_array_equal(before[:, :9], after[:, :9])
    assert not np.allclose(before[:, 9:], after[:, 9:])


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
        np.testing.assert_allclose(mixer.output(mixed, x), mixer(x), rtol=1e-5, atol=1e-6)


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
    from lmzoo.steps import init_train_state, loss_and_extra

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
