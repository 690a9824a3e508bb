"""Linear-attention family mixers (every variant whose spec is a ``LinearFamilyConfig``: linear,
retnet, gla, ...): what the generic protocol tests leave out.

Each is a ``LinearFamilyMixer``: its forward is ``output(x, mix(*heads(x, positions))[0])``, where
``heads`` makes the op's inputs (v third), ``mix`` runs the op, ``output`` gates / normalises /
projects. The family's variants are found through lmzoo.config.variant_names; FAMILY adds cases for other knobs.
Computations run compiled (XLA backend optimisation off): op-by-op dispatch of scans is slow.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.mixers.family.linear import LinearFamilyConfig
from lmzoo.mixers.linear import RandomFeatures
from lmzoo.mixers.retnet import retention_log_decays
from lmzoo.positions import default_positions

from conftest import VARIANTS, tiny_config
from mixer_checks import VOCAB, build, compiled, first_mixer, inputs, assert_refused_in_one_line

LINEAR_FAMILY = [v for v in VARIANTS if isinstance(tiny_config(v).attn, LinearFamilyConfig)]
FEATURE_MAPS = [("linear", "attn.feature_map=favor+"), ("linear", "attn.feature_map=relu"),
                ("linear", "attn.feature_map=identity", "attn.normalize=false")]
FAMILY = [(variant,) for variant in LINEAR_FAMILY] + FEATURE_MAPS
IDS = [" ".join(config) for config in FAMILY]


def mixing_three_ways(mixer, x):
    """(attention matrix times values, the op's mixing, that mixing through ``output``, the forward)."""
    heads = mixer.heads(x, default_positions(*x.shape[:2]))
    mixed = jnp.einsum("bhts,bshd->bthd", mixer.attention_matrix(x), heads[2])  # (B, T, H, Dv)
    return mixed, mixer.mix(*heads)[0], mixer.output(x, mixed), mixer(x)


@pytest.mark.parametrize("config", FAMILY, ids=IDS)
def test_attention_matrix_times_values_is_the_mixing(config):
    mixer = first_mixer(*config)
    if not mixer.matrix_acts_on_values:
        pytest.skip("its weights act on other values than v: its own tests check them")
    from_matrix, mixed, output_from_matrix, forward = compiled(mixing_three_ways, mixer)(inputs())
    np.testing.assert_allclose(from_matrix, mixed, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(output_from_matrix, forward, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", FEATURE_MAPS, ids=IDS[-len(FEATURE_MAPS):])
def test_other_feature_maps_step_equals_forward(config):
    mixer = first_mixer(*config)
    x = inputs(9, seed=3)
    step = compiled(lambda m, x_t, state: m.step(x_t, state), mixer)
    state, outputs = mixer.init_state(2, 9), []
    for t in range(9):
        y_t, state = step(x[:, t], state)
        outputs.append(y_t)
    np.testing.assert_allclose(jnp.stack(outputs, axis=1), compiled(lambda m, x: m(x), mixer)(x), rtol=1e-5, atol=1e-5)


def mixing_by_method(mixer, x, methods):
    heads = mixer.heads(x, default_positions(*x.shape[:2]))
    return {method: mixer.mix(*heads, method=method)[0] for method in methods}


@pytest.mark.parametrize("variant", LINEAR_FAMILY)
def test_every_method_gives_the_same_output(variant):
    methods = [m for m in tiny_config(variant).attn.forms if m != "jla"]  # jla's path: tests/ops/test_kernels.py
    mixed = compiled(functools.partial(mixing_by_method, methods=methods), first_mixer(variant))(inputs(21, seed=4))
    for method in methods:
        np.testing.assert_allclose(mixed[method], mixed["parallel"], rtol=1e-5, atol=1e-6, err_msg=method)


@pytest.mark.parametrize("config", FAMILY, ids=IDS)
def test_state_size_counts_the_decoding_state(config):
    mixer = first_mixer(*config)
    floats = [s for s in jax.tree.leaves(mixer.init_state(1, 100)) if jnp.issubdtype(s.dtype, jnp.floating)]
    assert mixer.state_size(100) == sum(s.size for s in floats) == mixer.state_size(10_000)


def test_favor_features_estimate_the_softmax_kernel():
    mixer = first_mixer("linear", "attn.feature_map=favor+", "attn.n_features=4096")
    q, k = 0.5 * jax.random.normal(jax.random.key(5), (2, 64, 8))  # 64 pairs of head-dim-8 vectors
    estimate = jnp.sum(mixer.features(q) * mixer.features(k), axis=-1)
    exact = jnp.exp(jnp.sum(q * k, axis=-1) / jnp.sqrt(8.0))
    assert float(jnp.mean(jnp.abs(estimate / exact - 1))) < 0.05
    assert bool(jnp.all(mixer.features(q) > 0))


def test_random_features_are_saved_but_not_trained():
    _, model = build("linear", "attn.feature_map=favor+")
    _, params, extra = nnx.split(model, nnx.Param, ...)  # what the trainer optimises / also checkpoints
    assert not any("projection" in str(path) for path, _ in nnx.to_flat_state(params))
    fixed = [v for path, v in nnx.to_flat_state(extra) if "projection" in str(path)]
    assert len(fixed) == 2 and all(v.shape == (8, 8) for v in fixed)
    assert len(jax.tree.leaves(nnx.state(model, RandomFeatures))) == 2  # found by its own variable type


def test_retnet_decays_and_rotation():
    np.testing.assert_allclose(jnp.exp(retention_log_decays(4)), 1 - 2.0 ** -np.arange(5, 9), rtol=1e-7)
    x = inputs(5)
    positions = default_positions(2, 5)
    for pos, rotated in (("rope", True), ("none", False)):
        mixer = first_mixer("retnet", f"pos={pos}")
        q = mixer.heads(x, positions)[0]
        unrotated = mixer.q_proj(x).reshape(q.shape)
        assert np.allclose(q, unrotated) != rotated


def test_gla_gates_follow_the_temperature():
    x = inputs(7)
    for temperature in (1.0, 16.0):
        mixer = first_mixer("gla", f"attn.gate_temperature={temperature}")
        log_g = mixer.heads(x)[3]
        logits = mixer.gate_up(mixer.gate_down(x)).reshape(log_g.shape)
        np.testing.assert_allclose(log_g, jax.nn.log_sigmoid(logits) / temperature, rtol=1e-6)
        assert bool(jnp.all(log_g <= 0))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (("linear", "attn.method=fused"), ["attn.method='fused'", "parallel, scan, assoc, chunk"]),
        (("retnet", "attn.method=triton"), ["attn.method='triton'", "chunk, chunk_recompute, pallas"]),
        (("gla", "attn.chunk_size=0"), ["attn.chunk_size=0"]),
        (("retnet", "attn.method=pallas", "attn.chunk_size=24"), ["attn.chunk_size=24", "multiple of 16"]),
        (("linear", "attn.feature_map=softplus"), ["attn.feature_map='softplus'", "elu+1, relu, identity, favor+"]),
        (("linear", "attn.feature_map=identity"), ["attn.normalize=true", "identity"]),
        (("linear", "attn.n_features=16"), ["attn.n_features", "favor+"]),
        (("gla", "attn.key_ratio=0.3"), ["attn.key_ratio=0.3", "model.n_heads=4"]),
        (("gla", "attn.gate_temperature=0"), ["attn.gate_temperature=0"]),
        (("gated_deltanet", "attn.gate=vector"), ["attn.gate='vector'", "head, channel"]),
        (("deltanet", "attn.conv_size=0"), ["attn.conv_size=0"]),
        (("deltanet", "attn.method=assoc"), ["attn.method='assoc'", "naive, parallel, chunk"]),
        (("gated_deltanet", "attn.dt_max=0.0001"), ["attn.dt_max=0.0001", "attn.dt_min"]),
    ],
)
def test_bad_settings_fail_with_one_line(overrides, expected, capsys):
    assert_refused_in_one_line(overrides, expected, capsys)


@pytest.mark.parametrize("variant", LINEAR_FAMILY)
def test_bfloat16_compute_stays_close_to_float32(variant):
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, VOCAB)
    _, model32 = build(variant)
    _, model16 = build(variant, "model.dtype=bfloat16")
    logits16 = compiled(lambda m, t: m(t), model16)(tokens)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, compiled(lambda m, t: m(t), model32)(tokens), atol=5e-2)
