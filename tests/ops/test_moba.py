"""MoBA's op (``lmzoo.ops.moba``): the output against a reference written per query from the definition (NumPy
loops: block means, gates, the top-k, a softmax over the chosen tokens), the gather form against the naive one on
values and the gradients of q, k and v (random cotangents) at an odd length with grouped query heads and documents
(a boundary inside a block), decoding steps, and the effective weights."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, random_like, rel_err

from lmzoo.ops.moba import moba, moba_step, moba_weights

B, T, HQ, H, D, DV = 2, 19, 4, 2, 8, 6  # odd length: blocks of 3 leave a partial last block
BS, TOPK = 3, 3
DOCS = (8, 11)  # row 0: a boundary inside a block; row 1: one document
TOLERANCE = 1e-5


def doc_ids():
    row = np.concatenate([np.full(n, i) for i, n in enumerate(DOCS)])
    return jnp.asarray(np.stack([row, np.zeros(T, int)]), jnp.int32)


def moba_inputs(seed=0):
    rng = np.random.default_rng(seed)
    n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    return {"q": n(B, T, HQ, D), "k": n(B, T, H, D), "v": n(B, T, H, DV)}


def reference(q, k, v, ids):
    """Per query, per head, from the definition, in float64."""
    q, k, v, ids = (np.asarray(x, np.float64) for x in (q, k, v, ids))
    out, g = np.zeros((B, T, HQ, DV)), HQ // H
    for b, t in np.ndindex(B, T):
        start = min(j for j in range(t + 1) if all(ids[b, i] == ids[b, t] for i in range(j, t + 1)))
        own = (t - start) // BS
        for h in range(H):
            gates = {c: np.mean([q[b, t, h * g + i] @ k[b, start + c * BS:start + (c + 1) * BS, h].mean(0)
                                 for i in range(g)]) for c in range(own)}
            chosen = [own] + sorted(gates, key=lambda c: (-gates[c], c))[:TOPK - 1]
            keys = [j for j in range(start, t + 1) if (j - start) // BS in chosen]
            for i in range(g):
                logits = k[b, keys, h] @ q[b, t, h * g + i] / np.sqrt(D)
                p = np.exp(logits - logits.max())
                out[b, t, h * g + i] = (p / p.sum()) @ v[b, keys, h]
    return out


def run(method, a, ids):
    return moba(a["q"], a["k"], a["v"], topk=TOPK, block_size=BS, segment_ids=ids, method=method)[0]


@functools.partial(compiled, static_argnums=(0,))
def pull_back(method, args, cotangent, ids):
    out, vjp = jax.vjp(lambda a: run(method, a, ids), args)
    return out, vjp(cotangent)[0]


@functools.lru_cache(maxsize=None)
def naive_pull_back():
    args, ids = moba_inputs(), doc_ids()
    cotangent = random_like(jax.eval_shape(lambda a: run("naive", a, ids), args), seed=5)
    return args, ids, cotangent, pull_back("naive", args, cotangent, ids)


def test_naive_form_follows_the_definition():
    args, ids, _, (out, _) = naive_pull_back()
    assert rel_err(out, reference(args["q"], args["k"], args["v"], ids)) < TOLERANCE


def test_gather_form_matches_the_naive_one():
    args, ids, cotangent, expected = naive_pull_back()
    assert_trees_close(pull_back("gather", args, cotangent, ids), expected)


def test_decoding_steps_equal_the_forward():
    a = moba_inputs(seed=1)
    out = compiled(lambda a: run("naive", a, None))(a)

    @compiled
    def stepped(a):
        def step(_, t):
            q_t = jax.lax.dynamic_slice_in_dim(a["q"], t, 1, axis=1)
            return None, moba_step(q_t, a["k"], a["v"], t, topk=TOPK, block_size=BS)[:, 0]
        return jax.lax.scan(step, None, jnp.arange(T))[1].swapaxes(0, 1)

    assert rel_err(stepped(a), out) < TOLERANCE


def test_weights_reproduce_the_outputs():
    args, ids, _, (out, _) = naive_pull_back()
    w = compiled(lambda a: moba_weights(a["q"], a["k"], topk=TOPK, block_size=BS, segment_ids=ids))(args)
    mixed = jnp.einsum("bhts,bshd->bthd", w, jnp.repeat(args["v"], HQ // H, axis=2))
    assert rel_err(mixed, out) < TOLERANCE
    assert np.all(np.triu(np.asarray(w), 1) == 0)
    assert np.allclose(np.asarray(w).sum(-1), 1.0, atol=1e-5)


def test_bad_settings_fail_in_one_line():
    a = moba_inputs()
    with pytest.raises(ValueError, match="topk=0 must be at least 1"):
        moba(a["q"], a["k"], a["v"], topk=0, block_size=BS)
    with pytest.raises(ValueError, match="naive, gather"):
        moba(a["q"], a["k"], a["v"], topk=TOPK, block_size=BS, method="parallel")
