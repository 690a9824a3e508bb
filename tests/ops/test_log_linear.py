"""Log-linear attention (``lmzoo.ops.log_linear``) and its Mamba-2 mixer: the Fenwick levels partition
the past; the chunk and scan forms equal the masked quadratic form (values, gradients with random
cotangents, final level states) at an odd length, with a partial last chunk, grouped heads, an
initial state, documents and bfloat16 inputs; every lam = 1 is simple GLA; decoding step by step
keeps one state per set bit of the position and equals the forward."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo import ops
from lmzoo.config import ConfigError, ModelConfig
from lmzoo.mixers import MixerContext, build_mixer
from lmzoo.mixers.log_linear_mamba2 import LogLinearMamba2Config, mean_extra_levels
from lmzoo.ops.log_linear import empty_slots, level, log_linear_attention, log_linear_step, log_linear_weights
from lmzoo.positions import Positions

from conftest import tiny_config
from op_checks import BF16_TOLERANCE, assert_trees_close, compiled, random_like, rel_err

B, T, G, H, DK, DV, LEVELS = 2, 19, 1, 2, 8, 4, 6  # ceil(log2 19) + 1 = 6 levels
CHUNK = 8  # 19 = 8 + 8 + a partial 3
DOCS = (5, 9, 5)  # row 0's documents; row 1 is one


def doc_ids() -> jax.Array:
    row = np.repeat(np.arange(len(DOCS)), DOCS)
    return jnp.asarray(np.stack([row, np.zeros(T, int)]), jnp.int32)


def make_args(*, levels=LEVELS, with_state=False, strong=False, seed=0) -> dict:
    """q, k [B,T,G,Dk] over v [B,T,H,Dv]; gates ~0.4..0.95 a step (strong: ~7 nats); lam in (0.2, 2)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    args = {"q": normal(B, T, G, DK), "k": normal(B, T, G, DK), "v": normal(B, T, H, DV),
            "level_scales": rng.uniform(0.2, 2.0, (B, T, H, levels)).astype(np.float32)}
    args["log_g"] = -np.exp(normal(B, T, H) + 2.0) if strong else -rng.uniform(0.05, 1.0, (B, T, H)).astype(np.float32)
    if with_state:
        args["state"] = normal(B, H, levels - 1, DK, DV)
    return jax.tree.map(jnp.asarray, args)


def run(method, args, context, chunk_size=CHUNK):
    return log_linear_attention(args["q"], args["k"], args["v"], args["log_g"], args["level_scales"],
                                initial_state=args.get("state"), method=method, chunk_size=chunk_size, **context)


@functools.partial(compiled, static_argnums=(0,), static_argnames=("chunk_size",))
def pull_back(method, args, cotangent, context, chunk_size=CHUNK):
    """(o, final state) and the gradients of <(o, S), cotangent> w.r.t. every array in ``args``."""
    out, vjp = jax.vjp(lambda a: run(method, a, context, chunk_size), args)
    return out, vjp(cotangent)[0]


run_fast = compiled(run, static_argnums=(0, 3))


def cotangent_for(args, context, seed=7):
    """Random upstream gradients for (o, final state), in their dtypes."""
    shapes = jax.eval_shape(lambda a: run("naive", a, context), args)
    return jax.tree.map(lambda x, like: x.astype(like.dtype), random_like(shapes, seed=seed), shapes)


# ----------------------------------------------------------------------------- the levels


def test_the_levels_partition_the_past():
    """Level 0 is t itself, level l >= 1 the block [t - t mod 2^l, t - t mod 2^(l-1)): every s <= t
    lies in exactly one, the one ``level`` names, and at most ceil(log2 T) + 1 are non-empty."""
    length = 70
    t, s = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    blocks = [t == s] + [(t - t % 2**k <= s) & (s < t - t % 2 ** (k - 1)) for k in range(1, 8)]
    count = np.sum(blocks, axis=0)
    assert np.all(count[s <= t] == 1) and np.all(count[s > t] == 0)
    named = np.asarray(level(jnp.asarray(t), jnp.asarray(s), 8))
    np.testing.assert_array_equal(np.argmax(blocks, axis=0)[s <= t], named[s <= t])
    assert named.max() == int(np.ceil(np.log2(length)))  # so ceil(log2 T) + 1 levels cover T tokens
    non_empty = np.sum([np.any(b, axis=1) for b in blocks], axis=0)  # one per set bit of t, and t itself
    np.testing.assert_array_equal(non_empty, [bin(x).count("1") + 1 for x in range(length)])


def test_the_quadratic_form_is_the_definition():
    """The naive form against the sum written out token by token (float64, scale 1)."""
    args, ids = make_args(), np.asarray(doc_ids())
    out, _ = log_linear_attention(*(args[n] for n in ("q", "k", "v", "log_g", "level_scales")), scale=1.0,
                                  method="naive", segment_ids=doc_ids())
    q, k, v, log_g, lam = (np.asarray(args[n], np.float64) for n in ("q", "k", "v", "log_g", "level_scales"))
    cum, expected = np.cumsum(log_g, axis=1), np.zeros((B, T, H, DV))
    for b in range(B):
        starts = [int(np.argmax(ids[b] == i)) for i in ids[b]]  # each token's document start
        for t in range(T):
            for s in range(starts[t], t + 1):
                lvl = ((t - starts[t]) ^ (s - starts[t])).bit_length()
                weight = lam[b, t, :, lvl] * np.exp(cum[b, t] - cum[b, s]) * (q[b, t, 0] @ k[b, s, 0])  # (H,)
                expected[b, t] += weight[:, None] * v[b, s]
    assert rel_err(out, expected) < 1e-6


# ----------------------------------------------------------------------------- the forms


@functools.lru_cache(maxsize=None)
def reference(setting):
    """Inputs, context, cotangent and the naive form's (outputs, gradients) for a setting."""
    with_state = setting == "state_documents"
    args = make_args(with_state=with_state)
    context = {"segment_ids": doc_ids(), "start": jnp.asarray(5)} if with_state else {}
    cotangent = cotangent_for(args, context)
    return args, context, cotangent, pull_back("naive", args, cotangent, context)


FORMS = [("chunk", "plain"), ("chunk", "state_documents"), ("scan", "state_documents")]


@pytest.mark.parametrize("method, setting", FORMS)
def test_fast_forms_equal_the_quadratic_form(method, setting):
    """Outputs, final level states and every gradient (q, k, v, gates, level scales, initial state)."""
    args, context, cotangent, expected = reference(setting)
    assert_trees_close(pull_back(method, args, cotangent, context), expected)


def test_chunks_are_exact_at_any_size_with_strong_gates_and_few_levels():
    """Gates of ~7 nats a step; 3 levels for 19 tokens (farther keys share the last level's weight and
    state); chunk sizes that neither divide T nor are powers of two, down to single tokens."""
    args = make_args(levels=3, with_state=True, strong=True, seed=3)
    context = {"segment_ids": doc_ids(), "start": jnp.asarray([2, 9])}
    cotangent = cotangent_for(args, context, seed=4)
    expected = pull_back("naive", args, cotangent, context)
    assert_trees_close(pull_back("chunk", args, cotangent, context, chunk_size=5), expected)
    assert_trees_close(run_fast("chunk", args, context, 1), expected[0])


def test_bfloat16_inputs():
    """bf16 q, k, v, gates and level scales: o comes back in bf16 and within bf16 rounding of the
    reference on the same rounded inputs; states and gradients within a bf16 tolerance."""
    args, context, _, _ = reference("state_documents")
    args = jax.tree.map(lambda x: x.astype(jnp.bfloat16), args)
    cotangent = cotangent_for(args, context)
    (out, state), grads = pull_back("chunk", args, cotangent, context)
    (ref_out, ref_state), ref_grads = pull_back("naive", args, cotangent, context)
    assert out.dtype == jnp.bfloat16 and state.dtype == jnp.float32
    assert_trees_close((out, state, grads), (ref_out, ref_state, ref_grads), tol=BF16_TOLERANCE)
    assert rel_err(state, ref_state) < 1e-5  # both from the same inputs, accumulated in float32


def test_state_carries_a_sequence_on():
    """The first 11 tokens, then the rest from their state at position 11, equal the whole."""
    args = make_args()
    whole = run_fast("chunk", args, {})
    first = {n: x[:, :11] for n, x in args.items()}
    out_a, state_a = run_fast("chunk", first, {})
    rest = {**{n: x[:, 11:] for n, x in args.items()}, "state": state_a}
    out_b, state_b = run_fast("chunk", rest, {"start": jnp.asarray(11)})
    assert_trees_close((jnp.concatenate([out_a, out_b], axis=1), state_b), whole)


def test_chunks_carry_only_the_slots_a_known_start_can_fill():
    """Without documents or an initial state and from a start known in advance (here 12), every chunk
    of 8 begins at a multiple of 4, so slots 1 and 2 are empty there and only the others are carried;
    the result is the quadratic form's, final state included."""
    inputs = [make_args()[n] for n in ("q", "k", "v", "log_g", "level_scales")]
    fast = log_linear_attention(*inputs, start=12, method="chunk", chunk_size=CHUNK)
    assert_trees_close(fast, log_linear_attention(*inputs, start=12, method="naive"))
    assert empty_slots(12, CHUNK) == 2 and empty_slots(0, CHUNK) == 3


def test_decoding_keeps_one_state_per_set_bit_and_equals_the_forward():
    """``log_linear_step`` token by token from an empty state: the forward's outputs and final state,
    and after t tokens exactly the slots of t's set bits hold keys (slot l for bit l - 1)."""
    args = make_args()
    expected_out, expected_state = run_fast("chunk", args, {})
    step = compiled(log_linear_step)
    state, outputs = jnp.zeros((B, H, LEVELS - 1, DK, DV)), []
    for t in range(T):
        out, state = step(*(args[n][:, t] for n in ("q", "k", "v", "log_g", "level_scales")), state, t)
        outputs.append(out)
        filled = np.asarray(jnp.any(state != 0, axis=(0, 1, 3, 4)))
        assert filled.tolist() == [bool((t + 1) >> bit & 1) for bit in range(LEVELS - 1)], t
    assert_trees_close((jnp.stack(outputs, axis=1), state), (expected_out, expected_state))


def test_every_level_scale_one_is_simple_gla():
    """lam = 1: Mamba-2 / GLA with one gate per head (grouped heads repeated); the level states sum to GLA's."""
    args = make_args()
    s0 = jnp.asarray(np.random.default_rng(5).standard_normal((B, H, DK, DV)), jnp.float32)
    levels_s0 = jnp.zeros((B, H, LEVELS - 1, DK, DV)).at[:, :, -1].set(s0)  # every slot weighs 1: any will do
    ones = {**args, "level_scales": jnp.ones_like(args["level_scales"]), "state": levels_s0}
    out, state = run_fast("chunk", ones, {"start": jnp.asarray(40)})
    q, k = (jnp.repeat(args[n], H // G, axis=2) for n in ("q", "k"))
    gla_out, gla_state = ops.gla(q, k, args["v"], args["log_g"], initial_state=s0, method="naive")
    assert_trees_close((out, state.sum(axis=2)), (gla_out, gla_state))


def test_weights_reproduce_the_op_and_stay_in_their_document():
    args, ids = make_args(), doc_ids()
    names = ("q", "k", "log_g", "level_scales")
    weights = compiled(log_linear_weights)(*(args[n] for n in names), segment_ids=ids)  # (B, H, T, S)
    out, _ = run_fast("chunk", args, {"segment_ids": ids})
    assert_trees_close(jnp.einsum("bhts,bshe->bthe", weights, args["v"]), out)
    across = np.asarray(ids[:, :, None] != ids[:, None, :])[:, None] | np.triu(np.ones((T, T), bool), 1)
    assert np.all(np.asarray(weights)[np.broadcast_to(across, weights.shape)] == 0)


def test_bad_settings_are_one_line_errors():
    args = make_args(levels=1)
    with pytest.raises(ValueError, match="level_scales has 1 levels"):
        run("chunk", args, {})
    with pytest.raises(ValueError, match="method='pallas'"):
        run("pallas", make_args(), {})


# ----------------------------------------------------------------------------- the mixer


@functools.lru_cache(maxsize=None)
def mixer_of(*overrides):
    cfg = tiny_config("log_linear_mamba2", *overrides)
    m = cfg.model
    ctx = MixerContext(m.d_model, m.n_heads, 0, m.n_layers, jnp.dtype(m.dtype), Positions(cfg.pos.kind), m.init_std,
                       train_len=cfg.data.seq_len)
    return build_mixer(cfg.attn, ctx, rngs=nnx.Rngs(0))


@nnx.jit
def attention_and_ssm(mixer, x):
    """(attention_matrix applied to x per SSM head, the op's output before D, matrix, per-head average)."""
    xs, dt, b, c, _, _ = mixer.ssm_inputs(x)
    y, _ = log_linear_attention(c, b, dt[..., None] * xs, dt * mixer.A(), mixer.level_scales(x), scale=1.0,
                                method="scan")
    weights = log_linear_weights(c, b, dt * mixer.A(), mixer.level_scales(x), scale=1.0) * dt.swapaxes(1, 2)[:, :, None]
    batch, _, length, _ = weights.shape
    heads = weights.reshape(batch, mixer.n_heads, -1, length, length).mean(axis=2)
    return jnp.einsum("bhij,bjhp->bihp", weights, xs), y, mixer.attention_matrix(x), heads


def test_mixer_attention_matrix_reproduces_its_ssm():
    mixer = mixer_of("attn.head_dim=8", "attn.n_groups=2")  # 8 SSM heads over 4 model heads
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 17, 32)), jnp.float32)
    mixed, y, weights, heads = attention_and_ssm(mixer, x)
    np.testing.assert_allclose(mixed, y, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weights, heads, rtol=1e-6, atol=1e-7)


def test_mixer_levels_state_and_flops():
    mixer = mixer_of("attn.head_dim=8", "attn.n_groups=2")  # data.seq_len = 32: levels 0..5
    assert mixer.levels == 6
    floats = sum(a.size for a in jax.tree.leaves(mixer.init_state(1, 64)))
    assert mixer.state_size(64) == floats
    model = ModelConfig(d_model=64)
    flops = LogLinearMamba2Config(name="l", mixer="log_linear_mamba2").flops_per_token(model, 256)
    extra = np.mean([max(bin(t).count("1") - 1, 0) for t in range(256)])  # set bits, less Mamba-2's one state
    assert mean_extra_levels(256, 9) == extra and flops == 6 * extra * 128 * 32
    assert mean_extra_levels(8, 2) == 0.0  # one slot holds every earlier key


@pytest.mark.parametrize("config, message", [
    (LogLinearMamba2Config(name="l", mixer="log_linear_mamba2", levels=1), "attn.levels=1"),
    (LogLinearMamba2Config(name="l", mixer="log_linear_mamba2", method="pallas"), "attn.method='pallas'"),
    (LogLinearMamba2Config(name="l", mixer="log_linear_mamba2", n_groups=3), "attn.n_groups=3"),
])
def test_mixer_bad_settings_are_config_errors(config, message):
    with pytest.raises(ConfigError, match=message):
        config.check(ModelConfig())
