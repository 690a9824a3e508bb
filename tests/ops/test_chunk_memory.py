"""The chunk forms keep only their inputs between the forward and the backward pass.

Autodiff through GLA's and the delta rule's chunk forms would save their within-chunk products
(~15x the inputs at training shapes, 135 MiB a sequence per layer for GLA at model=small, T = 2048);
``recompute_in_backward`` keeps the inputs and recomputes the rest in the backward pass. The
residuals are what ``jax.vjp``'s backward function closes over. Values, gradients and final states
against the reference forms are in test_linear_ops.py and test_delta_rule.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops import delta_rule, gla
from lmzoo.ops.common import recompute_in_backward

B, T, H, DK, DV = 1, 77, 2, 8, 16  # T: two whole chunks of 32 and a partial one


def inputs(gates: str, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 6)
    q, k = (jax.random.normal(key, (B, T, H, DK), jnp.bfloat16) for key in keys[:2])
    v = jax.random.normal(keys[2], (B, T, H, DV), jnp.bfloat16)
    beta = jax.nn.sigmoid(jax.random.normal(keys[3], (B, T, H)))
    shape = {"none": None, "head": (B, T, H), "channel": (B, T, H, DK)}[gates]
    log_g = None if shape is None else jax.nn.log_sigmoid(jax.random.normal(keys[4], shape)) / 4
    state = jax.random.normal(keys[5], (B, H, DK, DV))
    return q, k, v, beta, log_g, state


def saved_bytes(fn, *args) -> int:
    _, backward = jax.vjp(fn, *args)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(backward))


def input_bytes(*args) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(args))


@pytest.mark.parametrize("gates", ["none", "head", "channel"])
def test_gla_chunk_form_saves_only_its_inputs(gates):
    q, k, v, _, log_g, state = inputs(gates)

    def run(q, k, v, log_g, state):
        return gla(q, k, v, log_g, initial_state=state, method="chunk_recompute", chunk_size=32)

    args = (q, k, v, log_g, state)
    assert saved_bytes(run, *args) <= input_bytes(*args)


@pytest.mark.parametrize("gates", ["none", "head", "channel"])
def test_delta_rule_chunk_form_saves_only_its_inputs(gates):
    q, k, v, beta, log_g, state = inputs(gates)

    def run(q, k, v, beta, log_g, state):
        return delta_rule(q, k, v, beta, log_g, initial_state=state, method="chunk_recompute", chunk_size=32)

    args = (q, k, v, beta, log_g, state)
    assert saved_bytes(run, *args) <= input_bytes(*args)


def test_recomputing_in_the_backward_pass_gives_autodiffs_gradients():
    """Random cotangents on both outputs; an absent (None) input is passed through."""
    def form(x, y, absent):
        assert absent is None
        h = jnp.cumsum(jnp.tanh(x) * y, axis=0)
        return h * x, jnp.sum(h**2, axis=0)

    x, y = jax.random.normal(jax.random.key(1), (2, 9, 5))
    cotangent = tuple(jax.random.normal(jax.random.key(2 + i), shape) for i, shape in enumerate([(9, 5), (5,)]))
    outputs = []
    for fn in (form, recompute_in_backward(form)):
        out, backward = jax.vjp(lambda x, y, fn=fn: fn(x, y, None), x, y)
        outputs.append((out, backward(cotangent)))
    (out, grads), (out_r, grads_r) = outputs
    for a, b in zip(jax.tree.leaves((out, grads)), jax.tree.leaves((out_r, grads_r))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
