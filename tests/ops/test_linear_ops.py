"""Linear attention and GLA: every form against the "naive" reference, and that against loops.

Values, gradients (``jax.vjp`` with a random cotangent on the output and the final state) and
final states must agree to a norm-relative error of 1e-5 in float32, at lengths 1, 63 and 257
with a chunk size (16) that divides neither, with and without an initial state (see SETTINGS).
A gradient that vanishes identically (w.r.t. the gate at T = 1 without a state, or w.r.t. q and
k of normalised attention at T = 1) is rounding noise on both sides; it must stay below 1e-4.
The shared inputs and comparisons are in ``op_checks``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import (
    BF16_TOLERANCE,
    CASES,
    TOLERANCE,
    assert_trees_close,
    compiled,
    in_two_halves,
    make_args,
    outputs_and_grads,
    reference,
    rel_err,
    run_fast,
    strong_gates,
)

from lmzoo.ops import gla, gla_weights, linear_attention, linear_attention_weights

gla_fast = compiled(gla, static_argnames=("scale", "method", "chunk_size"))
linear_fast = compiled(linear_attention, static_argnames=("scale", "normalize", "eps", "method", "chunk_size"))

FAST_FORMS = ("parallel", "scan", "assoc", "chunk", "chunk_recompute")


# Without a state, the op fills in zeros before choosing the form, the same line for every gate
# layout; it is checked on the general cases (normalised, per-dimension gates) to keep compiling short.
SETTINGS = [
    (case, length, with_state)
    for case in CASES
    for length in (1, 63)  # 63 with chunks of 16: several whole chunks and a partial one
    for with_state in ((False, True) if case in ("linear_normalized", "gla") else (True,))
]
SETTING_IDS = [f"{case}-{length}-{'state' if with_state else 'no_state'}" for case, length, with_state in SETTINGS]


@pytest.mark.parametrize("case, length, with_state", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("method", FAST_FORMS)
def test_form_matches_naive(method, case, length, with_state):
    args, cotangent, expected = reference(case, length, with_state)
    assert_trees_close(outputs_and_grads(case, method, args, cotangent), expected)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ("naive",) + FAST_FORMS)
def test_two_halves_passing_the_state_equal_one_pass(method, case):
    """Against the one-pass reference (every form equals it in one pass, see above)."""
    args, _, (one_pass, _) = reference(case, 63, True)
    assert_trees_close(in_two_halves(case, method, args), one_pass)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ("naive",) + FAST_FORMS)
def test_bfloat16_inputs_close_to_float32_reference(method, case):
    args, _, (expected, _) = reference(case, 63, True)
    low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), args)
    out, state = run_fast(case, method, low)
    assert out.dtype == jnp.bfloat16
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(state))  # states accumulate in float32
    assert_trees_close((out.astype(jnp.float32), state), expected, tol=BF16_TOLERANCE)


# ----------------------------------------------------------------------------- the reference itself


def loop_gla(q, k, v, log_g, state, scale):
    """The recurrence written out in float64: S_t = diag(g_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t."""
    q, k, v, gates, s = (np.asarray(a, np.float64) for a in (q, k, v, jnp.exp(log_g), state))
    gates = np.broadcast_to(gates if gates.ndim == 4 else gates[..., None], q.shape)
    out = np.zeros(v.shape)
    for t in range(q.shape[1]):
        s = gates[:, t, :, :, None] * s + np.einsum("bhd,bhe->bhde", k[:, t], v[:, t])
        out[:, t] = scale * np.einsum("bhd,bhde->bhe", q[:, t], s)
    return out, s


@pytest.mark.parametrize("method", ["naive", "parallel"])
@pytest.mark.parametrize("case", ["gla", "gla_scalar"])
def test_gla_matches_the_recurrence_in_float64(case, method):
    args = make_args(case, 40, with_state=True, seed=11)
    q, k, v, log_g = (args[name] for name in ("q", "k", "v", "log_g"))
    out, state = gla_fast(q, k, v, log_g, initial_state=args["state"], scale=0.3, method=method)
    expected_out, expected_state = loop_gla(q, k, v, log_g, args["state"], 0.3)
    assert rel_err(out, expected_out) < TOLERANCE and rel_err(state, expected_state) < TOLERANCE


@pytest.mark.parametrize("method", ["naive", "parallel"])
def test_normalized_linear_attention_matches_the_definition(method):
    args = make_args("linear_normalized", 40, with_state=True, seed=12)
    (s0, z0), scale, eps = args["state"], 0.5, 1e-6
    out, (s, z) = linear_fast(args["q"], args["k"], args["v"], scale=scale, normalize=True, eps=eps,
                              initial_state=(s0, z0), method=method)
    zero_gates = jnp.zeros(args["q"].shape[:3])
    numerator, expected_s = loop_gla(args["q"], args["k"], args["v"], zero_gates, s0, scale)
    ones = jnp.ones(args["v"].shape[:3] + (1,))
    denominator, expected_z = loop_gla(args["q"], args["k"], ones, zero_gates, z0[..., None], scale)
    assert rel_err(out, numerator / (denominator + eps)) < TOLERANCE
    assert rel_err(s, expected_s) < TOLERANCE and rel_err(z, expected_z[..., 0]) < TOLERANCE


@compiled
def weights_times_values_and_outputs(gla_args, linear_args):
    """(W v, o) for GLA and for normalised linear attention, W from the ``*_weights`` functions."""
    q, k, v, log_g = (gla_args[name] for name in ("q", "k", "v", "log_g"))
    gated = (jnp.einsum("bhts,bshd->bthd", gla_weights(q, k, log_g), v), gla(q, k, v, log_g, method="scan")[0])
    q, k, v = (linear_args[name] for name in ("q", "k", "v"))
    w = linear_attention_weights(q, k, normalize=True)
    plain = (jnp.einsum("bhts,bshd->bthd", w, v), linear_attention(q, k, v, normalize=True, method="scan")[0])
    return gated, plain, w


def test_weights_reproduce_the_outputs():
    gla_args = make_args("gla", 30, with_state=False, seed=13)
    linear_args = make_args("linear_normalized", 30, with_state=False, seed=14)
    (gla_mixed, gla_out), (linear_mixed, linear_out), w = weights_times_values_and_outputs(gla_args, linear_args)
    assert rel_err(gla_mixed, gla_out) < TOLERANCE and rel_err(linear_mixed, linear_out) < TOLERANCE
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)  # positive features: rows are distributions
    assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0


# ----------------------------------------------------------------------------- numerics and errors


def test_strong_gates_in_one_long_chunk_stay_exact():
    """~900 nats of decay across one chunk: factoring exp(L_i - L_j) as exp(L_i) exp(-L_j) would overflow."""
    args, cotangent = strong_gates(129)
    assert float(jnp.sum(args["log_g"], axis=1).max()) < -500
    one_chunk = outputs_and_grads("gla", "chunk", args, cotangent, chunk_size=129)
    assert_trees_close(one_chunk, outputs_and_grads("gla", "naive", args, cotangent))


def test_unknown_method_names_the_valid_ones():
    args = make_args("gla", 5, with_state=False)
    with pytest.raises(ValueError, match="naive, parallel, scan, assoc, chunk"):
        gla(args["q"], args["k"], args["v"], args["log_g"], method="fused")
    with pytest.raises(ValueError, match="parallel, scan, assoc, chunk, chunk_recompute, pallas"):
        linear_attention(args["q"], args["k"], args["v"], method="fused")


def test_gate_shape_is_checked():
    args = make_args("gla", 5, with_state=False)
    with pytest.raises(ValueError, match="log_g"):
        gla(args["q"], args["k"], args["v"], args["log_g"][..., :3])


def test_zero_gates_are_linear_attention():
    args = make_args("linear", 33, with_state=True, seed=32)
    no_decay = jnp.zeros(args["q"].shape[:3])
    gated = gla_fast(args["q"], args["k"], args["v"], no_decay, initial_state=args["state"], method="chunk")
    assert_trees_close(gated, run_fast("linear", "naive", args))
