"""Titans' neural memory (``lmzoo.ops.titans``): its chunk form against its reference on outputs, final states and
the gradients of every input (initial memory and momentum, gates and the inner norm included; ``jax.vjp`` with
random cotangents) at an odd length (19: mini-batches of 4, the last of 3), with documents packed in row 0 (one
starting inside a mini-batch); the reference and the weights against the recurrence written out in float64;
decoding on from a state left mid mini-batch."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, decoded_from_a_split, forms_against_naive, packed_segment_ids, rel_err

from lmzoo.ops.titans import titans, titans_step, titans_weights

B, H, D = 2, 2, 6
LENGTH, CHUNK = 19, 4
DOCS = (8, 6, 5)  # row 0's documents: the second starts at a mini-batch's start, the third inside one
TOLERANCE = 2e-5
GATES = ("q", "k", "v", "theta", "log_decay", "log_momentum")


def packed_ids():
    return packed_segment_ids(DOCS, LENGTH)


def titans_args(length=LENGTH, seed=0):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    log_sigmoid = lambda x: -np.log1p(np.exp(-x))  # noqa: E731
    return jax.tree.map(jnp.asarray, {
        "q": unit(n(B, length, H, D)), "k": unit(n(B, length, H, D)), "v": n(B, length, H, D),
        "theta": 0.2 / (1 + np.exp(-n(B, length, H))), "log_decay": log_sigmoid(n(B, length, H) + 2),
        "log_momentum": log_sigmoid(n(B, length, H) + 1), "weight": 1 + 0.3 * n(H, D), "bias": 0.3 * n(H, D),
        "state": (0.5 * n(B, H, D, D), 0.3 * n(B, H, D, D))})


def run(method, a, segment_ids=None):
    return titans(*(a[n] for n in GATES), a["weight"], a["bias"], initial_state=a.get("state"), method=method,
                  chunk_size=CHUNK, segment_ids=segment_ids)


pull_back, reference = forms_against_naive(run, lambda: (titans_args(), packed_ids()))


def test_chunk_matches_reference():
    args, ids, cotangent, expected = reference()
    assert_trees_close(pull_back("chunk", args, cotangent, ids), expected, TOLERANCE)


def float64_recurrence(a, ids, eps=1e-6):
    """Outputs, read-outs z and updates u of the memory written out per token in float64: mini-batches of CHUNK
    from the start, documents restarting from the initial state."""
    f = {n: np.asarray(x, np.float64) for n, x in a.items() if n != "state"}
    m_init, s_init = (np.asarray(x, np.float64) for x in a["state"])
    out, z, u = (np.zeros(f["q"].shape) for _ in range(3))

    def norm(x):
        s = np.sqrt(x.var() + eps)
        return (x - x.mean()) / s, s

    for b, h in np.ndindex(B, H):
        w, c = f["weight"][h], f["bias"][h]
        for t in range(f["q"].shape[1]):
            if t == 0 or ids[b, t] != ids[b, t - 1]:
                memory, momentum, point = m_init[b, h].copy(), s_init[b, h].copy(), m_init[b, h].copy()
            q, k, v = (f[n][b, t, h] for n in ("q", "k", "v"))
            hat, s = norm(k @ point)
            g = w * (w * hat + c - (v - k))
            u[b, t, h] = (g - g.mean() - hat * (g * hat).mean()) / s
            momentum = np.exp(f["log_momentum"][b, t, h]) * momentum - 2 * f["theta"][b, t, h] * np.outer(k, u[b, t, h])
            memory = np.exp(f["log_decay"][b, t, h]) * memory + momentum
            z[b, t, h] = q @ memory
            out[b, t, h] = z[b, t, h] + norm(z[b, t, h])[0] * w + c
            if t % CHUNK == CHUNK - 1:
                point = memory.copy()
    return out, z, u


def test_reference_and_weights_against_the_recurrence_in_float64():
    """The reference's outputs are the recurrence's; from a zero state the weights times the updates u are the
    recurrence's read-outs z; the weights are causal and 0 across documents."""
    args, ids, _, ((out, _), _) = reference()
    expected, _, _ = float64_recurrence(args, np.asarray(ids))
    assert rel_err(out, expected) < TOLERANCE
    zero = {**args, "state": tuple(jnp.zeros_like(s) for s in args["state"])}
    _, z, u = float64_recurrence(zero, np.asarray(ids))
    w = np.asarray(titans_weights(*(args[n] for n in ("q", "k", "theta", "log_decay", "log_momentum")),
                                  segment_ids=ids))
    assert rel_err(np.einsum("bhts,bshd->bthd", w, u), z) < TOLERANCE
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]
    assert np.all(w[np.broadcast_to(across, w.shape)] == 0) and np.all(np.triu(w, 1) == 0)


def test_decoding_on_from_a_state_left_inside_a_mini_batch():
    """The chunk form's state after 9 steps, stepped on token by token, gives the chunk form's outputs over all 19
    and its final state."""
    args = titans_args(seed=3)
    (whole, final), (outs, state) = decoded_from_a_split(run, titans_step, args, GATES, 9, CHUNK)
    assert rel_err(outs, whole) < TOLERANCE
    assert_trees_close(state, final, TOLERANCE)


def test_bad_settings_fail_in_one_line():
    a = titans_args()
    with pytest.raises(ValueError, match="log_momentum has shape"):
        titans(*(a[n] for n in GATES[:-1]), a["log_momentum"][..., :1], a["weight"], a["bias"])
    with pytest.raises(ValueError, match="naive, chunk"):
        run("parallel", a)
