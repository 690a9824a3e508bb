"""DeltaFormer's op (``lmzoo.ops.deltaformer``): its fast forms against its reference form, on outputs, final states
and the gradients of every input (the initial state's keys and values included; ``jax.vjp`` with random cotangents)
at an odd length (19: two chunks of 8 and a remainder) with grouped query heads, an initial state and documents
packed in row 0; continuing from a state equals running the whole; the effective weights; and the written values
against a direct solve in float64."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, forms_against_naive, packed_segment_ids, rel_err

from lmzoo.ops.deltaformer import deltaformer, deltaformer_weights

B, H, K, D, DV = 2, 4, 2, 8, 6  # two query heads per key/value head
LENGTH, CHUNK, PAST = 19, 8, 3
DOCS = (7, 5, 7)  # row 0's documents; row 1 is one document
TOLERANCE = 1e-5


def packed_ids():
    return packed_segment_ids(DOCS, LENGTH)


def deltaformer_args(length=LENGTH, seed=0, past=PAST):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    args = {"q": n(B, length, H, D), "k": n(B, length, K, D), "v": n(B, length, K, DV),
            "beta": 1 / (1 + np.exp(-n(B, length, K))), "w": n(B, length, K, D)}
    if past:
        args["state"] = (n(B, past, K, D), n(B, past, K, DV))
    return jax.tree.map(jnp.asarray, args)


def run(method, a, segment_ids=None):
    return deltaformer(a["q"], a["k"], a["v"], a["beta"], w=a.get("w"), initial_state=a.get("state"), method=method,
                       chunk_size=CHUNK, segment_ids=segment_ids)


pull_back, reference = forms_against_naive(run, lambda: (deltaformer_args(), packed_ids()))


@pytest.mark.parametrize("method", ["chunk", "parallel"])
def test_form_matches_reference(method):
    args, ids, cotangent, expected = reference()
    assert_trees_close(pull_back(method, args, cotangent, ids), expected)


def test_continuing_from_the_state_equals_running_the_whole():
    """The sequence's first 5 tokens, then the other 14 from the state they leave: the outputs and the state of
    running all 19 at once (documents included), in the fast form. (A state's tokens all belong to the document
    the continuation begins in, so the cut lies in row 0's first document.)"""
    args, ids, _, ((out, state), _) = reference()
    cut = 5
    head = {n: x[:, :cut] for n, x in args.items() if n != "state"}
    tail = {n: x[:, cut:] for n, x in args.items() if n != "state"}
    first, middle = compiled(lambda a: run("chunk", a, ids[:, :cut]))({**head, "state": args["state"]})
    second, final = compiled(lambda a: run("chunk", a, ids[:, cut:]))({**tail, "state": middle})
    assert rel_err(jnp.concatenate([first, second], axis=1), out) < TOLERANCE
    assert_trees_close(final, state)


def test_each_document_as_if_alone():
    args, ids, _, ((out, (_, u)), _) = reference()
    edges = np.cumsum((0,) + DOCS)
    for a, b in zip(edges[1:-1], edges[2:]):  # the later documents: each from an empty state
        piece = {n: x[:1, a:b] for n, x in args.items() if n != "state"}
        alone, (_, alone_u) = compiled(lambda p: run("naive", p))(piece)
        assert rel_err(out[:1, a:b], alone) < TOLERANCE
        assert rel_err(u[:1, PAST + a:PAST + b], alone_u) < TOLERANCE


def test_weights_reproduce_the_outputs():
    args, ids = deltaformer_args(seed=9, past=0), packed_ids()

    @compiled
    def weighted_and_output(a):
        w = deltaformer_weights(a["q"], a["k"], a["beta"], w=a["w"], segment_ids=ids, chunk_size=CHUNK)
        values = jnp.repeat(a["v"], H // K, axis=2)
        return jnp.einsum("bhts,bshd->bthd", w, values), run("naive", a, ids)[0], w

    mixed, out, w = weighted_and_output(args)
    assert rel_err(mixed, out) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]
    assert np.all(np.asarray(w)[np.broadcast_to(across, w.shape)] == 0)
    assert np.all(np.triu(np.asarray(w), 1) == 0)


def test_written_values_solve_the_triangular_system():
    """In float64, with the keys as write queries: u = (I + diag(beta) P)^{-1} v, P the strictly causal softmax of
    the keys against each other, and o = A u; the first token writes its own value."""
    a = deltaformer_args(length=9, seed=3, past=0)
    a.pop("w")
    out, (_, u) = compiled(lambda a: run("naive", a))(a)
    f = {n: np.asarray(x, np.float64) for n, x in a.items()}
    scale = D ** -0.5
    for b, head in np.ndindex(B, K):
        k, v, beta = f["k"][b, :, head], f["v"][b, :, head], f["beta"][b, :, head]
        logits = k @ k.T * scale
        p = np.zeros((9, 9))
        for t in range(1, 9):
            e = np.exp(logits[t, :t] - logits[t, :t].max())
            p[t, :t] = e / e.sum()
        expected_u = np.linalg.solve(np.eye(9) + beta[:, None] * p, v)
        assert rel_err(u[b, :, head], expected_u) < TOLERANCE
        for g in range(H // K):
            qh = f["q"][b, :, head * (H // K) + g]
            scores = np.where(np.tril(np.ones((9, 9))) > 0, qh @ k.T * scale, -np.inf)
            read = np.exp(scores - scores.max(-1, keepdims=True))
            read /= read.sum(-1, keepdims=True)
            assert rel_err(out[b, :, head * (H // K) + g], read @ expected_u) < TOLERANCE
    assert rel_err(u[:, 0], a["v"][:, 0]) == 0


def test_bad_settings_fail_in_one_line():
    a = deltaformer_args()
    with pytest.raises(ValueError, match="beta has shape"):
        deltaformer(a["q"], a["k"], a["v"], a["beta"][..., :1])
    with pytest.raises(ValueError, match="multiple of 2 heads"):
        deltaformer(a["q"][:, :, :3], a["k"], a["v"], a["beta"])
    with pytest.raises(ValueError, match="naive, chunk, parallel"):
        run("pallas", a)
