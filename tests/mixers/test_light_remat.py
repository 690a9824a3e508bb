"""``model.remat=light``: the mixers' short convs and float32 gated norms keep only their inputs between the passes.

Autodiff keeps the conv's K shifted views of its input and silu's intermediates (``lmzoo.ops.lti``,
tested in tests/ops/test_conv_memory.py), nine float32 copies of Mamba-2's gated norm input
(``family.ssm.gated_rms_norm``) and eight of the linear and delta-rule families' gated head norm
(``family.linear.gated_head_norm``): at model=small, T = 2048, 0.65 GiB a sequence of Gated DeltaNet's
1.15 GiB and 1.46 of Mamba-2's 3.4 GiB of residuals. With the option they are made again in the backward
pass; values and gradients equal autodiff's to float32 rounding (XLA fuses the two differently, so it
is not the default).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from mixer_checks import first_mixer, inputs

from lmzoo.mixers.family.linear import gated_head_norm
from lmzoo.mixers.family.ssm import gated_rms_norm
from lmzoo.ops.common import recompute_in_backward

B, T, H, D = 2, 37, 3, 8


def saved_bytes(fn, *args) -> int:
    _, backward = jax.vjp(fn, *args)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(backward))


def input_bytes(*args) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(args))


def vjp_results(fn, args, seed=5):
    """Outputs and the gradients for a random cotangent, jitted."""
    out, backward = jax.jit(lambda *a: jax.vjp(fn, *a))(*args)
    cotangent = jax.tree.map(lambda o: jax.random.normal(jax.random.key(seed), o.shape, o.dtype), out)
    return jax.tree.leaves((out, backward(cotangent)))


def assert_close(got, expected, tol):
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- Mamba-2's gated RMSNorm

def norm_inputs(dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    y, z = (jax.random.normal(key, (B, T, H * D), dtype) for key in keys[:2])
    weight = 1 + 0.1 * jax.random.normal(keys[2], (H * D,))
    return y, z, weight


def gated_norm(groups, recompute):
    norm = functools.partial(gated_rms_norm, groups=groups)
    return recompute_in_backward(norm) if recompute else norm


@pytest.mark.parametrize("groups", [1, 3])
def test_ssd_gated_norm_recomputed_saves_only_its_inputs(groups):
    args = norm_inputs(jnp.bfloat16)
    assert saved_bytes(gated_norm(groups, True), *args) <= input_bytes(*args)
    assert saved_bytes(gated_norm(groups, False), *args) > 4 * input_bytes(*args)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("groups", [1, 3])
def test_ssd_gated_norm_recomputed_gives_autodiffs_values_and_gradients(dtype, tol, groups):
    """Float32 to rounding; bf16 inputs and output (float32 inside) to one bf16 step of 2^-7."""
    args = norm_inputs(dtype)
    assert_close(vjp_results(gated_norm(groups, True), args), vjp_results(gated_norm(groups, False), args), tol)


# ----------------------------------------------------------------------------- the families' gated head norm

def head_norm_inputs(dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    o = jax.random.normal(keys[0], (B, T, H, D), dtype)
    gate = jax.random.normal(keys[1], (B, T, H * D), dtype)
    norm = nnx.RMSNorm(D, epsilon=1e-5, dtype=jnp.float32, rngs=nnx.Rngs(0))
    norm.scale[...] = 1 + 0.1 * jax.random.normal(keys[2], (D,))
    return nnx.split(norm), o, gate


def head_norm(graphdef, activation, dtype, recompute):
    """The head norm as a function of (the norm's weights, o, gate)."""
    def run(weights, o, gate):
        return gated_head_norm(nnx.merge(graphdef, weights), o, gate, activation, dtype, recompute=recompute)
    return run


@pytest.mark.parametrize("activation", [jax.nn.silu, jax.nn.sigmoid])
def test_gated_head_norm_recomputed_saves_only_its_inputs(activation):
    (graphdef, weights), o, gate = head_norm_inputs(jnp.bfloat16)
    args = (weights, o, gate)
    assert saved_bytes(head_norm(graphdef, activation, jnp.bfloat16, True), *args) <= input_bytes(*args)
    assert saved_bytes(head_norm(graphdef, activation, jnp.bfloat16, False), *args) > 4 * input_bytes(*args)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("activation", [jax.nn.silu, jax.nn.sigmoid])
def test_gated_head_norm_recomputed_gives_autodiffs_values_and_gradients(dtype, tol, activation):
    """Gradients of o, the gate and the norm's scale; float32 to rounding, bf16 to one bf16 step."""
    (graphdef, weights), o, gate = head_norm_inputs(dtype)
    args = (weights, o, gate)
    assert_close(vjp_results(head_norm(graphdef, activation, dtype, True), args),
                 vjp_results(head_norm(graphdef, activation, dtype, False), args), tol)


# ----------------------------------------------------------------------------- whole mixers

def mixer_run(variant, *overrides, segment_ids=None):
    """The first mixer of a tiny model as a pure function of (its parameters, x)."""
    graphdef, params = nnx.split(first_mixer(variant, *overrides))
    return (lambda params, x: nnx.merge(graphdef, params)(x, segment_ids=segment_ids)), params


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("variant", ["gated_deltanet", "mamba2", "kda", "gla", "mamba"])
def test_light_remat_keeps_less_and_gives_the_same_mixer(variant, documents):
    """Residuals of the mixer's forward shrink; outputs and every gradient (x and parameters) stay
    autodiff's to float32 rounding, with and without packed documents."""
    x = inputs(length=19)  # the ops' naive forms: compiled fast, and the op is not what the option changes
    segment_ids = jnp.repeat(jnp.asarray([[0] * 8 + [1] * 9 + [2] * 2]), x.shape[0], axis=0) if documents else None
    plain, params = mixer_run(variant, "attn.method=naive", segment_ids=segment_ids)
    light, light_params = mixer_run(variant, "attn.method=naive", "model.remat=light", segment_ids=segment_ids)
    assert saved_bytes(light, light_params, x) < saved_bytes(plain, params, x)
    assert_close(vjp_results(light, (light_params, x)), vjp_results(plain, (params, x)), 1e-5)
