"""Gated slot attention's mixer (``+attn=gsa``): what the generic protocol tests (decoding equals the forward,
documents, the attention matrix, every form; a training step's lowering) leave out: its parametrisation, its output
and a bad setting."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from lmzoo.mixers.gsa import GSAConfig
from lmzoo.schema import ConfigError

from conftest import tiny_config
from mixer_checks import compiled, first_mixer, inputs


def test_slots_write_what_they_forget_and_the_output_is_the_head_norm():
    """s = 1 - a per slot, log a = logsigmoid(x W_f) / tau (tau = 8); q, k, v swish; the
    output is each head's RMSNorm, projected (no gate)."""
    mixer = first_mixer("gsa", "attn.num_slots=3")
    x = inputs(9, seed=7)

    def everything(m, x):
        q, k, v, s, log_a = m.heads(x)
        o = m.mix(q, k, v, s, log_a)[0]
        by_hand = m.o_proj(m.norm(o).reshape(2, 9, -1))
        return q, v, s, log_a, by_hand, m(x), jax.nn.silu(m.q_proj(x)), jax.nn.log_sigmoid(m.f_proj(x)) / 8.0

    q, v, s, log_a, by_hand, forward, swished, gates = compiled(everything, mixer)(x)
    assert s.shape == log_a.shape == (2, 9, 4, 3) and v.shape == (2, 9, 4, 8)
    np.testing.assert_allclose(s + np.exp(log_a), 1.0, rtol=1e-6)
    np.testing.assert_allclose(log_a.reshape(2, 9, -1), gates, rtol=1e-6)
    np.testing.assert_allclose(q.reshape(2, 9, -1), swished, rtol=1e-6)
    np.testing.assert_allclose(forward, by_hand, rtol=1e-5, atol=1e-6)


def test_bad_slot_count_fails_in_one_line():
    with pytest.raises(ConfigError, match="attn.num_slots=0 must be positive"):
        GSAConfig(num_slots=0).check(tiny_config("gsa").model)

