"""Entropy-invariant attention: does multiplying the logits by log n / log T keep attention entropy
flat beyond the training length T, and does that help length extrapolation?

Two models train once per seed in ``seeds`` on an equal budget through the normal trainer:
softmax attention with RoPE, and the same with log-n scaling (``+attn=logn``; factor 1 at n = T).
Three conditions are evaluated on the same validation tokens at 1x-8x the training length T: the
plain softmax models, the log-n models, and the plain models with log-n switched on at evaluation
only (clamped at 1, so nothing changes inside the training length).

Measured per condition:
- attention entropy of the row of a query that sees n keys, averaged over layers and heads, on the
  same ``entropy_windows`` windows of 8T tokens; its growth from n in (T/2, T] to n in (4T, 8T];
- the bpb ratio ``bpb@L / bpb@T``, over seeds (``lmzoo.experiments.arms``).

Judged (``judge``; ``lmzoo.experiments.judging``):
- positive control: plain softmax degrades past T, its ratio at 8T above ``degrades`` = 1.05:
  where RoPE does not degrade, log-n has nothing to fix;
- bpb ratio at 8T of the log-n models minus the softmax models' below -``min_effect`` = -0.02
  (separately trained models: undecided with one seed per arm);
- bpb ratio at 8T with log-n switched on at evaluation minus without below -0.02 (the same
  checkpoints, each paired with itself: the interval over the checkpoints' effects, seeds+text, decides it;
  text only with one checkpoint).
The entropy comparisons are reported, not judged: multiplying logits by a factor above 1 lowers
the entropy of any row that is not uniform, so the switched-on condition flattens the growth by
construction (an 8-step untrained model shows it too), and a trained log-n model is that same
scaling during training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import numpy as np

from lmzoo.experiments import Outcome
from lmzoo.experiments.arms import ratio_difference, ratio_estimate, ratio_runs, switch
from lmzoo.experiments.judging import Check, measured
from lmzoo.experiments.runs import (
    as_record, bucket_means, evaluate_run, over_windows, paired_over_windows, row_statistic, train_runs,
)
from lmzoo.scoring.sparsity import attention_entropy
from lmzoo.plots import error_bars, new_axes, save_axes, series_style, spread
from lmzoo.stats.bootstrap import ratio_to_reference

CLAIM = ("Scaling attention logits by log n / log T keeps attention entropy nearly constant as the context "
         "grows past the training length T, and so helps length extrapolation.")
SOURCE = "003"  # the source article whose claim this reruns (docs/seeds.md)
FACTORS = (1, 2, 4, 8)  # evaluation lengths, in training lengths
SWITCH_AT_EVAL = ["attn.logn=true", "attn.logn_clamp=true"]


@dataclass
class Settings:
    steps: int = 600
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])  # one training run per seed and model
    seq_len: int = 128  # the training length T
    eval_tokens: int = 65536  # validation targets scored at every length (the same for every condition)
    entropy_windows: int = 16  # windows of 8T tokens whose attention rows are measured
    min_effect: float = 0.02  # the smallest change of the bpb ratio at 8T a check counts
    degrades: float = 1.05  # the control: plain softmax's ratio at 8T must be above this
    overrides: List[str] = field(default_factory=list)  # more training settings, e.g. ["model.n_layers=2"]


QUICK = {"steps": 8, "seeds": [0], "seq_len": 32, "eval_tokens": 1024, "entropy_windows": 3,
         "overrides": ["train.batch_size=4", "model.n_layers=1", "model.d_model=64", "train.eval_every=8",
                       "train.eval_tokens=512", "train.probe_batch=0"]}


@dataclass
class Condition:
    name: str
    run_dirs: List[Path]  # one per seed
    overrides: List[str]  # evaluation-time switches
    results: List[dict] = None  # one per seed
    entropy: np.ndarray = None  # (every seed's windows, longest length): mean row entropy by query position


def run(settings: Settings, out_dir: Path) -> Outcome:
    lengths = [f * settings.seq_len for f in FACTORS]
    runs = {variant: [out_dir / "runs" / f"{variant}-s{seed}" for seed in settings.seeds]
            for variant in ("softmax", "logn")}
    for variant, run_dirs in runs.items():
        train_runs(variant, dict(zip(settings.seeds, run_dirs)), steps=settings.steps,
                   overrides=[f"data.seq_len={settings.seq_len}", *settings.overrides])
    conditions = [Condition("softmax", runs["softmax"], []), Condition("log-n trained", runs["logn"], []),
                  Condition("log-n at evaluation", runs["softmax"], SWITCH_AT_EVAL)]
    for c in conditions:
        tag = "logn_entropy" + ("_switched" if c.overrides else "")
        c.results = [evaluate_run(d, tag=tag, lengths=lengths, tokens=settings.eval_tokens, overrides=c.overrides)
                     for d in c.run_dirs]
        c.entropy = np.concatenate([row_statistic(d, c.overrides, attention_entropy, length=lengths[-1],
                                                  windows=settings.entropy_windows, tokens=settings.eval_tokens)
                                    for d in c.run_dirs])
    plain, trained, switched = conditions
    edges = [settings.seq_len // 2, *lengths]
    longest = lengths[-1]
    ratio_at_8t = lambda results: ratio_runs(results, longest)  # noqa: E731
    evidence = {
        "checks": {
            f"softmax: bpb ratio at {longest}": ratio_estimate(plain.results, longest),
            f"bpb ratio at {longest}, log-n trained - softmax":
                ratio_difference(trained.results, plain.results, longest),
            f"bpb ratio at {longest}, log-n at evaluation - without":
                switch(ratio_at_8t(switched.results), ratio_at_8t(plain.results), ratio_to_reference),
        },
        "entropy_differences": {  # measured, not judged (see the docstring); the same windows in both conditions
            "entropy growth, log-n trained - softmax": growth_difference(trained.entropy, plain.entropy, edges),
            "entropy growth, log-n at evaluation - without": growth_difference(switched.entropy, plain.entropy, edges),
        },
        "conditions": {c.name: summary(c, edges, lengths) for c in conditions},
    }
    figures = [plot_entropy(conditions, edges, out_dir / "entropy_vs_keys.png"),
               plot_ratios(conditions, lengths, out_dir / "ratio_vs_length.png")]
    return Outcome(evidence, figures, [*runs["softmax"], *runs["logn"]])


def judge(evidence: dict, settings: Settings) -> list[Check]:
    longest = FACTORS[-1] * settings.seq_len
    records = evidence["checks"]
    trained, switched = (f"bpb ratio at {longest}, log-n {which}"
                         for which in ("trained - softmax", "at evaluation - without"))
    return [
        Check(f"softmax: bpb ratio at {longest}", "control: plain RoPE softmax degrades past its training length",
              measured(records[f"softmax: bpb ratio at {longest}"]), "above", settings.degrades, control=True),
        Check(trained, "a model trained with log-n scaling extrapolates better than plain softmax",
              measured(records[trained]), "below", -settings.min_effect, trained_comparison=True),
        Check(switched, "log-n scaling switched on at evaluation helps the same models extrapolate",
              measured(records[switched]), "below", -settings.min_effect),
    ]


def growth(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Mean entropy of the last bucket minus the first, from per-window sums (resampled or not)."""
    means = sums / counts
    return means[..., -1] - means[..., 0]


def abs_growth(sums, counts):
    return np.abs(growth(sums, counts))


def growth_difference(first: np.ndarray, second: np.ndarray, edges: list[int]) -> dict:
    """|growth| of first minus |growth| of second, paired over the same windows, with its 95% interval."""
    return paired_over_windows(bucket_means(first, edges), bucket_means(second, edges), abs_growth)


def summary(c: Condition, edges: list[int], lengths: list[int]) -> dict:
    means = bucket_means(c.entropy, edges)
    per_bucket = over_windows(means)
    return {
        "entropy_by_keys_seen": {"buckets": [f"({lo}, {hi}]" for lo, hi in zip(edges[:-1], edges[1:])],
                                 "mean": np.asarray(per_bucket.estimate).tolist(), "ci": per_bucket.bounds()},
        "entropy_growth": as_record(over_windows(means, growth)),
        "bpb_ratio": {str(n): ratio_estimate(c.results, n) for n in lengths},
    }


def plot_entropy(conditions: list[Condition], edges: list[int], path: Path) -> str:
    fig, ax = new_axes((5.5, 3.8))
    centres = np.array([np.sqrt(lo * hi) for lo, hi in zip(edges[:-1], edges[1:])])
    for index, c in enumerate(conditions):
        band = over_windows(bucket_means(c.entropy, edges))
        error_bars(ax, spread(centres, index, len(conditions)), band.estimate, band.lo, band.hi, label=c.name,
                   **series_style(index))
    ax.set_xscale("log", base=2)
    save_axes(fig, ax, path, train_len=edges[1], xticks=edges, title="attention entropy against keys seen",
              xlabel="keys a query sees (bucket edges)", ylabel="mean row entropy, nats (95% interval over windows)")
    return str(path)


def plot_ratios(conditions: list[Condition], lengths: list[int], path: Path) -> str:
    fig, ax = new_axes((5.5, 3.8))
    for index, c in enumerate(conditions):
        entries = [ratio_estimate(c.results, n) for n in lengths]
        error_bars(ax, spread(lengths, index, len(conditions)), [e["estimate"] for e in entries],
                   [e["lo"] for e in entries], [e["hi"] for e in entries], label=c.name, **series_style(index))
    ax.set_xscale("log", base=2)
    seeds = len(conditions[0].results)
    save_axes(fig, ax, path, train_len=lengths[0], xticks=lengths, xlabel="evaluation length (tokens)",
              title=f"log-n scaling: bpb ratio against length ({seeds} seed{'s' * (seeds > 1)})",
              ylabel="bpb@L / bpb@train (95% interval)")
    return str(path)
