"""Delta-rule mixers (deltanet, gated_deltanet): the knobs the generic protocol tests (which build
every variant) leave out -- per-channel gates, the gates' form, the one-line config errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixer_checks import compiled, first_mixer, inputs, step_through

CHANNEL_GATES = ("gated_deltanet", "attn.gate=channel")


def test_channel_gates_step_equals_forward_and_matrix_reproduces_mixing():
    mixer = first_mixer(*CHANNEL_GATES)
    x = inputs(9, seed=3)

    def everything(m, x):
        heads = m.heads(x)
        mixed = jnp.einsum("bhts,bshd->bthd", m.attention_matrix(x), heads[2])
        return step_through(m, x, m.init_state(2, 9))[0], m(x), mixed, m.mix(*heads)[0], heads[4]

    stepped, forward, from_matrix, mixed, log_g = compiled(everything, mixer)(x)
    assert log_g.shape == (2, 9, 4, 8)  # one decay per key channel
    np.testing.assert_allclose(stepped, forward, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(from_matrix, mixed, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", [("gated_deltanet",), CHANNEL_GATES], ids=["head", "channel"])
def test_gates_follow_a_and_dt(config):
    mixer = first_mixer(*config)
    x = inputs(7)
    log_g = mixer.gates(x)
    step = jax.nn.softplus(mixer.gate_proj(x) + mixer.dt_bias[...]).reshape(log_g.shape)
    rate = jnp.exp(mixer.A_log[...]).reshape((4,) + (1,) * (log_g.ndim - 3))
    np.testing.assert_allclose(log_g, -rate * step, rtol=1e-6)
    assert bool(jnp.all(log_g < 0))


def test_queries_and_keys_are_unit_and_beta_in_range():
    q, k, _, beta, log_g = first_mixer("deltanet").heads(inputs(5))
    np.testing.assert_allclose(jnp.linalg.norm(q, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(k, axis=-1), 1.0, rtol=1e-5)
    assert bool(jnp.all((beta > 0) & (beta < 1))) and log_g is None
