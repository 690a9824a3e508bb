"""``lmzoo.ops.rwkv6``: every form against the naive recurrence (values, final states, gradients of every input with
random cotangents, odd lengths, an initial state, strong decays), documents kept apart, and the effective weights."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.rwkv6 import METHODS, rwkv6, rwkv6_weights

from op_checks import assert_forms_agree, rel_err, values_and_grads

B, H, DK, DV = 2, 2, 8, 16
NAMES = ("q", "k", "v", "log_w", "u", "state")


def rwkv6_inputs(length: int, *, strong: bool = False, per_head: bool = False, seed: int = 0):
    """q, k, v, log_w, u and an initial state; decays ~0.3 .. 1 a step, or ~7 nats a step when ``strong``."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    gate_shape = (B, length, H) if per_head else (B, length, H, DK)
    log_w = -jnp.exp(normal(*gate_shape) + (1.5 if strong else -1.5))
    return normal(B, length, H, DK), normal(B, length, H, DK), normal(B, length, H, DV), log_w, normal(H, DK), \
        normal(B, H, DK, DV)


def form(method, chunk_size=8, segment_ids=None):
    def fn(q, k, v, log_w, u, state):
        return rwkv6(q, k, v, log_w, u, scale=0.6, initial_state=state, method=method, chunk_size=chunk_size,
                     segment_ids=segment_ids)
    return fn


@functools.lru_cache(maxsize=None)
def expected(length, strong=False, per_head=False):
    args = rwkv6_inputs(length, strong=strong, per_head=per_head)
    return args, values_and_grads(form("naive"), args)


@pytest.mark.parametrize("method, chunk_size", [("chunk", 8), ("chunk", 5), ("chunk", 64), ("parallel", 8)])
@pytest.mark.parametrize("length", [1, 23])
def test_every_form_equals_the_naive_recurrence(method, chunk_size, length):
    args, reference = expected(length)
    assert_forms_agree(form(method, chunk_size), form("naive"), args, NAMES, expected=reference)


@pytest.mark.parametrize("case", ["strong", "per_head"])
def test_the_chunk_form_holds_under_strong_decays_and_one_decay_per_head(case):
    args, reference = expected(23, strong=case == "strong", per_head=case == "per_head")
    assert_forms_agree(form("chunk", 16), form("naive"), args, NAMES, expected=reference)


def test_the_state_carries_over_a_split():
    q, k, v, log_w, u, s0 = rwkv6_inputs(23)
    whole, final = rwkv6(q, k, v, log_w, u, initial_state=s0, method="chunk", chunk_size=8)
    first, middle = rwkv6(q[:, :10], k[:, :10], v[:, :10], log_w[:, :10], u, initial_state=s0, method="naive")
    second, end = rwkv6(q[:, 10:], k[:, 10:], v[:, 10:], log_w[:, 10:], u, initial_state=middle, method="chunk")
    assert rel_err(jnp.concatenate([first, second], axis=1), whole) < 1e-5
    assert rel_err(end, final) < 1e-5


DOCS = (7, 5, 11)  # row 0 holds three documents; row 1 one


def packed_ids():
    row0 = np.repeat(np.arange(len(DOCS)), DOCS)
    return jnp.asarray(np.stack([row0, np.zeros_like(row0)]))


@pytest.mark.parametrize("method", [m for m in METHODS if m not in ("naive", *PROVIDER_FORMS)])  # jla: test_kernels
def test_documents_are_mixed_as_if_alone(method):
    """Packed documents: each one's outputs are those it gives alone (the first from the initial state, the others
    from zero), the final state the last one's; and the form's gradients with documents equal the naive form's."""
    q, k, v, log_w, u, s0 = args = rwkv6_inputs(sum(DOCS))
    ids = packed_ids()
    (out, final), grads = values_and_grads(form(method, 4, ids), args)
    (out_ref, final_ref), grads_ref = values_and_grads(form("naive", segment_ids=ids), args)
    for name, g, g_ref in zip(NAMES, grads, grads_ref):
        assert rel_err(g, g_ref) < 1e-5, name
    edges = np.cumsum((0,) + DOCS)
    for d, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        state = s0[:1] if d == 0 else jnp.zeros_like(s0[:1])
        alone, alone_final = form("naive")(q[:1, a:b], k[:1, a:b], v[:1, a:b], log_w[:1, a:b], u, state)
        assert rel_err(out[:1, a:b], alone) < 1e-5 and rel_err(out_ref[:1, a:b], alone) < 1e-5, d
    assert rel_err(final[:1], alone_final) < 1e-5 and rel_err(final_ref[:1], alone_final) < 1e-5
    assert rel_err(out[1:], form("naive")(q[1:], k[1:], v[1:], log_w[1:], u, s0[1:])[0]) < 1e-5


def test_the_weights_times_the_values_are_the_output_and_zero_across_documents():
    q, k, v, log_w, u, _ = rwkv6_inputs(sum(DOCS))
    ids = packed_ids()
    for segment_ids in (None, ids):
        weights = rwkv6_weights(q, k, log_w, u, scale=0.6, segment_ids=segment_ids)
        out, _ = rwkv6(q, k, v, log_w, u, scale=0.6, method="naive", segment_ids=segment_ids)
        assert rel_err(jnp.einsum("bhts,bshd->bthd", weights, v), out) < 1e-5
    across = np.asarray(ids[:, :, None] != ids[:, None, :])[:, None]
    assert np.all(np.asarray(weights)[np.broadcast_to(across, weights.shape)] == 0)
    assert np.all(np.triu(np.asarray(weights), 1) == 0)
    np.testing.assert_allclose(np.diagonal(weights, axis1=-2, axis2=-1),  # the bonus alone on the diagonal
                               0.6 * jnp.einsum("bthd,hd->bht", q * k, u), rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_refused_in_one_line():
    q, k, v, log_w, u, _ = rwkv6_inputs(5)
    choices = r"\(choose from: naive, parallel, chunk, auto, jla\)"
    with pytest.raises(ValueError, match=r"method='scan' is not valid " + choices):
        rwkv6(q, k, v, log_w, u, method="scan")
    with pytest.raises(ValueError, match=r"u has shape \(8,\); expected \(2, 8\)"):
        rwkv6(q, k, v, log_w, u[0])
    assert jax.eval_shape(lambda: rwkv6(q, k, v, log_w, u))[0].shape == v.shape
