"""The short causal convolution with ``recompute=True`` keeps only its inputs between the passes.

Autodiff through ``causal_conv1d`` keeps each of its K shifted views of x for its multiply (and
silu's intermediates after it): 7 copies of x at K = 4, 756 MiB a sequence of Gated DeltaNet's 12
layers at model=small, T = 2048. ``recompute=True`` (``model.remat=light``) makes them again in the
backward pass; its values and gradients are autodiff's through the same computation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops import lti

B, T, C, K = 2, 37, 6, 4  # T odd, not a multiple of K
# the last shorter than K
SEGMENT_IDS = jnp.asarray(np.repeat([[0, 1, 2, 3]], B, axis=0).repeat([10, 13, 12, 2], axis=1))


def saved_bytes(fn, *args) -> int:
    _, backward = jax.vjp(fn, *args)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(backward))


def input_bytes(*args) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(args))


def conv_inputs(dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(keys[0], (B, T, C), dtype)
    weight, bias = jax.random.normal(keys[1], (K, C)), jax.random.normal(keys[2], (C,))
    state = jax.random.normal(keys[3], (B, K - 1, C), dtype)
    return x, weight, bias, state


def conv(activation, segment_ids, recompute=True):
    """The op as a function of its differentiable inputs."""
    def run(x, weight, bias, state):
        return lti.causal_conv1d(x, weight, bias, initial_state=state, segment_ids=segment_ids, activation=activation,
                                 recompute=recompute)
    return run


autodiff_conv = functools.partial(conv, recompute=False)  # plain autodiff, keeping the shifted views


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("activation", [None, jax.nn.silu])
def test_conv_saves_only_its_inputs(activation, documents):
    segment_ids = SEGMENT_IDS if documents else None
    args = conv_inputs(jnp.bfloat16)
    assert saved_bytes(conv(activation, segment_ids), *args) <= input_bytes(*args, segment_ids)
    assert saved_bytes(autodiff_conv(activation, segment_ids), *args) > 2 * input_bytes(*args, segment_ids)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("initial_state", [False, True])
def test_conv_gives_autodiffs_values_and_gradients(dtype, tol, documents, initial_state):
    """Random cotangents on the output and the final window; with and without documents and an initial
    state. Float32 to rounding; bf16 (x, the state and every product in bf16) to one bf16 step of 2^-7."""
    segment_ids = SEGMENT_IDS if documents else None
    x, weight, bias, state = conv_inputs(dtype)
    results = []
    for make in (conv, autodiff_conv):
        fn = make(jax.nn.silu, segment_ids)
        if not initial_state:
            fn = functools.partial(lambda fn, x, w, b: fn(x, w, b, None), fn)
        args = (x, weight, bias, state) if initial_state else (x, weight, bias)
        out, backward = jax.jit(lambda *a, fn=fn: jax.vjp(fn, *a))(*args)
        keys = jax.random.split(jax.random.key(9), 2)
        cotangent = tuple(jax.random.normal(key, o.shape, o.dtype) for key, o in zip(keys, out))
        results.append((out, backward(cotangent)))
    (out, grads), (expected_out, expected_grads) = results
    for got, expected in zip(jax.tree.leaves((out, grads)), jax.tree.leaves((expected_out, expected_grads))):
        assert got.dtype == expected.dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), rtol=tol, atol=tol)


def test_conv_activation_is_applied_to_the_output_not_the_window():
    x, weight, bias, state = conv_inputs(jnp.float32)
    y, final = lti.causal_conv1d(x, weight, bias, initial_state=state)
    y_silu, final_silu = lti.causal_conv1d(x, weight, bias, initial_state=state, activation=jax.nn.silu)
    np.testing.assert_allclose(y_silu, jax.nn.silu(y), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(final_silu, final)
