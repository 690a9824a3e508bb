"""One record for every estimate with its interval: evaluation metrics, arm comparisons and experiment checks.

An ``Estimate`` is a number (or a curve) with its interval, what the interval covers (``uncertainty``),
the runs behind it per arm (``seeds``), its coverage (``level``) and, for a Student-t interval, its degrees of
freedom (``df``). The bootstrap over text gives one (``lmzoo.stats.bootstrap``), so do the intervals between
trained arms (``lmzoo.stats.trained_models``) and the experiments' checks (``lmzoo.experiments.judging``).

What an interval covers decides what it may claim: only an interval that counts training noise
(``seeds`` or ``seeds+...``) can make a difference between separately trained models *significant*; a
text-only interval never does, however narrow. ``widened`` and ``p_value`` use the Student-t distribution at
the interval's own degrees of freedom; where they were not recorded (records written before they were), an
interval over seeds uses the fewest Welch's method can give, ``min(seeds) - 1`` (the widest: never narrower than
the exact rerun), and any other interval (a bootstrap over many blocks, draws or heads) the normal one.

``record()`` is plain JSON; ``Estimate.from_record`` reads it back, and the older ``{"value", "ci"}`` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

LEVEL = 0.95
SEEDS_AND_TEXT = "seeds+text"  # separately trained models: training noise from the seeds, text from the blocks
SEEDS = "seeds"  # a per-run statistic on text every run shares, not resampled (e.g. a probe's): seeds alone
TEXT = "text"  # which tokens were scored: enough for a switch on one checkpoint, never for trained models


@dataclass(frozen=True)
class Estimate:
    """An estimate with its interval, what the interval covers, the runs per arm behind it and its coverage.

    Reads as the sequence ``(estimate, lo, hi)`` (unpacking, indexing, ``np.array``). Scalars, or arrays of one
    shape for curves (a bootstrap band)."""

    estimate: float | np.ndarray
    lo: float | np.ndarray
    hi: float | np.ndarray
    uncertainty: str = TEXT  # SEEDS_AND_TEXT, SEEDS, TEXT, or what else was resampled ("draws", "heads", "windows")
    seeds: tuple[int, ...] = (1,)  # runs per arm: (n,) for one arm, (n_runs, n_baselines) for a difference
    level: float = LEVEL  # the interval's coverage: 0.95, or 1 - 0.05/m once widened over m checks
    df: float | None = None  # a t interval's degrees of freedom (inf: normal); None: not recorded

    def __iter__(self):
        return iter((self.estimate, self.lo, self.hi))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index):
        return (self.estimate, self.lo, self.hi)[index]

    def bounds(self) -> list:
        """``[lo, hi]`` as plain floats (or ``[[lo...], [hi...]]`` for curves), ready for JSON."""
        return [np.asarray(self.lo).tolist(), np.asarray(self.hi).tolist()]

    def excludes(self, value: float = 0.0) -> bool:
        """True when ``value`` lies outside a scalar interval; never for an undefined (NaN) interval."""
        return bool(self.lo > value or self.hi < value)

    @property
    def counts_training_noise(self) -> bool:
        return self.uncertainty.split("+")[0] == SEEDS

    @property
    def significant(self) -> bool:
        """The interval excludes zero and counts training noise: never for a text-only interval."""
        return self.counts_training_noise and self.excludes(0.0)

    @property
    def note(self) -> str:
        """What the interval covers, in the words a table shows beside it."""
        if self.counts_training_noise or self.uncertainty != TEXT:
            return self.uncertainty
        return "1 seed: text only" if min(self.seeds) == 1 else "text only"

    @property
    def degrees_of_freedom(self) -> float:
        """``df``, or where it was not recorded the fewest an interval over seeds can have (see the module doc)."""
        if self.df is not None:
            return float(self.df)
        return float(max(1, min(self.seeds) - 1)) if self.counts_training_noise else np.inf

    def quantile(self, level: float) -> float:
        """The two-sided ``level`` quantile of the interval's t (normal at infinite degrees of freedom)."""
        df = self.degrees_of_freedom
        return float(stats.t.ppf(0.5 + level / 2, df) if np.isfinite(df) else stats.norm.ppf(0.5 + level / 2))

    def widened(self, level: float) -> Estimate:
        """The interval at ``level``: each side scaled about the estimate by the ratio of the t quantiles at the
        interval's own degrees of freedom (exact for a t interval; for a percentile bootstrap, the normal one)."""
        factor = self.quantile(level) / self.quantile(self.level)
        return replace(self, lo=self.estimate - factor * (self.estimate - self.lo),
                       hi=self.estimate + factor * (self.hi - self.estimate), level=level)

    @property
    def p_value(self) -> float:
        """The two-sided p-value of zero difference implied by the interval (half-width = t x se); 1.0 for an
        interval that cannot be significant (text only), so it never counts in an adjustment."""
        if not self.counts_training_noise:
            return 1.0
        se = (self.hi - self.lo) / (2 * self.quantile(self.level))
        if not se > 0:
            return 0.0 if self.estimate != 0 else 1.0
        df = self.degrees_of_freedom
        z = abs(self.estimate) / se
        return float(2 * (stats.t.sf(z, df) if np.isfinite(df) else stats.norm.sf(z)))

    def scaled(self, factor: float) -> Estimate:
        lo, hi = np.minimum(self.lo * factor, self.hi * factor), np.maximum(self.lo * factor, self.hi * factor)
        plain = (lambda x: float(x)) if np.ndim(lo) == 0 else np.asarray  # noqa: E731
        return replace(self, estimate=self.estimate * factor, lo=plain(lo), hi=plain(hi))

    def negated(self) -> Estimate:
        """The estimate of the opposite difference (B - A from A - B)."""
        return self.scaled(-1.0)

    def record(self) -> dict:
        """Plain JSON: ``estimate``, ``lo``, ``hi``, ``seeds``, ``uncertainty``, ``significant``, ``level``, and
        ``df`` where known (``null`` for a normal interval)."""
        record = {"estimate": float(self.estimate), "lo": float(self.lo), "hi": float(self.hi),
                  "seeds": list(self.seeds), "uncertainty": self.uncertainty, "significant": self.significant,
                  "level": self.level}
        if self.df is not None:
            record["df"] = float(self.df) if np.isfinite(self.df) else None
        return record

    @classmethod
    def from_record(cls, record: dict, *, uncertainty: str = TEXT, seeds=(1,)) -> Estimate:
        """A record as ``record()`` writes it (older ones without ``level`` or ``df`` too), or the older
        ``{"value", "ci"}`` of one seed with an interval over the text only."""
        if "estimate" not in record:
            lo, hi = record["ci"]
            return cls(record["value"], lo, hi, uncertainty, tuple(seeds))
        df = None if "df" not in record else np.inf if record["df"] is None else record["df"]
        return cls(record["estimate"], record["lo"], record["hi"], record.get("uncertainty", uncertainty),
                   tuple(record.get("seeds", seeds)), record.get("level", LEVEL), df)


ADJUSTMENTS = ("holm", "none")  # how the stars of several arms' differences to one baseline are adjusted


def adjusted_p_values(p_values: list[float], method: str = "holm") -> list[float]:
    """The p-values adjusted for testing them together: Holm's step-down (family-wise error at most the level,
    whichever of them are true), or ``none``. Holm: sorted ascending, the i-th (from 0) is scaled by ``m - i``,
    made non-decreasing, capped at 1."""
    if method not in ADJUSTMENTS:
        raise ValueError(f"adjust={method!r} is not valid (choose from: {', '.join(ADJUSTMENTS)})")
    if method == "none":
        return list(p_values)
    order = np.argsort(p_values, kind="stable")
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted
