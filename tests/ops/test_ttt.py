"""TTT-Linear's op (``lmzoo.ops.ttt``): its chunk form against its reference on outputs, final states and the
gradients of every input (the initial model and the inner norm included; ``jax.vjp`` with random cotangents) at
an odd length (19: mini-batches of 4, the last of 3) from an initial model, with documents packed in row 0 (one
starting inside a mini-batch); a document starting at a mini-batch's start as if alone; the reference and the
weights against the recurrence written out in float64; decoding on from a state left mid mini-batch."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import (assert_trees_close, compiled, decoded_from_a_split, forms_against_naive, packed_segment_ids,
                       rel_err)

from lmzoo.ops.ttt import ttt_linear, ttt_linear_step, ttt_linear_weights

B, H, D = 2, 2, 6
LENGTH, CHUNK = 19, 4
DOCS = (8, 6, 5)  # row 0's documents: the second starts at a mini-batch's start, the third inside one
TOLERANCE = 2e-5


def packed_ids():
    return packed_segment_ids(DOCS, LENGTH)


def ttt_args(length=LENGTH, seed=0):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return jax.tree.map(jnp.asarray, {
        "q": unit(n(B, length, H, D)), "k": unit(n(B, length, H, D)), "v": n(B, length, H, D),
        "eta": 0.5 / (1 + np.exp(-n(B, length, H))), "weight": 1 + 0.3 * n(H, D), "bias": 0.3 * n(H, D),
        "state": (0.5 * n(B, H, D, D), 0.3 * n(B, H, D))})


def run(method, a, segment_ids=None):
    return ttt_linear(a["q"], a["k"], a["v"], a["eta"], a["weight"], a["bias"], initial_state=a.get("state"),
                      method=method, chunk_size=CHUNK, segment_ids=segment_ids)


pull_back, reference = forms_against_naive(run, lambda: (ttt_args(), packed_ids()))


def test_chunk_matches_reference():
    args, ids, cotangent, expected = reference()
    assert_trees_close(pull_back("chunk", args, cotangent, ids), expected, TOLERANCE)


def test_a_document_at_a_mini_batch_start_as_if_alone():
    """Row 0's second document (steps 8..13) from the initial model equals that document run alone."""
    args, ids, _, ((out, _), _) = reference()
    piece = {n: (x[:1, 8:14] if n not in ("state", "weight", "bias") else x) for n, x in args.items()}
    piece["state"] = tuple(s[:1] for s in args["state"])
    alone, _ = compiled(lambda p: run("naive", p))(piece)
    assert rel_err(out[:1, 8:14], alone) < TOLERANCE


def float64_recurrence(a, ids, eps=1e-6):
    """Outputs, read-outs z and updates u of the layer written out per token in float64, mini-batches of CHUNK from
    the start, documents restarting from the initial model."""
    f = {n: np.asarray(x, np.float64) for n, x in a.items() if n != "state"}
    w_init, b_init = (np.asarray(x, np.float64) for x in a["state"])
    length, scale = f["q"].shape[1], D ** -0.5
    out, z, u = (np.zeros(f["q"].shape) for _ in range(3))

    def norm(x):
        s = np.sqrt(x.var() + eps)
        return (x - x.mean()) / s, s

    for b, h in np.ndindex(B, H):
        w_lr, c = f["weight"][h], f["bias"][h]
        for t in range(length):
            if t == 0 or ids[b, t] != ids[b, t - 1]:
                w0, b0, dw, db = w_init[b, h].copy(), b_init[b, h].copy(), np.zeros((D, D)), np.zeros(D)
            k, v, q = f["k"][b, t, h], f["v"][b, t, h], f["q"][b, t, h]
            hat, s = norm(k @ w0 + b0)
            g = w_lr * (w_lr * hat + c - (v - k))
            u[b, t, h] = (g - g.mean() - hat * (g * hat).mean()) / s
            dw, db = dw + np.outer(k, u[b, t, h]), db + u[b, t, h]
            rate = f["eta"][b, t, h]
            z[b, t, h] = scale * q @ (w0 - rate * dw) + b0 - rate * db
            out[b, t, h] = z[b, t, h] + norm(z[b, t, h])[0] * w_lr + c
            if t % CHUNK == CHUNK - 1:
                w0, b0, dw, db = w0 - rate * dw, b0 - rate * db, np.zeros((D, D)), np.zeros(D)
    return out, z, u


def test_reference_and_weights_against_the_recurrence_in_float64():
    """The reference's outputs are the recurrence's; z from the initial model's read-out plus the weights times
    the updates u (zero initial model, documents) is the recurrence's z, and the weights are causal and 0 across
    documents."""
    args, ids, _, ((out, _), _) = reference()
    expected, _, _ = float64_recurrence(args, np.asarray(ids))
    assert rel_err(out, expected) < TOLERANCE
    zero = {**args, "state": tuple(jnp.zeros_like(s) for s in args["state"])}
    _, z, u = float64_recurrence(zero, np.asarray(ids))
    w = np.asarray(ttt_linear_weights(args["q"], args["k"], args["eta"], chunk_size=CHUNK, segment_ids=ids))
    assert rel_err(np.einsum("bhts,bshd->bthd", w, u), z) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]
    assert np.all(w[np.broadcast_to(across, w.shape)] == 0) and np.all(np.triu(w, 1) == 0)


def test_decoding_on_from_a_state_left_inside_a_mini_batch():
    """The chunk form's state after 9 steps (one step into the third mini-batch), stepped on token by token,
    gives the chunk form's outputs over all 19 and its final state."""
    args = ttt_args(seed=3)
    (whole, final), (outs, state) = decoded_from_a_split(run, ttt_linear_step, args, ("q", "k", "v", "eta"), 9, CHUNK)
    assert rel_err(outs, whole) < TOLERANCE
    assert_trees_close(state, final, TOLERANCE)


def test_bad_settings_fail_in_one_line():
    a = ttt_args()
    with pytest.raises(ValueError, match="eta has shape"):
        ttt_linear(a["q"], a["k"], a["v"], a["eta"][..., :1], a["weight"], a["bias"])
    with pytest.raises(ValueError, match="one shape"):
        ttt_linear(a["q"], a["k"], a["v"][..., :3], a["eta"], a["weight"], a["bias"])
    with pytest.raises(ValueError, match="naive, chunk"):
        run("parallel", a)
