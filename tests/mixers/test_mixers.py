"""The mixer protocol, checked for every registered variant (found through lmzoo.config.variant_names) and every
layer of its model: a hybrid's model has enough layers to build each of its sub-configs."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.mixers.softmax import SoftmaxAttention
from lmzoo.model import LM

from conftest import VARIANTS, fewest_layers, layer_specs, layers_to_check, tiny_config
from mixer_checks import compiled

VOCAB = 259


def build(variant: str, *overrides: str, seed: int = 0, layers: tuple[str, ...] | None = None):
    """The tiny model of ``variant`` with a layer of every kind its spec builds, each kind once and two layers at
    least (``fewest_layers``), or as ``layers`` says."""
    cfg = tiny_config(variant, *(layers or fewest_layers(variant)), *overrides)
    return cfg, LM(cfg, VOCAB, rngs=nnx.Rngs(seed))


def random_tokens(batch: int, length: int, seed: int = 1):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


# Every check compiled (op-by-op dispatch of every layer's steps is slow), at XLA's lowest backend
# optimisation, which changes compile time, not results (mixer_checks.compiled). Compiling is what these
# tests spend their time on, so each variant's checks share one program.
def steps(step_fn, xs, state, *, switch_at=None, switch_to=None):
    """``step_fn`` over ``xs`` [B, T, ...] from ``state`` in one scan: (outputs [B, T, ...], state reached at
    ``switch_at``). At ``switch_at`` the stepping goes on from ``switch_to`` instead of the state it reached."""
    def one(carry, inputs):
        state, reached = carry
        x_t, t = inputs
        if switch_at is not None:
            here = t == switch_at
            reached = jax.tree.map(lambda s, r: jnp.where(here, s, r), state, reached)
            state = jax.tree.map(lambda new, s: jnp.where(here, new, s), switch_to, state)
        y_t, state = step_fn(x_t, state)
        return (state, reached), y_t

    (_, reached), ys = jax.lax.scan(one, (state, state), (jnp.moveaxis(xs, 1, 0), jnp.arange(xs.shape[1])))
    return jnp.moveaxis(ys, 0, 1), reached


def assert_same_layout(state, expected, message):
    """Same structure, shapes and dtypes (checked while tracing: stepping on from ``state`` needs them)."""
    assert jax.tree.structure(state) == jax.tree.structure(expected), message
    for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
        assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype), message


def assert_same_state(state, expected, message):
    """Same structure, shapes and dtypes, and the same values up to float rounding."""
    assert_same_layout(state, expected, message)
    for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
        np.testing.assert_allclose(leaf, want, rtol=1e-5, atol=1e-5, err_msg=message)


LENGTH, CHANGED, PROMPT, MAX_LEN = 17, 9, 13, 20  # odd lengths; a prompt past softmax attn.window=4's ring buffer


def protocol_outputs(model, tokens, changed, x):
    """What the protocol checks compare, in one program. The model: logits of ``tokens`` and of ``changed``
    (one token changed), and logits stepping through ``tokens`` from its initial state. Each layer's mixer on
    ``x``: its forward; prefill of the first PROMPT steps; stepping from the initial state, switching at PROMPT
    to prefill's state (so the outputs after it continue from prefill), and the state stepping reached there;
    a softmax layer's attention matrix at work."""
    batch = tokens.shape[0]
    logits = model(jnp.concatenate([tokens, changed]))
    stepped, _ = steps(model.step, tokens, model.init_state(batch, MAX_LEN))
    layers = []
    for layer, block in enumerate(model.blocks):
        mixer, initial = block.mixer, block.mixer.init_state(batch, MAX_LEN)
        y_prefill, prefilled = mixer.prefill(x[:, :PROMPT], MAX_LEN)
        assert_same_layout(prefilled, initial, f"layer {layer}: prefill's state is not laid out as init_state's")
        y_stepped, reached = steps(mixer.step, x, initial, switch_at=PROMPT, switch_to=prefilled)
        out = {"forward": mixer(x), "prefill": y_prefill, "prefilled": prefilled, "stepped": y_stepped,
               "reached": reached}
        if isinstance(mixer, SoftmaxAttention):
            out.update(softmax_weights_at_work(mixer, x))
        layers.append(out)
    return logits[:batch], logits[batch:], stepped, layers


def softmax_weights_at_work(mixer, x):
    """A softmax layer's attention matrix [B, H, T, T], and its output with that matrix mixing the values."""
    batch, length, _ = x.shape
    weights = mixer.attention_matrix(x)
    _, _, v = mixer.project(x, jnp.broadcast_to(jnp.arange(length), (batch, length)))
    v = jnp.repeat(v, mixer.n_heads // mixer.n_kv_heads, axis=2)  # (B, T, H, D)
    mixed = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(batch, length, -1)
    return {"weights": weights, "output_from_weights": mixer.output(mixed, x)}


@pytest.mark.parametrize("variant", [*VARIANTS, "softmax attn.window=4"])
def test_causal_decoding_and_prefill_equal_the_forward(variant):
    """The model is causal (a changed token changes only the logits from it on), and stepping it through a
    sequence token by token gives its forward's logits. Each layer's mixer: stepping from the initial state
    gives the forward's outputs; prefill's output is the forward's (mixing is causal) and its state the one
    stepping leaves (at an odd length, past a window's ring buffer); stepping on from it gives the forward's
    outputs on the longer sequence. A softmax layer's attention matrix has rows summing to one and, times its
    values, gives its output."""
    name, *overrides = variant.split()
    _, model = build(name, *overrides, layers=layers_to_check(name))
    tokens = random_tokens(2, LENGTH)
    changed = tokens.at[:, CHANGED].set((tokens[:, CHANGED] + 1) % VOCAB)
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, 32))
    before, after, stepped, layers = compiled(protocol_outputs, model)(tokens, changed, x)

    np.testing.assert_array_equal(before[:, :CHANGED], after[:, :CHANGED], err_msg="not causal")
    assert not np.allclose(before[:, CHANGED:], after[:, CHANGED:]), "a changed token changes nothing"
    np.testing.assert_allclose(stepped, before, rtol=1e-4, atol=1e-4, err_msg="model decoding")
    for layer, out in enumerate(layers):
        message, forward_out = f"layer {layer}", out["forward"]
        np.testing.assert_allclose(out["prefill"], forward_out[:, :PROMPT], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{message}: prefill")
        np.testing.assert_allclose(out["stepped"][:, :PROMPT], forward_out[:, :PROMPT], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{message}: stepping from the initial state")
        assert_same_state(out["prefilled"], out["reached"], f"{message}: prefill's state is not stepping's")
        np.testing.assert_allclose(out["stepped"][:, PROMPT:], forward_out[:, PROMPT:], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{message}: stepping on from prefill's state")
        if "weights" in out:
            np.testing.assert_allclose(out["weights"].sum(-1), 1.0, rtol=1e-6, err_msg=f"{message}: rows of weights")
            np.testing.assert_allclose(out["output_from_weights"], forward_out, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{message}: the attention matrix times the values")


def model_prefill_outputs(model, tokens):
    """The forward on all of ``tokens``; prefill of the first 7 with room for all (stepping on through the rest from
    its state), with room for exactly the prompt, and without ``max_len`` (room for the prompt alone)."""
    length = tokens.shape[1]
    prefill_logits, state = model.prefill(tokens[:, :7], length)
    continued, _ = steps(model.step, tokens[:, 7:], state)
    return model(tokens), prefill_logits, continued, model.prefill(tokens[:, :7])[1], model.prefill(tokens[:, :7], 7)[1]


def test_model_prefill_then_steps_equal_the_forward():
    _, model = build("gla_softmax")
    full, prefill_logits, continued, exact, seven = compiled(model_prefill_outputs, model)(random_tokens(2, 12))
    np.testing.assert_allclose(prefill_logits, full[:, :7], rtol=1e-5, atol=1e-5)  # causal: the prompt's forward
    np.testing.assert_allclose(continued, full[:, 7:], rtol=1e-4, atol=1e-4)
    assert_same_state(exact, seven, "max_len=None")  # no max_len: a cache for the prompt alone


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
    from lmzoo.run.steps import init_train_state, loss_and_extra

    tokens = random_tokens(2, 17)
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    results = []
    for remat in ("none", "block", "mixer", "light"):
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
    assert "model.remat='layer' is not valid (choose from: none, block, mixer, light)" in capsys.readouterr().err
