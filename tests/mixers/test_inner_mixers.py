"""The test-time-training family (``lmzoo.mixers.family.inner``: TTT-Linear, Titans) beyond the protocol every mixer
passes (tests/mixers/test_mixers.py, tests/ops/test_segments.py): its decoding state's size, as the README's variant
table gives it, and its settings' one-line errors. Built, never compiled: seconds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from lmzoo.config import ConfigError, ModelConfig
from lmzoo.mixers import MixerContext, build_mixer
from lmzoo.mixers.titans import TitansConfig
from lmzoo.mixers.ttt_linear import TTTLinearConfig
from lmzoo.positions import Positions

from conftest import tiny_config


def mixer_of(variant, *overrides):
    cfg = tiny_config(variant, *overrides)
    m = cfg.model
    ctx = MixerContext(m.d_model, m.n_heads, 0, m.n_layers, jnp.dtype(m.dtype), Positions(cfg.pos.kind), m.init_std)
    return cfg, build_mixer(cfg.attn, ctx, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("variant, per_head", [("ttt_linear", lambda d: 2 * d * d + 2 * d),
                                               ("titans", lambda d: 3 * d * d)])
def test_state_size_counts_the_decoding_state(variant, per_head):
    """The op's state (the README's per-head count) and the conv window over q, k and v; O(1) in the length."""
    cfg, mixer = mixer_of(variant)
    heads, width = cfg.model.n_heads, cfg.model.d_model
    state = jax.eval_shape(lambda: mixer.init_state(1, 64))
    assert sum(a.size for a in jax.tree.leaves((state["S"], state["conv"]))) == mixer.state_size(64)
    assert mixer.state_size(64) == heads * per_head(width // heads) + 3 * width * (cfg.attn.conv_size - 1)
    assert mixer.state_size(4096) == mixer.state_size(64)


@pytest.mark.parametrize("spec", [TTTLinearConfig, TitansConfig])
@pytest.mark.parametrize("setting, message", [({"method": "parallel"}, "naive, chunk"),
                                              ({"chunk_size": 0}, "attn.chunk_size"),
                                              ({"base_lr": 0.0}, "attn.base_lr"),
                                              ({"conv_size": 0}, "attn.conv_size")])
def test_bad_settings_are_config_errors(spec, setting, message):
    with pytest.raises(ConfigError, match=message):
        spec(name="x", mixer="x", **setting).check(ModelConfig())
