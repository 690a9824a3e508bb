"""Stick-breaking and PaTH attention (lmzoo.ops.stick_breaking, lmzoo.ops.path) and the softmax family's
head options (QK-norm, output gate): fast forms against their references on values and gradients
(random cotangents) at odd lengths with partial last blocks, grouped heads and documents; the
references against the contracts written out in NumPy. Decoding, documents and logical axes of the
variants' YAMLs are covered by test_mixers.py, test_segments.py and test_sharding.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixer_checks import compiled as compiled_mixer, first_mixer, inputs
from op_checks import assert_trees_close, compiled, random_like

from lmzoo.ops import path as path_ops, stick_breaking as sb_ops
from lmzoo.schema import ConfigError

from conftest import tiny_config

B, T, HQ, H, D = 2, 19, 4, 2, 8
IDS = jnp.asarray([[0] * 7 + [1] * 12, [0] * 19], jnp.int32)  # row 0: two documents, the second across blocks


def normal(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def pulled_back(fn, args, cotangent):
    """fn(args) and the gradients of <fn(args), cotangent> w.r.t. every input, compiled."""
    def run(args, cotangent):
        out, vjp = jax.vjp(fn, args)
        return out, vjp(cotangent)[0]

    return compiled(run)(args, cotangent)


def forms_agree(run, args, fast, reference, tol=2e-5):
    """Outputs and gradients of ``run(method, args)`` in float32, and in bfloat16 inputs within 2e-2."""
    cotangent = random_like(jax.eval_shape(lambda a: run(reference, a), args), seed=7)
    expected = pulled_back(lambda a: run(reference, a), args, cotangent)
    assert_trees_close(pulled_back(lambda a: run(fast, a), args, cotangent), expected, tol=tol)
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), args)
    out_fast, out_ref = compiled(lambda a: (run(fast, a), run(reference, a)))(bf16)
    assert_trees_close(out_fast, out_ref, tol=2e-2)  # bf16 outputs: rounding to 8 bits, same float32 inside


# ----------------------------------------------------------------------------- stick-breaking


def stick_breaking_contract(q, k, v, *, attend_current, ids):
    """o, rem and A from the definition: the stick broken key by key, nearest first, in float64."""
    q, k, v = (np.repeat(np.asarray(x, np.float64), q.shape[2] // x.shape[2], axis=2) if x is not q
               else np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, d = q.shape
    weights = np.zeros((b, h, t, t))
    for bi, hi, i in np.ndindex(b, h, t):
        stick = 1.0
        for j in range(i if attend_current else i - 1, -1, -1):
            if ids[bi, j] != ids[bi, i]:
                continue
            share = 1 / (1 + np.exp(-q[bi, i, hi] @ k[bi, j, hi] / np.sqrt(d)))
            weights[bi, hi, i, j], stick = share * stick, stick * (1 - share)
    return np.einsum("bhts,bshd->bthd", weights, v), 1 - weights.sum(-1).transpose(0, 2, 1), weights


@pytest.mark.parametrize("attend_current", [False, True])
def test_stick_breaking_reference_is_the_contract(attend_current):
    rng = np.random.default_rng(0)
    q, k, v = normal(rng, B, 9, HQ, D) * 2, normal(rng, B, 9, H, D), normal(rng, B, 9, H, D)
    ids = IDS[:, 3:12]
    o, rem = sb_ops.stick_breaking_attention(q, k, v, attend_current=attend_current, segment_ids=ids, method="naive")
    want_o, want_rem, want_a = stick_breaking_contract(q, k, v, attend_current=attend_current, ids=np.asarray(ids))
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rem, want_rem, rtol=1e-5, atol=1e-6)  # rem = 1 - sum_j A_ij
    weights, _ = sb_ops.stick_breaking_matrix(q, k, attend_current=attend_current, segment_ids=ids)
    np.testing.assert_allclose(weights, want_a, rtol=1e-5, atol=1e-7)


def test_stick_breaking_blocked_equals_naive(monkeypatch):
    """Blocks of 8 queries at T = 19: a partial last block, a document starting inside the first."""
    monkeypatch.setattr(sb_ops, "QUERY_BLOCK", 8)
    rng = np.random.default_rng(1)
    args = {"q": normal(rng, B, T, HQ, D) * 2, "k": normal(rng, B, T, H, D), "v": normal(rng, B, T, H, D)}

    def run(method, a):
        return sb_ops.stick_breaking_attention(a["q"], a["k"], a["v"], segment_ids=IDS, method=method)

    forms_agree(run, args, "blocked", "naive")


# ----------------------------------------------------------------------------- PaTH


def path_inputs(rng, t):
    w = np.asarray(rng.standard_normal((B, t, H, D)))
    return {
        "q": normal(rng, B, t, HQ, D), "k": normal(rng, B, t, H, D), "v": normal(rng, B, t, H, D),
        "w": jnp.asarray(w / np.linalg.norm(w, axis=-1, keepdims=True), jnp.float32),
        "beta": jnp.asarray(rng.uniform(0.05, 1.95, (B, t, H)), jnp.float32),  # negative eigenvalues too
        "log_g": -jnp.asarray(rng.uniform(0.01, 0.5, (B, t, HQ)), jnp.float32),
    }


def path_contract(a, ids):
    """o from the definition: every l_ij with the reflections between j and i multiplied out, float64."""
    q, k, v, w, beta, log_g = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "w", "beta", "log_g"))
    rep = q.shape[2] // k.shape[2]
    k, v, w, beta = (np.repeat(x, rep, axis=2) for x in (k, v, w, beta))
    b, t, h, d = q.shape
    g = np.cumsum(log_g, axis=1)
    out = np.zeros_like(q)
    for bi, hi, i in np.ndindex(b, h, t):
        logits, product = np.full(t, -np.inf), np.eye(d)  # product = H_i ... H_{j+1}
        for j in range(i, -1, -1):
            if ids[bi, j] == ids[bi, i]:
                logits[j] = (q[bi, i, hi] @ product @ k[bi, j, hi] + g[bi, i, hi] - g[bi, j, hi]) / np.sqrt(d)
            product = product @ (np.eye(d) - beta[bi, j, hi] * np.outer(w[bi, j, hi], w[bi, j, hi]))
        p = np.exp(logits - logits.max())
        out[bi, i, hi] = (p / p.sum()) @ v[bi, :, hi]
    return out


def run_path(method, a):
    return path_ops.path_attention(a["q"], a["k"], a["v"], a["w"], a["beta"], a["log_g"], segment_ids=IDS,
                                   method=method, chunk_size=8)


def test_path_reference_is_the_contract_and_its_keys_the_decoding_recurrence():
    args = path_inputs(np.random.default_rng(2), 9)
    ids = IDS[:, :9].at[0, 4:].set(1)

    def naive_and_stepped(a):
        o, keys = path_ops.path_attention(a["q"], a["k"], a["v"], a["w"], a["beta"], a["log_g"], segment_ids=ids,
                                          method="naive")
        stepped = jnp.zeros((B, 9, H, D))  # every cached key reflected by each new token, then the token's key
        for t in range(9):
            stepped = path_ops.reflect_keys(stepped, a["w"][:, t], a["beta"][:, t]).at[:, t].set(a["k"][:, t])
        return o, keys, stepped

    o, keys, stepped = compiled(naive_and_stepped)(args)
    contract = path_contract(args, np.asarray(ids))  # the scale multiplies the gate term too
    np.testing.assert_allclose(o, contract, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(keys, stepped, rtol=1e-5, atol=1e-5)


def test_path_chunk_equals_naive():
    """Chunks of 8 at T = 19 (a partial last chunk), grouped heads, forget gates, a document starting
    inside a chunk; outputs, transformed keys and every gradient."""
    forms_agree(run_path, path_inputs(np.random.default_rng(3), T), "chunk", "naive", tol=1e-4)


# ----------------------------------------------------------------------------- the variants' own identities


def test_stick_breaking_weights_with_the_remainder_sum_to_one_and_give_the_output():
    mixer = first_mixer("stickbreaking", "attn.n_kv_heads=2")
    x = inputs(9)

    def both(m, x):
        weights = m.attention_matrix(x)  # (B, H, T, T)
        _, _, v = m.heads(x)
        mixed = jnp.einsum("bhts,bshd->bthd", weights, jnp.repeat(v, 2, axis=2))
        return weights, m.o_proj(mixed.reshape(*x.shape[:2], -1)), m(x)

    weights, rebuilt, y = compiled_mixer(both, mixer)(x)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(rebuilt, y, rtol=1e-5, atol=1e-6)


HEAD_OPTIONS = ("attn.qk_norm=true", "attn.output_gate=true")


@pytest.mark.parametrize("variant, overrides", [("fox", HEAD_OPTIONS), ("stickbreaking", HEAD_OPTIONS),
                                                ("path", (*HEAD_OPTIONS, "attn.forget_gate=true", "attn.n_kv_heads=2")),
                                                ("mla", ("attn.output_gate=true",)),
                                                ("deltaformer", (*HEAD_OPTIONS, "attn.n_kv_heads=2")),
                                                ("moba", (*HEAD_OPTIONS, "attn.n_kv_heads=2", "attn.block_size=2"))])
def test_head_options_prefill_and_decode_as_the_forward(variant, overrides):
    """A prompt of 4 tokens prefilled, the other 5 decoded one by one: the forward's outputs."""
    mixer = first_mixer(variant, *overrides)
    assert mixer.output_gate is not None and (mixer.qk_norm is not None) == ("attn.qk_norm=true" in overrides)
    x = inputs(9, seed=3)

    def decoded_and_forward(m, x, prompt=4):
        y, state = m.prefill(x[:, :prompt], x.shape[1])
        outputs = [y]
        for t in range(prompt, x.shape[1]):
            y_t, state = m.step(x[:, t], state)
            outputs.append(y_t[:, None])
        return jnp.concatenate(outputs, axis=1), m(x)

    decoded, forward = compiled_mixer(decoded_and_forward, mixer)(x)
    np.testing.assert_allclose(decoded, forward, rtol=1e-5, atol=1e-5)


def test_path_state_size_counts_keys_values_and_gates():
    mixer = first_mixer("path", "attn.forget_gate=true", "attn.n_kv_heads=2")  # 4 query heads of 8 dims
    # keys and values; the cumulative gate of each key and the running one
    assert mixer.state_size(100) == 2 * 100 * 2 * 8 + 4 * (100 + 1)


def test_qk_norm_gives_unit_rms_heads_and_the_gate_scales_each_channel():
    mixer = first_mixer("gated_softmax")
    mixer.output_gate.proj.kernel[...] = jnp.zeros_like(mixer.output_gate.proj.kernel[...])  # every gate 1/2
    o = jnp.asarray(np.random.default_rng(0).standard_normal((2, 6, 4, 8)), jnp.float32)

    def parts(m, x, o):
        q, k, _ = m.project(x)
        return q, k, m.output(o, x), m.o_proj(0.5 * o.reshape(2, 6, -1))

    q, k, gated, halved = compiled_mixer(parts, mixer)(inputs(6), o)
    for a in (q, k):  # gains start at 1: every head's RMS is 1
        np.testing.assert_allclose(jnp.sqrt(jnp.mean(jnp.square(a), axis=-1)), 1.0, rtol=1e-3)
    np.testing.assert_allclose(gated, halved, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("variant, overrides, message", [
    ("gau", ("attn.output_gate=true",), "attn.output_gate=true is not available for attn.mixer=gau"),
    ("mla", ("attn.qk_norm=true",), "attn.qk_norm=true is not available for attn.mixer=mla"),
    ("keynorm", ("attn.qk_norm=true",), "attn.qk_norm and attn.key_norm both normalise the keys"),
])
def test_bad_settings_are_one_line_errors(variant, overrides, message, capsys):
    with pytest.raises((SystemExit, ConfigError)):
        tiny_config(variant, *overrides)
    assert message in capsys.readouterr().err
