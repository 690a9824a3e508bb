"""Document boundaries: with ``segment_ids`` every op form and every registered variant mixes each
document as if it were alone -- outputs, final states and gradients (random upstream gradients,
odd lengths, boundaries inside and across chunks); without them nothing changes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mixer_checks
import op_checks
from conftest import VARIANTS, layers_to_check, tiny_config
from lmzoo import ops
from lmzoo.model import LM
from lmzoo.ops.common import segment_starts
from lmzoo.positions import segment_positions
from op_checks import assert_trees_close, compiled, random_like

DOCS = (10, 14, 13)  # row 0's documents: T = 37, boundaries inside the first and second chunks of 16
LENGTH = sum(DOCS)


def packed_ids() -> jax.Array:
    """[2, T]: row 0 holds DOCS, row 1 one document."""
    row = np.concatenate([np.full(n, i) for i, n in enumerate(DOCS)])
    return jnp.asarray(np.stack([row, np.zeros(LENGTH, int)]), jnp.int32)


def test_segment_helpers():
    ids = jnp.asarray([[3, 3, 5, 5, 5, 9], [0, 0, 0, 0, 0, 0]])
    assert segment_starts(ids).tolist() == [[False, False, True, False, False, True], [False] * 6]
    assert segment_positions(ids).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]


# ----------------------------------------------------------------------------- recurrent ops


def run_linear(case, method, args, segment_ids=None):
    q, k, v, state = args["q"], args["k"], args["v"], args.get("state")
    if case.startswith("gla"):
        return ops.gla(q, k, v, args["log_g"], initial_state=state, method=method, chunk_size=op_checks.CHUNK,
                       segment_ids=segment_ids)
    return ops.linear_attention(q, k, v, normalize=case == "linear_normalized", initial_state=state, method=method,
                                chunk_size=op_checks.CHUNK, segment_ids=segment_ids)


def run_delta(gate, method, args, segment_ids=None):
    return ops.delta_rule(args["q"], args["k"], args["v"], args["beta"], args.get("log_g"),
                          initial_state=args.get("state"), method=method, chunk_size=op_checks.CHUNK,
                          segment_ids=segment_ids)


@functools.partial(compiled, static_argnums=(0, 1, 2))
def pull_back(run, case, method, args, cotangent, segment_ids=None):
    """(o, final state) and the gradients of <(o, S), cotangent> w.r.t. every input."""
    out, vjp = jax.vjp(lambda a: run(case, method, a, segment_ids), args)
    return out, vjp(cotangent)[0]


def alone(run, case, method, args, cotangent):
    """What the packed batch must give: row 0's documents each run alone (only the first from the
    initial state, only the last passing its state on), row 1 as it is; in the packed layout."""
    row = lambda tree, r: jax.tree.map(lambda x: x[r : r + 1], tree)
    time = lambda tree, a, b: {n: (x if n == "state" else x[:, a:b]) for n, x in tree.items()}
    zero_state = lambda tree: jax.tree.map(jnp.zeros_like, tree)
    first, rest = row(args, 0), row(args, 1)
    out_pieces, grad_pieces, state, state_grad = [], [], None, None
    edges = np.cumsum((0,) + DOCS)
    for d, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        piece = time(first, a, b)
        if d and "state" in piece:
            piece["state"] = zero_state(piece["state"])
        last = d == len(DOCS) - 1
        ct_out, ct_state = row(cotangent, 0)
        ct = (ct_out[:, a:b], ct_state if last else zero_state(ct_state))
        (o, s), g = pull_back(run, case, method, piece, ct)
        out_pieces.append(o)
        grad_pieces.append({n: x for n, x in g.items() if n != "state"})
        state = s if last else state
        state_grad = g.get("state") if d == 0 else state_grad
    grads0 = {n: jnp.concatenate([g[n] for g in grad_pieces], axis=1) for n in grad_pieces[0]}
    if state_grad is not None:
        grads0["state"] = state_grad
    (o1, s1), grads1 = pull_back(run, case, method, rest, row(cotangent, 1))
    both = lambda x, y: jnp.concatenate([x, y], axis=0)
    out = (both(jnp.concatenate(out_pieces, axis=1), o1), jax.tree.map(both, state, s1))
    return out, jax.tree.map(both, grads0, grads1)


# A reset is a forget gate, so every form of per-dimension GLA is checked; the ungated and per-head
# layouts take their own in-chunk path (one gate per head) in the chunk form and the kernels. Each
# op is checked against its reference form ("naive") on each document alone.
LINEAR = [("gla", method) for method in ("naive", "parallel", "scan", "assoc", "chunk", "pallas")]
LINEAR += [("gla_scalar", "chunk"), ("gla_scalar", "pallas"), ("linear", "chunk"), ("linear_normalized", "chunk")]
DELTA = [("channel", method) for method in ("naive", "parallel", "chunk")] + [("none", "chunk"), ("head", "chunk")]
RECURRENT = [(run_linear, op_checks.make_args, "naive", *case) for case in LINEAR]
RECURRENT += [(run_delta, op_checks.delta_args, "naive", *case) for case in DELTA]


@pytest.mark.parametrize("run, inputs, reference, case, method", RECURRENT,
                         ids=[f"{r.__name__[4:]}-{c}-{m}" for r, _, _, c, m in RECURRENT])
def test_recurrent_forms_keep_documents_apart(run, inputs, reference, case, method):
    args = inputs(case, LENGTH, with_state=True)
    cotangent = random_like(jax.eval_shape(lambda a: run(case, reference, a), args), seed=7)
    expected = alone(run, case, reference, args, cotangent)
    assert_trees_close(pull_back(run, case, method, args, cotangent, packed_ids()), expected)


def test_the_weights_are_zero_across_documents_and_the_op_inside_them():
    ids, rng = packed_ids(), np.random.default_rng(3)
    q, k = (jnp.asarray(rng.standard_normal((2, LENGTH, 2, 8)), jnp.float32) for _ in range(2))
    log_g = -jnp.asarray(rng.uniform(0.05, 1.0, (2, LENGTH, 2)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.1, 0.9, (2, LENGTH, 2)), jnp.float32)
    across = ~np.asarray(ids[:, :, None] == ids[:, None, :])[:, None]  # (B, 1, T, T)
    for packed, whole in (
        (ops.gla_weights(q, k, log_g, segment_ids=ids), ops.gla_weights(q, k, log_g)),
        (ops.linear_attention_weights(q, k, segment_ids=ids), ops.linear_attention_weights(q, k)),
        (ops.delta_rule_weights(q, k / jnp.linalg.norm(k, axis=-1, keepdims=True), beta, log_g, segment_ids=ids),
         ops.delta_rule_weights(q, k / jnp.linalg.norm(k, axis=-1, keepdims=True), beta, log_g)),
    ):
        assert np.all(np.asarray(packed)[np.broadcast_to(across, packed.shape)] == 0)
        np.testing.assert_allclose(packed[1], whole[1], rtol=1e-5, atol=1e-6)  # one document: unchanged
        np.testing.assert_allclose(packed[0, :, :10, :10], whole[0, :, :10, :10], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- attention


def attention_inputs(seed=0, heads=4, kv_heads=2):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((2, LENGTH, heads, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, LENGTH, kv_heads, 8)), jnp.float32) for _ in range(2))
    return q, k, v


def out_and_grads(fn, *args, cotangent):
    """fn(*args) and the gradients of <fn(*args), cotangent> w.r.t. args, compiled."""
    def pulled(args, cotangent):
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(cotangent)

    return compiled(pulled)(args, cotangent)


def assert_each_document_alone(attend, args, ct, ids):
    """attend(*args, ids) on row 0 equals attend(*args) on each of its documents alone (values and
    gradients), and on row 1 (one document) equals attend without ids."""
    packed, packed_grads = out_and_grads(lambda *a: attend(*a, ids), *args, cotangent=ct)
    edges = np.cumsum((0,) + DOCS)
    for a, b in zip(edges[:-1], edges[1:]):
        doc = lambda x: x[:1, a:b]
        out, grads = out_and_grads(lambda *x: attend(*x), *map(doc, args), cotangent=doc(ct))
        np.testing.assert_allclose(packed[:1, a:b], out, rtol=1e-5, atol=1e-6)
        for got, want in zip(packed_grads, grads):
            if got.dtype != jax.dtypes.float0:  # integer inputs (VQ's codes) have no gradient
                np.testing.assert_allclose(got[:1, a:b], want, rtol=1e-5, atol=1e-6)
    whole, _ = out_and_grads(lambda *a: attend(*a), *args, cotangent=ct)
    np.testing.assert_allclose(packed[1:], whole[1:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method, window", [("xla", None), ("naive", 6)])
def test_softmax_attention_keeps_documents_apart(method, window):
    q, k, v = attention_inputs()
    ct = random_like(jax.ShapeDtypeStruct(q.shape, q.dtype), seed=5)
    attend = lambda q, k, v, ids=None: ops.softmax_attention(q, k, v, window=window, method=method, segment_ids=ids)
    assert_each_document_alone(attend, (q, k, v), ct, packed_ids())


def test_vq_attention_keeps_documents_apart():
    """In value a document attends as it would alone; blocks stay aligned to the window (see ops.vq).
    Blocks of 4 put document starts inside blocks and on their edges; the caches restart."""
    rng = np.random.default_rng(4)
    codebook = jnp.asarray(rng.standard_normal((2, 5, 8)), jnp.float32)
    q, v = (jnp.asarray(rng.standard_normal((2, LENGTH, 2, 8)), jnp.float32) for _ in range(2))
    codes = jnp.asarray(rng.integers(0, 5, (2, LENGTH, 2)), jnp.int32)

    def attend(q, v, codes, ids=None):  # gradients w.r.t. q and v; the codes ride along (no gradient)
        k_hat = ops.vq.gather_codewords(codebook, codes)
        return ops.vq_attention(q, k_hat, codes, codebook, v, block_size=4, method="blocked", segment_ids=ids)

    ct = random_like(jax.ShapeDtypeStruct(q.shape, q.dtype), seed=6)
    assert_each_document_alone(attend, (q, v, codes), ct, packed_ids())


# ----------------------------------------------------------------------------- every variant's model

VOCAB, FIRST = 259, 16  # documents of 16 and 13 tokens: an odd window of 29


def model_of(variant: str):
    """Every kind of layer the variant has, each once (a hybrid's [gla, gla, gla, softmax] as [gla, softmax]); two
    layers at least for softmax, gla and mamba, whose second layers check that documents stay apart in what the
    model passes up (code every variant shares): ``layers_to_check``."""
    cfg = tiny_config(variant, *layers_to_check(variant))
    return cfg, LM(cfg, VOCAB, rngs=nnx.Rngs(0))


def forward_and_pull_back(model, tokens, cotangent, segment_ids=None):
    """Logits, the parameter gradients of <logits, cotangent>, and every layer's attention matrix."""
    def pulled(m):
        logits = m(tokens, segment_ids=segment_ids)
        return jnp.sum(logits * cotangent), logits

    grads, logits = nnx.grad(pulled, has_aux=True)(model)
    return logits, grads, model.attention_matrices(tokens, segment_ids=segment_ids)


def packed_and_alone(model, tokens, cotangent, segment_ids):
    """``forward_and_pull_back`` of the packed windows with their ``segment_ids``, and of their documents alone
    (without ids) in one batch: rows [:B] the first document in a window of the packed shape, no gradient after
    it (a causal model's outputs there do not see what follows); rows [B:] the second, rolled to the start."""
    rolled = lambda x: jnp.roll(x, -FIRST, axis=1)
    alone_tokens = jnp.concatenate([tokens, rolled(tokens)])
    alone_cotangent = jnp.concatenate([cotangent.at[:, FIRST:].set(0.0), rolled(cotangent.at[:, :FIRST].set(0.0))])
    return (forward_and_pull_back(model, tokens, cotangent, segment_ids),
            forward_and_pull_back(model, alone_tokens, alone_cotangent))


def documents_and_cotangent(seed=0):
    """Two windows of documents of 16 and 13 tokens (an odd 29), their ids, and a random cotangent."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (2, FIRST + 13)), jnp.int32)
    cotangent = jnp.asarray(rng.standard_normal((2, FIRST + 13, VOCAB)), jnp.float32)
    ids = jnp.asarray(np.repeat([[0] * FIRST + [1] * 13], 2, axis=0), jnp.int32)
    return tokens, cotangent, ids


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_mixes_each_document_as_if_alone(variant):
    """Against each document run alone (one program computes both, see ``packed_and_alone``), with a random
    upstream gradient on the logits: each document's logits are its own, the parameter gradients are the sum
    of the documents', and every layer's attention matrix [B, H, T, T] is causal, zero across documents, and
    the document's own inside them (positions restarting, every layer)."""
    cfg, model = model_of(variant)
    tokens, cotangent, ids = documents_and_cotangent()
    packed, alone = mixer_checks.compiled(packed_and_alone, model)(tokens, cotangent, ids)
    (logits, grads, weights), (alone_logits, alone_grads, alone_weights) = packed, alone
    batch, second = len(tokens), 13

    np.testing.assert_allclose(logits[:, :FIRST], alone_logits[:batch, :FIRST], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(logits[:, FIRST:], alone_logits[batch:, :second], rtol=2e-5, atol=2e-5)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(alone_grads)):
        scale = float(np.abs(want).max()) + 1e-6  # the batch's gradient: the sum of both documents'
        np.testing.assert_allclose(got / scale, want / scale, atol=2e-4, err_msg=jax.tree_util.keystr(path))
    assert len(weights) == len(model.blocks)
    upper = np.triu(np.ones((FIRST + second, FIRST + second), bool), k=1)
    for layer, (w, alone_w) in enumerate(zip(weights, alone_weights)):
        assert w.shape == (batch, cfg.model.n_heads, FIRST + second, FIRST + second)
        assert np.all(np.asarray(w)[..., upper] == 0), f"layer {layer}: not causal"
        assert np.all(np.asarray(w)[..., FIRST:, :FIRST] == 0), f"layer {layer}"
        np.testing.assert_allclose(w[..., :FIRST, :FIRST], alone_w[:batch, :, :FIRST, :FIRST], rtol=1e-4,
                                   atol=1e-5, err_msg=f"layer {layer}")
        np.testing.assert_allclose(w[..., FIRST:, FIRST:], alone_w[batch:, :, :second, :second], rtol=1e-4,
                                   atol=1e-5, err_msg=f"layer {layer}")
