"""Native sparse attention (NSA) and DeepSeek sparse attention (DSA): the ops against references
written per query from their definitions (NumPy loops), their forms against each other on values
and gradients (random cotangents), documents as if alone, decoding steps, and the mixers' matrices."""

from __future__ import annotations

import functools
import importlib
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest
from flax import nnx

import mixer_checks
from op_checks import assert_trees_close, compiled, random_like

# the modules, not the functions of the same names that lmzoo.ops exports
dsa_ops = importlib.import_module("lmzoo.ops.dsa")
nsa_ops = importlib.import_module("lmzoo.ops.nsa")

B, T, HQ, H, D, DV = 2, 19, 4, 2, 8, 6  # odd length: blocks of 4 leave a partial last block
BS, S, WINDOW, TOPK, HI, DI = 4, 4, 5, 6, 3, 4
DOCS = (6, 13)  # row 0: a boundary inside a block; row 1: one document
BF16_TOL = 1e-2


def doc_ids() -> jnp.ndarray:
    row = np.concatenate([np.full(n, i) for i, n in enumerate(DOCS)])
    return jnp.asarray(np.stack([row, np.zeros(T, int)]), jnp.int32)


def pieces(ids_row):
    """(start, stop) of each document of one row."""
    edges = np.flatnonzero(np.diff(np.asarray(ids_row))) + 1
    bounds = [0, *edges.tolist(), len(ids_row)]
    return list(zip(bounds[:-1], bounds[1:]))


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def nsa_inputs(seed=0):
    rng = np.random.default_rng(seed)
    gates = [1 / (1 + np.exp(-normal(rng, B, T, HQ))) for _ in range(3)]
    return tuple(jnp.asarray(x) for x in (normal(rng, B, T, HQ, D), normal(rng, B, T, H, D), normal(rng, B, T, H, DV),
                                          *gates))


def dsa_inputs(seed=1):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(x) for x in (normal(rng, B, T, HQ, D), normal(rng, B, T, H, D), normal(rng, B, T, H, DV),
                                          normal(rng, B, T, HI, DI), normal(rng, B, T, DI), normal(rng, B, T, HI)))


# ----------------------------------------------------------------------------- references, one query at a time


def softmax_attend(q, keys, values, scale):
    logits = scale * keys @ q
    p = np.exp(logits - logits.max())
    return p @ values / p.sum(), np.log(np.exp(logits - logits.max()).sum()) + logits.max()


def assert_top_set(chosen, scores, allowed, k):
    """``chosen`` (−1 padded) is a top-k set of ``scores`` over ``allowed``: the right size, no
    repeats, and every kept entry scores at least every dropped one (any tie may go either way)."""
    kept = [int(c) for c in chosen if c >= 0]
    assert len(kept) == len(set(kept)) == min(k, len(allowed)), (kept, allowed)
    assert set(kept) <= set(allowed)
    dropped = [c for c in allowed if c not in kept]
    if kept and dropped:
        assert min(scores[c] for c in kept) >= max(scores[c] for c in dropped)


def nsa_reference(q, k, v, gates, indices, scale):
    """One document [T, ...]: (o_cmp, lse, o_slc, o_win, o) from the definitions; checks ``indices``
    [T, H, S] against the top-k rule and selects with them."""
    t_len, g = q.shape[0], HQ // H
    nc = math.ceil(t_len / BS)
    k_cmp = np.stack([k[c * BS:(c + 1) * BS].mean(0) for c in range(nc)])
    v_cmp = np.stack([v[c * BS:(c + 1) * BS].mean(0) for c in range(nc)])
    o_cmp, lse = np.zeros((t_len, HQ, DV)), np.full((t_len, HQ), -np.inf)
    o_slc, o_win = np.zeros((t_len, HQ, DV)), np.zeros((t_len, HQ, DV))
    for t in range(t_len):
        visible = [c for c in range(nc) if (c + 1) * BS - 1 <= t]
        probs = np.zeros((HQ, nc))
        for hq in range(HQ):
            h = hq // g
            if visible:
                o_cmp[t, hq], lse[t, hq] = softmax_attend(q[t, hq], k_cmp[visible, h], v_cmp[visible, h], scale)
                logits = scale * k_cmp[visible, h] @ q[t, hq]
                probs[hq, visible] = np.exp(logits - lse[t, hq])
            keys = [c * BS + r for c in indices[t, h] if c >= 0 for r in range(BS) if c * BS + r <= t]
            o_slc[t, hq] = softmax_attend(q[t, hq], k[keys, h], v[keys, h], scale)[0]
            near = list(range(max(0, t - WINDOW + 1), t + 1))
            o_win[t, hq] = softmax_attend(q[t, hq], k[near, h], v[near, h], scale)[0]
        forced = {c for c in (0, t // BS, t // BS - 1) if c >= 0}
        for h in range(H):
            scores = {c: 1.0 if c in forced else probs[h * g:(h + 1) * g, c].mean() for c in range(nc)}
            assert_top_set(indices[t, h], scores, sorted(forced | set(visible)), S)
            assert forced <= set(int(c) for c in indices[t, h])  # S >= 3 keeps every forced block
    o = gates[1][..., None] * o_slc + gates[0][..., None] * o_cmp + gates[2][..., None] * o_win
    return o_cmp, lse, o_slc, o_win, o


def dsa_reference(q, k, v, q_idx, k_idx, w_idx, indices, scale):
    """One document: checks ``indices`` [T, topk] against the indexer's top-k and attends over them."""
    t_len, g = q.shape[0], HQ // H
    o = np.zeros((t_len, HQ, DV))
    for t in range(t_len):
        scores = {s: sum(w_idx[t, j] * max(0.0, DI**-0.5 * q_idx[t, j] @ k_idx[s]) for j in range(HI))
                  for s in range(t + 1)}
        assert_top_set(indices[t], scores, list(range(t + 1)), TOPK)
        keys = [int(s) for s in indices[t] if s >= 0]
        for hq in range(HQ):
            o[t, hq] = softmax_attend(q[t, hq], k[keys, hq // g], v[keys, hq // g], scale)[0]
    return o


# ----------------------------------------------------------------------------- NSA


@functools.partial(compiled, static_argnames=("method",))
def run_nsa(q, k, v, g_cmp, g_slc, g_win, ids, method="gather"):
    """Every NSA op on one input: compression, top-k, selection (with those indices) and the whole."""
    kw = dict(block_size=BS, segment_ids=ids)
    k_cmp, v_cmp = nsa_ops.nsa_block_means(k, BS, ids), nsa_ops.nsa_block_means(v, BS, ids)
    o_cmp, lse = nsa_ops.nsa_compression(q, k_cmp, v_cmp, **kw)
    indices = nsa_ops.nsa_topk(q, k_cmp, block_counts=S, **kw)
    o_slc = nsa_ops.nsa_selection(q, k, v, indices, method=method, **kw)
    o, whole_indices = nsa_ops.nsa(q, k, v, g_cmp, g_slc, g_win, block_counts=S, window=WINDOW, method=method, **kw)
    return o_cmp, lse, indices, o_slc, o, whole_indices


@pytest.mark.parametrize("documents", [False, True])
def test_nsa_ops_follow_the_definition_and_documents_are_alone(documents):
    """Each op per query from its definition (each document alone, blocks from its first token)."""
    q, k, v, *gates = nsa_inputs()
    ids = doc_ids() if documents else None
    o_cmp, lse, indices, o_slc, o, whole_indices = run_nsa(q, k, v, *gates, ids)
    np.testing.assert_array_equal(whole_indices, indices)
    arrays = [np.asarray(x) for x in (q, k, v, *gates)]
    for b in range(B):
        for a, z in pieces(ids[b]) if documents else [(0, T)]:
            part = lambda x: x[b, a:z]  # noqa: E731
            ref = nsa_reference(*map(part, arrays[:3]), [part(g) for g in arrays[3:]], part(np.asarray(indices)),
                                D**-0.5)
            for got, want in zip((o_cmp, lse, o_slc, o), ref[:3] + ref[4:]):
                np.testing.assert_allclose(part(np.asarray(got)), want, rtol=1e-5, atol=1e-5)
    assert np.isneginf(np.asarray(lse)[:, : BS - 1]).all() and not np.asarray(o_cmp)[:, : BS - 1].any()


def test_nsa_block_means_with_documents():
    """Complete blocks of each document in order, then the last document's partial block; one
    document gives the plain block means (a partial last block averages its valid tokens)."""
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, T, 1, 1)), jnp.float32)
    means, plain = compiled(lambda x, ids: (nsa_ops.nsa_block_means(x, BS, ids), nsa_ops.nsa_block_means(x, BS)))(
        x, doc_ids())
    means, plain, xs = np.asarray(means)[..., 0, 0], np.asarray(plain)[..., 0, 0], np.asarray(x)[..., 0, 0]
    expected = [xs[0, 0:4].mean(), xs[0, 6:10].mean(), xs[0, 10:14].mean(), xs[0, 14:18].mean(), xs[0, 18:19].mean()]
    np.testing.assert_allclose(means[0], expected, rtol=1e-6)
    np.testing.assert_allclose(means[1], plain[1], rtol=1e-6)
    np.testing.assert_allclose(plain[1], [xs[1, c * 4:(c + 1) * 4].mean() for c in range(5)], rtol=1e-6)


@functools.partial(compiled, static_argnames=("method",))
def nsa_pull_back(args, cotangent, ids, method):
    def whole(a):
        return nsa_ops.nsa(*a, block_counts=S, block_size=BS, window=WINDOW, segment_ids=ids, method=method)[0]

    out, vjp = jax.vjp(whole, args)
    return out, vjp(cotangent)[0]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_nsa_fast_forms_equal_the_naive_one(dtype):
    """Values and gradients of every input (random cotangent), grouped heads, documents; bf16 inputs
    within bf16's rounding (every form accumulates in float32 and they choose the same blocks)."""
    args = tuple(x.astype(dtype) for x in nsa_inputs(seed=4))
    cotangent = random_like(jax.ShapeDtypeStruct((B, T, HQ, DV), jnp.float32), seed=5).astype(dtype)
    tol = 1e-5 if dtype == jnp.float32 else BF16_TOL
    expected = nsa_pull_back(args, cotangent, doc_ids(), "naive")
    for method in ("parallel", "gather"):
        assert_trees_close(nsa_pull_back(args, cotangent, doc_ids(), method), expected, tol)


def padded(x, length):
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def each_step(step, per_token, cached):
    """``step(t, *per_token[:, t:t+1], *cached)`` for every t, as one compiled scan; outputs stacked on time."""
    def one(t):
        return step(t, *(lax.dynamic_slice_in_dim(x, t, 1, axis=1) for x in per_token), *cached)

    outs = lax.map(one, jnp.arange(per_token[0].shape[1]))
    return jax.tree.map(lambda y: jnp.moveaxis(y[:, :, 0], 0, 1), outs)


NSA_OPTIONS = dict(block_counts=S, block_size=BS, window=WINDOW)


@compiled
def nsa_three_ways(q, k, v, g_cmp, g_slc, g_win):
    """The forward, its weights applied to v, and decoding steps against a cache of 23 slots (longer
    than the sequence and not a multiple of the block size)."""
    o, _ = nsa_ops.nsa(q, k, v, g_cmp, g_slc, g_win, **NSA_OPTIONS)
    weights = nsa_ops.nsa_weights(q, k, g_cmp, g_slc, g_win, **NSA_OPTIONS)  # (B, HQ, T, T)
    mixed = jnp.einsum("bhts,bshd->bthd", weights, jnp.repeat(v, HQ // H, axis=2))
    step = lambda t, q, g_cmp, g_slc, g_win, k, v: nsa_ops.nsa_step(q, k, v, g_cmp, g_slc, g_win, t, **NSA_OPTIONS)  # noqa: E731
    stepped = each_step(step, (q, g_cmp, g_slc, g_win), (padded(k, 23), padded(v, 23)))
    return o, weights, mixed, stepped


def test_nsa_weights_reproduce_the_output_and_steps_equal_the_forward():
    o, weights, mixed, stepped = nsa_three_ways(*nsa_inputs(seed=6))
    np.testing.assert_allclose(mixed, o, rtol=1e-5, atol=1e-5)
    assert not np.triu(np.asarray(weights), 1).any()
    np.testing.assert_allclose(stepped, o, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- DSA


@functools.partial(compiled, static_argnames=("method",))
def run_dsa(args, ids, method):
    return dsa_ops.dsa(*args, topk=TOPK, segment_ids=ids, method=method)


@pytest.mark.parametrize("documents", [False, True])
def test_dsa_follows_the_definition_and_documents_are_alone(documents):
    args = dsa_inputs()
    ids = doc_ids() if documents else None
    o, indices = run_dsa(args, ids, "gather")
    arrays = [np.asarray(x) for x in args]
    for b in range(B):
        for a, z in pieces(ids[b]) if documents else [(0, T)]:
            part = lambda x: x[b, a:z]  # noqa: E731
            want = dsa_reference(*map(part, arrays), part(np.asarray(indices)), D**-0.5)
            np.testing.assert_allclose(part(np.asarray(o)), want, rtol=1e-5, atol=1e-5)


@functools.partial(compiled, static_argnames=("method",))
def dsa_pull_back(args, cotangent, ids, method):
    out, vjp = jax.vjp(lambda a: dsa_ops.dsa(*a, topk=TOPK, segment_ids=ids, method=method)[0], args)
    return out, vjp(cotangent)[0]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dsa_gather_form_equals_the_naive_one(dtype):
    args = tuple(x.astype(dtype) for x in dsa_inputs(seed=7))
    cotangent = random_like(jax.ShapeDtypeStruct((B, T, HQ, DV), jnp.float32), seed=8).astype(dtype)
    tol = 1e-5 if dtype == jnp.float32 else BF16_TOL
    out, grads = dsa_pull_back(args, cotangent, doc_ids(), "gather")
    expected_out, expected_grads = dsa_pull_back(args, cotangent, doc_ids(), "naive")
    assert_trees_close((out, grads[:3]), (expected_out, expected_grads[:3]), tol)
    for g in grads[3:]:  # the choice is an integer: no gradient reaches the indexer
        assert not np.asarray(g, np.float32).any()


@compiled
def dsa_three_ways(q, k, v, q_idx, k_idx, w_idx):
    o, indices = dsa_ops.dsa(q, k, v, q_idx, k_idx, w_idx, topk=TOPK)
    weights = dsa_ops.dsa_weights(q, k, indices)
    mixed = jnp.einsum("bhts,bshd->bthd", weights, jnp.repeat(v, HQ // H, axis=2))
    step = lambda t, q, q_idx, w_idx, k, v, k_idx: dsa_ops.dsa_step(q, k, v, q_idx, k_idx, w_idx, t, topk=TOPK)  # noqa: E731
    stepped = each_step(step, (q, q_idx, w_idx), (padded(k, T + 4), padded(v, T + 4), padded(k_idx, T + 4)))
    return o, indices, weights, mixed, stepped


def test_dsa_weights_reproduce_the_output_and_steps_equal_the_forward():
    o, indices, weights, mixed, (stepped, step_indices) = dsa_three_ways(*dsa_inputs(seed=9))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(mixed, o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stepped, o, rtol=1e-5, atol=1e-5)
    sets = lambda x: [[set(row) for row in seq] for seq in np.asarray(x).tolist()]  # noqa: E731
    assert sets(step_indices) == sets(indices)


# ----------------------------------------------------------------------------- the mixers

SPARSE = {"nsa": ("attn.block_size=4", "attn.block_counts=3", "attn.window=3"), "dsa": ("attn.topk=5",)}


HEAD_OPTIONS = ("attn.qk_norm=true", "attn.output_gate=true")


def mixer_outputs(mixer, x):
    """The forward, its attention matrix applied to the values (then the output gate and projection),
    and the prefill of the first 13 tokens followed by decoding steps."""
    t = x.shape[1]
    v = mixer.rotated_heads(x)[2]
    weights = mixer.attention_matrix(x)
    mixed = jnp.einsum("bhts,bshd->bthd", weights, jnp.repeat(v, mixer.n_heads // mixer.n_kv_heads, axis=2))
    y, state = mixer.prefill(x[:, :13], t)
    outs = [y]
    for i in range(13, t):
        y_t, state = mixer.step(x[:, i], state)
        outs.append(y_t[:, None])
    return mixer(x), mixer.output(mixed, x), jnp.concatenate(outs, axis=1), weights


@pytest.mark.parametrize("variant, head_options",
                         [("nsa", ()), ("dsa", ()), ("nsa", HEAD_OPTIONS), ("dsa", HEAD_OPTIONS)],
                         ids=["nsa", "dsa", "nsa-head_options", "dsa-head_options"])
def test_sparse_mixers_matrix_prefill_and_steps_equal_the_forward(variant, head_options):
    """At settings where the choice is sparse at this length (the generic tests run the YAML's), with
    and without QK-norm and the output gate."""
    mixer = mixer_checks.first_mixer(variant, *SPARSE[variant], *head_options)
    assert (mixer.qk_norm is not None, mixer.output_gate is not None) == (bool(head_options),) * 2
    y, mixed, decoded, weights = mixer_checks.compiled(mixer_outputs, mixer)(mixer_checks.inputs(length=17))
    np.testing.assert_allclose(mixed, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decoded, y, rtol=1e-5, atol=1e-5)
    if variant == "dsa":  # each query reads min(topk, t + 1) keys (NSA's block means reach every complete block)
        np.testing.assert_array_equal((np.asarray(weights) > 0).sum(-1),
                                      np.broadcast_to(np.minimum(5, np.arange(1, 18)), weights.shape[:3]))


def training_losses(model, tokens):
    """(aux/indexer, its gradient, the next-token loss's gradient) of the DSA model in training view."""
    from lmzoo.run.steps import next_token_loss

    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}

    def indexer(m):
        return next_token_loss(nnx.view(m, training=True), batch)[1]["aux/indexer"]

    def language(m):
        return next_token_loss(nnx.view(m, training=True), batch)[0]

    return indexer(model), nnx.grad(indexer)(model), nnx.grad(language)(model)


def test_the_dsa_indexer_trains_on_its_own_loss_only():
    _, model = mixer_checks.build("dsa", "attn.topk=5")
    tokens = jax.random.randint(jax.random.key(0), (2, 17), 0, mixer_checks.VOCAB)
    loss, indexer_grads, language_grads = mixer_checks.compiled(training_losses, model)(tokens)
    assert float(loss) > 0
    for path, g in nnx.to_flat_state(nnx.state(indexer_grads, nnx.Param)):
        norm = float(jnp.abs(g.get_value()).sum())
        assert (norm > 0) == (any(str(p).startswith("index_") for p in path)), path
    for path, g in nnx.to_flat_state(nnx.state(language_grads, nnx.Param)):
        if any(str(p).startswith("index_") for p in path):
            assert not np.asarray(g.get_value()).any(), path


@pytest.mark.parametrize("variant, override, message", [
    ("nsa", "pos=alibi", "pos.kind=alibi is not supported by attn.mixer=nsa"),
    ("dsa", "attn.window=8", "attn.window=8 is not supported by attn.mixer=dsa"),
    ("nsa", "attn.logn=true", "attn.logn=true is not supported by attn.mixer=nsa (set it to false)"),
    ("nsa", "attn.method=blocked", "attn.method='blocked' is not valid (choose from: naive, parallel, gather)"),
])
def test_settings_the_sparse_mixers_refuse(variant, override, message, capsys):
    """In one line, from the config check (the command exits) or when the layer is built."""
    from lmzoo.schema import ConfigError

    try:
        mixer_checks.build(variant, override)
    except SystemExit:
        assert message in capsys.readouterr().err
    except ConfigError as error:
        assert message in str(error)
    else:
        pytest.fail(f"{variant} accepted {override}")
