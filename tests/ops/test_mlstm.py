"""``lmzoo.ops.mlstm``: every form against the naive recurrence (values, the final (C, n, m), gradients of every input
with random cotangents, odd lengths, an initial state, input gates large enough to need the stabiliser), documents
kept apart, and the effective weights."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops.mlstm import mlstm, mlstm_weights

from op_checks import assert_trees_close, random_like, rel_err

B, H, DK, DV = 2, 2, 8, 16


def mlstm_inputs(length: int, *, gate_scale: float = 2.0, seed: int = 0):
    """q, k, v, the input gates' logs (spread by ``gate_scale``), log forget gates ~ -0.02 .. -1, an initial state."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    log_f = jax.nn.log_sigmoid(normal(B, length, H) + 2.0)
    state = (normal(B, H, DK, DV), normal(B, H, DK), normal(B, H))
    return {"q": normal(B, length, H, DK), "k": normal(B, length, H, DK), "v": normal(B, length, H, DV),
            "log_i": gate_scale * normal(B, length, H), "log_f": log_f, "state": state}


def run(method, segment_ids=None):
    def fn(args):
        return mlstm(args["q"], args["k"], args["v"], args["log_i"], args["log_f"], initial_state=args["state"],
                     method=method, segment_ids=segment_ids)
    return fn


def pull_back(fn, args):
    """(outputs, gradients of every input) for one random cotangent of (h, (C, n, m))."""
    cotangent = random_like(jax.eval_shape(fn, args), seed=7)

    @jax.jit
    def both(args):
        out, vjp = jax.vjp(fn, args)
        return out, vjp(cotangent)[0]

    return both(args)


@functools.lru_cache(maxsize=None)
def expected(length, gate_scale=2.0):
    args = mlstm_inputs(length, gate_scale=gate_scale)
    return args, pull_back(run("naive"), args)


@pytest.mark.parametrize("method", ["parallel", "assoc"])
@pytest.mark.parametrize("length, gate_scale", [(1, 2.0), (23, 2.0), (23, 8.0)])
def test_every_form_equals_the_naive_recurrence(method, length, gate_scale):
    """Input gates up to e^{±20} at gate_scale 8: the stabiliser keeps every form finite and equal."""
    args, reference = expected(length, gate_scale)
    assert_trees_close(pull_back(run(method), args), reference, tol=2e-5)


@pytest.mark.parametrize("method", ["parallel", "assoc"])
def test_input_gates_past_float32s_range_stay_finite_and_equal(method):
    """Input gates of e^{+-120} (exp alone would overflow float32): values and states equal the naive form's, every
    gradient finite. (Their gradients agree only to ~1e-4 there: the normaliser's division amplifies rounding.)"""
    args, ((out, state), _) = expected(23, 40.0)
    (fast_out, fast_state), grads = pull_back(run(method), args)
    assert float(jnp.max(jnp.abs(args["log_i"]))) > 89.0
    assert_trees_close((fast_out, fast_state), (out, state), tol=2e-5)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_the_state_carries_over_a_split():
    args = mlstm_inputs(23)
    whole, final = run("assoc")(args)
    head = {n: (x if n == "state" else x[:, :10]) for n, x in args.items()}
    first, middle = run("naive")(head)
    second, end = run("assoc")({**{n: x[:, 10:] for n, x in args.items() if n != "state"}, "state": middle})
    assert rel_err(jnp.concatenate([first, second], axis=1), whole) < 1e-5
    for a, b in zip(end, final):
        assert rel_err(a, b) < 1e-5


DOCS = (7, 5, 11)  # row 0 holds three documents; row 1 one


@pytest.mark.parametrize("method", ["naive", "parallel", "assoc"])
def test_documents_are_mixed_as_if_alone(method):
    """Each document's outputs are those it gives alone (the first from the initial state, the others from zeros),
    the final state the last one's; the fast forms' gradients with documents equal the naive form's."""
    args = mlstm_inputs(sum(DOCS))
    ids = jnp.asarray(np.stack([np.repeat(np.arange(3), DOCS), np.zeros(sum(DOCS), int)]))
    packed = pull_back(run(method, ids), args)
    assert_trees_close(packed, pull_back(run("naive", ids), args), tol=2e-5)
    (out, final), _ = packed
    edges = np.cumsum((0,) + DOCS)
    row0 = {n: (tuple(s[:1] for s in x) if n == "state" else x[:1]) for n, x in args.items()}
    for d, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        piece = {n: (x if n == "state" else x[:, a:b]) for n, x in row0.items()}
        if d:
            piece["state"] = tuple(jnp.zeros_like(s) for s in piece["state"])
        alone, alone_final = run("naive")(piece)
        assert rel_err(out[:1, a:b], alone) < 1e-5, d
    for got, want in zip(final, alone_final):
        assert rel_err(got[:1], want) < 1e-5


def test_the_weights_times_the_values_are_the_output_and_zero_across_documents():
    args = mlstm_inputs(sum(DOCS))
    ids = jnp.asarray(np.stack([np.repeat(np.arange(3), DOCS), np.zeros(sum(DOCS), int)]))
    q, k, v, log_i, log_f = (args[n] for n in ("q", "k", "v", "log_i", "log_f"))
    for segment_ids in (None, ids):
        weights = mlstm_weights(q, k, log_i, log_f, segment_ids=segment_ids)
        out, _ = mlstm(q, k, v, log_i, log_f, method="naive", segment_ids=segment_ids)
        assert rel_err(jnp.einsum("bhts,bshd->bthd", weights, v), out) < 1e-5
    across = np.asarray(ids[:, :, None] != ids[:, None, :])[:, None]
    assert np.all(np.asarray(weights)[np.broadcast_to(across, weights.shape)] == 0)
    assert np.all(np.triu(np.asarray(weights), 1) == 0)


def test_a_bad_form_is_refused_in_one_line():
    args = mlstm_inputs(5)
    choices = r"\(choose from: naive, parallel, assoc, auto, jla\)"
    with pytest.raises(ValueError, match=r"method='chunk' is not valid " + choices):
        mlstm(args["q"], args["k"], args["v"], args["log_i"], args["log_f"], method="chunk")
