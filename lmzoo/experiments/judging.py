"""How an experiment's evidence becomes a verdict: named checks with effect sizes, positive controls,
and an outcome that can say "we could not tell".

A ``Check`` is one measured quantity with its 95% interval, the effect size it must clear (a
bound on one side, never only a sign) and whether it is a *positive control*: a condition that
must hold for the experiment to be able to see the claim at all (the baseline learned the task,
the reference degrades past its training length). Each check comes out

- passed: the whole interval lies beyond the bound;
- failed: the whole interval lies on the other side of it;
- undecided (``None``): the interval straddles the bound, the bound is measured from the data and the
  evidence predates that measurement (``bound`` None), or the check compares separately
  trained models with one seed in an arm, whose training noise cannot be estimated (a text-only
  interval, never significant, ``lmzoo.stats.trained_models``).

Several claim checks are several chances to pass by luck, so before the vote each claim check's
interval is widened to a family-wise 95% over the m claim checks (``familywise``: Bonferroni, each
at level 1 - 0.05/m). Only the 95% interval is recorded by the measurement, so the widening scales
each side of it about the estimate by t(1 - 0.025/m) / t(0.975), Student's quantiles at the
interval's own degrees of freedom (``Estimate.widened``): exact for the t intervals over seeds. An
interval recorded without its degrees of freedom (before rules version 4) is widened at the fewest
its seeds allow (``min(seeds) - 1``: never narrower than the exact rerun); a bootstrap interval over
many blocks, draws or heads at the normal quantiles. Controls keep their 95% intervals (a control
must hold on its own).

The outcome (``outcome``): any control not passed: *inconclusive*, whatever the other checks
say. Otherwise, over the other checks (the vote; controls do not count): all passed, *reproduced*;
at least half passed, *partly*; more than half failed, *not reproduced*; else *inconclusive*
(too many undecided to say either). No checks at all: *inconclusive*.

``RULES_VERSION`` names these rules in every verdict.json, so a verdict judged under older rules
can be told apart (and re-judged from its evidence, ``lmzoo.experiments.rejudge``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmzoo.stats.uncertainty import LEVEL, Estimate

RULES_VERSION = 4
OUTCOMES = ("reproduced", "partly", "not reproduced", "inconclusive")
SMOKE = "smoke run"  # the verdict word of a quick run: it never reads as a full run's outcome
TRAINING_NOISE_UNKNOWN = "1 seed: text only"
UNMEASURED_BOUND = "its bound was not measured when the evidence was recorded"


Measured = Estimate  # a check's value: ``lmzoo.stats.uncertainty``, the record compare and the seeds statistics use


def measured(record: dict, *, uncertainty: str = "text", seeds=(1,)) -> Measured:
    """A record as the experiments write it: ``lmzoo.stats.trained_models``' (estimate, lo, hi, seeds, uncertainty, df),
    or the older ``{"value", "ci"}`` of one seed with an interval over the text only."""
    return Estimate.from_record(record, uncertainty=uncertainty, seeds=seeds)


@dataclass(frozen=True)
class Check:
    name: str
    tests: str  # what it tests, in one sentence
    value: Measured
    side: str  # "above" or "below": where the interval must lie
    bound: float | None  # the effect size it must clear; None: a bound the evidence predates (undecided)
    control: bool = False
    trained_comparison: bool = False  # compares separately trained models: needs two seeds per arm

    @property
    def passed(self) -> bool | None:
        if self.bound is None or (self.trained_comparison and min(self.value.seeds) < 2):
            return None
        lo, hi = self.value.lo, self.value.hi
        beyond, short = ((lo > self.bound, hi < self.bound) if self.side == "above"
                         else (hi < self.bound, lo > self.bound))
        return True if beyond else False if short else None

    @property
    def why_undecided(self) -> str | None:
        if self.passed is not None:
            return None
        if self.bound is None:
            return UNMEASURED_BOUND
        if self.trained_comparison and min(self.value.seeds) < 2:
            return TRAINING_NOISE_UNKNOWN
        return f"the interval straddles {self.bound:g}"

    @property
    def must(self) -> str:
        bound = "an unmeasured bound" if self.bound is None else f"{self.bound:g}"
        return f"{'>' if self.side == 'above' else '<'} {bound}"

    def record(self) -> dict:
        value = {k: v for k, v in self.value.record().items() if k != "significant"}  # passed says what counts
        return {"name": self.name, "tests": self.tests, "control": self.control, **value,
                "must": self.must, "trained_comparison": self.trained_comparison, "passed": self.passed,
                "undecided": self.why_undecided}


def familywise(checks: list[Check]) -> list[Check]:
    """The checks with every claim check's interval at a family-wise 95% over the claim checks (Bonferroni)."""
    m = sum(not c.control for c in checks)
    if m <= 1:
        return list(checks)
    level = 1 - (1 - LEVEL) / m
    return [c if c.control else replace(c, value=c.value.widened(level)) for c in checks]


def outcome(checks: list[Check]) -> tuple[str, str]:
    """(outcome, the reason in one line) under the rules above."""
    unmet = [c.name for c in checks if c.control and c.passed is not True]
    if unmet:
        return "inconclusive", f"positive control not passed: {'; '.join(unmet)}"
    claims = [c for c in checks if not c.control]
    passed = sum(c.passed is True for c in claims)
    failed = sum(c.passed is False for c in claims)
    counts = f"{passed} of {len(claims)} checks passed, {failed} failed, {len(claims) - passed - failed} undecided"
    if not claims:
        return "inconclusive", "no check of the claim"
    if passed == len(claims):
        return "reproduced", counts
    if 2 * passed >= len(claims):
        return "partly", counts
    if 2 * failed > len(claims):
        return "not reproduced", counts
    return "inconclusive", counts
