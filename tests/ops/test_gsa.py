"""Gated slot attention's op (``lmzoo.ops.gsa``): its fast forms against its reference form, on outputs, both final
states and the gradients of every input (initial states included; ``jax.vjp`` with random cotangents) at an odd
length (19: two chunks of 8 and a remainder) from initial states with documents packed in row 0; each document as if
alone; gates strong enough to overflow any exponent taken from a chunk's start; the effective weights; and the
second pass against GLA's op."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, forms_against_naive, packed_segment_ids, rel_err

from lmzoo.ops.gated import gla
from lmzoo.ops.gsa import gsa, gsa_weights

B, H, DK, DV, SLOTS = 2, 2, 8, 6, 5
LENGTH, CHUNK = 19, 8
DOCS = (7, 5, 7)  # row 0's documents; row 1 is one document
TOLERANCE = 1e-5


def packed_ids():
    return packed_segment_ids(DOCS, LENGTH)


def gsa_args(length=LENGTH, seed=0, gate_shift=2.0):
    """Gates a = sigmoid(z + gate_shift) per slot, writes s = 1 - a (as the layer ties them, here free inputs)."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    log_g = -np.log1p(np.exp(-(n(B, length, H, SLOTS) + gate_shift)))
    return jax.tree.map(jnp.asarray, {
        "q": n(B, length, H, DK), "k": n(B, length, H, DK), "v": n(B, length, H, DV),
        "s": -np.expm1(log_g), "log_g": log_g, "state": (n(B, H, DK, SLOTS), n(B, H, SLOTS, DV))})


def run(method, a, segment_ids=None):
    return gsa(a["q"], a["k"], a["v"], a["s"], a["log_g"], initial_state=a.get("state"), method=method,
               chunk_size=CHUNK, segment_ids=segment_ids)


pull_back, reference = forms_against_naive(run, lambda: (gsa_args(), packed_ids()))


@pytest.mark.parametrize("method", ["chunk", "parallel"])
def test_form_matches_reference(method):
    args, ids, cotangent, expected = reference()
    assert_trees_close(pull_back(method, args, cotangent, ids), expected)


def test_each_document_as_if_alone():
    args, ids, _, ((out, state), _) = reference()
    edges = np.cumsum((0,) + DOCS)
    for a, b in zip(edges[1:-1], edges[2:]):  # the later documents: each from zero states
        piece = {n: x[:1, a:b] for n, x in args.items() if n != "state"}
        alone, alone_state = compiled(lambda p: run("naive", p))(piece)
        assert rel_err(out[:1, a:b], alone) < TOLERANCE
    assert_trees_close(jax.tree.map(lambda x: x[:1], state), alone_state)  # the last document's states


def test_strong_gates_stay_exact_in_the_chunks():
    """Slots forgetting ~30 nats a step: exp of any decay summed from a chunk's start would overflow float32
    within a chunk of 8; the halving takes only exponents <= 0, so the chunk form still equals the reference."""
    args = gsa_args(seed=4, gate_shift=-30.0)
    args = {**args, "s": jnp.ones_like(args["s"])}
    (out, state), (ref, ref_state) = (compiled(lambda a, m=m: run(m, a))(args) for m in ("chunk", "naive"))
    assert rel_err(out, ref) < TOLERANCE
    assert_trees_close(state, ref_state)


def test_second_pass_is_gla_with_the_slots_as_keys():
    """o = GLA(p, s, v) with the per-slot gates on its keys and scale 1, p the softmax over the first pass's
    scores: here p comes from a direct float32 loop over the first pass's definition."""
    a = gsa_args(length=9, seed=5)
    out, _ = compiled(lambda a: run("chunk", a))(a)
    f = {n: np.asarray(x, np.float64) for n, x in a.items() if n != "state"}
    keys = np.asarray(a["state"][0], np.float64).copy()
    scores = np.zeros(f["s"].shape)
    for t in range(9):
        keys = keys * np.exp(f["log_g"][:, t])[:, :, None, :] + f["k"][:, t, :, :, None] * f["s"][:, t, :, None, :]
        scores[:, t] = np.einsum("bhd,bhdm->bhm", f["q"][:, t] * DK ** -0.5, keys)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p = jnp.asarray(p / p.sum(-1, keepdims=True), jnp.float32)
    expected, _ = gla(p, a["s"], a["v"], a["log_g"], scale=1.0, initial_state=a["state"][1], method="naive")
    assert rel_err(out, expected) < TOLERANCE


def test_weights_reproduce_the_outputs():
    args, ids = gsa_args(seed=9), packed_ids()

    @compiled
    def weighted_and_output(a):
        w = gsa_weights(a["q"], a["k"], a["s"], a["log_g"], chunk_size=CHUNK, segment_ids=ids)
        return jnp.einsum("bhts,bshd->bthd", w, a["v"]), run("naive", {**a, "state": None}, ids)[0], w

    mixed, out, w = weighted_and_output(args)
    assert rel_err(mixed, out) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]
    assert np.all(np.asarray(w)[np.broadcast_to(across, w.shape)] == 0)
    assert np.all(np.triu(np.asarray(w), 1) == 0)


def test_bad_settings_fail_in_one_line():
    a = gsa_args()
    with pytest.raises(ValueError, match=r"log_g has shape .*\(one gate per slot\)"):
        gsa(a["q"], a["k"], a["v"], a["s"], a["log_g"][..., :3])
    with pytest.raises(ValueError, match="s has shape"):
        gsa(a["q"], a["k"], a["v"], a["s"][:, :3], a["log_g"])
    with pytest.raises(ValueError, match="choose from: naive, chunk, parallel"):
        run("pallas", a)
