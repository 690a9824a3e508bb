"""Position methods: neutral settings are plain RoPE, each method's defining identity, config errors,
and swapping a method into a trained model without touching its parameters."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.model import LM
from lmzoo.positions import KINDS, PosConfig, Positions, alibi_slopes, default_positions
from lmzoo.schema import ConfigError

from conftest import run_lmzoo, tiny_config

B, T, H, D = 2, 23, 2, 16


def qk(t=T, seed=0):
    kq, kk = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kq, (B, t, H, D)), jax.random.normal(kk, (B, t, H, D))


def rope_scores(q, k, q_pos, k_pos):
    return Positions("rope").scores(q, k, q_pos, k_pos)


def test_every_kind_has_a_config_file_naming_it():
    import pathlib

    from lmzoo.config import CONFIG_DIR
    from omegaconf import OmegaConf

    files = sorted(pathlib.Path(CONFIG_DIR, "pos").glob("*.yaml"))
    assert sorted(f.stem for f in files) == sorted(KINDS)
    for path in files:
        cfg = PosConfig(**OmegaConf.to_container(OmegaConf.load(path)))
        assert cfg.kind == path.stem
        cfg.check()


@pytest.mark.parametrize("kind", ["pi", "ntk", "yarn"])
def test_factor_one_is_plain_rope(kind):
    q, _ = qk()
    positions = default_positions(B, T) * 37  # large positions: every frequency turns many times
    plain = Positions("rope").rotate(q, positions)
    neutral = Positions(kind, factor=1.0, original_len=64).rotate(q, positions)
    np.testing.assert_array_equal(neutral, plain)
    assert Positions(kind, factor=1.0, original_len=64).logit_scale == 1.0


@pytest.mark.parametrize("kind", ["rerope", "leaky_rerope"])
def test_window_covering_the_sequence_is_plain_rope(kind):
    q, k = qk()
    positions = default_positions(B, T)
    plain = rope_scores(q, k, positions, positions)
    np.testing.assert_array_equal(Positions(kind, window=T).scores(q, k, positions, positions), plain)
    clipped = Positions(kind, window=5).scores(q, k, positions, positions)
    assert not np.allclose(np.tril(clipped[0, 0], -6), np.tril(plain[0, 0], -6))


def test_pi_divides_positions_by_the_factor():
    q, _ = qk()
    positions = default_positions(B, T)
    np.testing.assert_allclose(
        Positions("pi", factor=4.0).rotate(q, 4 * positions), Positions("rope").rotate(q, positions), atol=1e-5
    )


def test_ntk_keeps_the_highest_frequency_and_stretches_the_lowest_by_the_factor():
    plain, ntk = Positions("rope").frequencies(D), Positions("ntk", factor=8.0).frequencies(D)
    assert float(ntk[0]) == float(plain[0]) == 1.0
    np.testing.assert_allclose(ntk[-1], plain[-1] / 8.0, rtol=1e-5)
    assert np.all(np.diff(np.asarray(plain / ntk)) > 0)  # stretch grows towards low frequencies


def test_yarn_interpolates_slow_dimensions_keeps_fast_ones_and_sets_the_temperature():
    original, factor = 2048, 4.0
    plain = np.asarray(Positions("rope").frequencies(D))
    yarn = np.asarray(Positions("yarn", factor=factor, original_len=original).frequencies(D))
    turns = original * plain / (2 * math.pi)
    fast, slow = turns > 32.0, turns < 1.0
    assert fast.any() and slow.any()
    np.testing.assert_allclose(yarn[fast], plain[fast], rtol=1e-6)
    np.testing.assert_allclose(yarn[slow], plain[slow] / factor, rtol=1e-6)
    middle = ~fast & ~slow
    assert np.all((yarn[middle] < plain[middle]) & (yarn[middle] > plain[middle] / factor))
    assert (Positions("yarn", factor=factor, original_len=original).logit_scale
            == pytest.approx((0.1 * math.log(4) + 1) ** 2))


@pytest.mark.parametrize("kind, leak", [("rerope", None), ("leaky_rerope", 4.0)])
def test_rerope_clips_or_compresses_relative_positions_beyond_the_window(kind, leak):
    window = 6
    pos = Positions(kind, window=window, **({"leak": leak} if leak else {}))
    q, k = qk()
    positions = default_positions(B, T)
    scores = np.asarray(pos.scores(q, k, positions, positions))
    expected_distance = lambda d: d if d < window else (window if leak is None else window + (d - window) / leak)
    for i, j in [(3, 0), (10, 5), (10, 4), (20, 2), (22, 0)]:
        d = expected_distance(i - j)  # RoPE scores depend only on the relative position
        want = rope_scores(q[:, i : i + 1], k[:, j : j + 1], jnp.full((B, 1), d), jnp.zeros((B, 1)))
        np.testing.assert_allclose(scores[:, :, i, j], want[:, :, 0, 0], rtol=1e-4, atol=1e-4)


def test_alibi_slopes_and_bias():
    np.testing.assert_allclose(alibi_slopes(8), [2.0**-h for h in range(1, 9)])
    np.testing.assert_allclose(alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])
    positions = default_positions(1, 5)
    bias = Positions("alibi").bias(positions, positions, 8)
    assert bias.shape == (1, 8, 5, 5)
    assert float(bias[0, 0, 4, 1]) == -0.5 * 3 and float(bias[0, 7, 4, 4]) == 0.0
    assert Positions("rope").bias(positions, positions, 8) is None


def test_pos_config_errors_are_one_line():
    unknown = "pos.kind='bogus' is not valid (choose from: rope, pi, ntk, yarn, rerope, leaky_rerope, alibi, none)"
    with pytest.raises(ConfigError, match=f"^{re.escape(unknown)}$"):
        PosConfig(kind="bogus").check()
    for kwargs, message in [
        ({"factor": 0.5}, "pos.factor=0.5 must be at least 1"),
        ({"window": 0}, "pos.window=0 must be positive"),
        ({"leak": 1.0}, "pos.leak=1.0 must be greater than 1"),
    ]:
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
            PosConfig(**kwargs).check()


@pytest.mark.slow
def test_unknown_kind_on_the_command_line_is_one_line():
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", "pos.kind=spiral", "train.steps=1", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lmzoo: error: pos.kind='spiral' is not valid "
        "(choose from: rope, pi, ntk, yarn, rerope, leaky_rerope, alibi, none)"
    ]


def swapped(model: LM, variant: str, *overrides: str) -> LM:
    """The same parameters under another config (what evaluating a checkpoint with overrides does)."""
    other = LM(tiny_config(variant, *overrides), 259, rngs=nnx.Rngs(1))
    nnx.update(other, nnx.state(model))
    return other


def test_position_methods_swap_into_a_trained_model_without_changing_parameters():
    model = LM(tiny_config("softmax"), 259, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 13), 0, 259)
    plain = model(tokens)
    neutral = swapped(model, "softmax", "pos.kind=ntk", "pos.factor=1")
    assert jax.tree.structure(nnx.state(neutral)) == jax.tree.structure(nnx.state(model))
    np.testing.assert_array_equal(neutral(tokens), plain)
    np.testing.assert_allclose(swapped(model, "softmax", "pos.kind=rerope", "pos.window=13")(tokens), plain,
                               rtol=1e-6, atol=1e-6)
    extensions = (["pos.kind=ntk", "pos.factor=4"], ["pos.kind=yarn", "pos.factor=2"],
                  ["pos.kind=leaky_rerope", "pos.window=4"])
    for overrides in extensions:
        changed = swapped(model, "softmax", *overrides)(tokens)
        assert np.all(np.isfinite(changed)) and not np.allclose(changed, plain), overrides


@pytest.mark.parametrize("kind", ["yarn", "leaky_rerope", "alibi"])
def test_decoding_agrees_with_the_forward_under_each_score_rule(kind):
    cfg = tiny_config("gqa", f"pos.kind={kind}", "pos.factor=2", "pos.window=4", "attn.window=6")
    mixer = LM(cfg, 259, rngs=nnx.Rngs(0)).blocks[0].mixer
    x = jax.random.normal(jax.random.key(0), (2, 13, 32))
    state, outputs = mixer.init_state(2, 13), []
    for t in range(13):
        y_t, state = mixer.step(x[:, t], state)
        outputs.append(y_t)
    np.testing.assert_allclose(jnp.stack(outputs, axis=1), mixer(x), rtol=1e-5, atol=1e-5)
