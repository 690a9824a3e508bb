"""Intervals between trained models that count both sources of uncertainty: seeds and text.

An *arm* is the runs of one configuration, one per training seed. Every run of every arm scored
the same blocks of validation text (``lmzoo.stats.bootstrap``), so each run gives block sums
``[B]`` on the same blocks, and a metric of them (mean loss, bits per byte, a ratio of lengths).
Two things would change a measured difference between arms if the experiment were repeated:

- **training noise**: other seeds give other models. Seen in the spread of the per-run metric
  inside each arm, and nowhere else: no resampling of text can show it;
- **text**: other validation text gives other numbers. Seen by resampling the blocks, with the same
  draws for every run, since all runs scored the same tokens.

The method (the reasons, and its calibration, are in docs/measuring.md, "Comparing trained models").
With ``m_i`` the metric of run ``i`` on all the scored text and arms A (``n_A`` runs) and B:

- estimate ``d = mean_A m - mean_B m`` (seeds are not paired across arms: arm sizes may differ);
- seed term ``s_A^2 / n_A + s_B^2 / n_B`` with ``s^2`` the sample variance of ``m_i`` in an arm;
- text term: over block resamples ``r``, ``Var_r(d_r)`` minus the part the seed term already holds.
  Each run reacts to the drawn text in its own way too; that part of ``Var_r(d_r)`` is
  ``sum over arms of v_a / n_a``, with ``v_a`` the resampled spread of an arm's runs around the arm's
  mean (``sum_i Var_r(m_ir - mean_a m_r) / (n_a - 1)``), and the seed term has counted it already
  (a run's own reaction to this text is part of its ``m_i``). What is left is the text's effect
  shared by all runs of an arm: the only text effect a seed term cannot see. Floored at zero.
- ``se = sqrt(seed term + text term)``; the interval is ``d ± t * se`` with Student's ``t`` at the
  Welch–Satterthwaite degrees of freedom of both terms: each arm's seed variance has ``n_a - 1``, and
  the text term as many as its blocks carry evenly (``text_degrees_of_freedom``: a few documents
  that carry most of the variance give few, not ``B``). With three seeds per arm that is
  ``t ≈ 2.8``, not 1.96: a percentile bootstrap over three seeds would be far too narrow; where
  seed noise is small, the text term's own degrees of freedom keep ``t`` above the normal 1.96.
  The interval records its degrees of freedom (``df``), so widening it for several checks at once
  or adjusting for several arms uses the t distribution it came from.

With one seed in an arm its training noise cannot be estimated: the interval is the text-only
percentile bootstrap, ``uncertainty`` says ``"text"``, and the difference is never called
significant, however narrow its interval.

``over_seeds`` is the plain mean ± sample sd of one number over an arm's runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np
from scipy import stats

from lmzoo.stats.bootstrap import LEVEL, RESAMPLES, SEED, bootstrap, draws, ratio_of_sums, resampled_sums
from lmzoo.stats.uncertainty import SEEDS, SEEDS_AND_TEXT, TEXT, Estimate

Run = Sequence[np.ndarray]  # block-sum arrays [B] of one run, the arguments of a metric (e.g. (loss, count))
Comparison = Estimate  # an arm's estimate or a difference between arms: its ``seeds`` and ``uncertainty`` say which


class SeedSummary(NamedTuple):
    """Mean and sample standard deviation of one number over the runs of a group (seeds)."""

    mean: float
    sd: float  # NaN for a single run: one seed says nothing about the spread between seeds
    n: int


def run_values(runs: Sequence[Run], metric: Callable, drawn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(metric of each run on all blocks ``[n]``, on each resample's drawn blocks ``[n, resamples]``)."""
    full, resampled = [], []
    with np.errstate(invalid="ignore", divide="ignore"):
        for arrays in runs:
            arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
            full.append(metric(*[a.sum(keepdims=True) for a in arrays])[0])
            resampled.append(metric(*[resampled_sums(a, drawn) for a in arrays]))
    return np.asarray(full), np.asarray(resampled)


def shared_text_variance(arms: Sequence[np.ndarray], signs: Sequence[float]) -> float:
    """The text term: variance over resamples of ``sum(sign * arm mean)``, less each run's own reaction to the
    drawn text (which the seed term holds already); ``arms`` are ``[n, resamples]`` resampled run values."""
    combined = sum(sign * values.mean(axis=0) for sign, values in zip(signs, arms))
    own = sum(((values - values.mean(axis=0)).var(axis=1, ddof=1).sum() / (len(values) - 1)) / len(values)
              for values in arms if len(values) > 1)
    return max(0.0, float(np.var(combined, ddof=1)) - own)


def text_degrees_of_freedom(arms: Sequence[Sequence[Run]], signs: Sequence[float], metric: Callable) -> float:
    """How many degrees of freedom the text term's variance rests on: ``2 B / (kurtosis - 1)`` of the blocks'
    influence on ``sum(sign * arm mean)`` (leaving each block out in turn), at most ``B - 1``.

    Evenly spread influence gives about ``B``; a few documents carrying most of it give few, as a variance
    estimated from that many documents should (the method of moments of Satterthwaite's approximation)."""
    left_out = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        for sign, runs in zip(signs, arms):
            per_run = [metric(*[a.sum() - a for a in (np.asarray(x, np.float64) for x in run)]) for run in runs]
            left_out = left_out + sign * np.mean(per_run, axis=0)
    influence = np.asarray(left_out, np.float64)
    influence = influence[np.isfinite(influence)] - np.nanmean(influence)
    blocks = len(influence)
    second = float(np.sum(influence**2))
    if blocks < 3 or second <= 0:
        return np.inf
    kurtosis = blocks * float(np.sum(influence**4)) / second**2
    return float(min(blocks - 1, 2 * blocks / max(kurtosis - 1, 1e-12)))


def t_interval(estimate: float, seed_parts: Sequence[tuple[float, int]], text_variance: float, level: float,
               text_df: float = np.inf) -> tuple[float, float, float]:
    """``(estimate - t * se, estimate + t * se, df)``; ``seed_parts`` are (s^2 / n, n) per arm, the text term has
    ``text_df`` degrees of freedom (infinite: taken as known); ``df`` is Welch-Satterthwaite's over all terms."""
    seed_variance = sum(v for v, _ in seed_parts)
    se = np.sqrt(seed_variance + text_variance)
    spread = sum(v**2 / (n - 1) for v, n in seed_parts) + (text_variance**2 / text_df if np.isfinite(text_df) else 0.0)
    df = (seed_variance + text_variance) ** 2 / spread if spread > 0 else np.inf
    t = stats.t.ppf(0.5 + level / 2, df) if np.isfinite(df) else stats.norm.ppf(0.5 + level / 2)
    return float(estimate - t * se), float(estimate + t * se), float(df)


def welch_interval(estimate: float, seed_parts: Sequence[tuple[float, int]], text_variance: float,
                   level: float) -> tuple[float, float]:
    """``estimate ± t * se`` with the text term taken as known (``t_interval`` without its degrees of freedom)."""
    return t_interval(estimate, seed_parts, text_variance, level)[:2]


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
    drawn = draws(len(np.asarray(runs[0][0])), resamples, seed)
    (full_a, values_a), (full_b, values_b) = run_values(runs, metric, drawn), run_values(baselines, metric, drawn)
    estimate = float(full_a.mean() - full_b.mean())
    text = shared_text_variance([values_a, values_b], [1.0, -1.0])
    text_df = text_degrees_of_freedom([runs, baselines], [1.0, -1.0], metric)
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
    drawn = draws(len(np.asarray(runs[0][0])), resamples, seed)
    full, values = run_values(runs, metric, drawn)
    text = shared_text_variance([values], [1.0])
    text_df = text_degrees_of_freedom([runs], [1.0], metric)
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
    if len(with_switch) < 2:
        return text_only_difference(with_switch, without, metric, (1,), **bootstrap_args).scaled(scale)
    width = len(with_switch[0])
    paired = [(*a, *b) for a, b in zip(with_switch, without)]
    effect = lambda *arrays: metric(*arrays[:width]) - metric(*arrays[width:])  # noqa: E731
    return arm_estimate(paired, effect, scale=scale, **bootstrap_args)


def over_seeds(values: Sequence[float | None]) -> SeedSummary:
    """Mean ± sample sd over the runs of a group; runs without the value are left out of ``n``."""
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    if not len(present):
        return SeedSummary(float("nan"), float("nan"), 0)
    sd = float(present.std(ddof=1)) if len(present) > 1 else float("nan")
    return SeedSummary(float(present.mean()), sd, len(present))
