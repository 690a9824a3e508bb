"""Linear attention and GLA: every form against the "parallel" reference, and that against loops.

Values, gradients (``jax.vjp`` with a random cotangent on the output and the final state) and
final states must agree to a norm-relative error of 1e-5 in float32, at lengths 1, 63 and 257
with a chunk size (16) that divides neither, with and without an initial state (see SETTINGS).
A gradient that vanishes identically (w.r.t. the gate at T = 1 without a state, or w.r.t. q and
k of normalised attention at T = 1) is rounding noise on both sides; it must stay below 1e-4.

Programs are compiled with XLA's backend optimisation off: it changes compile time, not results,
and compiling dominates these tests on a CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops import gla, gla_weights, linear_attention, linear_attention_weights

FAST_FORMS = ("scan", "assoc", "chunk")
CASES = ("linear", "linear_normalized", "gla", "gla_scalar")
B, H, DK, DV = 2, 2, 8, 16
CHUNK = 16
TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-2  # rounding q, k, v, gates to bf16 (8 mantissa bits) alone moves o and S by ~3e-3
VANISHING = 1e-4  # gradient norms below this are identically zero in exact arithmetic (see above)


def compiled(fn, **jit_kwargs):
    return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0}, **jit_kwargs)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_trees_close(actual, expected, tol=TOLERANCE):
    """Leaf by leaf (outputs, states, gradients): finite, and within ``tol`` norm-relative error."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
        name = jax.tree_util.keystr(path)
        assert np.all(np.isfinite(np.asarray(a, np.float32))), name
        if np.linalg.norm(np.asarray(b, np.float64)) < VANISHING:
            assert np.linalg.norm(np.asarray(a, np.float64)) < VANISHING, name
            continue
        assert rel_err(a, b) <= tol, f"{name}: relative error {rel_err(a, b):.2e} > {tol}"


def make_args(case: str, length: int, *, with_state: bool, seed: int = 0) -> dict:
    """Random inputs for ``case``; normalised linear attention gets positive features and key sums."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    args = {"q": normal(B, length, H, DK), "k": normal(B, length, H, DK), "v": normal(B, length, H, DV)}
    if case == "linear_normalized":  # elu(x) + 1 features
        args["q"], args["k"] = (np.where(x > 0, x + 1, np.exp(x)) for x in (args["q"], args["k"]))
    if case.startswith("gla"):
        gates = normal(B, length, H, DK) if case == "gla" else normal(B, length, H)
        args["log_g"] = -np.log1p(np.exp(-(gates + 2.0)))  # log sigmoid: gates ~0.5 .. 1
    if with_state:
        args["state"] = normal(B, H, DK, DV)
        if case == "linear_normalized":  # a key sum from positive features is positive
            args["state"] = (args["state"], np.abs(normal(B, H, DK)) + 1.0)
    return jax.tree.map(jnp.asarray, args)


def run(case: str, method: str, args: dict, chunk_size: int = CHUNK):
    q, k, v, state = args["q"], args["k"], args["v"], args.get("state")
    if case.startswith("gla"):
        return gla(q, k, v, args["log_g"], initial_state=state, method=method, chunk_size=chunk_size)
    normalize = case == "linear_normalized"
    return linear_attention(q, k, v, normalize=normalize, initial_state=state, method=method, chunk_size=chunk_size)


run_fast = compiled(run, static_argnums=(0, 1, 3))
gla_fast = compiled(gla, static_argnames=("scale", "method", "chunk_size"))
linear_fast = compiled(linear_attention, static_argnames=("scale", "normalize", "eps", "method", "chunk_size"))


def random_like(tree, seed: int):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), tree)


@functools.partial(compiled, static_argnums=(0, 1), static_argnames=("chunk_size",))
def outputs_and_grads(case, method, args, cotangent, chunk_size=CHUNK):
    """(o, final state) and the gradients of <(o, S), cotangent> w.r.t. every input."""
    out, vjp = jax.vjp(lambda a: run(case, method, a, chunk_size), args)
    return out, vjp(cotangent)[0]


@functools.lru_cache(maxsize=None)
def reference(case, length, with_state):
    """Inputs, a random cotangent, and outputs_and_grads of the "parallel" form, shared by the forms.

    Without a state, the reference runs from a zero state (one compiled program serves both) and
    its gradient w.r.t. that state is dropped.
    """
    args = make_args(case, length, with_state=with_state)
    zero_state = jax.tree.map(jnp.zeros_like, make_args(case, length, with_state=True)["state"])
    full = args if with_state else {**args, "state": zero_state}
    cotangent = random_like(jax.eval_shape(lambda a: run(case, "parallel", a), full), seed=7)
    out, grads = outputs_and_grads(case, "parallel", full, cotangent)
    return args, cotangent, (out, {name: grads[name] for name in args})


# Without a state, the op fills in zeros before choosing the form, the same line for every gate
# layout; it is checked on the general cases (normalised, per-dimension gates) to keep compiling short.
SETTINGS = [
    (case, length, with_state)
    for case in CASES
    for length in (1, 63, 257)
    for with_state in ((False, True) if case in ("linear_normalized", "gla") else (True,))
]
SETTING_IDS = [f"{case}-{length}-{'state' if with_state else 'no_state'}" for case, length, with_state in SETTINGS]


@pytest.mark.parametrize("case, length, with_state", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("method", FAST_FORMS)
def test_form_matches_parallel(method, case, length, with_state):
    args, cotangent, expected = reference(case, length, with_state)
    assert_trees_close(outputs_and_grads(case, method, args, cotangent), expected)


@functools.partial(compiled, static_argnums=(0, 1))
def in_two_halves(case, method, args):
    """The first 29 steps, then the rest from the state they leave: (o, final state)."""
    first = {name: (x if name == "state" else x[:, :29]) for name, x in args.items()}
    out_a, state_a = run(case, method, first)
    second = {name: x[:, 29:] for name, x in args.items() if name != "state"}
    out_b, state_b = run(case, method, {**second, "state": state_a})
    return jnp.concatenate([out_a, out_b], axis=1), state_b


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ("parallel",) + FAST_FORMS)
def test_two_halves_passing_the_state_equal_one_pass(method, case):
    """Against the one-pass reference (every form equals it in one pass, see above)."""
    args, _, (one_pass, _) = reference(case, 63, True)
    assert_trees_close(in_two_halves(case, method, args), one_pass)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ("parallel",) + FAST_FORMS)
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


@pytest.mark.parametrize("case", ["gla", "gla_scalar"])
def test_gla_parallel_matches_the_recurrence(case):
    args = make_args(case, 40, with_state=True, seed=11)
    q, k, v, log_g = (args[name] for name in ("q", "k", "v", "log_g"))
    out, state = gla_fast(q, k, v, log_g, initial_state=args["state"], scale=0.3, method="parallel")
    expected_out, expected_state = loop_gla(q, k, v, log_g, args["state"], 0.3)
    assert rel_err(out, expected_out) < TOLERANCE and rel_err(state, expected_state) < TOLERANCE


def test_normalized_linear_attention_parallel_matches_the_definition():
    args = make_args("linear_normalized", 40, with_state=True, seed=12)
    (s0, z0), scale, eps = args["state"], 0.5, 1e-6
    out, (s, z) = linear_fast(args["q"], args["k"], args["v"], scale=scale, normalize=True, eps=eps,
                              initial_state=(s0, z0), method="parallel")
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


def strong_gates(length: int):
    """GLA inputs whose gates decay by ~7 nats a step, and a random cotangent for (o, S)."""
    args = make_args("gla", length, with_state=True, seed=21)
    args["log_g"] = -jnp.exp(random_like(args["log_g"], seed=22) + 1.5)
    cotangent = random_like(jax.eval_shape(lambda a: run("gla", "scan", a), args), seed=8)
    return args, cotangent


def test_strong_gates_in_one_long_chunk_stay_exact():
    """~900 nats of decay across one chunk: factoring exp(L_i - L_j) as exp(L_i) exp(-L_j) would overflow."""
    args, cotangent = strong_gates(129)
    assert float(jnp.sum(args["log_g"], axis=1).max()) < -500
    one_chunk = outputs_and_grads("gla", "chunk", args, cotangent, chunk_size=129)
    assert_trees_close(one_chunk, outputs_and_grads("gla", "scan", args, cotangent))


def test_unknown_method_names_the_valid_ones():
    args = make_args("gla", 5, with_state=False)
    with pytest.raises(ValueError, match="parallel, scan, assoc, chunk"):
        gla(args["q"], args["k"], args["v"], args["log_g"], method="fused")
    with pytest.raises(ValueError, match="parallel, scan, assoc, chunk, pallas"):
        linear_attention(args["q"], args["k"], args["v"], method="fused")


def test_gate_shape_is_checked():
    args = make_args("gla", 5, with_state=False)
    with pytest.raises(ValueError, match="log_g"):
        gla(args["q"], args["k"], args["v"], args["log_g"][..., :3])


def test_zero_gates_are_linear_attention():
    args = make_args("linear", 33, with_state=True, seed=32)
    no_decay = jnp.zeros(args["q"].shape[:3])
    gated = gla_fast(args["q"], args["k"], args["v"], no_decay, initial_state=args["state"], method="chunk")
    assert_trees_close(gated, run_fast("linear", "parallel", args))
