"""Entropy-invariant attention: does multiplying the logits by log n / log T keep attention entropy
flat beyond the training length T, and does that help length extrapolation?

Two models train on an equal budget through the normal trainer: softmax attention with RoPE, and
the same with log-n scaling (``+attn=logn``; factor 1 at n = T). Three conditions are evaluated on
the same validation tokens at 1x-8x the training length: the plain softmax model, the log-n model,
and the plain model with log-n switched on at evaluation only (clamped at 1, so nothing changes
inside the training length).

Measured per condition:
- attention entropy of the row of a query that sees n keys, averaged over layers and heads, on the
  same ``entropy_windows`` windows of 8T tokens; its growth from n in (T/2, T] to n in (4T, 8T],
  with a bootstrap interval over windows;
- the bpb ratio ``bpb@L / bpb@T`` with its paired interval (``lmzoo.eval``).

Judged, as fixed before running, by four paired comparisons (the same windows or token blocks in
both conditions), each counting when its 95% interval lies below zero:
1. |entropy growth| of the log-n model minus that of softmax;
2. |entropy growth| with log-n at evaluation minus that without;
3. bpb ratio at 8T of the log-n model minus softmax's;
4. bpb ratio at 8T with log-n at evaluation minus without.
All four: reproduced; two or three: partly; fewer: not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import numpy as np

from lmzoo.experiments import Outcome, vote
from lmzoo.experiments.runs import (as_record, bucket_means, evaluate_run, over_windows, paired_over_windows,
                                    ratio_difference, row_statistic, train_run)
from lmzoo.metrics.sparsity import attention_entropy
from lmzoo.plots import error_bars, new_axes, save_axes

CLAIM = ("Scaling attention logits by log n / log T keeps attention entropy nearly constant as the context "
         "grows past the training length T, and so helps length extrapolation.")
SEED = "003"
FACTORS = (1, 2, 4, 8)  # evaluation lengths, in training lengths
SWITCH_AT_EVAL = ["attn.logn=true", "attn.logn_clamp=true"]


@dataclass
class Settings:
    steps: int = 600
    seed: int = 0
    seq_len: int = 128  # the training length T
    eval_tokens: int = 65536  # validation targets scored at every length (the same for every condition)
    entropy_windows: int = 16  # windows of 8T tokens whose attention rows are measured
    overrides: List[str] = field(default_factory=list)  # more training settings, e.g. ["model.n_layers=2"]


QUICK = {"steps": 8, "seq_len": 32, "eval_tokens": 1024, "entropy_windows": 3,
         "overrides": ["train.batch_size=4", "model.n_layers=1", "model.d_model=64", "train.eval_every=8",
                       "train.eval_tokens=512", "train.probe_batch=0"]}


@dataclass
class Condition:
    name: str
    run_dir: Path
    overrides: List[str]  # evaluation-time switches
    results: dict = None
    entropy: np.ndarray = None  # (windows, longest length): mean row entropy by query position


def run(settings: Settings, out_dir: Path) -> Outcome:
    lengths = [f * settings.seq_len for f in FACTORS]
    runs = {}
    for variant in ("softmax", "logn"):
        runs[variant] = out_dir / "runs" / variant
        train_run(variant, runs[variant], seed=settings.seed, steps=settings.steps,
                  overrides=[f"data.seq_len={settings.seq_len}", *settings.overrides])
    conditions = [Condition("softmax", runs["softmax"], []), Condition("log-n trained", runs["logn"], []),
                  Condition("log-n at evaluation", runs["softmax"], SWITCH_AT_EVAL)]
    for c in conditions:
        tag = "logn_entropy" + ("_switched" if c.overrides else "")
        c.results = evaluate_run(c.run_dir, tag=tag, lengths=lengths, tokens=settings.eval_tokens, overrides=c.overrides)
        c.entropy = row_statistic(c.run_dir, c.overrides, attention_entropy, length=lengths[-1],
                                  windows=settings.entropy_windows, tokens=settings.eval_tokens)
    plain, trained, switched = conditions
    edges = [settings.seq_len // 2, *lengths]
    longest = lengths[-1]
    checks = {
        "entropy growth, log-n trained - softmax": growth_difference(trained.entropy, plain.entropy, edges),
        "entropy growth, log-n at evaluation - without": growth_difference(switched.entropy, plain.entropy, edges),
        f"bpb ratio at {longest}, log-n trained - softmax": ratio_difference(trained.results, plain.results, longest),
        f"bpb ratio at {longest}, log-n at evaluation - without": ratio_difference(switched.results, plain.results, longest),
    }
    holds = [check["ci"][1] < 0 for check in checks.values()]
    evidence = {"paired_differences": checks, "holds": dict(zip(checks, holds)),
                "conditions": {c.name: summary(c, edges, lengths) for c in conditions}}
    figures = [plot_entropy(conditions, edges, out_dir / "entropy_vs_keys.png"),
               plot_ratios(conditions, lengths, out_dir / "ratio_vs_length.png")]
    return Outcome(vote(sum(holds), len(holds)), evidence, figures, [runs["softmax"], runs["logn"]])


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
        "bpb_ratio": {str(n): {"value": c.results["lengths"][str(n)]["ratio"],
                               "ci": c.results["lengths"][str(n)]["ratio_ci"]} for n in lengths},
    }


def plot_entropy(conditions: list[Condition], edges: list[int], path: Path) -> str:
    fig, ax = new_axes((5.5, 3.8))
    centres = [np.sqrt(lo * hi) for lo, hi in zip(edges[:-1], edges[1:])]
    for c in conditions:
        band = over_windows(bucket_means(c.entropy, edges))
        error_bars(ax, centres, band.estimate, band.lo, band.hi, marker="o", label=c.name)
    ax.set_xscale("log")
    save_axes(fig, ax, path, train_len=edges[1], title="attention entropy against context",
              xlabel="keys a query sees (bucket centre)", ylabel="mean row entropy, nats (95% interval)")
    return str(path)


def plot_ratios(conditions: list[Condition], lengths: list[int], path: Path) -> str:
    fig, ax = new_axes((5.5, 3.8))
    for c in conditions:
        entries = [c.results["lengths"][str(n)] for n in lengths]
        lo, hi = zip(*(e["ratio_ci"] for e in entries))
        error_bars(ax, lengths, [e["ratio"] for e in entries], lo, hi, marker="o", label=c.name)
    ax.set_xscale("log", base=2)
    save_axes(fig, ax, path, train_len=lengths[0], title="length extrapolation", xticks=lengths, xlabel="evaluation length (tokens)",
              ylabel="bpb@L / bpb@train (95% interval)")
    return str(path)
