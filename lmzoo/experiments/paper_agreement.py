"""lmzoo's results beside a paper's: does lmzoo rank the shared variants as the paper does, and which variants
land outside what the paper printed?

``agreement(scores, published)`` takes lmzoo's score of each variant, one number per training seed, and a
published column (``lmzoo.experiments.published.column``), and over the variants both hold reports

- **Kendall's tau** (tau-b: ties allowed) between lmzoo's seed means and the published values, with
  - a 95% **interval over seeds**: a bootstrap that redraws each variant's seeds (with replacement, each variant
    on its own), recomputes the means and tau, and takes the 2.5 and 97.5 percentiles. Why this one: the papers
    print one number per variant with no interval, and the variants are the whole set compared, not a sample
    of some population of architectures, so the one noise that can be resampled is lmzoo's training noise (which
    seed). It says how much of lmzoo's ranking is luck of the seeds; it cannot say how the paper's own ranking
    would move on a rerun. With one seed per variant it is undefined (NaN): training noise unknown.
  - the **exact p-value** of tau under no association (``scipy.stats.kendalltau``: exact without ties for few
    variants), which says whether the agreement beats a random ranking of these n variants. With n variants
    tau moves in steps of 4 / (n (n - 1)); with three variants nothing short of tau = 1 has p < 0.35: a small
    shared set cannot show agreement, whatever the models.
- the variants **outside** the paper: lmzoo's 95% interval over seeds (Student's t, ``lmzoo.stats``'s
  ``seed_mean``) and the range the printed cell stands for (its rounding, or a bound such as ">99.0") do not
  meet. Each says whether lmzoo is above or below. With one seed the interval is unknown and the variant is
  listed as undecided, never as outside.

A disagreement is a finding to explain (scale, protocol, implementation), not a failure: docs/yardsticks.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from lmzoo.experiments.judging import Check, Measured
from lmzoo.experiments.published import Published
from lmzoo.stats.trained_models import seed_mean

RESAMPLES = 2000
LEVEL = 0.95


@dataclass
class Agreement:
    variants: list[str]  # the shared variants, in the paper's order (best first)
    tau: float
    lo: float  # NaN: one seed per variant somewhere, training noise unknown
    hi: float
    p_value: float  # exact, under no association
    seeds: dict[str, int]
    interval: str = "bootstrap over each variant's seeds (percentile, 95%)"
    outside: list[dict] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)  # one seed: no interval to hold against the paper

    def record(self) -> dict:
        finite = lambda x: None if x is None or not math.isfinite(x) else float(x)  # noqa: E731
        return {"variants": self.variants, "kendall_tau": finite(self.tau), "lo": finite(self.lo),
                "hi": finite(self.hi), "p_value": finite(self.p_value), "interval": self.interval,
                "seeds": self.seeds, "outside": self.outside, "undecided": self.undecided}


def kendall_tau(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """tau-b between two scorings of the same variants; NaN where either gives every variant one value."""
    if len(set(ours)) < 2 or len(set(theirs)) < 2:
        return math.nan
    return float(stats.kendalltau(ours, theirs).statistic)


def exact_p_value(ours: Sequence[float], theirs: Sequence[float]) -> float:
    if len(set(ours)) < 2 or len(set(theirs)) < 2:
        return math.nan
    ties = len(set(ours)) < len(ours) or len(set(theirs)) < len(theirs)
    return float(stats.kendalltau(ours, theirs, method="asymptotic" if ties else "exact").pvalue)


def pairwise_tau(ours: np.ndarray, theirs: Sequence[float]) -> np.ndarray:
    """tau-b of each row of ``ours`` [R, n] against ``theirs`` [n], vectorised over the rows: (concordant -
    discordant pairs) / sqrt(pairs untied in ours x pairs untied in theirs); NaN for a row with every value tied."""
    i, j = np.triu_indices(len(theirs), k=1)
    theirs = np.asarray(theirs, dtype=np.float64)
    sign_ours, sign_theirs = np.sign(ours[:, i] - ours[:, j]), np.sign(theirs[i] - theirs[j])
    untied = np.count_nonzero(sign_ours, axis=1) * np.count_nonzero(sign_theirs)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sign_ours * sign_theirs).sum(axis=1) / np.sqrt(untied)


def tau_over_seeds(scores: Sequence[np.ndarray], theirs: Sequence[float], *, resamples: int = RESAMPLES,
                   seed: int = 0, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of tau when each variant's seeds are redrawn; NaN with one seed anywhere."""
    if min(len(s) for s in scores) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = np.stack([rng.choice(s, size=(resamples, len(s)), replace=True).mean(axis=1) for s in scores], axis=1)
    taus = pairwise_tau(means, theirs)
    taus = taus[np.isfinite(taus)]  # a draw where every mean tied has no ranking to compare
    if not len(taus):
        return math.nan, math.nan
    alpha = (1 - level) / 2
    return float(np.quantile(taus, alpha)), float(np.quantile(taus, 1 - alpha))


def beside(variant: str, runs: np.ndarray, number: Published) -> dict | None:
    """The variant's record when lmzoo's interval over seeds misses the printed range, else None; raises
    nothing for one seed (the caller lists it as undecided)."""
    estimate = seed_mean(runs)
    low, high = number.range
    if estimate is None or (estimate.hi >= low and estimate.lo <= high):
        return None
    return {"variant": variant, "lmzoo": {"estimate": estimate.estimate, "lo": estimate.lo, "hi": estimate.hi,
                                          "seeds": len(runs)},
            "paper": number.record(), "lmzoo_is": "above" if estimate.lo > high else "below"}


def agreement(scores: Mapping[str, Sequence[float]], published: Mapping[str, Published], *,
              higher_is_better: bool = True, resamples: int = RESAMPLES, seed: int = 0) -> Agreement:
    """lmzoo's ranking of the variants both hold against the paper's (the module's docstring says how)."""
    shared = [v for v in published if v in scores and len(scores[v])]
    if len(shared) < 2:
        raise ValueError(f"a ranking needs two shared variants; lmzoo has {sorted(scores)}, the paper "
                         f"{sorted(published)}")
    sign = 1.0 if higher_is_better else -1.0
    shared.sort(key=lambda v: -sign * published[v].value)
    runs = [np.asarray(scores[v], dtype=np.float64) for v in shared]
    ours, theirs = [float(r.mean()) for r in runs], [published[v].value for v in shared]
    lo, hi = tau_over_seeds(runs, theirs, resamples=resamples, seed=seed)
    outside = [b for v, r in zip(shared, runs) if (b := beside(v, r, published[v])) is not None]
    return Agreement(shared, kendall_tau(ours, theirs), lo, hi, exact_p_value(ours, theirs),
                     {v: len(r) for v, r in zip(shared, runs)}, outside=outside,
                     undecided=[v for v, r in zip(shared, runs) if len(r) < 2])


def tau_checks(record: dict | None, name: str, claim: str) -> list[Check]:
    """The check that lmzoo ranks the shared variants as the paper does: Kendall's tau above zero, with the
    percentile bootstrap over seeds that ``agreement`` recorded (``Agreement.record()``); none without a ranking."""
    if record is None:
        return []
    nan = lambda x: np.nan if x is None else x  # noqa: E731  (a tau undefined on tied ranks is recorded as None)
    tau = Measured(nan(record["kendall_tau"]), nan(record["lo"]), nan(record["hi"]), "seeds",
                   (min(record["seeds"].values()),), df=np.inf)
    return [Check(name, claim, tau, "above", 0.0)]
