"""Softmax-family refinements: log-n scaling, KeyNorm, sliding windows, MLA, GAU, Transformer-VQ,
per-layer hybrids and the family's FLOPs count. Generic protocol checks (step == forward, causality,
probe shapes) for every variant YAML run in test_mixers.py; these pin each method's own identities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.mixers.base import AuxLoss
from lmzoo.model import LM, count_params
from lmzoo.ops.attention import logn_scale, softmax_attention
from lmzoo.ops.vq import gather_codewords, init_vq_cache, vq_attention, vq_step
from lmzoo.positions import default_positions

from conftest import tiny_config

VOCAB = 259


def build(variant: str, *overrides: str, seed: int = 0) -> LM:
    return LM(tiny_config(variant, *overrides), VOCAB, rngs=nnx.Rngs(seed))


def same_params(model: LM, variant: str, *overrides: str) -> LM:
    """``model``'s parameters under another config, as an evaluation-time override gives them."""
    other = build(variant, *overrides, seed=1)
    nnx.update(other, nnx.state(model))
    return other


def x_of(t: int, seed: int = 0):
    return jax.random.normal(jax.random.key(seed), (2, t, 32))


def stepped(mixer, x):
    state, outputs = mixer.init_state(x.shape[0], x.shape[1]), []
    for t in range(x.shape[1]):
        y_t, state = mixer.step(x[:, t], state)
        outputs.append(y_t)
    return jnp.stack(outputs, axis=1), state


def rel_err(a, b, *, floor: float = 0.0) -> float:
    """||a - b|| / ||b||; ``floor`` bounds the denominator below (for references that may be exactly 0)."""
    return float(jnp.linalg.norm(a - b) / max(float(jnp.linalg.norm(b)), floor))


# ----------------------------------------------------------------------------- log-n


def test_logn_factor_values():
    n = jnp.array([1, 16, 256, 4096])
    np.testing.assert_allclose(logn_scale(n, 256), [0.0, 0.5, 1.0, 1.5], atol=1e-6)
    np.testing.assert_allclose(logn_scale(n, 256, clamp=True), [1.0, 1.0, 1.0, 1.5], atol=1e-6)


def test_logn_scales_each_query_by_the_keys_it_sees():
    model = build("logn", "attn.logn_base=4", "attn.window=6")  # a window caps n at 6
    mixer = model.blocks[0].mixer
    x = x_of(13)
    plain = same_params(model, "softmax", "attn.window=6").blocks[0].mixer
    q, k, _ = plain.project(x, default_positions(2, 13))
    logits = jnp.einsum("bthd,bshd->bhts", q, k) * 8**-0.5
    n = np.minimum(np.arange(1, 14), 6)
    want = jnp.where(np.tril(np.ones((13, 13), bool), 0) & ~np.tril(np.ones((13, 13), bool), -6),
                     logits * (np.log(n) / np.log(4))[:, None], -jnp.inf)
    np.testing.assert_allclose(mixer.attention_matrix(x), jax.nn.softmax(want, -1), rtol=1e-5, atol=1e-6)


def test_logn_switched_on_at_evaluation_is_exact_inside_the_training_length():
    model = build("gqa")
    tokens = jax.random.randint(jax.random.key(1), (2, 13), 0, VOCAB)
    switched = same_params(model, "gqa", "attn.logn=true", "attn.logn_clamp=true", "attn.logn_base=8")
    logits, plain = switched(tokens), model(tokens)
    np.testing.assert_array_equal(logits[:, :8], plain[:, :8])  # queries seeing <= 8 keys: factor 1
    assert not np.allclose(logits[:, 8:], plain[:, 8:])


# ----------------------------------------------------------------------------- KeyNorm


def test_keynorm_uses_unit_keys_and_scale_one():
    mixer = build("keynorm").blocks[0].mixer
    x = x_of(13)
    q, k, _ = mixer.project(x, default_positions(2, 13))
    np.testing.assert_allclose(jnp.linalg.norm(k, axis=-1), 1.0, rtol=1e-5)
    logits = jnp.einsum("bthd,bshd->bhts", q, k)  # scale 1: the query's length is the temperature
    want = jax.nn.softmax(jnp.where(np.tril(np.ones((13, 13), bool)), logits, -jnp.inf), -1)
    np.testing.assert_allclose(mixer.attention_matrix(x), want, rtol=1e-5, atol=1e-6)
    scaled = build("keynorm", "attn.scale=0.5").blocks[0].mixer
    assert scaled.scoring.scale == 0.5


# ----------------------------------------------------------------------------- sliding window


def test_window_covering_the_sequence_is_full_attention():
    model = build("softmax")
    windowed = same_params(model, "swa", "attn.window=13").blocks[0].mixer
    x = x_of(13)
    np.testing.assert_allclose(windowed(x), model.blocks[0].mixer(x), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(windowed.attention_matrix(x), model.blocks[0].mixer.attention_matrix(x))


def test_window_ring_buffer_decodes_past_its_size():
    mixer = build("swa", "attn.window=4").blocks[0].mixer
    x = x_of(13)
    weights = np.asarray(mixer.attention_matrix(x))
    assert np.all(np.tril(weights, -4) == 0) and np.all(np.diagonal(weights, -3, 2, 3) > 0)
    out, state = stepped(mixer, x)
    assert state["k"].shape[1] == 4 and mixer.state_size(1000) == 2 * 4 * 4 * 8
    np.testing.assert_allclose(out, mixer(x), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- MLA


def test_mla_absorbed_decoding_caches_only_latents_and_equals_the_forward():
    mixer = build("mla", "attn.kv_rank=12", "attn.q_rank=16", "attn.rope_dim=4").blocks[0].mixer
    x = x_of(13)
    out, state = stepped(mixer, x)
    assert rel_err(out, mixer(x)) < 1e-5
    assert ({k: v.shape for k, v in state.items() if k not in ("pos", "t")}
            == {"latent": (2, 13, 12), "rope_key": (2, 13, 4)})
    assert mixer.state_size(100) == 100 * (12 + 4) < 2 * 100 * 4 * 8  # vs an MHA cache of the same heads


def test_mla_rope_key_is_shared_by_all_heads():
    mixer = build("mla").blocks[0].mixer
    k, _ = mixer.keys_values(*mixer.latents(x_of(13)))
    rope_part = k[..., mixer.head_dim :]
    np.testing.assert_array_equal(rope_part, jnp.broadcast_to(rope_part[:, :, :1], rope_part.shape))


# ----------------------------------------------------------------------------- GAU


def test_gau_weights_are_scaled_squared_relu_over_the_keys_seen():
    mixer = build("gau", "attn.qk_dim=16").blocks[0].mixer
    x = x_of(13)
    _, q, k, _ = mixer.project(x)
    positions = default_positions(2, 13)
    rq, rk = mixer.scoring.pos.rotate(q, positions), mixer.scoring.pos.rotate(k, positions)
    a = jnp.square(jax.nn.relu(jnp.einsum("bthd,bshd->bhts", rq, rk) / 4.0)) / jnp.arange(1, 14)[:, None]
    want = jnp.where(np.tril(np.ones((13, 13), bool)), a, 0.0)
    np.testing.assert_allclose(mixer.attention_matrix(x)[:, :1], want, rtol=1e-5, atol=1e-7)
    softmax_gau = build("gau", "attn.weights=softmax").blocks[0].mixer
    np.testing.assert_allclose(softmax_gau.attention_matrix(x).sum(-1), 1.0, rtol=1e-6)


def test_gau_models_have_no_separate_mlp():
    gau, with_mlp = build("gau"), build("gau", "model.mlp=true")
    assert all(block.mlp is None for block in gau.blocks)
    assert count_params(gau) < count_params(with_mlp)


# ----------------------------------------------------------------------------- Transformer-VQ


def vq_inputs(t, *, h=2, d=8, s=5, seed=0, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 4)
    codebook = jax.random.normal(ks[0], (h, s, d))
    codes = jax.random.randint(ks[1], (2, t, h), 0, s)
    q = jax.random.normal(ks[2], (2, t, h, d), dtype)
    v = jax.random.normal(ks[3], (2, t, h, 12), dtype)
    return q, gather_codewords(codebook, codes).astype(dtype), codes, codebook, v


@pytest.mark.parametrize("t", [1, 63, 257])
def test_vq_blocked_equals_naive_on_values_and_gradients(t):
    q, k_hat, codes, codebook, v = vq_inputs(t)
    forms = {
        m: (lambda q, k, c, v, m=m: vq_attention(q, k, codes, c, v, block_size=16, method=m))
        for m in ("naive", "blocked")
    }
    cotangent = jax.random.normal(jax.random.key(9), v.shape)
    results = {}
    for method, fn in forms.items():
        forward_backward = jax.jit(lambda *args, fn=fn: (lambda out, vjp: (out, vjp(cotangent)))(*jax.vjp(fn, *args)))
        results[method] = forward_backward(q, k_hat, codebook, v)
    out_q, grads_q = results["naive"]
    out_b, grads_b = results["blocked"]
    assert rel_err(out_b, out_q) < 1e-5
    for name, gb, gq in zip(("q", "k_hat", "codebook", "v"), grads_b, grads_q):
        assert rel_err(gb, gq, floor=1.0) < 1e-5, name  # floor: at T=1 the q gradient is exactly 0
    # in value: plain softmax attention over the quantised keys
    assert rel_err(out_q, softmax_attention(q, k_hat, v, method="naive")) < 1e-5


def test_vq_bfloat16_stays_close_to_the_float32_reference():
    q, k_hat, codes, codebook, v = vq_inputs(63)
    want = vq_attention(q, k_hat, codes, codebook, v, block_size=16, method="naive")
    half = [a.astype(jnp.bfloat16) for a in (q, k_hat, codebook, v)]
    got = vq_attention(half[0], half[1], codes, half[2], half[3], block_size=16, method="blocked")
    assert got.dtype == jnp.bfloat16 and rel_err(got.astype(jnp.float32), want) < 2e-2


def test_vq_compressive_cache_steps_equal_the_forward():
    q, k_hat, codes, codebook, v = vq_inputs(21)
    full = vq_attention(q, k_hat, codes, codebook, v, block_size=8)
    cache, outputs = init_vq_cache(2, 2, 5, 12), []
    step = jax.jit(vq_step)
    for t in range(21):
        y, cache = step(cache, q[:, t], codes[:, t], codebook, v[:, t])
        outputs.append(y)
    assert rel_err(jnp.stack(outputs, 1), full) < 1e-5
    np.testing.assert_array_equal(cache["counts"].sum(-1), 21.0)


def test_vq_training_forward_sows_commitment_and_moves_the_codebook_plain_forward_does_not():
    from lmzoo.run.steps import init_train_state, loss_and_extra

    cfg = tiny_config("vq", "attn.block_size=8")
    model = LM(cfg, VOCAB, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 13), 0, VOCAB)
    mixer = model.blocks[0].mixer
    before = mixer.codebook()
    model(tokens)  # evaluation / probes: no statistics change, nothing sown
    np.testing.assert_array_equal(mixer.codebook(), before)
    assert not jax.tree.leaves(nnx.state(model, AuxLoss))

    graphdef, state, _ = init_train_state(cfg, model)
    batch = {"inputs": tokens, "targets": tokens}
    objective_and_grads = jax.jit(jax.value_and_grad(loss_and_extra, has_aux=True), static_argnums=2)  # as train_step
    (objective, (metrics, extra)), grads = objective_and_grads(state["params"], state["extra"], graphdef, batch)
    assert float(metrics["aux/commitment"]) > 0
    assert float(objective) == pytest.approx(float(metrics["loss"] + metrics["aux/commitment"]), rel=1e-6)
    trained = nnx.merge(graphdef, state["params"], extra)
    moved = trained.blocks[0].mixer.codebook()
    assert not np.allclose(moved, before)  # a moving-average step towards this batch's keys
    k_grad = [v for path, v in nnx.to_flat_state(grads) if "k_proj" in path]
    assert k_grad and all(float(jnp.abs(g[...]).max()) > 0 for g in k_grad)  # keys learn through the estimator


def test_vq_state_does_not_grow_with_length():
    mixer = build("vq").blocks[0].mixer
    assert mixer.state_size(100) == mixer.state_size(100_000) == 4 * 128 * (8 + 1)


# ----------------------------------------------------------------------------- hybrids


def test_hwfa_windows_lower_layers_and_makes_the_top_global_nope_and_logn():
    model = build("hwfa", "model.n_layers=3")
    scorings = [block.mixer.scoring for block in model.blocks]
    assert [s.window for s in scorings] == [64, 64, None]
    assert [s.pos.kind for s in scorings] == ["rope", "rope", "none"]
    assert [s.logn_base for s in scorings] == [None, None, 32]  # log-n base: the training length


def test_hybrid_pattern_cycles_from_the_bottom_with_top_layers_last():
    cfg = tiny_config("hwfa").attn
    cfg.pattern, cfg.top = ["window", "window", "full"], ["full"]
    assert cfg.layer_names(6) == ["window", "window", "full", "window", "window", "full"]
    assert cfg.for_layer(5, 6).nope and cfg.for_layer(0, 6).window == 64


@pytest.mark.parametrize("override, message", [
    ("attn.pattern=[window,wide]", "attn.pattern: 'wide' is not in attn.layers (defined: window, full)"),
    ("attn.layers.window.window=-3", "attn.layers.window.window=-3 must be positive"),
    ("attn.layers.full.mixer=nope", "attn.layers.full.mixer='nope' is not a registered mixer"),
    ("+attn.layers.full.colour=red", "unknown key 'attn.layers.full.colour'"),
])
def test_hybrid_sub_config_errors_are_one_line(override, message, capsys):
    with pytest.raises(SystemExit):
        tiny_config("hwfa", override)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"lmzoo: error: {message}"), err


@pytest.mark.parametrize("variant, override, message", [
    ("swa", "attn.window=0", "attn.window=0 must be positive"),
    ("logn", "attn.logn_base=1", "attn.logn_base=1 must be at least 2"),
    ("gau", "attn.weights=cosine", "attn.weights='cosine' is not valid (choose from: relu2, softmax)"),
    ("vq", "attn.ema_decay=1.5", "attn.ema_decay=1.5 must lie in [0, 1)"),
    ("mla", "attn.rope_dim=3", "attn.rope_dim=3 must be even"),
])
def test_bad_knobs_give_one_line(variant, override, message, capsys):
    with pytest.raises(SystemExit):
        tiny_config(variant, override)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"lmzoo: error: {message}"), err


# ----------------------------------------------------------------------------- FLOPs


def test_flops_per_token_count_scores_and_values_over_the_keys_seen():
    model = tiny_config("softmax").model  # d_model 32, 4 heads of 8

    def flops(variant, *overrides):
        return tiny_config(variant, *overrides).attn.flops_per_token(model, 256)

    assert flops("softmax") == flops("gqa") == 6 * 256 * 32  # 3 passes x 2 x (T / 2 keys) x (scores + values)
    assert flops("swa", "attn.window=64") == 6 * (64 - 64**2 / 512) * 64 < flops("softmax")
    assert flops("swa", "attn.window=512") == flops("softmax")  # a window past the sequence changes nothing
    assert flops("mla", "attn.rope_dim=4") == 3 * 256 * (4 * (8 + 4) + 4 * 8)  # rope dims add to the scores only
    # chunked recurrences: per head the state's update and read-out and the causal half of each 64-step chunk
    assert flops("gla") == 3 * 4 * (4 * 4 * 8 + (4 + 8) * 64)  # 4 heads, keys 4 wide (key_ratio 0.5), values 8
    assert flops("gated_deltanet") == 3 * 4 * (6 * 8 * 8 + (8 + 8) * 64)  # the delta rule reads S once more
    assert flops("mamba") == 0  # a scan over channels: nothing beyond the 6N rule's
    # Mamba-3's trapezoid runs as one chunked SSD: 4 heads (d_inner 64 / head_dim 16) of state [N = 32, P = 16]
    assert flops("mamba3") == 3 * 4 * (4 * 32 * 16 + (32 + 16) * 64) == flops("mamba2", "attn.d_state=32")
    hybrid = tiny_config("gla_softmax", "model.n_layers=4")  # three gla layers, one softmax
    assert hybrid.attn.flops_per_token(hybrid.model, 256) == (3 * flops("gla") + flops("softmax")) / 4
