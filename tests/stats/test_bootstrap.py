"""Block bootstrap intervals: contain the estimate, shrink with data, reproducible, paired, calibrated."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.stats.bootstrap import (
    block_starts,
    block_sums,
    bootstrap,
    length_intervals,
    metric_interval,
    paired_difference_interval,
    paired_ratio_interval,
    ratio_to_reference,
)


def fake_blocks(n_blocks: int, *, mean: float = 2.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-block (loss sum, token count): blocks of 50-150 tokens whose mean loss varies by text."""
    rng = np.random.default_rng(seed)
    count = rng.integers(50, 151, n_blocks).astype(float)
    difficulty = rng.normal(mean, 0.3, n_blocks)  # (blocks,)
    return difficulty * count, count


def test_interval_contains_the_estimate_and_the_estimate_is_the_ratio_of_sums():
    loss, count = fake_blocks(64)
    interval = metric_interval(loss, count)
    assert interval.estimate == pytest.approx(loss.sum() / count.sum())
    assert interval.lo < interval.estimate < interval.hi


def test_scale_turns_loss_into_bits_per_byte():
    loss, count = fake_blocks(32)
    nats, bits = metric_interval(loss, count), metric_interval(loss, count, scale=0.5)
    np.testing.assert_allclose(bits, np.array(nats) * 0.5)


def test_interval_shrinks_as_blocks_grow():
    widths = []
    for n_blocks in (16, 64, 256):
        interval = metric_interval(*fake_blocks(n_blocks))
        widths.append(interval.hi - interval.lo)
    assert widths[0] > 1.5 * widths[1] > 2.25 * widths[2]  # about 1/sqrt(blocks): halves per 4x


def test_reproducible_for_a_seed_and_different_across_seeds():
    loss, count = fake_blocks(40)
    assert metric_interval(loss, count, seed=3) == metric_interval(loss, count, seed=3)
    assert metric_interval(loss, count, seed=3) != metric_interval(loss, count, seed=4)


def test_paired_ratio_of_a_run_against_itself_is_exactly_one():
    loss, count = fake_blocks(50)
    assert tuple(paired_ratio_interval(loss, count, loss.copy(), count.copy())) == (1.0, 1.0, 1.0)
    zero = paired_difference_interval([(loss, count)], [(loss.copy(), count.copy())])
    assert tuple(zero) == (0.0, 0.0, 0.0) and not zero.excludes(0.0)


def test_pairing_cancels_text_difficulty():
    """A longer context that lowers every block's loss by 2% is a clear effect only when paired."""
    loss, count = fake_blocks(30)
    longer = loss * 0.98
    ratio = paired_ratio_interval(longer, count, loss, count)
    assert ratio.lo == pytest.approx(0.98) and ratio.hi == pytest.approx(0.98)
    separate = metric_interval(longer, count), metric_interval(loss, count)
    assert separate[0].hi > separate[1].lo  # unpaired intervals overlap: the 2% hides in the text noise
    difference = paired_difference_interval([(longer, count)], [(loss, count)])
    assert difference.excludes(0.0) and difference.hi < 0


def test_paired_difference_averages_over_seed_pairs():
    loss, count = fake_blocks(30)
    runs = [(loss * 1.01, count, loss, count), (loss * 1.03, count, loss, count)]
    baselines = [(loss, count, loss, count)] * 2
    interval = paired_difference_interval(runs, baselines, metric=ratio_to_reference)
    assert interval.estimate == pytest.approx(0.02)


def test_coverage_of_a_known_mean_is_near_95_percent():
    """Blocks drawn from a known distribution: the 95% interval holds the true mean about 95% of the time."""
    true_mean, hits, trials = 2.0, 0, 200
    for trial in range(trials):
        interval = metric_interval(*fake_blocks(40, mean=true_mean, seed=100 + trial), resamples=400, seed=trial)
        hits += interval.lo <= true_mean <= interval.hi
    assert 0.88 <= hits / trials <= 0.99


def test_curves_get_a_band_per_position_and_unscored_positions_are_nan():
    rng = np.random.default_rng(0)
    count = rng.integers(5, 10, (20, 4)).astype(float)  # (blocks, positions)
    count[:, 0] = 0  # a position no block scores (the prompt of a synthetic task)
    loss = count * np.array([1.0, 3.0, 2.0, 1.0]) * rng.uniform(0.8, 1.2, count.shape)
    curve = metric_interval(loss, count)
    assert curve.estimate.shape == curve.lo.shape == curve.hi.shape == (4,)
    assert np.isnan([curve.estimate[0], curve.lo[0], curve.hi[0]]).all()
    assert (curve.lo[1:] < curve.estimate[1:]).all() and (curve.estimate[1:] < curve.hi[1:]).all()
    lo, hi = curve.bounds()
    assert len(lo) == len(hi) == 4


def test_curves_in_memory_slices_equal_one_gather():
    """Summing resamples a slice at a time (bounded memory) gives the same numbers as all at once."""
    import lmzoo.stats.bootstrap as block_bootstrap

    loss, count = fake_blocks(16)
    curve_loss, curve_count = np.stack([loss, 2 * loss], 1), np.stack([count, count], 1)
    whole = metric_interval(curve_loss, curve_count, resamples=50)
    original, block_bootstrap._GATHER_FLOATS = block_bootstrap._GATHER_FLOATS, 40
    try:
        sliced = metric_interval(curve_loss, curve_count, resamples=50)
    finally:
        block_bootstrap._GATHER_FLOATS = original
    np.testing.assert_array_equal(whole, sliced)


def test_zero_count_blocks_leave_the_estimate_alone():
    loss, count = fake_blocks(20)
    padded = metric_interval(np.r_[loss, 0, 0], np.r_[count, 0, 0])
    assert padded.estimate == pytest.approx(loss.sum() / count.sum())
    assert padded.lo < padded.estimate < padded.hi


@pytest.mark.parametrize(
    "loss, count, message",
    [
        ([1.0], [10.0], "at least 2 blocks"),
        ([0.0, 0.0], [0.0, 0.0], "no scored tokens"),
        ([1.0, 1.0], [-1.0, 2.0], "non-negative"),
    ],
)
def test_unusable_blocks_are_clear_errors(loss, count, message):
    with pytest.raises(ValueError, match=message):
        metric_interval(np.array(loss), np.array(count))


def test_paired_arrays_must_cover_the_same_blocks():
    with pytest.raises(ValueError, match="same blocks"):
        bootstrap(lambda a, b: a / b, [np.ones(3), np.ones(4)])


def test_blocks_are_contiguous_fixed_spans():
    np.testing.assert_array_equal(block_starts(10, 3), [0, 3, 6])
    per_token = np.arange(10.0)
    np.testing.assert_array_equal(block_sums(per_token, 3), [0 + 1 + 2, 3 + 4 + 5, 6 + 7 + 8 + 9])
    assert block_sums(np.ones((10, 2)), 5).shape == (5, 2)
    with pytest.raises(ValueError, match="blocks"):
        block_starts(3, 4)


def test_length_intervals_are_the_results_json_keys():
    loss, count = fake_blocks(30)
    train = {"loss": loss, "count": count}
    at_train = length_intervals(train, train, bits_per_nat=2.0)
    assert set(at_train) == {"tokens", "bpb_ci", "ratio", "ratio_ci"}
    assert at_train["tokens"] == count.sum() and at_train["ratio"] == 1.0 and at_train["ratio_ci"] == [1.0, 1.0]
    lo, hi = at_train["bpb_ci"]
    assert lo < 2.0 * loss.sum() / count.sum() < hi
    longer = length_intervals({"loss": loss * 1.1, "count": count, "correct": count / 2}, train, bits_per_nat=2.0)
    assert longer["ratio"] == pytest.approx(1.1) and longer["accuracy_ci"] == pytest.approx([0.5, 0.5])
