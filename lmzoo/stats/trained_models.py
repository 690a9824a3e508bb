"""Intervals between trained models that count both sources of uncertainty: seeds and text.

An *arm* is the runs of one configuration, one per training seed. Every run of every arm scored
the same blocks of validation text (``lmzoo.stats.bootstrap``), so each run gives block sums
``[B]`` on the same blocks, and a metric of them (mean loss, bits per byte, a ratio of lengths).
Two things would change a measured difference between arms if the experiment were repeated:

- **training noise**: other seeds give other models. Seen in the spread of the per-run metric
  inside each arm, and nowhere else: no resampling of text can show it;
- **text**: other validation text gives other numbers. Seen by leaving out one block at a time, the
  same block for every run, since all runs scored the same tokens.

The method (the reasons, and its calibration, are in docs/measuring.md, "Comparing trained models").
With ``m_i`` the metric of run ``i`` on all the scored text and arms A (``n_A`` runs) and B:

- estimate ``d = mean_A m - mean_B m`` (seeds are not paired across arms: arm sizes may differ);
- seed term ``s_A^2 / n_A + s_B^2 / n_B`` with ``s^2`` the sample variance of ``m_i`` in an arm;
- text term: the jackknife variance over blocks of ``d`` (each block left out in turn, ``jackknife_variance``),
  minus the part the seed term already holds. Each run reacts to the text in its own way too; that part is
  ``sum over arms of v_a / n_a``, with ``v_a`` the jackknife variance of an arm's runs around the arm's mean
  (``sum_i V(m_i - mean_a m) / (n_a - 1)``), and the seed term has counted it already (a run's own reaction to
  this text is part of its ``m_i``). What is left is the text's effect shared by all runs of an arm: the only
  text effect a seed term cannot see. Floored at zero. The jackknife, not the plug-in bootstrap's variance over
  resamples: on blocks of uneven size (documents) the bootstrap's runs low by about
  ``1 - 2 sum w^3 / sum w^2 + sum w^2`` (``w`` the blocks' shares of the scored tokens), the jackknife's does not.
- ``se = sqrt(seed term + text term)``; the interval is ``d ± t * se`` with Student's ``t`` at the
  Satterthwaite degrees of freedom of both terms: each arm's seed variance has ``n_a - 1`` (Welch), and
  the text term as many as its blocks carry evenly (``text_degrees_of_freedom``: a few documents
  that carry most of the variance give few, not ``B``; one with two blocks). With three seeds per arm that is
  ``t ≈ 2.8``, not 1.96: a percentile bootstrap over three seeds would be far too narrow; where
  seed noise is small, the text term's own degrees of freedom keep ``t`` above the normal 1.96.
  With an arm of fewer than three seeds (``FEWEST_SEEDS_FOR_WELCH``) the seed term as a whole gets the
  smaller arm's ``n - 1``: Welch's count, estimated from an arm of two, is too many whenever its two seeds
  came out close, and the stars over many arms would not hold their rate.
  The interval records its degrees of freedom (``df``), so widening it for several checks at once
  or adjusting for several arms uses the t distribution it came from.

With one seed in an arm its training noise cannot be estimated: the interval is the text-only
percentile bootstrap, ``uncertainty`` says ``"text"``, and the difference is never called
significant, however narrow its interval.

A seed sets the training data's order as well as the initial weights, so runs of one seed number in two arms
share something: ``paired_by_seed_difference`` pairs them (``compare pair=seed``), the interval over the pairs'
differences with ``n - 1`` degrees of freedom (one with two pairs, whatever the text term). ``arm_difference``
treats the arms as independent, which overstates the variance of a difference where runs of one seed number are
alike: cautious, not wrong.

``over_seeds`` is the plain mean ± sample sd of one number over an arm's runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np
from scipy import stats

from lmzoo.stats.bootstrap import LEVEL, RESAMPLES, SEED, bootstrap, ratio_of_sums
from lmzoo.stats.uncertainty import SEEDS, SEEDS_AND_TEXT, TEXT, Estimate

Run = Sequence[np.ndarray]  # block-sum arrays [B] of one run, the arguments of a metric (e.g. (loss, count))
Comparison = Estimate  # an arm's estimate or a difference between arms: its ``seeds`` and ``uncertainty`` say which


class SeedSummary(NamedTuple):
    """Mean and sample standard deviation of one number over the runs of a group (seeds)."""

    mean: float
    sd: float  # NaN for a single run: one seed says nothing about the spread between seeds
    n: int


def run_values(runs: Sequence[Run], metric: Callable) -> tuple[np.ndarray, np.ndarray]:
    """(metric of each run on all blocks ``[n]``, on all blocks but one, each left out in turn ``[n, B]``)."""
    full, left_out = [], []
    with np.errstate(invalid="ignore", divide="ignore"):
        for arrays in runs:
            arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
            full.append(metric(*[a.sum(keepdims=True) for a in arrays])[0])
            left_out.append(metric(*[a.sum() - a for a in arrays]))
    return np.asarray(full), np.asarray(left_out, dtype=np.float64)


def jackknife_variance(left_out: np.ndarray) -> np.ndarray:
    """The jackknife's variance of a statistic from its values with each block left out in turn (last axis):
    ``(B - 1) / B * sum_b (v_b - mean v)^2``. Unlike the plug-in bootstrap's variance, which a weighted mean of
    ``B`` blocks of shares ``w`` underestimates by the factor ``1 - 2 sum w^3 / sum w^2 + sum w^2`` ((B - 1) / B
    for equal blocks; 0.95 on the stdlib split's 42 documents), it has no such bias for a weighted mean (a ratio
    of sums), whatever the blocks' sizes, to first order."""
    blocks = left_out.shape[-1]
    centred = left_out - left_out.mean(axis=-1, keepdims=True)
    return (blocks - 1) / blocks * np.sum(centred**2, axis=-1)


def scored_blocks(arms: Sequence[np.ndarray]) -> np.ndarray:
    """The blocks whose leaving out leaves every run's metric defined (a block that is all the scored text is not)."""
    return np.all([np.isfinite(values).all(axis=0) for values in arms], axis=0)


def shared_text_variance(arms: Sequence[np.ndarray], signs: Sequence[float]) -> float:
    """The text term: the jackknife variance over blocks of ``sum(sign * arm mean)``, less each run's own reaction
    to the text (which the seed term holds already); ``arms`` are ``[n, B]`` leave-one-block-out run values."""
    kept = scored_blocks(arms)
    arms = [values[:, kept] for values in arms]
    combined = sum(sign * values.mean(axis=0) for sign, values in zip(signs, arms))
    own = sum(jackknife_variance(values - values.mean(axis=0)).sum() / (len(values) - 1) / len(values)
              for values in arms if len(values) > 1)
    return max(0.0, float(jackknife_variance(combined)) - float(own))


def influence_degrees_of_freedom(influence: np.ndarray) -> float:
    """``2 B / (kurtosis - 1)`` of the blocks' influence, at most ``B - 1`` (1 with two blocks); infinite where no
    block has any (the term is then zero and its degrees of freedom do not matter)."""
    influence = influence - influence.mean()
    blocks, second = len(influence), float(np.sum(influence**2))
    if blocks < 2 or second <= 0:
        return np.inf
    kurtosis = blocks * float(np.sum(influence**4)) / second**2
    return float(min(blocks - 1, 2 * blocks / max(kurtosis - 1, 1e-12)))


def text_degrees_of_freedom(arms: Sequence[Sequence[Run]], signs: Sequence[float], metric: Callable) -> float:
    """How many degrees of freedom the text term's variance rests on: ``2 B / (kurtosis - 1)`` of the blocks'
    influence on ``sum(sign * arm mean)`` (leaving each block out in turn), at most ``B - 1``.

    Evenly spread influence gives about ``B``; a few documents carrying most of it give few, as a variance
    estimated from that many documents should (the method of moments of Satterthwaite's approximation)."""
    left_out = [run_values(runs, metric)[1] for runs in arms]
    kept = scored_blocks(left_out)
    return influence_degrees_of_freedom(sum(sign * values[:, kept].mean(axis=0)
                                            for sign, values in zip(signs, left_out)))


# Welch-Satterthwaite's degrees of freedom come from the arms' own variances: with an arm of two seeds (one degree
# of freedom) they are too many whenever that arm's variance came out small by chance, which at Holm's levels
# (0.5% for ten arms) doubles the tail. Below this many seeds in an arm the seed term gets the fewest degrees of
# freedom any of its arms has (Hsu's bound: valid whatever the arms' variances, at some cost in power).
FEWEST_SEEDS_FOR_WELCH = 3


def seed_spread(seed_parts: Sequence[tuple[float, int]]) -> float:
    """The seed term's part of Satterthwaite's denominator: ``sum v^2 / (n - 1)`` over the arms (Welch), or with an
    arm below ``FEWEST_SEEDS_FOR_WELCH`` seeds, ``(sum v)^2 / (min n - 1)``."""
    fewest = min(n for _, n in seed_parts)
    if len(seed_parts) > 1 and fewest < FEWEST_SEEDS_FOR_WELCH:
        return sum(v for v, _ in seed_parts) ** 2 / (fewest - 1)
    return sum(v**2 / (n - 1) for v, n in seed_parts)


def t_interval(estimate: float, seed_parts: Sequence[tuple[float, int]], text_variance: float, level: float,
               text_df: float = np.inf) -> tuple[float, float, float]:
    """``(estimate - t * se, estimate + t * se, df)``; ``seed_parts`` are (s^2 / n, n) per arm, the text term has
    ``text_df`` degrees of freedom (infinite: taken as known); ``df`` is Satterthwaite's over all terms, the seed
    term's as ``seed_spread`` counts it."""
    seed_variance = sum(v for v, _ in seed_parts)
    se = np.sqrt(seed_variance + text_variance)
    spread = seed_spread(seed_parts) + (text_variance**2 / text_df if np.isfinite(text_df) else 0.0)
    df = (seed_variance + text_variance) ** 2 / spread if spread > 0 else np.inf
    t = stats.t.ppf(0.5 + level / 2, df) if np.isfinite(df) else stats.norm.ppf(0.5 + level / 2)
    return float(estimate - t * se), float(estimate + t * se), float(df)


def welch_interval(estimate: float, seed_parts: Sequence[tuple[float, int]], text_variance: float,
                   level: float) -> tuple[float, float]:
    """``estimate ± t * se`` with the text term taken as known (``t_interval`` without its degrees of freedom)."""
    return t_interval(estimate, seed_parts, text_variance, level)[:2]


def text_term(arms: Sequence[np.ndarray], signs: Sequence[float]) -> tuple[float, float]:
    """(the text term's variance, its degrees of freedom) from the arms' leave-one-block-out run values."""
    kept = scored_blocks(arms)
    combined = sum(sign * values[:, kept].mean(axis=0) for sign, values in zip(signs, arms))
    return shared_text_variance(arms, signs), influence_degrees_of_freedom(combined)


def _check_arms(*arms: Sequence[Run]) -> None:
    if any(not arm for arm in arms):
        raise ValueError("every arm needs at least one evaluated run")
    n_blocks = {len(np.asarray(run[0])) for arm in arms for run in arm}
    if len(n_blocks) > 1:
        raise ValueError(f"runs scored different blocks ({sorted(n_blocks)} blocks): they are not on the same text")


def arm_difference(
    runs: Sequence[Run],
    baselines: Sequence[Run],
    metric: Callable[..., np.ndarray] = ratio_of_sums,
    *,
    scale: float = 1.0,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Comparison:
    """``scale * (mean over runs of metric - mean over baselines of metric)`` with its interval.

    ``runs`` and ``baselines`` hold one entry per seed, each the block-sum arrays ``metric`` takes, all on
    the same blocks. Both arms need two runs or more for a ``seeds+text`` interval; otherwise it is the
    text-only bootstrap, never significant.
    """
    _check_arms(runs, baselines)
    seeds = (len(runs), len(baselines))
    if min(seeds) < 2:
        return text_only_difference(runs, baselines, metric, seeds, resamples=resamples, seed=seed,
                                    level=level).scaled(scale)
    (full_a, values_a), (full_b, values_b) = run_values(runs, metric), run_values(baselines, metric)
    estimate = float(full_a.mean() - full_b.mean())
    text, text_df = text_term([values_a, values_b], [1.0, -1.0])
    seed_parts = [(float(full.var(ddof=1)) / len(full), len(full)) for full in (full_a, full_b)]
    lo, hi, df = t_interval(estimate, seed_parts, text, level, text_df)
    return Estimate(estimate, lo, hi, SEEDS_AND_TEXT, seeds, level, df).scaled(scale)


def arm_estimate(
    runs: Sequence[Run],
    metric: Callable[..., np.ndarray] = ratio_of_sums,
    *,
    scale: float = 1.0,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Comparison:
    """``scale *`` the mean over one arm's runs of ``metric``, with its interval (seeds+text from two runs)."""
    _check_arms(runs)
    if len(runs) < 2:
        interval = bootstrap(metric, list(runs[0]), resamples=resamples, seed=seed, level=level)
        return replace(interval, seeds=(1,), level=level).scaled(scale)
    full, values = run_values(runs, metric)
    text, text_df = text_term([values], [1.0])
    seed_part = (float(full.var(ddof=1)) / len(full), len(full))
    lo, hi, df = t_interval(float(full.mean()), [seed_part], text, level, text_df)
    return Estimate(float(full.mean()), lo, hi, SEEDS_AND_TEXT, (len(runs),), level, df).scaled(scale)


def seed_difference(values: Sequence[float], baselines: Sequence[float], *, level: float = LEVEL) -> Comparison | None:
    """Mean of ``values`` minus mean of ``baselines`` (one number per run), Welch's interval over the seeds alone.

    For a statistic every run measures on the same fixed text without block sums behind it (the attention
    probes' sparsity and entropy): the text's part of the uncertainty is not counted, and the interval says so
    (``uncertainty="seeds"``). None where an arm has fewer than two runs: its training noise is unknown."""
    a, b = (np.asarray([v for v in arm if v is not None], dtype=np.float64) for arm in (values, baselines))
    if min(len(a), len(b)) < 2:
        return None
    estimate = float(a.mean() - b.mean())
    lo, hi, df = t_interval(estimate, [(float(x.var(ddof=1)) / len(x), len(x)) for x in (a, b)], 0.0, level)
    return Estimate(estimate, lo, hi, SEEDS, (len(a), len(b)), level, df)


def seed_mean(values: Sequence[float], *, level: float = LEVEL) -> Comparison | None:
    """Mean of ``values`` (one number per run of an arm) with Student's interval over the seeds alone.

    The single-arm counterpart of ``seed_difference``, for the same kind of statistic; None with fewer than two
    runs."""
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if len(a) < 2:
        return None
    lo, hi, df = t_interval(float(a.mean()), [(float(a.var(ddof=1)) / len(a), len(a))], 0.0, level)
    return Estimate(float(a.mean()), lo, hi, SEEDS, (len(a),), level, df)


def text_only_difference(runs, baselines, metric, seeds, **bootstrap_args) -> Comparison:
    """Mean over runs minus mean over baselines, every run resampled with the same block draws."""
    width = len(runs[0])
    flat = [array for run in (*runs, *baselines) for array in run]

    def statistic(*sums):
        values = [metric(*sums[i : i + width]) for i in range(0, len(sums), width)]
        return np.mean(values[: len(runs)], axis=0) - np.mean(values[len(runs) :], axis=0)

    return replace(bootstrap(statistic, flat, **bootstrap_args), seeds=seeds, uncertainty=TEXT)


def switch_difference(with_switch: Sequence[Run], without: Sequence[Run], metric: Callable = ratio_of_sums, *,
                      scale: float = 1.0, **bootstrap_args) -> Comparison:
    """An evaluation-time switch on the same checkpoints (a position override, a longer length): the mean over
    checkpoints of each one's paired difference. The switch's effect on each checkpoint is the unit: with two
    checkpoints or more (one per seed) the interval counts how much that effect differs between checkpoints and
    the text (``seeds+text``, as ``arm_estimate`` of the per-checkpoint differences), so it speaks for models
    trained this way, not only for these; with one checkpoint, the text only."""
    if len(with_switch) != len(without):
        raise ValueError(f"a switch pairs each checkpoint with itself: got {len(with_switch)} and {len(without)} runs")
    return pair_effects(with_switch, without, metric, (len(with_switch),), scale=scale, **bootstrap_args)


def paired_by_seed_difference(runs: Sequence[Run], baselines: Sequence[Run], metric: Callable = ratio_of_sums, *,
                              scale: float = 1.0, **bootstrap_args) -> Comparison:
    """Mean over pairs of ``metric(runs[i]) - metric(baselines[i])``, each pair two arms' runs of one seed number.

    A seed sets both the initial weights and the order of the training data, so runs of one seed number in two arms
    share that order: pairing them takes what they share out of the difference. The seed term is the spread of
    the pairs' differences (``n - 1`` degrees of freedom over ``n`` pairs), the text term the jackknife of the
    mean paired difference less each pair's own reaction to the text (``arm_estimate`` of the per-pair
    differences); with one pair, the text only (never significant)."""
    if len(runs) != len(baselines):
        raise ValueError(f"pairing by seed needs as many runs in each arm: got {len(runs)} and {len(baselines)}")
    return pair_effects(runs, baselines, metric, (len(runs), len(baselines)), scale=scale, **bootstrap_args)


def pair_effects(runs: Sequence[Run], others: Sequence[Run], metric: Callable, seeds: tuple[int, ...], *,
                 scale: float = 1.0, **bootstrap_args) -> Comparison:
    """The mean over pairs ``(runs[i], others[i])`` of each pair's difference in ``metric``, with ``arm_estimate``'s
    interval of the differences (text only for one pair), recorded with ``seeds``."""
    _check_arms(runs, others)
    if len(runs) < 2:
        return text_only_difference(runs, others, metric, seeds, **bootstrap_args).scaled(scale)
    width = len(runs[0])
    paired = [(*a, *b) for a, b in zip(runs, others)]
    effect = lambda *arrays: metric(*arrays[:width]) - metric(*arrays[width:])  # noqa: E731
    estimate = replace(arm_estimate(paired, effect, scale=scale, **bootstrap_args), seeds=seeds)
    if len(runs) < FEWEST_SEEDS_FOR_WELCH:  # one degree of freedom in the pairs' spread: the text term must not add
        return at_degrees_of_freedom(estimate, len(runs) - 1)  # to it when that spread came out small by chance
    return estimate


def at_degrees_of_freedom(estimate: Comparison, df: float) -> Comparison:
    """The same standard error at ``df`` degrees of freedom, where fewer than the interval has (else unchanged)."""
    if estimate.degrees_of_freedom <= df:
        return estimate
    se = (estimate.hi - estimate.lo) / (2 * estimate.quantile(estimate.level))
    fewer = replace(estimate, df=float(df))
    half = se * fewer.quantile(estimate.level)
    return replace(fewer, lo=estimate.estimate - half, hi=estimate.estimate + half)


def over_seeds(values: Sequence[float | None]) -> SeedSummary:
    """Mean ± sample sd over the runs of a group; runs without the value are left out of ``n``."""
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    if not len(present):
        return SeedSummary(float("nan"), float("nan"), 0)
    sd = float(present.std(ddof=1)) if len(present) > 1 else float("nan")
    return SeedSummary(float(present.mean()), sd, len(present))
