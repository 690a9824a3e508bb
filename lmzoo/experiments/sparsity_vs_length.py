"""How attention sparsity S = E|a| / sqrt(E a²) of a row changes with the number of keys n it sees,
in trained models.

Each variant trains on an equal budget through the normal trainer; its effective attention rows
(softmax probabilities; normalised feature-map products; decayed products; Mamba's hidden
attention) are measured on the same validation windows of 4x the training length. Per window, the
mean S of the rows whose query sees n keys, in octaves n in (2^k, 2^(k+1)], gives a curve; its
exponent alpha is the least-squares slope of log S against log n over the octaves from n > 8 on
(S ∝ n^alpha: 0 for rows that stay as spread as they are, -1/2 for rows that keep one key).

The source article predicts from closed forms that softmax attention can keep getting sparser as n
grows, that linear attention with a fixed feature map tends to a floor, and that decayed
recurrences get sparser only by forgetting. Each variant trains once per seed in ``seeds``;
intervals count training noise and the windows (``lmzoo.experiments.arms``). Judged by:
- positive control: softmax rows attend, their mean S over queries seeing (T/2, T] keys below
  ``attends`` = 0.9 (uniform rows have S = 1; an untrained model's rows are nearly uniform, and
  nothing about how sparsity grows could be seen in them);
- softmax: alpha below -``min_exponent`` = -0.05 (S falls at least 3.4% per doubling of n);
- each linear variant: alpha - softmax's alpha above ``min_exponent`` (flatter than softmax by
  that much); separately trained models, so with one seed per arm it stays undecided.
FoX, window attention, NSA, DSA, stick-breaking and PaTH are measured and reported beside them, not judged.
The decayed variants' exponents are reported, not judged: alpha < 0 holds for any row whose
weight sits on a bounded span of recent keys (S ~ n^(-1/2) once n exceeds the span), whatever
the model learned, so it cannot tell forgetting from choosing; a test shows it.
Each check passes, fails or stays undecided as ``lmzoo.experiments.judging`` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import numpy as np

from lmzoo.experiments import Outcome
from lmzoo.experiments.arms import column, curve_metric, difference, estimate, window_run
from lmzoo.experiments.judging import Check, measured
from lmzoo.experiments.runs import bucket_means, over_windows, row_statistic, train_runs
from lmzoo.scoring.sparsity import l1_l2_sparsity
from lmzoo.plots import error_bars, new_axes, save_axes, series_style, spread
from lmzoo.schema import one_of

CLAIM = ("Softmax attention rows can keep getting sparser as the context grows, linear attention's tend to a floor, "
         "and decayed recurrences get sparser only by forgetting.")
SOURCE = "001"  # the source article whose claim this reruns (docs/seeds.md)
# name: (what the article predicts for it, +attn variant, training overrides)
VARIANTS = {
    "softmax": ("softmax", "softmax", []),
    "linear elu+1": ("linear", "linear", []),
    "linear identity": ("linear", "linear", ["attn.feature_map=identity", "attn.normalize=false"]),
    "retnet": ("decayed", "retnet", []),
    "gla": ("decayed", "gla", []),
    "mamba": ("decayed", "mamba", []),
    # Softmax's refinements and rivals, measured beside it and not judged: the article's closed forms say
    # nothing about them.
    "fox": ("reported", "fox", []),
    "swa": ("reported", "swa", []),
    "nsa": ("reported", "nsa", []),
    "dsa": ("reported", "dsa", []),
    "stickbreaking": ("reported", "stickbreaking", []),
    "path": ("reported", "path", []),
    "gated_softmax": ("reported", "gated_softmax", []),
    "log_linear_mamba2": ("reported", "log_linear_mamba2", []),
}


@dataclass
class Settings:
    variants: List[str] = field(default_factory=lambda: list(VARIANTS))
    steps: int = 600
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])  # one training run per seed and variant
    seq_len: int = 128  # the training length T; rows are measured up to n = 4T
    eval_tokens: int = 65536  # validation targets the windows are cut from
    windows: int = 16
    min_exponent: float = 0.05  # the smallest exponent (or difference of exponents) a check counts
    attends: float = 0.9  # the control: softmax rows' S near the training length must be below this
    overrides: List[str] = field(default_factory=list)  # more training settings


QUICK = {"steps": 8, "seeds": [0], "seq_len": 32, "eval_tokens": 1024, "windows": 3,
         "variants": ["softmax", "linear elu+1", "gla"],
         "overrides": ["train.batch_size=4", "model.n_layers=1", "model.d_model=64", "train.eval_every=8",
                       "train.eval_tokens=512", "train.probe_batch=0"]}


def octaves(longest: int) -> list[int]:
    """Bucket edges 8, 16, ..., longest: the octaves the exponent is fitted over."""
    return [2**k for k in range(3, int(np.log2(longest)) + 1)]


def exponent(sums: np.ndarray, counts: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Least-squares slope of log S against log n over the last axis (the octaves)."""
    x = np.log(centres) - np.log(centres).mean()
    y = np.log(sums / counts)
    return (y - y.mean(axis=-1, keepdims=True)) @ x / (x @ x)


def run(settings: Settings, out_dir: Path) -> Outcome:
    for name in settings.variants:
        one_of("variants", name, list(VARIANTS))
    longest = 4 * settings.seq_len
    edges = octaves(longest)
    centres = np.sqrt(np.array(edges[:-1]) * np.array(edges[1:]))
    alpha = curve_metric(lambda sums, counts: exponent(sums, counts, centres))
    per_seed, runs = {}, []  # per_seed[name]: (windows, octaves) per seed
    for name in settings.variants:
        _, variant, extra = VARIANTS[name]
        per_seed[name] = []
        run_dirs = {seed: out_dir / "runs" / f"{name.replace(' ', '_')}-s{seed}" for seed in settings.seeds}
        train_runs(variant, run_dirs, steps=settings.steps,
                   overrides=[f"data.seq_len={settings.seq_len}", *extra, *settings.overrides])
        for run_dir in run_dirs.values():
            rows = row_statistic(run_dir, [], l1_l2_sparsity, length=longest, windows=settings.windows,
                                 tokens=settings.eval_tokens)
            per_seed[name].append(bucket_means(rows, edges))
            runs.append(run_dir)
    arms = {name: [window_run(values) for values in seeds] for name, seeds in per_seed.items()}
    kinds = {name: VARIANTS[name][0] for name in settings.variants}
    checks = {}
    for name, kind in kinds.items():
        if kind == "linear" and "softmax" in arms:
            checks[f"{name}: alpha - softmax's alpha"] = difference(arms[name], arms["softmax"], alpha)
        if kind == "softmax":
            checks[f"{name}: alpha"] = estimate(arms[name], alpha)
            near_t = edges.index(settings.seq_len) - 1  # the octave (T/2, T]
            checks[f"{name}: S at {octave_names(edges)[near_t]} keys"] = estimate(arms[name], column(near_t))
    pooled = {name: np.concatenate(seeds) for name, seeds in per_seed.items()}  # every seed's windows, for the figure
    evidence = {"checks": checks,
                "curves": {name: {"octaves": octave_names(edges), **as_curve(over_windows(c))}
                          for name, c in pooled.items()},
                "exponents": {name: estimate(arm, alpha) for name, arm in arms.items()}}
    figure = plot(pooled, edges, settings.seq_len, len(settings.seeds), out_dir / "sparsity_vs_keys.png")
    return Outcome(evidence, [figure], runs)


def octave_names(edges: list[int]) -> list[str]:
    return [f"({lo}, {hi}]" for lo, hi in zip(edges[:-1], edges[1:])]


def judge(evidence: dict, settings: Settings) -> list[Check]:
    records = evidence["checks"]
    kinds = {name: VARIANTS[name][0] for name in settings.variants}
    checks = [attends_check(records, evidence["curves"]["softmax"], settings)] if "softmax" in kinds else []
    if "softmax: alpha" in records:
        checks.append(Check("softmax: alpha", "softmax rows keep getting sparser as they see more keys",
                            measured(records["softmax: alpha"], uncertainty="windows"), "below",
                            -settings.min_exponent))
    for name, kind in kinds.items():
        key = f"{name}: alpha - softmax's alpha"
        if kind == "linear" and key in records:
            checks.append(Check(key, f"{name}'s rows tend to a floor: their S falls more slowly with n than softmax's",
                                measured(records[key], uncertainty="windows"), "above", settings.min_exponent,
                                trained_comparison=True))
    return checks


def attends_check(records: dict, curve: dict, settings: Settings) -> Check:
    """The control: the mean S of softmax rows seeing (T/2, T] keys: its estimate over seeds where the run
    recorded one, else from the curve (every window of the one seed)."""
    k = curve["octaves"].index(f"({settings.seq_len // 2}, {settings.seq_len}]")
    name = f"softmax: S at {curve['octaves'][k]} keys"
    lo, hi = curve["ci"]
    value = measured(records.get(name) or {"value": curve["mean"][k], "ci": [lo[k], hi[k]]}, uncertainty="windows")
    return Check(name, "control: the trained softmax rows attend (uniform rows have S = 1)",
                 value, "below", settings.attends, control=True)


def as_curve(interval) -> dict:
    return {"mean": np.asarray(interval.estimate).tolist(), "ci": interval.bounds()}


def plot(curves: dict, edges: list[int], train_len: int, seeds: int, path: Path) -> str:
    centres = np.sqrt(np.array(edges[:-1]) * np.array(edges[1:]))
    fig, ax = new_axes((7, 4))
    for index, (name, values) in enumerate(curves.items()):
        band = over_windows(values)
        error_bars(ax, spread(centres, index, len(curves)), band.estimate, band.lo, band.hi, label=name,
                   **series_style(index))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    save_axes(fig, ax, path, train_len=train_len, xticks=edges,
              title=f"attention row sparsity against keys seen ({seeds} seed{'s' * (seeds > 1)} per variant)",
              xlabel="keys a query sees (octave centre)", ylabel="mean row S (95% interval over windows)")
    return str(path)
