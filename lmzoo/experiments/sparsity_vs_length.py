"""How attention sparsity S = E|a| / sqrt(E a²) of a row changes with the number of keys n it sees,
in trained models.

Each variant trains on an equal budget through the normal trainer; its effective attention rows
(softmax probabilities; normalised feature-map products; decayed products; Mamba's hidden
attention) are measured on the same validation windows of 4x the training length. Per window, the
mean S of the rows whose query sees n keys, in octaves n in (2^k, 2^(k+1)], gives a curve; its
exponent alpha is the least-squares slope of log S against log n over the octaves from n > 8 on
(S ∝ n^alpha: 0 for rows that stay as spread as they are, -1/2 for rows that keep one key).

The seed article predicts from closed forms that softmax attention can keep getting sparser as n
grows, that linear attention with a fixed feature map tends to a floor, and that decayed
recurrences get sparser only by forgetting. Judged, as fixed before running, by these checks,
each holding when its 95% interval (bootstrap over windows; paired where two variants are
compared on the same windows) lies on the stated side of zero:
- softmax: alpha < 0;
- each linear variant: alpha - softmax's alpha > 0 (flatter than softmax);
- each decayed variant: alpha < 0.
All hold: reproduced; at least half: partly; fewer: not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import numpy as np

from lmzoo.experiments import Outcome, vote
from lmzoo.experiments.runs import as_record, bucket_means, over_windows, paired_over_windows, row_statistic, train_run
from lmzoo.metrics.sparsity import l1_l2_sparsity
from lmzoo.plots import error_bars, new_axes, save_axes
from lmzoo.schema import one_of

CLAIM = ("Softmax attention rows can keep getting sparser as the context grows, linear attention's tend to a floor, "
         "and decayed recurrences get sparser only by forgetting.")
SEED = "001"
# name: (what the article predicts for it, +attn variant, training overrides)
VARIANTS = {
    "softmax": ("softmax", "softmax", []),
    "linear elu+1": ("linear", "linear", []),
    "linear identity": ("linear", "linear", ["attn.feature_map=identity", "attn.normalize=false"]),
    "retnet": ("decayed", "retnet", []),
    "gla": ("decayed", "gla", []),
    "mamba": ("decayed", "mamba", []),
}


@dataclass
class Settings:
    variants: List[str] = field(default_factory=lambda: list(VARIANTS))
    steps: int = 600
    seed: int = 0
    seq_len: int = 128  # the training length T; rows are measured up to n = 4T
    eval_tokens: int = 65536  # validation targets the windows are cut from
    windows: int = 16
    overrides: List[str] = field(default_factory=list)  # more training settings


QUICK = {"steps": 8, "seq_len": 32, "eval_tokens": 1024, "windows": 3, "variants": ["softmax", "linear elu+1", "gla"],
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
    kinds = {name: VARIANTS[name][0] for name in settings.variants}
    longest = 4 * settings.seq_len
    edges = octaves(longest)
    centres = np.sqrt(np.array(edges[:-1]) * np.array(edges[1:]))
    fit = lambda sums, counts: exponent(sums, counts, centres)  # noqa: E731
    curves, runs = {}, []
    for name in settings.variants:
        _, variant, extra = VARIANTS[name]
        run_dir = out_dir / "runs" / name.replace(" ", "_")
        train_run(variant, run_dir, seed=settings.seed, steps=settings.steps,
                  overrides=[f"data.seq_len={settings.seq_len}", *extra, *settings.overrides])
        rows = row_statistic(run_dir, [], l1_l2_sparsity, length=longest, windows=settings.windows,
                             tokens=settings.eval_tokens)
        curves[name] = bucket_means(rows, edges)
        runs.append(run_dir)
    checks = {}
    softmax = [n for n, k in kinds.items() if k == "softmax"]
    for name, kind in kinds.items():
        if kind == "linear":
            for reference in softmax:
                checks[f"{name}: alpha - {reference}'s alpha"] = (paired_over_windows(curves[name], curves[reference], fit), "above")
        else:
            checks[f"{name}: alpha"] = (as_record(over_windows(curves[name], fit)), "below")
    holds = {name: record["ci"][0] > 0 if side == "above" else record["ci"][1] < 0 for name, (record, side) in checks.items()}
    evidence = {"checks": {name: record for name, (record, _) in checks.items()}, "holds": holds,
                "curves": {name: {"octaves": [f"({lo}, {hi}]" for lo, hi in zip(edges[:-1], edges[1:])],
                                  **as_curve(over_windows(c))} for name, c in curves.items()},
                "exponents": {name: as_record(over_windows(c, fit)) for name, c in curves.items()}}
    figure = plot(curves, centres, settings.seq_len, out_dir / "sparsity_vs_keys.png")
    return Outcome(vote(sum(holds.values()), len(holds)), evidence, [figure], runs)


def as_curve(interval) -> dict:
    return {"mean": np.asarray(interval.estimate).tolist(), "ci": interval.bounds()}


def plot(curves: dict, centres: np.ndarray, train_len: int, path: Path) -> str:
    fig, ax = new_axes((6, 4))
    for name, values in curves.items():
        band = over_windows(values)
        error_bars(ax, centres, band.estimate, band.lo, band.hi, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    save_axes(fig, ax, path, train_len=train_len, title="attention sparsity against context",
              xlabel="keys a query sees (octave centre)", ylabel="mean row S (95% interval)")
    return str(path)
