"""The DPLR-era mixers (kda, gdn2, rwkv7): what the generic protocol tests (decoding equals the
forward, documents, logical axes; they build every variant) leave out -- grouped value
heads, the gates' ranges and shapes, the attention matrix against the op, the one-line config errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixer_checks import compiled, first_mixer, inputs, step_through, assert_refused_in_one_line


def test_kda_grouped_value_heads_step_equals_forward_and_matrix_reproduces_mixing():
    """Eight value heads over four query/key heads: per-channel gates, beta and state per value head."""
    mixer = first_mixer("kda", "attn.value_heads=8")
    x = inputs(6, seed=3)

    def everything(m, x):
        heads = m.heads(x)
        mixed = jnp.einsum("bhts,bshd->bthd", m.attention_matrix(x), heads[2])
        stepped, state = step_through(m, x, m.init_state(2, 6))
        gate = jax.nn.sigmoid(m.out_gate.gate(x))
        return stepped, state, m(x), mixed, m.mix(*heads)[0], heads, gate

    stepped, state, forward, from_matrix, mixed, heads, gate = compiled(everything, mixer)(x)
    q, k, v, beta, log_g = heads
    assert q.shape == k.shape == (2, 6, 4, 8) and v.shape == (2, 6, 8, 8) and beta.shape == (2, 6, 8)
    assert log_g.shape == (2, 6, 8, 8) and bool(jnp.all(log_g < 0))  # one decay per value head and key channel
    assert state["S"].shape == (2, 8, 8, 8) and mixer.state_size(9) == 8 * 8 * 8 + 3 * (2 * 32 + 64)
    assert bool(jnp.all((gate > 0) & (gate < 1)))  # the output gate is a sigmoid
    np.testing.assert_allclose(stepped, forward, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(from_matrix, mixed, rtol=1e-5, atol=1e-6)


def test_gdn2_gates_and_matrix_on_the_written_values():
    mixer = first_mixer("gdn2")
    x = inputs(9, seed=4)

    def everything(m, x):
        heads = m.heads(x)
        v, write = heads[2], heads[5]
        return heads, jnp.einsum("bhts,bshd->bthd", m.attention_matrix(x), write * v), m.mix(*heads)[0]

    (q, k, v, log_g, erase, write), from_matrix, mixed = compiled(everything, mixer)(x)
    assert log_g.shape == erase.shape == (2, 9, 4, 8) and write.shape == v.shape == (2, 9, 4, 8)
    assert bool(jnp.all(log_g < 0)) and all(bool(jnp.all((g > 0) & (g < 1))) for g in (erase, write))
    np.testing.assert_allclose(jnp.linalg.norm(k, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(from_matrix, mixed, rtol=1e-5, atol=1e-6)


def test_rwkv7_parametrisation_and_matrix():
    """alpha = -kappa_hat (unit), beta = kappa_hat * a with a in (0, 1), w = exp(log w) in
    (e^-e^-0.5, 1); the matrix reproduces the op (scale 1); the output is the op's group norm plus
    the bonus term, gated."""
    mixer = first_mixer("rwkv7")
    x = inputs(9, seed=5)

    def everything(m, x):
        heads, gate, bonus = m.project(x)
        o = m.mix(*heads)[0]
        mixed = jnp.einsum("bhts,bshd->bthd", m.attention_matrix(x), heads[2])
        own = jnp.sum(bonus, axis=-1, keepdims=True) * heads[2]
        by_hand = m.o_proj((m.group_norm(o) + own.reshape(2, 9, -1)) * gate)
        return heads, o, mixed, by_hand, m(x)

    (r, k, v, alpha, beta, log_w), o, mixed, by_hand, forward = compiled(everything, mixer)(x)
    kappa = -alpha
    np.testing.assert_allclose(jnp.linalg.norm(kappa, axis=-1), 1.0, rtol=1e-5)
    a = beta / jnp.where(kappa == 0, 1.0, kappa)
    assert bool(jnp.all((a > 0) & (a < 1)))
    assert bool(jnp.all((log_w < 0) & (log_w > -math.exp(-0.5))))
    np.testing.assert_allclose(mixed, o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(forward, by_hand, rtol=1e-6, atol=1e-7)


def test_rwkv7_token_shift_reads_the_previous_token():
    """Changing token 5 changes the mixer's output from token 5 on, through the shift at token 6
    too: the r, k, v of token 6 differ although token 6 itself did not change."""
    mixer = first_mixer("rwkv7")
    x = inputs(9, seed=6)
    changed = x.at[:, 5].add(1.0)
    heads = compiled(lambda m, a: m.heads(a), mixer)
    (r0, k0, v0, *_), (r1, k1, v1, *_) = heads(x), heads(changed)
    for before, after in ((r0, r1), (k0, k1), (v0, v1)):
        np.testing.assert_array_equal(before[:, :5], after[:, :5])
        assert not np.allclose(before[:, 6], after[:, 6])
        np.testing.assert_array_equal(before[:, 7:], after[:, 7:])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (("kda", "attn.value_heads=6"), ["attn.value_heads=6", "model.n_heads=4"]),
        (("kda", "attn.out_gate_rank=0"), ["attn.out_gate_rank=0"]),
        (("gdn2", "attn.method=pallas"), ["attn.method='pallas'", "naive, parallel, chunk"]),
        (("rwkv7", "attn.decay_rank=-1"), ["attn.decay_rank=-1"]),
    ],
)
def test_bad_settings_fail_with_one_line(overrides, expected, capsys):
    assert_refused_in_one_line(overrides, expected, capsys)
