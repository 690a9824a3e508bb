"""lmzoo's ranking against a paper's: tau and its interval over seeds, the exact p-value, and the variants whose
interval misses the printed range."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lmzoo.experiments.paper_agreement import agreement, kendall_tau, pairwise_tau, tau_over_seeds
from lmzoo.experiments.published import Citation, Published

CITATION = Citation("p", "a", "v", "0000.00000", "Table 1", "text", "s")


def column(printed: dict[str, str]) -> dict[str, Published]:
    return {v: Published("y", "s", CITATION, v.title(), v, "c", "accuracy", p, (0.0, 100.0))
            for v, p in printed.items()}


PAPER = column({"softmax": "90.0", "mamba": "70.0", "gla": "50.0", "deltanet": "30.0"})


def test_the_same_ranking_gives_tau_one_and_the_reverse_minus_one():
    same = agreement({"softmax": [91, 89, 90], "mamba": [69, 71, 70], "gla": [50, 51, 49], "deltanet": [30, 29, 31]},
                     PAPER)
    assert same.tau == pytest.approx(1.0) and same.lo == pytest.approx(1.0) and same.hi == pytest.approx(1.0)
    assert same.variants == ["softmax", "mamba", "gla", "deltanet"] and same.outside == []
    assert same.p_value == pytest.approx(stats.kendalltau([1, 2, 3, 4], [1, 2, 3, 4]).pvalue)  # exact: 1/24 each side
    reverse = agreement({"softmax": [30, 31], "mamba": [50, 49], "gla": [70, 71], "deltanet": [90, 91]}, PAPER)
    assert reverse.tau == pytest.approx(-1.0)


def test_noisy_seeds_widen_the_interval_around_the_means_tau():
    rng = np.random.default_rng(1)
    close = {"softmax": 60 + rng.normal(0, 8, 4), "mamba": 58 + rng.normal(0, 8, 4),
             "gla": 56 + rng.normal(0, 8, 4), "deltanet": 54 + rng.normal(0, 8, 4)}
    result = agreement(close, PAPER)
    means = [np.mean(close[v]) for v in result.variants]
    assert result.tau == pytest.approx(stats.kendalltau(means, [90, 70, 50, 30]).statistic)
    assert result.lo <= result.tau <= result.hi and result.hi - result.lo >= 1.0  # seeds this close reorder them


def test_the_interval_is_a_percentile_bootstrap_over_seeds():
    scores = [np.array([1.0, 3.0]), np.array([2.0, 2.5])]
    lo, hi = tau_over_seeds(scores, [2.0, 1.0], resamples=4000, seed=0)
    # each resample's means: variant 1 from {1, 2, 3}, variant 2 from {2, 2.25, 2.5}: tau is +1 or -1 (a tie: NaN)
    assert (lo, hi) == (-1.0, 1.0)
    assert all(math.isnan(x) for x in tau_over_seeds([np.array([1.0]), np.array([2.0, 3.0])], [1.0, 2.0]))


def test_one_seed_leaves_the_interval_and_the_outside_list_undecided():
    result = agreement({"softmax": [10.0], "mamba": [95.0]}, PAPER)
    assert math.isnan(result.lo) and math.isnan(result.hi) and result.tau == pytest.approx(-1.0)
    assert result.outside == [] and result.undecided == ["softmax", "mamba"]
    assert result.record()["lo"] is None  # JSON: no NaN


def test_a_variant_whose_interval_misses_the_printed_range_is_outside_with_its_direction():
    scores = {"softmax": [89.9, 90.1, 90.0], "mamba": [40.0, 41.0, 42.0], "gla": [80.0, 81.0, 82.0]}
    result = agreement(scores, PAPER)
    outside = {o["variant"]: o["lmzoo_is"] for o in result.outside}
    assert outside == {"mamba": "below", "gla": "above"}  # softmax's interval holds 90.0
    assert result.outside[0]["paper"]["printed"] in ("70.0", "50.0")
    assert result.variants == ["softmax", "mamba", "gla"]  # deltanet: not run by lmzoo, left out


def test_a_bound_counts_every_value_beyond_it_as_agreeing():
    paper = column({"softmax": ">99.0", "mamba": "0.0"})
    result = agreement({"softmax": [99.5, 99.7, 99.9], "mamba": [0.0, 0.01, 0.02]}, paper)
    assert result.outside == []
    result = agreement({"softmax": [97.0, 97.5, 98.0], "mamba": [0.0, 0.01, 0.02]}, paper)
    assert [o["variant"] for o in result.outside] == ["softmax"]


def test_lower_is_better_ranks_the_other_way_and_fewer_than_two_shared_variants_is_refused():
    losses = column({"softmax": "1.0", "mamba": "2.0"})
    assert agreement({"softmax": [1.0, 1.1], "mamba": [2.0, 2.1]}, losses, higher_is_better=False).tau == 1.0
    with pytest.raises(ValueError, match="two shared variants"):
        agreement({"softmax": [1.0, 2.0]}, losses)
    assert math.isnan(kendall_tau([1.0, 1.0], [1.0, 2.0]))


def test_the_vectorised_tau_is_scipys_tau_b_ties_included():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 4, size=(50, 6)).astype(float)  # many ties
    theirs = [3.0, 1.0, 1.0, 2.0, 5.0, 0.0]
    expected = [stats.kendalltau(r, theirs).statistic if len(set(r)) > 1 else np.nan for r in rows]
    np.testing.assert_allclose(pairwise_tau(rows, theirs), expected, rtol=1e-12)
