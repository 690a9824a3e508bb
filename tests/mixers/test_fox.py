"""The Forgetting Transformer (fox): what the generic protocol tests (step == forward, causality,
attention matrix, through +attn=fox) leave out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixer_checks import compiled, first_mixer, inputs

from lmzoo.ops import softmax_attention


def test_forget_gates_at_one_are_plain_causal_softmax_without_positions():
    mixer = first_mixer("fox")
    mixer.forget_proj.kernel[...] = jnp.zeros_like(mixer.forget_proj.kernel[...])
    mixer.forget_proj.bias[...] = jnp.full_like(mixer.forget_proj.bias[...], 200.0)  # log sigmoid(200) = -0.0

    def both(m, x):
        q, k, v, log_f = m.project(x)
        plain = softmax_attention(q, k, v, method="naive").reshape(x.shape)
        return m(x), m.o_proj(plain), log_f

    fox, plain, log_f = compiled(both, mixer)(inputs(12))
    assert float(jnp.abs(log_f).max()) == 0.0
    np.testing.assert_allclose(fox, plain, rtol=1e-5, atol=1e-6)


def test_logits_carry_the_log_gates_between_query_and_key():
    mixer = first_mixer("fox")
    x = inputs(6)
    q, k, _, log_f = mixer.project(x)
    weights = mixer.attention_matrix(x)  # (B, H, T, T)
    i, j = 5, 2
    logits = jnp.einsum("bhd,bshd->bhs", q[:, i], k[:, : i + 1]) * mixer.head_dim**-0.5
    expected_gap = logits[..., j] - logits[..., i] + jnp.sum(log_f[:, j + 1 : i + 1], axis=1)
    np.testing.assert_allclose(jnp.log(weights[:, :, i, j] / weights[:, :, i, i]), expected_gap, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides", [("attn.window=4",), ("attn.nope=false",), ("attn.nope=false", "pos=alibi")],
                         ids=["window", "rope", "alibi"])
def test_decoding_equals_forward_with_other_knobs(overrides):
    mixer = first_mixer("fox", *overrides)
    x = inputs(9, seed=3)

    def stepped_and_forward(m, x):
        state, outputs = m.init_state(2, 9), []
        for t in range(x.shape[1]):
            y_t, state = m.step(x[:, t], state)
            outputs.append(y_t)
        return jnp.stack(outputs, axis=1), m(x)

    stepped, forward = compiled(stepped_and_forward, mixer)(x)
    np.testing.assert_allclose(stepped, forward, rtol=1e-5, atol=1e-5)


def test_state_size_counts_the_cache_and_the_gates():
    mixer = first_mixer("fox")
    floats = [s for s in jax.tree.leaves(mixer.init_state(1, 20)) if jnp.issubdtype(s.dtype, jnp.floating)]
    assert mixer.state_size(20) == sum(s.size for s in floats)
