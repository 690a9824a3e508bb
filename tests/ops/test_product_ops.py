"""Gated DeltaProduct, Comba, the momentum and preconditioned delta rules and Mamba-3's recurrence: every fast
form against the op's reference form.

Outputs, final states and the gradients of every input (initial state included; ``jax.vjp`` with
random cotangents on both outputs) agree to a norm-relative 1e-5 in float32 at an odd length (19:
two chunks of 8 and a remainder), from an initial state with documents packed in row 0, and from no
state without documents (there Comba's gates decay by ~12 nats a step). bfloat16 inputs stay within
2e-2 of the float32 reference, with float32 states. The references are checked against float64 loops
written from the equations, against each document run alone, and against the ops they generalise
(the delta rule, Mamba-2's SSD). Inputs are what the mixers feed: unit keys, DeltaProduct's beta in (0, 2).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, random_like, rel_err

from lmzoo.ops import delta_rule, ssd
from lmzoo.ops.comba import comba, comba_weights
from lmzoo.ops.delta_product import delta_product, delta_product_weights
from lmzoo.ops.mamba3 import mamba3, mamba3_attention
from lmzoo.ops.momentum_delta import momentum_delta_rule, momentum_delta_rule_weights
from lmzoo.ops.precond_delta import precond_delta_rule, precond_delta_rule_weights

B, H, DK, DV, STEPS = 2, 2, 8, 8, 2  # STEPS: DeltaProduct's n_h
G, N, R = 1, 8, 2  # Mamba-3: B/C groups, state size, rotating pairs
LENGTH, CHUNK = 19, 8
DOCS = (7, 5, 7)  # row 0's documents; row 1 is one document
TOLERANCE, BF16_TOLERANCE = 1e-5, 2e-2


def packed_ids():
    row = np.concatenate([np.full(n, i) for i, n in enumerate(DOCS)])
    return jnp.asarray(np.stack([row, np.zeros(LENGTH, int)]), jnp.int32)


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def product_args(rng, length):
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return {"q": n(B, length, H, DK), "k": unit(n(B, length, H, STEPS, DK)), "v": n(B, length, H, STEPS, DV),
            "beta": 2 * sigmoid(n(B, length, H, STEPS)), "log_g": np.log(sigmoid(n(B, length, H) + 2)),
            "state": n(B, H, DK, DV)}


def comba_args(rng, length):
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    k = unit(n(B, length, H, DK))
    return {"q": n(B, length, H, DK), "k": k, "v": n(B, length, H, DV), "p": 0.7 * k + 0.3 * unit(n(B, length, H, DK)),
            "beta": sigmoid(n(B, length, H)), "log_g": np.log(sigmoid(n(B, length, H) + 2)), "state": n(B, H, DK, DV)}


def momentum_args(rng, length):
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    k = unit(n(B, length, H, DK))
    return {"q": n(B, length, H, DK), "k": k, "v": n(B, length, H, DV), "p": 0.7 * k + 0.3 * unit(n(B, length, H, DK)),
            "beta": sigmoid(n(B, length, H)), "eta": sigmoid(n(B, length, H)),
            "log_alpha": np.log(sigmoid(n(B, length, H) + 2)), "log_mu": np.log(sigmoid(n(B, length, H))),
            "state": (n(B, H, DK, DV), n(B, H, DK, DV))}


def precond_args(rng, length):
    """Grouped value heads (two per key head) and one decay per key channel, as preconditioned KDA's."""
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return {"q": n(B, length, H, DK), "k": unit(n(B, length, H, DK)), "v": n(B, length, 2 * H, DV),
            "beta": sigmoid(n(B, length, 2 * H)), "log_g": np.log(sigmoid(n(B, length, 2 * H, DK) + 2)),
            "beta_atk": sigmoid(n(B, length, H)), "log_g_atk": np.log(sigmoid(n(B, length, H) + 2)),
            "state": (n(B, 2 * H, DK, DV), np.abs(n(B, H, DK)))}


def mamba3_args(rng, length):
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    state = {"h": n(B, H, DV, N), "x": n(B, H, DV), "B": n(B, H, N), "phase": n(B, H, R)}
    return {"x": n(B, length, H, DV), "dt": np.log1p(np.exp(n(B, length, H) - 1)), "A": -np.exp(n(B, length, H)),
            "B": n(B, length, G, N), "C": n(B, length, G, N), "lam": sigmoid(n(B, length, H)),
            "theta": 3 * n(B, length, H, R), "D": n(H), "state": state}


def run_product(method, a, segment_ids=None, chunk_size=CHUNK):
    return delta_product(a["q"], a["k"], a["v"], a["beta"], a.get("log_g"), initial_state=a.get("state"),
                         method=method, chunk_size=chunk_size, segment_ids=segment_ids)


def run_comba(method, a, segment_ids=None, chunk_size=CHUNK):
    return comba(a["q"], a["k"], a["v"], a["p"], a["beta"], a.get("log_g"), initial_state=a.get("state"),
                 method=method, chunk_size=chunk_size, segment_ids=segment_ids)


def run_momentum(method, a, segment_ids=None, chunk_size=CHUNK):
    return momentum_delta_rule(a["q"], a["k"], a["v"], a["p"], a["beta"], a["eta"], a["log_alpha"], a["log_mu"],
                               initial_state=a.get("state"), method=method, chunk_size=chunk_size,
                               segment_ids=segment_ids)


def run_precond(method, a, segment_ids=None, chunk_size=CHUNK):
    return precond_delta_rule(a["q"], a["k"], a["v"], a["beta"], a["log_g"], a["beta_atk"], a["log_g_atk"],
                              initial_state=a.get("state"), method=method, chunk_size=chunk_size,
                              segment_ids=segment_ids)


def run_mamba3(method, a, segment_ids=None, chunk_size=CHUNK):
    return mamba3(a["x"], a["dt"], a["A"], a["B"], a["C"], a["lam"], a["theta"], D=a["D"], initial_state=a.get("state"),
                  method=method, chunk_size=chunk_size, segment_ids=segment_ids)


OPS = {  # name: (run, inputs, reference form, fast forms)
    "delta_product": (run_product, product_args, "naive", ("chunk", "parallel")),
    "comba": (run_comba, comba_args, "naive", ("chunk", "parallel")),
    "mamba3": (run_mamba3, mamba3_args, "naive", ("scan", "chunk")),
    "momentum_delta": (run_momentum, momentum_args, "naive", ("chunk", "parallel")),
    "precond_delta": (run_precond, precond_args, "naive", ("chunk", "parallel")),
}


def inputs(op, length=LENGTH, seed=0):
    return jax.tree.map(jnp.asarray, OPS[op][1](np.random.default_rng(seed), length))


@functools.partial(compiled, static_argnums=(0, 1))
def pull_back(op, method, args, cotangent, segment_ids=None):
    """(output, final state) and the gradients of <(output, state), cotangent> w.r.t. every input."""
    out, vjp = jax.vjp(lambda a: OPS[op][0](method, a, segment_ids), args)
    return out, vjp(cotangent)[0]


@functools.lru_cache(maxsize=None)
def reference(op, documents):
    """Inputs (with an initial state and packed documents, or neither), a cotangent, and the
    reference form's outputs and gradients. Comba's gates without documents decay by ~12 nats a
    step, ~230 over the sequence: its one-chunk form ("parallel") must stay exact where
    exp(b_i) exp(-b_j) would overflow float32."""
    args = inputs(op)
    if not documents:
        args = {name: x for name, x in args.items() if name != "state"}
        if op == "comba":
            args["log_g"] = -jnp.exp(random_like(args["log_g"], seed=6) + 2.0)
        if op == "momentum_delta":  # both decays strong: ~12 nats a step each
            args["log_alpha"] = -jnp.exp(random_like(args["log_alpha"], seed=6) + 2.0)
            args["log_mu"] = -jnp.exp(random_like(args["log_mu"], seed=5) + 2.0)
        if op == "precond_delta":
            args["log_g"] = -jnp.exp(random_like(args["log_g"], seed=6) + 2.0)
    ids = packed_ids() if documents else None
    cotangent = random_like(jax.eval_shape(lambda a: OPS[op][0](OPS[op][2], a), inputs(op)), seed=7)
    return args, ids, cotangent, pull_back(op, OPS[op][2], args, cotangent, ids)


# Every fast form in one setting: the chunk forms from an initial state with documents, the others
# from no state ("parallel" is the chunk form with one chunk; Mamba-3's "scan" is GLA's scan under the
# same mapping as its chunk form), so every op runs both with and without an initial state.
CASES = [("delta_product", "chunk", True), ("delta_product", "parallel", False),
         ("comba", "chunk", True), ("comba", "parallel", False),
         ("mamba3", "chunk", True), ("mamba3", "scan", False),
         ("momentum_delta", "chunk", True), ("momentum_delta", "parallel", False),
         ("precond_delta", "chunk", True), ("precond_delta", "parallel", False)]


@pytest.mark.parametrize("op, method, documents", CASES,
                         ids=[f"{op}-{m}-{'state_and_documents' if d else 'no_state'}" for op, m, d in CASES])
def test_form_matches_reference(op, method, documents):
    args, ids, cotangent, expected = reference(op, documents)
    if op == "comba" and not documents:
        assert float(jnp.sum(args["log_g"], axis=1).max()) < -100
    if op == "momentum_delta" and not documents:
        assert float(jnp.sum(args["log_alpha"], axis=1).max()) < -100
    assert_trees_close(pull_back(op, method, args, cotangent, ids), expected)


@pytest.mark.parametrize("op", OPS)
def test_bfloat16_inputs_close_to_float32_reference(op):
    args, ids, _, (expected, _) = reference(op, True)
    method = OPS[op][3][-1]
    out, state = compiled(lambda a: OPS[op][0](method, a, ids))(jax.tree.map(lambda x: x.astype(jnp.bfloat16), args))
    assert out.dtype == jnp.bfloat16 and all(s.dtype == jnp.float32 for s in jax.tree.leaves(state))
    assert_trees_close((out.astype(jnp.float32), state), expected, tol=BF16_TOLERANCE)


@pytest.mark.parametrize("op", OPS)
def test_reference_runs_each_document_as_if_alone(op):
    """Row 0's documents each from a zero state (the first from the initial state), row 1 unchanged."""
    run, _, method, _ = OPS[op]
    args, ids, _, ((out, state), _) = reference(op, True)
    edges = np.cumsum((0,) + DOCS)
    for a, b in zip(edges[1:-1], edges[2:]):  # the later documents: each starts from a zero state
        piece = {n: (x if x.ndim < 2 else x[:1, a:b]) for n, x in args.items() if n != "state"}  # D is per head
        alone, alone_state = compiled(lambda p: run(method, p))(piece)
        assert rel_err(out[:1, a:b], alone) < TOLERANCE
    assert_trees_close(jax.tree.map(lambda x: x[:1], state), alone_state)  # the last document's state


# ----------------------------------------------------------------------------- the references themselves


def loop_product(a, scale):
    q, k, v, beta, s = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "beta", "state"))
    gates, out = np.exp(np.asarray(a["log_g"], np.float64)), np.zeros(q.shape[:3] + (v.shape[-1],))
    for b, h in np.ndindex(B, H):
        state = s[b, h].copy()
        for t in range(q.shape[1]):
            state = gates[b, t, h] * state
            for j in range(STEPS):
                kj = k[b, t, h, j]
                state = state + beta[b, t, h, j] * np.outer(kj, v[b, t, h, j] - state.T @ kj)
            out[b, t, h] = scale * state.T @ q[b, t, h]
        s[b, h] = state
    return out, s


def loop_comba(a, scale):
    q, k, v, p, beta, s = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "p", "beta", "state"))
    gates, out = np.exp(np.asarray(a["log_g"], np.float64)), np.zeros(v.shape)
    for b, h in np.ndindex(B, H):
        state = s[b, h].copy()
        for t in range(q.shape[1]):
            error = v[b, t, h] - state.T @ p[b, t, h]  # the state before the decay
            state = gates[b, t, h] * state + beta[b, t, h] * np.outer(k[b, t, h], error)
            out[b, t, h] = scale * state.T @ q[b, t, h]
        s[b, h] = state
    return out, s


def loop_momentum(a, scale):
    q, k, v, p, beta, eta = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "p", "beta", "eta"))
    alpha, mu = (np.exp(np.asarray(a[n], np.float64)) for n in ("log_alpha", "log_mu"))
    s, m = (np.asarray(x, np.float64).copy() for x in a["state"])
    out = np.zeros(v.shape)
    for b, h in np.ndindex(B, H):
        state, momentum = s[b, h].copy(), m[b, h].copy()
        for t in range(q.shape[1]):
            error = v[b, t, h] - state.T @ p[b, t, h]  # the state before the decay
            momentum = mu[b, t, h] * momentum - eta[b, t, h] * np.outer(k[b, t, h], error)
            state = alpha[b, t, h] * state - beta[b, t, h] * momentum
            out[b, t, h] = scale * state.T @ q[b, t, h]
        s[b, h], m[b, h] = state, momentum
    return out, (s, m)


def loop_precond(a, scale, squash=1.5, center=-0.2, eps=1e-6):
    q, k, v, beta, beta_atk = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "beta", "beta_atk"))
    gates, atk_gates = (np.exp(np.asarray(a[n], np.float64)) for n in ("log_g", "log_g_atk"))
    s, second = (np.asarray(x, np.float64).copy() for x in a["state"])
    out, group = np.zeros(v.shape), v.shape[2] // H
    for b, h in np.ndindex(B, H):
        for t in range(q.shape[1]):
            second[b, h] = atk_gates[b, t, h] * second[b, h] + beta_atk[b, t, h] * k[b, t, h] ** 2
            r = np.log(second[b, h] + eps) - center
            written = k[b, t, h] * squash ** (-r / (1 + np.abs(r)))
            for hv in range(h * group, (h + 1) * group):
                state = gates[b, t, hv][:, None] * s[b, hv]
                state = state + beta[b, t, hv] * np.outer(written, v[b, t, hv] - state.T @ k[b, t, h])
                out[b, t, hv], s[b, hv] = scale * state.T @ q[b, t, h], state
    return out, (s, second)


def loop_mamba3(a, scale):
    """The docstring's equations with explicit 2 x 2 rotations of the pairs (2i, 2i + 1)."""
    f = {n: np.asarray(x, np.float64) for n, x in a.items() if n != "state"}
    st = {n: np.asarray(x, np.float64).copy() for n, x in a["state"].items()}
    out = np.zeros(f["x"].shape)

    def rot(vec, phase):
        vec = vec.copy()
        for i, angle in enumerate(phase):
            c, s = math.cos(angle), math.sin(angle)
            vec[2 * i], vec[2 * i + 1] = c * vec[2 * i] - s * vec[2 * i + 1], s * vec[2 * i] + c * vec[2 * i + 1]
        return vec

    for b, h in np.ndindex(B, H):
        hs, x_prev, b_prev, phase = st["h"][b, h], st["x"][b, h], st["B"][b, h], st["phase"][b, h]
        for t in range(f["x"].shape[1]):
            dt, lam = f["dt"][b, t, h], f["lam"][b, t, h]
            alpha = math.exp(dt * f["A"][b, t, h])
            phase = phase + dt * f["theta"][b, t, h]
            b_t, c_t = rot(f["B"][b, t, h // (H // G)], phase), rot(f["C"][b, t, h // (H // G)], phase)
            hs = (alpha * hs + (1 - lam) * dt * alpha * np.outer(x_prev, b_prev)
                  + lam * dt * np.outer(f["x"][b, t, h], b_t))
            out[b, t, h] = hs @ c_t + f["D"][h] * f["x"][b, t, h]
            x_prev, b_prev = f["x"][b, t, h], b_t
        st["h"][b, h], st["x"][b, h], st["B"][b, h], st["phase"][b, h] = hs, x_prev, b_prev, np.mod(phase, 2 * math.pi)
    return out, st


LOOPS = {"delta_product": loop_product, "comba": loop_comba, "mamba3": loop_mamba3, "momentum_delta": loop_momentum,
         "precond_delta": loop_precond}


@pytest.mark.parametrize("op", OPS)
def test_reference_matches_the_equations_in_float64(op):
    args = inputs(op, length=9, seed=11)
    out, state = compiled(lambda a: OPS[op][0](OPS[op][2], a))(args)
    expected_out, expected_state = LOOPS[op](args, DK**-0.5)
    assert rel_err(out, expected_out) < TOLERANCE
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected_state)):
        assert rel_err(got, want) < TOLERANCE


def test_one_householder_step_is_the_delta_rule():
    a = inputs("delta_product", seed=3)
    one = {**a, "k": a["k"][:, :, :, :1], "v": a["v"][:, :, :, :1], "beta": a["beta"][..., :1] / 2}

    @compiled
    def both(a):
        expected = delta_rule(a["q"], a["k"][:, :, :, 0], a["v"][:, :, :, 0], a["beta"][..., 0], a["log_g"],
                              initial_state=a["state"], method="naive")
        return run_product("chunk", a), expected

    got, expected = both(one)
    assert_trees_close(got, expected)


def test_mamba3_euler_step_without_rotation_is_mamba2():
    """lam = 1 drops the look-back term and theta = 0 the rotation: Mamba-2's SSD with A per head."""
    a = inputs("mamba3", seed=4)
    a = {**a, "lam": jnp.ones_like(a["lam"]), "theta": jnp.zeros_like(a["theta"]),
         "A": jnp.broadcast_to(a["A"][0, 0], a["dt"].shape)}
    a["state"] = {**a["state"], "phase": jnp.zeros_like(a["state"]["phase"])}

    @compiled
    def both(a):
        y, _ = run_mamba3("chunk", a)
        expected, _ = ssd(a["x"], a["dt"], a["A"][0, 0], a["B"], a["C"], D=a["D"], initial_state=a["state"]["h"],
                          method="naive")
        return y, expected

    got, expected = both(a)
    assert rel_err(got, expected) < TOLERANCE


def test_momentum_without_momentum_is_comba():
    """mu = 0 (a log decay of -60) keeps no momentum: S_t = alpha_t S_{t-1} + beta_t eta_t k_t (v_t - S_{t-1}^T p_t)^T,
    Comba's rule with the step size beta eta."""
    a = inputs("momentum_delta", seed=5)
    a = {**a, "log_mu": jnp.full_like(a["log_mu"], -60.0), "state": (a["state"][0], jnp.zeros_like(a["state"][1]))}

    @compiled
    def both(a):
        o, (s, _) = run_momentum("chunk", a)
        expected = comba(a["q"], a["k"], a["v"], a["p"], a["beta"] * a["eta"], a["log_alpha"],
                         initial_state=a["state"][0], method="naive")
        return (o, s), expected

    got, expected = both(a)
    assert_trees_close(got, expected)


def test_momentum_weights_reproduce_the_outputs():
    """With documents and zero states: the momentum delta rule's weights applied to v give its output."""
    ids, a = packed_ids(), inputs("momentum_delta", seed=9)

    @compiled
    def weighted_and_output(a):
        w = momentum_delta_rule_weights(a["q"], a["k"], a["p"], a["beta"], a["eta"], a["log_alpha"], a["log_mu"],
                                        segment_ids=ids)
        return jnp.einsum("bhts,bshd->bthd", w, a["v"]), run_momentum("naive", {**a, "state": None}, ids)[0], w

    mixed, out, w = weighted_and_output(a)
    assert rel_err(mixed, out) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]  # (B, 1, T, S)
    assert np.all(np.asarray(w)[np.broadcast_to(across, w.shape)] == 0)
    assert np.all(np.triu(np.asarray(w), 1) == 0)


def test_precond_at_the_center_is_the_delta_rule():
    """A second moment that stays at exp(center) (no decay, no step, eps = 0) makes the preconditioner 1: the delta
    rule itself."""
    a = inputs("precond_delta", seed=5)
    a = {**a, "beta_atk": jnp.zeros_like(a["beta_atk"]), "log_g_atk": jnp.zeros_like(a["log_g_atk"]),
         "state": (a["state"][0], jnp.full_like(a["state"][1], np.exp(-0.2)))}

    @compiled
    def both(a):
        o, (s, _) = precond_delta_rule(a["q"], a["k"], a["v"], a["beta"], a["log_g"], a["beta_atk"], a["log_g_atk"],
                                       eps=0.0, initial_state=a["state"], chunk_size=CHUNK)
        return (o, s), delta_rule(a["q"], a["k"], a["v"], a["beta"], a["log_g"], initial_state=a["state"][0],
                                  method="naive")

    got, expected = both(a)
    assert_trees_close(got, expected)


def test_precond_weights_reproduce_the_outputs():
    """With documents and zero states: the preconditioned delta rule's weights applied to v give its output."""
    ids, a = packed_ids(), inputs("precond_delta", seed=9)

    @compiled
    def weighted_and_output(a):
        w = precond_delta_rule_weights(a["q"], a["k"], a["beta"], a["log_g"], a["beta_atk"], a["log_g_atk"],
                                       segment_ids=ids)
        return jnp.einsum("bhts,bshd->bthd", w, a["v"]), run_precond("naive", {**a, "state": None}, ids)[0], w

    mixed, out, w = weighted_and_output(a)
    assert rel_err(mixed, out) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]  # (B, 1, T, S)
    assert np.all(np.asarray(w)[np.broadcast_to(across, w.shape)] == 0)
    assert np.all(np.triu(np.asarray(w), 1) == 0)


def test_effective_weights_reproduce_the_outputs():
    """With documents and no initial state: W applied to the values gives each op's output."""
    ids = packed_ids()
    p, c, m = inputs("delta_product", seed=9), inputs("comba", seed=9), inputs("mamba3", seed=9)

    @compiled
    def weighted_and_outputs(p, c, m):
        w_p = delta_product_weights(p["q"], p["k"], p["beta"], p["log_g"], segment_ids=ids)
        w_c = comba_weights(c["q"], c["k"], c["p"], c["beta"], c["log_g"], segment_ids=ids)
        w_m = mamba3_attention(m["dt"], m["A"], m["B"], m["C"], m["lam"], m["theta"], segment_ids=ids)
        m_plain = {**m, "D": jnp.zeros_like(m["D"]), "state": None}
        return ((jnp.einsum("bhtsj,bshjd->bthd", w_p, p["v"]), run_product("naive", {**p, "state": None}, ids)[0]),
                (jnp.einsum("bhts,bshd->bthd", w_c, c["v"]), run_comba("naive", {**c, "state": None}, ids)[0]),
                (jnp.einsum("bhts,bshd->bthd", w_m, m["x"]), run_mamba3("naive", m_plain, ids)[0]),
                (w_p, w_c, w_m))

    *pairs, weights = weighted_and_outputs(p, c, m)
    for mixed, out in pairs:
        assert rel_err(mixed, out) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]  # (B, 1, T, S)
    for w in weights:
        w = np.asarray(w).reshape(B, H, LENGTH, LENGTH, -1)
        assert np.all(w[np.broadcast_to(across, w.shape[:4])] == 0)
        assert np.all(np.triu(np.moveaxis(w, -1, 2), 1) == 0)  # causal


def test_bad_shapes_and_methods_fail_in_one_line():
    p, c, m = inputs("delta_product"), inputs("comba"), inputs("mamba3")
    with pytest.raises(ValueError, match="naive, chunk, parallel"):
        run_product("fused", p)
    with pytest.raises(ValueError, match="beta"):
        delta_product(p["q"], p["k"], p["v"], p["beta"][..., :1])
    with pytest.raises(ValueError, match="p has shape"):
        comba(c["q"], c["k"], c["v"], c["p"][..., :3], c["beta"])
    d = inputs("momentum_delta")
    with pytest.raises(ValueError, match="eta has shape"):
        momentum_delta_rule(d["q"], d["k"], d["v"], d["p"], d["beta"], d["eta"][..., :1], d["log_alpha"], d["log_mu"])
    with pytest.raises(ValueError, match="naive, chunk, parallel"):
        run_momentum("pallas", d)
    c = inputs("precond_delta")
    with pytest.raises(ValueError, match="beta_atk has shape"):
        precond_delta_rule(c["q"], c["k"], c["v"], c["beta"], c["log_g"], c["beta_atk"][..., :1], c["log_g_atk"])
    with pytest.raises(ValueError, match="squash=1.0 must exceed 1"):
        precond_delta_rule(c["q"], c["k"], c["v"], c["beta"], c["log_g"], c["beta_atk"], c["log_g_atk"], squash=1.0)
    with pytest.raises(ValueError, match="theta"):
        mamba3(m["x"], m["dt"], m["A"], m["B"], m["C"], m["lam"], jnp.zeros((B, LENGTH, H, N)))
