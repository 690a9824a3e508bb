"""How often an interval between arms calls two copies of one experiment different: the A/A simulation.

Synthetic evaluations with a known truth stand in for trained runs, so the false-positive rate of
``lmzoo.stats.trained_models.arm_difference`` can be counted over many replicates (a real A/A pair of runs
is one replicate). Each replicate draws one validation text and two arms of ``seeds`` runs each::

    loss sum of run i on document b = tokens_b * (mean + text_b + seed_i + own_ib)

- ``tokens_b``: documents of uneven length (log-normal), as in a real validation split;
- ``text_b ~ N(0, text_sd)``: how hard document b is, the same for every run;
- ``seed_i ~ N(0, seed_sd)``: run i's training noise, a shift of its whole loss;
- ``own_ib ~ N(0, own_sd * sqrt(mean tokens / tokens_b))``: how run i in particular copes with
  document b (per token; smaller on longer documents).

An arm B may be shifted by ``shift`` nats (a real difference, to count how often it is found).
``family_rejection_rate`` draws ten arms equal to one baseline on one text and counts how often Holm's
adjustment still leaves a star: the family-wise rate ``lmzoo.compare`` promises for many arms.
``DEFAULT`` mirrors the default model trained for 150 steps on the stdlib corpus: a per-run shift of 0.024 nats
between seeds, a single run's text interval of about ±0.08 bits per byte and a paired one of about ±0.01.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from scipy import stats

from lmzoo.stats.trained_models import Comparison, arm_difference, paired_by_seed_difference, text_only_difference
from lmzoo.stats.uncertainty import adjusted_p_values


@dataclass(frozen=True)
class Scenario:
    seeds: int = 3  # runs per arm
    documents: int = 40
    mean_tokens: float = 800.0
    mean: float = 1.36  # nats per token
    text_sd: float = 0.2
    seed_sd: float = 0.024
    own_sd: float = 0.016
    shift: float = 0.0  # arm B minus arm A, nats per token
    seeds_b: int | None = None  # runs of arm B where the arms differ in size (None: ``seeds``)
    interaction_sd: float = 0.0  # how arm B as a whole copes with each document, beyond arm A (mean 0 over documents)
    shared_seed_sd: float = 0.0  # the part of a run's shift its seed number gives every arm (the data order)

    def draw(self, rng: np.random.Generator) -> tuple[list, list]:
        """Arm A's ``seeds`` runs and arm B's ``seeds_b``, each run ``(loss sums [documents], token counts
        [documents])``."""
        text = self.draw_text(rng)
        return self.draw_arm(rng, text, self.seeds, 0.0), self.draw_arm(rng, text, self.seeds_b or self.seeds)

    def draw_text(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One validation text and seed numbers: (tokens per document, each document's difficulty, the shift each
        seed number gives a run of any arm)."""
        tokens = np.maximum(1, np.round(rng.lognormal(np.log(self.mean_tokens) - 0.5, 1.0, self.documents)))
        difficulty = rng.normal(0, self.text_sd, self.documents)
        seeds = max(self.seeds, self.seeds_b or 0)
        shared = rng.normal(0, self.shared_seed_sd, seeds) if self.shared_seed_sd else np.zeros(seeds)
        return tokens, difficulty, shared

    def draw_arm(self, rng: np.random.Generator, text: tuple, runs: int, shift: float | None = None) -> list:
        """``runs`` runs of one arm on ``text``, ``shift`` nats worse than arm A (``self.shift`` when None; an arm B
        also draws its own reaction to each document, ``interaction_sd``)."""
        tokens, difficulty, shared = text
        own_scale = self.own_sd * np.sqrt(tokens.mean() / tokens)
        if shift is None:
            shift = self.shift + rng.normal(0, self.interaction_sd, self.documents) * np.sqrt(tokens.mean() / tokens)

        def run(seed_number):
            seed_shift = rng.normal(0, self.seed_sd) + shared[seed_number]  # before the documents' own noise
            per_token = self.mean + shift + difficulty + seed_shift + rng.normal(0, 1, self.documents) * own_scale
            return tokens * per_token, tokens

        return [run(i) for i in range(runs)]


DEFAULT = Scenario()
# Training noise small beside how differently each run copes with each document: the text term dominates.
TEXT_HEAVY = Scenario(seed_sd=0.002, own_sd=0.03)
# Arm B copes with some documents better and others worse than arm A, by as much on average (no difference over
# all documents), with little training noise: the shared text term carries the interval, on few effective documents.
INTERACTION = Scenario(seed_sd=0.002, own_sd=0.005, interaction_sd=0.05)
UNEQUAL = Scenario(seeds=2, seeds_b=5)  # arms of 2 and 5 seeds
# A seed number shares the data order across arms: 16.5% of the variance between seeds (as across the frontier arms)
# comes with the seed number, the rest is each run's own. For the paired-by-seed analysis.
SHARED_SEEDS = Scenario(seed_sd=0.024 * np.sqrt(0.835), shared_seed_sd=0.024 * np.sqrt(0.165))
REGIMES = {"3 seeds": DEFAULT, "5 seeds": replace(DEFAULT, seeds=5), "2 vs 5 seeds": UNEQUAL,
           "5 vs 2 seeds": replace(DEFAULT, seeds=5, seeds_b=2), "2 vs 2 seeds": replace(DEFAULT, seeds=2),
           "text-dominated": TEXT_HEAVY, "document interaction": INTERACTION, "seeds shared across arms": SHARED_SEEDS}
# Ten arms equal to one baseline, stars adjusted by Holm's method: the family-wise rate of at least one star.
# ``seeds``: the baseline's runs, ``seeds_b``: each arm's.
FAMILY_ARMS = 10
FAMILIES = {"10 arms, 3 vs 3 seeds": DEFAULT, "10 arms of 2 seeds vs 5": replace(DEFAULT, seeds=5, seeds_b=2),
            "10 arms of 5 seeds vs 2": UNEQUAL,
            "10 arms, 2 vs 2 seeds": replace(DEFAULT, seeds=2),
            "10 arms, document interaction": INTERACTION}

Method = Callable[[list, list], Comparison]


def seeds_and_text(runs: list, baselines: list, resamples: int) -> Comparison:
    return arm_difference(baselines, runs, resamples=resamples)


def paired_by_seed(runs: list, baselines: list, resamples: int) -> Comparison:
    """Runs of one seed number paired across the arms (``compare pair=seed``)."""
    return paired_by_seed_difference(baselines, runs, resamples=resamples)


def text_only(runs: list, baselines: list, resamples: int) -> Comparison:
    """The interval of text alone (runs paired seed by seed, blocks resampled): blind to training noise."""
    comparison = text_only_difference(baselines, runs, lambda n, c: n / c, (len(runs), len(baselines)),
                            resamples=resamples, seed=0)
    return replace(comparison, uncertainty="seeds+text")  # judged as if it were a full interval: what it claims


def rejection_rate(scenario: Scenario, method: Callable = seeds_and_text, *, replicates: int = 1000,
                   resamples: int = 200, seed: int = 0) -> float:
    """The share of replicates whose interval of B - A excludes zero (``significant``)."""
    rng = np.random.default_rng(seed)
    found = sum(method(*scenario.draw(rng), resamples).significant for _ in range(replicates))
    return found / replicates


def family_rejection_rate(scenario: Scenario, *, arms: int = FAMILY_ARMS, replicates: int = 400,
                          adjust: str = "holm", seed: int = 0) -> float:
    """The share of replicates in which at least one of ``arms`` arms, all equal to the baseline, gets a star once
    the arms' p-values are adjusted together (``adjust``): the family-wise error rate ``compare`` promises."""
    return family_rejection_rates(scenario, arms=arms, replicates=replicates, adjusts=(adjust,), seed=seed)[adjust]


def family_rejection_rates(scenario: Scenario, *, arms: int = FAMILY_ARMS, replicates: int = 400,
                           adjusts: tuple[str, ...] = ("holm", "none"), seed: int = 0) -> dict[str, float]:
    """``family_rejection_rate`` for each of ``adjusts``, on the same replicates."""
    rng = np.random.default_rng(seed)
    found = dict.fromkeys(adjusts, 0)
    for _ in range(replicates):
        text = scenario.draw_text(rng)
        baseline = scenario.draw_arm(rng, text, scenario.seeds, 0.0)
        comparisons = [arm_difference(scenario.draw_arm(rng, text, scenario.seeds_b or scenario.seeds), baseline)
                       for _ in range(arms)]
        for adjust in adjusts:
            adjusted = adjusted_p_values([c.p_value for c in comparisons], adjust)
            found[adjust] += any(c.counts_training_noise and p < 1 - c.level for c, p in zip(comparisons, adjusted))
    return {adjust: count / replicates for adjust, count in found.items()}


def clopper_pearson(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a rate: never narrower than its coverage needs, even near 0."""
    tail = (1 - level) / 2
    lo = stats.beta.ppf(tail, successes, trials - successes + 1) if successes > 0 else 0.0
    hi = stats.beta.ppf(1 - tail, successes + 1, trials - successes) if successes < trials else 1.0
    return float(lo), float(hi)


def wilson(successes: float, trials: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a rate: the Monte Carlo uncertainty of a simulated rejection rate."""
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials**2)) / (1 + z * z / trials)
    return float(centre - half), float(centre + half)
