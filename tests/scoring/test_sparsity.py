"""Sparsity, entropy and first-key share on rows whose answers are known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.scoring import attention_entropy, first_key_share, l1_l2_sparsity


def test_uniform_row_is_one_and_has_maximal_entropy():
    row = np.full(8, 1 / 8)
    assert float(l1_l2_sparsity(row)) == pytest.approx(1.0)
    assert float(attention_entropy(row)) == pytest.approx(np.log(8))


@pytest.mark.parametrize("n", [1, 4, 25])
def test_one_hot_row_is_one_over_sqrt_n_with_zero_entropy(n):
    row = np.eye(n)[n // 2]
    assert float(l1_l2_sparsity(row)) == pytest.approx(1 / np.sqrt(n))
    assert float(attention_entropy(row)) == pytest.approx(0.0)


def test_scale_invariant_and_defined_for_signed_rows():
    row = np.array([0.5, -2.0, 1.0, 0.0])
    expected = np.abs(row).mean() / np.sqrt((row**2).mean())
    assert float(l1_l2_sparsity(row)) == pytest.approx(expected)
    assert float(l1_l2_sparsity(-7.5 * row)) == pytest.approx(expected)
    p = np.abs(row) / np.abs(row).sum()
    assert float(attention_entropy(row)) == pytest.approx(-(p[p > 0] * np.log(p[p > 0])).sum())


def test_mask_restricts_each_row_to_its_valid_entries():
    """Causal rows: row i has i + 1 valid entries; uniform over them gives S = 1, H = log(i + 1)."""
    t = 6
    causal = np.tril(np.ones((t, t), bool))
    uniform = np.where(causal, 1.0 / np.arange(1, t + 1)[:, None], 0.0)
    np.testing.assert_allclose(l1_l2_sparsity(uniform, causal), np.ones(t), rtol=1e-6)
    np.testing.assert_allclose(attention_entropy(uniform, causal), np.log(np.arange(1, t + 1)), atol=1e-6)
    # without the mask the zeros above the diagonal count: S = sqrt((i + 1) / t)
    np.testing.assert_allclose(l1_l2_sparsity(uniform), np.sqrt(np.arange(1, t + 1) / t), rtol=1e-6)


def test_batched_matrices_and_other_axes():
    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 5, 5))
    out = l1_l2_sparsity(w)
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(out[1, 2, 4], np.abs(w[1, 2, 4]).mean() / np.sqrt((w[1, 2, 4] ** 2).mean()), rtol=1e-6)
    cols = l1_l2_sparsity(w, axis=-2)
    np.testing.assert_allclose(cols[0, 0, 1], np.abs(w[0, 0, :, 1]).mean() / np.sqrt((w[0, 0, :, 1] ** 2).mean()),
                               rtol=1e-6)


def test_empty_rows_are_nan():
    assert np.isnan(float(l1_l2_sparsity(np.zeros(4))))
    assert np.isnan(float(l1_l2_sparsity(np.ones(4), np.zeros(4, bool))))


def test_first_key_share_reads_each_rows_first_valid_key():
    t = 5
    causal = np.tril(np.ones((t, t), bool))
    uniform = np.where(causal, 1.0 / np.arange(1, t + 1)[:, None], 0.0)
    shares = np.asarray(first_key_share(uniform, causal))
    assert np.isnan(shares[0])  # one key: the first by force, not a sink
    np.testing.assert_allclose(shares[1:], 1 / np.arange(2, t + 1), rtol=1e-6)
    sink = np.zeros((t, t))
    sink[:, 0], sink[np.arange(t), np.arange(t)] = 0.75, 0.25  # each row parks 3/4 of its weight on key 0
    np.testing.assert_allclose(np.asarray(first_key_share(sink, causal))[1:], 0.75, rtol=1e-6)
    # two documents packed in one row: the second document's rows start at its own first key (position 2)
    segments = np.array([0, 0, 1, 1, 1])
    visible = causal & (segments[:, None] == segments[None, :])
    weights = np.where(visible, 1.0, 0.0)
    weights[3, 2], weights[4, 2] = 3.0, 2.0
    np.testing.assert_allclose(np.asarray(first_key_share(weights, visible))[[1, 3, 4]], [0.5, 0.75, 0.5], rtol=1e-6)
    assert np.isnan(np.asarray(first_key_share(weights, visible))[2])  # the document's first row


def test_probes_report_each_layer_of_the_model():
    import jax
    from flax import nnx

    from lmzoo.scoring.probes import attention_stats
    from lmzoo.model import LM

    from conftest import tiny_config

    cfg = tiny_config("gqa", "model.n_layers=3")
    model = LM(cfg, 259, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 259)
    stats = attention_stats(model, tokens, position_buckets=3)
    assert np.array(stats["sparsity"]).shape == (3, 4) and np.array(stats["entropy"]).shape == (3, 4)
    assert np.array(stats["sparsity_by_position"]).shape == (3, 3) and stats["positions"] == [4, 8, 12]

    # the probe of layer l is the attention that layer's mixer applies to its actual input
    h = model.embed(tokens)
    causal = np.tril(np.ones((12, 12), bool))
    for layer, block in enumerate(model.blocks):
        weights = block.mixer.attention_matrix(block.mixer_norm(h))
        for key, statistic in (("sparsity", l1_l2_sparsity), ("entropy", attention_entropy),
                               ("first_key", first_key_share)):
            np.testing.assert_allclose(stats[key][layer], np.nanmean(statistic(weights, causal), axis=(0, 2)),
                                       rtol=1e-5)
        h = block(h)
    # softmax rows are positive and normalised: 1/sqrt(n) <= S <= 1 and 0 <= H <= log(n)
    assert np.all(np.array(stats["sparsity"]) <= 1 + 1e-6) and np.all(np.array(stats["entropy"]) >= 0)
