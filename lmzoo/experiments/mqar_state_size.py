"""Associative recall against decoding-state size: MQAR accuracy of two-layer models of several widths
per variant, the best over a small learning-rate grid, plotted against the floats of state each
model carries when decoding.

Every (variant, width, pairs, learning rate) trains through the normal trainer on ``data=mqar``
(run directories ``<out_dir>/runs/<variant>-d<width>-p<pairs>-lr<lr>``) and is scored by
``lmzoo.eval`` on the same validation examples, accuracy over the answer tokens with its 95%
interval (bootstrap over blocks of examples).

Expected from the literature (zoology's MQAR figure; seed 002's rank argument, seed 001's
sparsity): attention recalls at any width, while a recurrent state must grow with the number of
pairs. Judged, as fixed before running, by these checks ("above" means the intervals do not
overlap):
- the variants whose decoding cache grows with the context (``solvers``: softmax and FoX, which is
  softmax with learned forgetting): accuracy at least ``solved`` (the interval's lower end) at
  every width and number of pairs;
- each other variant (a state of fixed size; sliding-window attention keeps ``swa_window`` keys, a
  quarter of the context): at its smallest width, accuracy with the fewest pairs above that with
  the most pairs;
- each other variant: with the most pairs, accuracy at its largest width above that at its smallest.
All hold: reproduced; at least half: partly; fewer: not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from lmzoo.experiments import Outcome, vote
from lmzoo.experiments.runs import evaluate_run, state_floats, train_run
from lmzoo.plots import error_bars, label_log_axis, plt, save_axes, series_style

CLAIM = ("Softmax attention solves multi-query associative recall at any width, while recurrent variants need "
         "a larger state as the number of key-value pairs grows.")
SEED = "002"


@dataclass
class Settings:
    variants: List[str] = field(default_factory=lambda: ["softmax", "swa", "linear", "retnet", "gla", "h3", "mamba",
                                                         "mamba2", "deltanet", "gated_deltanet", "fox"])
    solvers: List[str] = field(default_factory=lambda: ["softmax", "fox"])  # expected to solve every setting
    swa_window: int = 16  # keys swa keeps: a quarter of seq_len, so its cache is bounded below the context
    widths: List[int] = field(default_factory=lambda: [32, 64])  # d_model
    pairs: List[int] = field(default_factory=lambda: [4, 8])  # data.num_pairs
    lrs: List[float] = field(default_factory=lambda: [1e-3, 3e-3])
    steps: int = 300
    seed: int = 0
    seq_len: int = 64
    eval_tokens: int = 16384  # validation examples x seq_len, the same examples for every run
    solved: float = 0.9
    overrides: List[str] = field(default_factory=list)  # more training settings


QUICK = {"variants": ["softmax", "gla"], "widths": [32], "pairs": [2, 4], "lrs": [3e-3], "steps": 8, "seq_len": 32,
         "eval_tokens": 2048, "overrides": ["train.batch_size=8", "train.eval_every=8", "train.eval_tokens=512",
                                                                   "train.probe_batch=0"]}


def best_over_lrs(variant: str, width: int, pairs: int, settings: Settings, runs_dir: Path, runs: list) -> dict:
    """The run of the grid with the highest accuracy: its accuracy, interval, learning rate and state size."""
    best = None
    for lr in settings.lrs:
        run_dir = runs_dir / f"{variant}-d{width}-p{pairs}-lr{lr:g}"
        cfg = train_run(variant, run_dir, seed=settings.seed, steps=settings.steps,
                        overrides=["data=mqar", f"data.seq_len={settings.seq_len}", f"data.num_pairs={pairs}",
                                   "model.n_layers=2", f"model.d_model={width}", f"optim.lr={lr}",
                                   *([f"attn.window={settings.swa_window}"] if variant == "swa" else []),
                                   *settings.overrides])
        entry = evaluate_run(run_dir, tag="mqar_state_size", lengths=[settings.seq_len],
                             tokens=settings.eval_tokens)["lengths"][str(settings.seq_len)]
        runs.append(run_dir)
        if best is None or entry["accuracy"] > best["accuracy"]:
            best = {"accuracy": entry["accuracy"], "ci": entry["accuracy_ci"], "lr": lr, "state_floats": state_floats(cfg),
                    "chance": 2 / cfg.data.task_vocab}  # a uniform guess among the values
    return best


def run(settings: Settings, out_dir: Path) -> Outcome:
    grid, runs = {}, []  # grid[variant][pairs][width] = best
    for variant in settings.variants:
        grid[variant] = {p: {w: best_over_lrs(variant, w, p, settings, out_dir / "runs", runs) for w in settings.widths}
                         for p in settings.pairs}
    holds = judge(grid, settings)
    evidence = {"holds": holds, "grid": {v: {str(p): {str(w): b for w, b in by_w.items()} for p, by_w in by_p.items()}
                                         for v, by_p in grid.items()}}
    figure = plot(grid, settings.pairs, out_dir / "accuracy_vs_state.png")
    return Outcome(vote(sum(holds.values()), len(holds)), evidence, [figure], runs)


def above(first: dict, second: dict) -> bool:
    """first's interval lies wholly above second's."""
    return first["ci"][0] > second["ci"][1]


def judge(grid: dict, settings: Settings) -> dict:
    holds = {}
    fewest, most = min(settings.pairs), max(settings.pairs)
    narrow, wide = min(settings.widths), max(settings.widths)
    for variant, by_pairs in grid.items():
        if variant in settings.solvers:
            holds[f"{variant} solves every setting"] = all(
                b["ci"][0] >= settings.solved for by_width in by_pairs.values() for b in by_width.values())
            continue
        if fewest != most:
            holds[f"{variant}: {fewest} pairs above {most} at width {narrow}"] = above(by_pairs[fewest][narrow], by_pairs[most][narrow])
        if narrow != wide:
            holds[f"{variant}: width {wide} above {narrow} at {most} pairs"] = above(by_pairs[most][wide], by_pairs[most][narrow])
    return holds


def plot(grid: dict, pairs: list[int], path: Path) -> str:
    fig, axes = plt.subplots(1, len(pairs), sharey=True, squeeze=False,
                             figsize=(4.2 * len(pairs) + 1.6, 3.8))  # room for the legend beside the panels
    axes = axes[0]
    for ax, p in zip(axes, pairs):
        for index, (variant, by_pairs) in enumerate(grid.items()):
            points = sorted(by_pairs[p].values(), key=lambda b: b["state_floats"])
            error_bars(ax, [b["state_floats"] for b in points], [b["accuracy"] for b in points],
                       [b["ci"][0] for b in points], [b["ci"][1] for b in points], label=variant,
                       **series_style(index))
        ax.axhline(points[0]["chance"], color="grey", linestyle="--", linewidth=0.8, label="chance")
        ax.set_xscale("log")
        label_log_axis(ax)
        ax.set(title=f"{p} key-value pairs", xlabel="decoding-state floats per sequence")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("MQAR accuracy (95% interval)")
    save_axes(fig, axes[-1], path, title=f"{pairs[-1]} key-value pairs", xlabel="decoding-state floats per sequence")
    return str(path)
