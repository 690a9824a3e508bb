"""MesaNet's op (``lmzoo.ops.mesa``): its fast forms against its reference form, on outputs, final states and
the gradients of every input (initial states and the ridge penalty included; ``jax.vjp`` with random cotangents)
at an odd length (19: two chunks of 8 and a remainder) from initial states with documents packed in row 0; each
document as if alone; the effective weights; and the solve against an exact one in float64."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, forms_against_naive, packed_segment_ids, rel_err

from lmzoo.ops.mesa import mesa_net, mesa_net_weights

B, H, DK, DV = 2, 2, 8, 6
LENGTH, CHUNK, CG_STEPS = 19, 8, 12
DOCS = (7, 5, 7)  # row 0's documents; row 1 is one document
TOLERANCE = 1e-5


def packed_ids():
    return packed_segment_ids(DOCS, LENGTH)


def mesa_args(length=LENGTH, seed=0):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    past = unit(n(B, 4, H, DK))
    return jax.tree.map(jnp.asarray, {
        "q": unit(n(B, length, H, DK)), "k": unit(n(B, length, H, DK)), "v": n(B, length, H, DV),
        "beta": 1 / (1 + np.exp(-n(B, length, H))), "log_g": -np.log1p(np.exp(-(n(B, length, H) + 2))),
        "lamb": 0.5 + np.abs(n(H, DK)),
        "state": (np.einsum("bthd,bthe->bhde", past, past), n(B, H, DK, DV))})  # H: a sum of outer products


def run(method, a, segment_ids=None, cg_steps=CG_STEPS):
    return mesa_net(a["q"], a["k"], a["v"], a["beta"], a["log_g"], a["lamb"], cg_steps=cg_steps,
                    initial_state=a.get("state"), method=method, chunk_size=CHUNK, segment_ids=segment_ids)


pull_back, reference = forms_against_naive(run, lambda: (mesa_args(), packed_ids()))


@pytest.mark.parametrize("method", ["chunk", "parallel"])
def test_form_matches_reference(method):
    args, ids, cotangent, expected = reference()
    assert_trees_close(pull_back(method, args, cotangent, ids), expected)


def test_each_document_as_if_alone():
    args, ids, _, ((out, state), _) = reference()
    edges = np.cumsum((0,) + DOCS)
    for a, b in zip(edges[1:-1], edges[2:]):  # the later documents: each from zero states
        piece = {n: x[:1, a:b] for n, x in args.items() if n not in ("state", "lamb")}
        alone, alone_state = compiled(lambda p: run("naive", {**p, "lamb": args["lamb"]}))(piece)
        assert rel_err(out[:1, a:b], alone) < TOLERANCE
    assert_trees_close(jax.tree.map(lambda x: x[:1], state), alone_state)  # the last document's states


def test_weights_reproduce_the_outputs():
    args, ids = mesa_args(seed=9), packed_ids()

    @compiled
    def weighted_and_output(a):
        w = mesa_net_weights(a["q"], a["k"], a["beta"], a["log_g"], a["lamb"], cg_steps=CG_STEPS, segment_ids=ids)
        return jnp.einsum("bhts,bshd->bthd", w, a["v"]), run("naive", {**a, "state": None}, ids)[0], w

    mixed, out, w = weighted_and_output(args)
    assert rel_err(mixed, out) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]
    assert np.all(np.asarray(w)[np.broadcast_to(across, w.shape)] == 0)
    assert np.all(np.triu(np.asarray(w), 1) == 0)


def test_enough_conjugate_gradient_steps_give_the_exact_ridge_regression():
    """DK steps of conjugate gradients solve a DK x DK system exactly in exact arithmetic: against float64 sums and
    a direct solve, the reference with 2 DK steps agrees to 2e-3 (float32 conjugate gradients, whose guarded
    denominators stop improving near 1e-3), and 2 steps are much further off."""
    a = mesa_args(length=9, seed=3)
    out, (h, g) = compiled(lambda a: run("naive", a, cg_steps=2 * DK))(a)
    f = {n: np.asarray(x, np.float64) for n, x in a.items() if n != "state"}
    hs, gs = (np.asarray(x, np.float64).copy() for x in a["state"])
    expected = np.zeros(out.shape)
    for b, head in np.ndindex(B, H):
        for t in range(9):
            decay, k = np.exp(f["log_g"][b, t, head]), f["k"][b, t, head]
            hs[b, head] = decay * hs[b, head] + f["beta"][b, t, head] * np.outer(k, k)
            gs[b, head] = decay * gs[b, head] + f["beta"][b, t, head] * np.outer(k, f["v"][b, t, head])
            x = np.linalg.solve(hs[b, head] + np.diag(f["lamb"][head]), f["q"][b, t, head])
            expected[b, t, head] = gs[b, head].T @ x
    assert rel_err(out, expected) < 2e-3
    assert rel_err(compiled(lambda a: run("naive", a, cg_steps=2))(a)[0], expected) > 1e-2
    assert rel_err(h, hs) < TOLERANCE and rel_err(g, gs) < TOLERANCE


def test_bad_settings_fail_in_one_line():
    a = mesa_args()
    with pytest.raises(ValueError, match="lamb has shape"):
        mesa_net(a["q"], a["k"], a["v"], a["beta"], a["log_g"], a["lamb"][:, :3])
    with pytest.raises(ValueError, match="cg_steps=0 must be positive"):
        run("chunk", a, cg_steps=0)
    with pytest.raises(ValueError, match="naive, chunk, parallel"):
        run("pallas", a)
