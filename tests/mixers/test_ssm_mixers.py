"""State-space mixers beyond the generic protocol tests: every form of the parallel forward agrees,
the attention matrices reproduce the layers' outputs, state sizes count the decoding state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.config import ConfigError, ModelConfig
from lmzoo.mixers import MixerContext, build_mixer
from lmzoo.mixers.h3 import H3Config
from lmzoo.mixers.mamba import MambaConfig
from lmzoo.mixers.mamba2 import Mamba2Config
from lmzoo.ops import selective_attention, selective_scan, ssd, ssd_attention
from lmzoo.ops.selective_scan import effective_delta
from lmzoo.positions import Positions

from conftest import tiny_config
from mixer_checks import step_through
from op_checks import F32_TOL, rel_err

LENGTH = 40  # several chunks of 16, the last one partial


def mixer_of(variant, *overrides):
    """The first layer's mixer of the tiny test model (same seed, same parameters whatever the method)."""
    cfg = tiny_config(variant, *overrides)
    m = cfg.model
    ctx = MixerContext(m.d_model, m.n_heads, 0, m.n_layers, jnp.dtype(m.dtype), Positions(cfg.pos.kind), m.init_std)
    return build_mixer(cfg.attn, ctx, rngs=nnx.Rngs(0))


@nnx.jit
def forward(mixer, x):
    return mixer(x)


def inputs(length=LENGTH, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((2, length, 32)), jnp.float32)


@pytest.mark.parametrize(
    "variant, overrides",
    [
        ("mamba", ("attn.method=chunk", "attn.chunk_size=16")),
        ("mamba", ("attn.method=assoc",)),
        ("mamba2", ("attn.method=chunk", "attn.chunk_size=16")),
        ("h3", ("attn.method=parallel",)),
        ("h3", ("attn.method=fft",)),
    ],
)
def test_every_form_gives_the_recurrent_forward(variant, overrides):
    x = inputs()
    recurrent = mixer_of(variant, "attn.method=naive")
    np.testing.assert_allclose(forward(mixer_of(variant, *overrides), x), forward(recurrent, x), rtol=1e-5, atol=1e-6)


@nnx.jit
def mamba_hidden_attention(mixer, x):
    """(α applied to u, the scan's y before D and gate, attention_matrix, α averaged per head)."""
    u, delta, b, c, _, _ = mixer.ssm_inputs(x)
    y, _ = selective_scan(u, delta, mixer.A(), b, c, delta_bias=mixer.dt_bias[...], delta_softplus=True, method="scan")
    delta = effective_delta(delta, mixer.dt_bias[...], True)
    per_channel = selective_attention(delta, mixer.A(), b, c)  # (B, E, T, T)
    batch, _, length, _ = per_channel.shape
    groups = per_channel.reshape(batch, mixer.n_heads, -1, length, length).mean(axis=2)  # contiguous channel groups
    return jnp.einsum("bdij,bjd->bid", per_channel, u), y, mixer.attention_matrix(x), groups


def test_mamba_hidden_attention_reproduces_the_scan():
    mixed, y, weights, groups = mamba_hidden_attention(mixer_of("mamba"), inputs(17))
    np.testing.assert_allclose(mixed, y, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weights, groups, rtol=1e-5, atol=1e-7)


@nnx.jit
def mamba2_attention(mixer, x):
    """(weights applied to x, SSD's y before D, attention_matrix, weights averaged per model head)."""
    xs, dt, b, c, _, _ = mixer.ssm_inputs(x)
    y, _ = ssd(xs, dt, mixer.A(), b, c, method="scan")
    weights = ssd_attention(dt, mixer.A(), b, c)  # (B, H_ssm, T, T)
    batch, _, length, _ = weights.shape
    heads = weights.reshape(batch, mixer.n_heads, -1, length, length).mean(axis=2)
    return jnp.einsum("bhij,bjhp->bihp", weights, xs), y, mixer.attention_matrix(x), heads


@pytest.mark.parametrize("overrides", [(), ("attn.head_dim=8", "attn.n_groups=2")])
def test_mamba2_attention_reproduces_ssd(overrides):
    mixed, y, weights, heads = mamba2_attention(mixer_of("mamba2", *overrides), inputs(17))
    np.testing.assert_allclose(mixed, y, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weights, heads, rtol=1e-6, atol=1e-7)


@nnx.jit
def h3_attention(mixer, x):
    """(out_proj of attention_matrix applied to v, the layer's output)."""
    _, _, v, _ = mixer.project(x)
    mixed = jnp.einsum("bhij,bjhp->bihp", mixer.attention_matrix(x), v)
    return mixer.out_proj(mixed.reshape(*x.shape[:2], -1)), mixer(x)


def test_h3_attention_reproduces_the_layer():
    by_weights, y = h3_attention(mixer_of("h3", "attn.method=fft"), inputs(17))
    np.testing.assert_allclose(by_weights, y, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("variant", ["h3", "mamba", "mamba2"])
def test_state_size_counts_the_decoding_state(variant):
    mixer = mixer_of(variant)
    floats = sum(a.size * (2 if jnp.iscomplexobj(a) else 1) for a in jax.tree.leaves(mixer.init_state(1, 64)))
    assert mixer.state_size(64) == floats == mixer.state_size(4096)  # O(1) in the sequence length


def test_mamba_initialisation():
    mixer = mixer_of("mamba")
    dt = jax.nn.softplus(mixer.dt_bias[...])
    assert float(dt.min()) >= 0.001 * 0.999 and float(dt.max()) <= 0.1 * 1.001
    np.testing.assert_allclose(mixer.A()[3], -np.arange(1, 17), rtol=1e-6)  # S4D-real


@pytest.mark.parametrize(
    "config, message",
    [
        (MambaConfig(name="m", mixer="mamba", method="parallel"), "attn.method='parallel'"),
        (MambaConfig(name="m", mixer="mamba", dt_min=0.1, dt_max=0.01), "attn.dt_max"),
        (Mamba2Config(name="m", mixer="mamba2", n_groups=3), "attn.n_groups=3"),
        (Mamba2Config(name="m", mixer="mamba2", head_dim=48), "attn.head_dim=48"),
        (H3Config(name="h", mixer="h3", d_state=15), "attn.d_state=15"),
        (H3Config(name="h", mixer="h3", method="chunk"), "naive, parallel, fft"),
    ],
)
def test_bad_settings_are_config_errors(config, message):
    with pytest.raises(ConfigError, match=message):
        config.check(ModelConfig())


# ----------------------------------------------------------------------------- packed documents
# Three documents of 10, 14 and 13 steps: with chunks of 16 the second starts inside the first chunk
# and runs across its edge, and so does the third across the next.

DOCUMENTS = (10, 14, 13)
EDGES = np.cumsum((0, *DOCUMENTS))
SEGMENT_IDS = jnp.asarray(np.repeat([[0, 1, 2]], 2, axis=0).repeat(DOCUMENTS, axis=1))  # (B, 37)


@nnx.jit
def packed(mixer, x, segment_ids):
    return mixer(x, segment_ids=segment_ids), mixer.attention_matrix(x, segment_ids=segment_ids)


@nnx.jit
def alone(mixer, x):
    return mixer(x), mixer.attention_matrix(x)


@pytest.mark.parametrize(
    "variant, overrides",
    [
        # the default forms run in every variant's test in test_segments.py
        ("mamba", ("attn.method=chunk", "attn.chunk_size=16")),
        ("mamba2", ("attn.method=chunk", "attn.chunk_size=16")),
        ("h3", ("attn.method=fft",)),
        ("h3", ("attn.method=naive",)),
    ],
)
def test_packed_documents_equal_each_document_alone(variant, overrides):
    mixer, x = mixer_of(variant, *overrides), inputs(int(EDGES[-1]))
    y, weights = packed(mixer, x, SEGMENT_IDS)
    inside = np.zeros(weights.shape[-2:], bool)
    for start, end in zip(EDGES[:-1], EDGES[1:]):
        y_alone, weights_alone = alone(mixer, x[:, start:end])
        assert rel_err(y[:, start:end], y_alone) <= F32_TOL, (start, end)
        assert rel_err(weights[..., start:end, start:end], weights_alone) <= F32_TOL, (start, end)
        inside[start:end, start:end] = True
    assert np.all(np.asarray(weights)[..., ~inside] == 0)


@pytest.mark.parametrize("variant", ["h3"])  # the masked long convolution; the ops' tests check the rest
def test_one_document_changes_nothing(variant):
    """segment_ids equal everywhere: the same numbers as without them."""
    mixer, x = mixer_of(variant), inputs(21)
    y, weights = packed(mixer, x, jnp.zeros((2, 21), jnp.int32))
    y_ref, weights_ref = alone(mixer, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weights, weights_ref, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- mamba with negative eigenvalues

NEGATIVE = "attn.negative_eigenvalues=true"


@nnx.jit
def signed_mamba(mixer, x):
    """(forward, stepped outputs and state, prefill's state, the layer from the op's naive form, α applied to u, the
    scan's y before D and gate)."""
    stepped, state = step_through(mixer, x, mixer.init_state(x.shape[0], x.shape[1]))
    _, prefilled = mixer.prefill(x)
    u, delta, b, c, z, _ = mixer.ssm_inputs(x)
    scan = lambda **kw: selective_scan(u, delta, mixer.A(), b, c, delta_bias=mixer.dt_bias[...], delta_softplus=True,  # noqa: E731
                                       method="naive", negative_eigenvalues=True, **kw)[0]
    alpha = selective_attention(effective_delta(delta, mixer.dt_bias[...], True), mixer.A(), b, c,
                                negative_eigenvalues=True)
    return (mixer(x), stepped, state, prefilled, mixer.out_proj(scan(D=mixer.D[...], z=z)),
            jnp.einsum("bdij,bjd->bid", alpha, u), scan())


def test_mamba_with_negative_eigenvalues_runs_the_signed_scan_and_decodes_as_it_runs():
    x = inputs(7)
    out, stepped, state, prefilled, layer, mixed, y = signed_mamba(mixer_of("mamba", NEGATIVE), x)
    np.testing.assert_allclose(out, layer, rtol=1e-6, atol=1e-9)  # the layer runs the signed transition
    assert rel_err(forward(mixer_of("mamba"), x), out) > 1e-5  # which differs from the default's at init already
    np.testing.assert_allclose(stepped, out, rtol=1e-5, atol=1e-7)  # decoding equals the forward
    np.testing.assert_allclose(state["ssm"], prefilled["ssm"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mixed, y, rtol=1e-4, atol=1e-7)  # the hidden attention reproduces the scan
    np.testing.assert_allclose(forward(mixer_of("mamba", NEGATIVE, "attn.method=assoc"), x), out, rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("method", ["chunk", "pallas", "jla"])
def test_mamba_negative_eigenvalues_refuse_the_log_space_forms_in_one_line(method):
    config = MambaConfig(name="m", mixer="mamba", method=method, negative_eigenvalues=True)
    with pytest.raises(ConfigError, match=rf"^attn.negative_eigenvalues=true needs attn.method in auto, naive, scan, "
                                          rf"assoc \(the forms that multiply transitions\); attn.method='{method}'"):
        config.check(ModelConfig())
