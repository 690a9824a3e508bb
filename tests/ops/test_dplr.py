"""The DPLR rule and GDN-2 (``lmzoo.ops.dplr``): every form against the "naive" reference, that
against a float64 loop, and the delta rule (scalar and per-channel gates, grouped value heads), KDA
and GDN-2 as special cases of DPLR.

Outputs, final states and the gradients of every input (``jax.vjp`` with random cotangents on both
outputs) agree to a norm-relative 1e-5 in float32 at an odd length (19 steps: two chunks of 8 and a
remainder), from a zero and a random initial state, with documents, and with gates of ~12 nats a
step inside one long chunk. Inputs are RWKV-7's: alpha = -kappa_hat (unit), beta = kappa_hat * a.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, random_like, rel_err

from lmzoo.ops.delta import delta_rule
from lmzoo.ops.dplr import delta_as_dplr, dplr, dplr_weights, gdn2
from lmzoo.ops.ut import decayed_pairs

B, H, DK, DV = 2, 2, 8, 6
CHUNK = 8
ODD = 19
TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-2
DOCS = (6, 8, 5)  # row 0's documents; row 1 is one document
INPUTS = ("q", "k", "v", "alpha", "beta", "log_g")


def dplr_args(length, *, with_state, seed=0, strong=False):
    """RWKV-7-like inputs: unit kappa_hat, a in (0, 1), per-channel gates ~0.5 .. 1 (or ~12 nats a step)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    kappa = normal(B, length, H, DK)
    kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
    a = 1 / (1 + np.exp(-normal(B, length, H, DK)))
    logits = normal(B, length, H, DK)
    log_g = -np.exp(logits + 2.5) if strong else -np.log1p(np.exp(-(logits + 2.0)))
    args = {"q": normal(B, length, H, DK), "k": normal(B, length, H, DK) / np.sqrt(DK), "v": normal(B, length, H, DV),
            "alpha": -kappa, "beta": kappa * a, "log_g": log_g}
    if with_state:
        args["state"] = normal(B, H, DK, DV)
    return jax.tree.map(jnp.asarray, args)


def packed_ids(length=ODD):
    row = np.concatenate([np.full(n, i) for i, n in enumerate(DOCS)])
    return jnp.asarray(np.stack([row, np.zeros(length, int)]), jnp.int32)


def run(method, args, chunk_size=CHUNK, segment_ids=None):
    return dplr(*(args[n] for n in INPUTS), initial_state=args.get("state"), method=method, chunk_size=chunk_size,
                segment_ids=segment_ids)


@functools.partial(compiled, static_argnums=(0,), static_argnames=("chunk_size",))
def outputs_and_grads(method, args, cotangent, segment_ids=None, chunk_size=CHUNK):
    out, vjp = jax.vjp(lambda a: run(method, a, chunk_size, segment_ids), args)
    return out, vjp(cotangent)[0]


@functools.lru_cache(maxsize=None)
def reference(setting):
    """Inputs, segment ids, a cotangent and the reference's outputs and gradients for a setting.

    To compile few programs, "state" passes segment ids too (one document: no reset), sharing the
    programs of "documents", and "no_state" runs its reference from a zero state."""
    args = dplr_args(ODD, with_state=setting != "no_state")
    ids = None if setting == "no_state" else packed_ids() if setting == "documents" else jnp.zeros((B, ODD), jnp.int32)
    full = {**args, "state": jnp.zeros((B, H, DK, DV))} if setting == "no_state" else args
    cotangent = random_like(jax.eval_shape(lambda a: run("naive", a), full), seed=7)
    out, grads = outputs_and_grads("naive", full, cotangent, ids)
    return args, ids, cotangent, (out, {name: grads[name] for name in args})


SETTINGS = [("chunk", "no_state"), ("chunk", "state"), ("chunk", "documents"), ("parallel", "state")]


@pytest.mark.parametrize("method, setting", SETTINGS, ids=[f"{m}-{s}" for m, s in SETTINGS])
def test_form_matches_naive(method, setting):
    args, ids, cotangent, expected = reference(setting)
    assert_trees_close(outputs_and_grads(method, args, cotangent, ids), expected)


def test_strong_decay_in_one_long_chunk_stays_exact():
    """Hundreds of nats inside one chunk (the parallel form's one chunk): a pair decay taken as
    exp(b_i) exp(-b_j) would overflow. Same shapes as the "state" setting: its programs serve."""
    args = dplr_args(ODD, with_state=True, seed=21, strong=True)
    assert float(jnp.sum(args["log_g"], axis=1).max()) < -100  # every channel: exp(100) overflows float32
    _, ids, cotangent, _ = reference("state")
    expected = outputs_and_grads("naive", args, cotangent, ids)
    assert_trees_close(outputs_and_grads("parallel", args, cotangent, ids), expected)


def test_bfloat16_inputs_close_to_float32_reference():
    args, _, _, (expected, _) = reference("state")
    out, state = compiled(lambda a: run("chunk", a))(jax.tree.map(lambda x: x.astype(jnp.bfloat16), args))
    assert out.dtype == jnp.bfloat16 and state.dtype == jnp.float32
    assert_trees_close((out.astype(jnp.float32), state), expected, tol=BF16_TOLERANCE)


def test_documents_are_mixed_as_if_alone():
    """Row 0 packs three documents: each equals its own run from a zero state (the first from the
    initial state), values and final state, although the low-rank term reads before the decay."""
    args, ids, _, ((out, final), _) = reference("documents")
    edges = np.cumsum((0,) + DOCS)
    for d, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        piece = {n: args[n][:1, a:b] for n in INPUTS}
        piece["state"] = args["state"][:1] * (d == 0)
        o, s = run("naive", piece)
        assert rel_err(out[:1, a:b], o) < TOLERANCE, f"document {d}"
    assert rel_err(final[:1], s) < TOLERANCE


# ----------------------------------------------------------------------------- the reference itself


def loop_dplr(args, scale):
    """The recurrence in float64, one head and step at a time."""
    q, k, v, alpha, beta, log_g, s = (np.asarray(args[n], np.float64) for n in (*INPUTS, "state"))
    out = np.zeros(v.shape)
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            state = s[b, h].copy()
            for t in range(q.shape[1]):
                read = alpha[b, t, h] @ state  # before the decay
                state = np.exp(log_g[b, t, h])[:, None] * state + np.outer(beta[b, t, h], read)
                state += np.outer(k[b, t, h], v[b, t, h])
                out[b, t, h] = scale * state.T @ q[b, t, h]
            s[b, h] = state
    return out, s


def test_naive_matches_the_recurrence_in_float64():
    args = dplr_args(12, with_state=True, seed=11)
    out, state = compiled(lambda a: dplr(*(a[n] for n in INPUTS), scale=0.3, initial_state=a["state"],
                                         method="naive"))(args)
    expected_out, expected_state = loop_dplr(args, 0.3)
    assert rel_err(out, expected_out) < TOLERANCE and rel_err(state, expected_state) < TOLERANCE


def test_weights_reproduce_the_outputs_and_vanish_across_documents():
    args = dplr_args(ODD, with_state=False, seed=13)
    ids = packed_ids()

    @compiled
    def weights_and_outputs(a):
        w = dplr_weights(*(a[n] for n in ("q", "k", "alpha", "beta", "log_g")), segment_ids=ids)
        return w, jnp.einsum("bhts,bshd->bthd", w, a["v"]), run("naive", a, segment_ids=ids)[0]

    w, mixed, out = weights_and_outputs(args)
    assert rel_err(mixed, out) < TOLERANCE
    assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0
    assert float(jnp.abs(w[0, :, 6:, :6]).max()) == 0.0  # the second document never sees the first


# ----------------------------------------------------------------------------- special cases


@pytest.mark.parametrize("gate", ("head", "channel"))
def test_the_delta_rule_is_dplr(gate):
    """Gated DeltaNet (one gate per head) and KDA (per channel): same outputs and final state through
    ``dplr`` (alpha = exp(g) k, beta -> -beta k, k -> beta k), here with grouped value heads."""
    rng = np.random.default_rng(3)
    value_heads = 2 * H
    args = dplr_args(ODD, with_state=False, seed=4)
    q, k = args["q"], args["k"] / jnp.linalg.norm(args["k"], axis=-1, keepdims=True)
    v = jnp.asarray(rng.standard_normal((B, ODD, value_heads, DV)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0, 1, (B, ODD, value_heads)), jnp.float32)
    gate_shape = (B, ODD, value_heads) + ((DK,) if gate == "channel" else ())
    log_g = jnp.asarray(-rng.uniform(0.01, 0.7, gate_shape), jnp.float32)
    s0 = jnp.asarray(rng.standard_normal((B, value_heads, DK, DV)), jnp.float32)

    @compiled
    def both(q, k, v, beta, log_g, s0):
        expected = delta_rule(q, k, v, beta, log_g, initial_state=s0, method="naive")
        qv, kv = jnp.repeat(q, 2, axis=2), jnp.repeat(k, 2, axis=2)  # value head hv uses key head hv // 2
        written, alpha, low_rank_beta = delta_as_dplr(kv, beta, log_g)
        through_dplr = dplr(qv, written, v, alpha, low_rank_beta, log_g, initial_state=s0, method="naive")
        return through_dplr, expected

    assert_trees_close(*both(q, k, v, beta, log_g, s0))


def loop_gdn2(q, k, v, log_g, erase, write, s0, scale):
    """GDN-2 written out in float64: decay, erase at (erase * k), write (write * v) at k."""
    q, k, v, log_g, erase, write, s = (np.asarray(x, np.float64) for x in (q, k, v, log_g, erase, write, s0))
    out = np.zeros(v.shape)
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            state = s[b, h].copy()
            for t in range(q.shape[1]):
                state = np.exp(log_g[b, t, h])[:, None] * state
                state = state + np.outer(k[b, t, h],
                                         write[b, t, h] * v[b, t, h] - state.T @ (erase[b, t, h] * k[b, t, h]))
                out[b, t, h] = scale * state.T @ q[b, t, h]
            s[b, h] = state
    return out, s


def gdn2_args(seed=5):
    rng = np.random.default_rng(seed)
    args = dplr_args(ODD, with_state=True, seed=seed)
    k = args["k"] / jnp.linalg.norm(args["k"], axis=-1, keepdims=True)
    erase = jnp.asarray(rng.uniform(0, 1, (B, ODD, H, DK)), jnp.float32)
    write = jnp.asarray(rng.uniform(0, 1, (B, ODD, H, DV)), jnp.float32)
    return args["q"], k, args["v"], args["log_g"], erase, write, args["state"]


def test_gdn2_matches_its_recurrence_in_float64():
    """GDN-2 maps its inputs onto ``dplr``, whose forms the tests above check with gradients."""
    inputs = gdn2_args()
    out, state = compiled(lambda *a: gdn2(*a[:6], initial_state=a[6], method="naive"))(*inputs)
    expected_out, expected_state = loop_gdn2(*inputs, DK**-0.5)
    assert rel_err(out, expected_out) < TOLERANCE and rel_err(state, expected_state) < TOLERANCE


def test_gdn2_with_erase_and_write_beta_is_kda():
    q, k, v, log_g, _, _, s0 = gdn2_args(seed=6)
    beta = jnp.asarray(np.random.default_rng(6).uniform(0, 1, (B, ODD, H)), jnp.float32)

    @compiled
    def both(q, k, v, log_g, beta, s0):
        erase, write = (jnp.broadcast_to(beta[..., None], x.shape) for x in (k, v))
        return (gdn2(q, k, v, log_g, erase, write, initial_state=s0, method="naive"),
                delta_rule(q, k, v, beta, log_g, initial_state=s0, method="naive"))

    assert_trees_close(*both(q, k, v, log_g, beta, s0))


def test_bad_settings_fail_clearly():
    args = dplr_args(5, with_state=False)
    with pytest.raises(ValueError, match="naive, parallel, chunk"):
        run("pallas", args)
    with pytest.raises(ValueError, match="alpha"):
        dplr(*(args[n] for n in ("q", "k", "v")), args["alpha"][..., :3], args["beta"], args["log_g"])
    with pytest.raises(ValueError, match="log_g"):
        dplr(*(args[n] for n in ("q", "k", "v", "alpha", "beta")), args["log_g"][..., :3])
    with pytest.raises(ValueError, match="before_decay"):
        decayed_pairs(args["q"], args["k"], args["log_g"], diagonal=True, before_decay=True)
    with pytest.raises(ValueError, match="multiple of the 2 key heads"):
        delta_rule(args["q"], args["k"], jnp.zeros((B, 5, 3, DV)), jnp.zeros((B, 5, 3)))
