"""Associative recall against decoding-state size: MQAR accuracy of two-layer models of several widths
per variant, the best over a small learning-rate grid, plotted against the floats of state each
model carries when decoding.

Every (variant, width, pairs, learning rate) trains once per seed in ``seeds`` through the normal
trainer on ``data=mqar`` (run directories ``<out_dir>/runs/<variant>-d<width>-p<pairs>-lr<lr>-s<seed>``).
The learning rate is chosen on *validation* examples (the best mean accuracy over seeds) and the
chosen runs are reported on a held-out *test* split: examples drawn from another data seed
(``seed`` + ``test_seed_offset`` at evaluation), never seen in training or in the choice.
Accuracy is over the answer tokens, with a 95% interval counting seeds and examples
(``lmzoo.stats.trained_models``).

Expected from the literature (zoology's MQAR figure; source article 002's fixed-size state, 001's
sparsity): attention recalls at any width, while a recurrent state must grow with the number of
pairs. Judged (``judge``; ``lmzoo.experiments.judging``):
- positive control: softmax solves every setting, test accuracy above ``solved`` = 0.9 at the
  worst cell (without it, the other checks measure how fast each model leaves chance, not how
  much state recall needs);
- the other variants whose cache grows with the context (``solvers`` but softmax: FoX, softmax
  with learned forgetting) solve every setting the same way;
- each other variant (a state of fixed size; sliding-window attention keeps ``swa_window`` keys, a
  quarter of the context): at its smallest width, accuracy with the fewest pairs minus that with
  the most above ``min_effect`` = 0.05; with the most pairs, accuracy at its largest width minus
  that at its smallest above 0.05. These compare separately trained models (undecided with one
  seed per arm); the interval of a difference is the conservative [lo1 - hi2, hi1 - lo2].

Two scales (``scale=``): ``cpu``, the defaults below, a grid a 2-core CPU trains in about half an hour, too
little training for softmax to learn the task; ``zoology``, a grid shaped like zoology's MQAR figure (wider
models, pairs from 4 to 16, two learning rates, three seeds, 64-example batches and thousands of steps, every
cell's learning rates and seeds trained as one vmapped step) sized for one 9-minute call on one GPU
(docs/claims.md says what it costs). A scale sets the settings left at their defaults; ``key=value`` given on
the command line still wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import numpy as np

from lmzoo.experiments import Outcome
from lmzoo.experiments import at_scale as scaled
from lmzoo.experiments.arms import estimate
from lmzoo.experiments.judging import Check, Measured, measured
from lmzoo.experiments.runs import accuracy_runs, evaluate_run, state_floats, train_grid
from lmzoo.plots import error_bars, label_log_axis, plt, save_axes, series_style, spread
from lmzoo.stats.bootstrap import ratio_of_sums

CLAIM = ("Softmax attention solves multi-query associative recall at any width, while recurrent variants need "
         "a larger state as the number of key-value pairs grows.")
SOURCE = "002"  # the source article whose claim this reruns (docs/seeds.md)


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
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])  # one training run per seed and cell
    test_seed_offset: int = 1000  # the test split: examples of data seed seed + this, scored once
    seq_len: int = 64
    eval_tokens: int = 16384  # validation examples x seq_len, the same examples for every run
    solved: float = 0.9
    min_effect: float = 0.05  # the smallest accuracy difference the fixed-state checks count
    overrides: List[str] = field(default_factory=list)  # more training settings
    scale: str = "cpu"  # cpu | zoology: the grid SCALES names, in place of the settings left at their defaults


QUICK = {"seeds": [0], "variants": ["softmax", "gla"], "widths": [32], "pairs": [2, 4], "lrs": [3e-3], "steps": 8,
         "seq_len": 32, "eval_tokens": 2048,
         "overrides": ["train.batch_size=8", "train.eval_every=8", "train.eval_tokens=512", "train.probe_batch=0"]}


ZOOLOGY_STEPS = 6000  # x 64 examples = 384k examples per run (zoology: 100k examples x 64 epochs)
SCALES = {
    "cpu": {},
    "zoology": {
        # the control, a gated linear and a selective state (more: a call more)
        "variants": ["softmax", "gla", "mamba"],
        "widths": [64, 128],
        "pairs": [4, 16],
        "lrs": [3e-3, 1e-2],
        "steps": ZOOLOGY_STEPS,
        "eval_tokens": 32768,  # 512 examples of 64 tokens
        "overrides": ["train.batch_size=64", "train.steps_per_call=8", f"train.eval_every={ZOOLOGY_STEPS}",
                      "train.eval_tokens=4096", f"train.log_every={ZOOLOGY_STEPS // 10}", "train.probe_batch=0",
                      f"train.checkpoint_every={ZOOLOGY_STEPS}"],
    },
}


def at_scale(settings: Settings) -> Settings:
    """``settings`` with its scale's values in place of the settings left at their defaults."""
    return scaled(settings, SCALES)


def best_over_lrs(variant: str, width: int, pairs: int, settings: Settings, runs_dir: Path, runs: list) -> dict:
    """The grid cell: every learning rate's mean validation accuracy over seeds, the best one, and its
    runs' accuracy on the test split with its interval, state size and chance level."""
    evaluate = lambda run_dir, tag, extra=(): evaluate_run(  # noqa: E731
        run_dir, tag=tag, lengths=[settings.seq_len], tokens=settings.eval_tokens, overrides=list(extra))
    validation, run_dirs = {}, {}
    for lr in settings.lrs:
        run_dirs[lr] = [runs_dir / f"{variant}-d{width}-p{pairs}-lr{lr:g}-s{seed}" for seed in settings.seeds]
    configs = train_grid(variant, {(lr, seed): run_dir for lr in settings.lrs
                                   for seed, run_dir in zip(settings.seeds, run_dirs[lr])}, steps=settings.steps,
                         overrides=["data=mqar", f"data.seq_len={settings.seq_len}", f"data.num_pairs={pairs}",
                                    "model.n_layers=2", f"model.d_model={width}",
                                    *([f"attn.window={settings.swa_window}"] if variant == "swa" else []),
                                    *settings.overrides])
    cfg = next(iter(configs.values()))  # the grid's shapes and task: alike in every run
    for lr in settings.lrs:
        accuracies = []
        for run_dir in run_dirs[lr]:
            accuracies.append(evaluate(run_dir, "mqar_state_size")["lengths"][str(settings.seq_len)]["accuracy"])
            runs.append(run_dir)
        validation[f"{lr:g}"] = float(np.mean(accuracies))
    best = max(settings.lrs, key=lambda lr: validation[f"{lr:g}"])
    test = [evaluate(d, "mqar_state_size_test", [f"seed={seed + settings.test_seed_offset}"])
            for seed, d in zip(settings.seeds, run_dirs[best])]
    return {"accuracy": estimate(accuracy_runs(test, settings.seq_len), ratio_of_sums), "lr": best,
            "validation_accuracy": validation, "state_floats": state_floats(cfg),
            "chance": 1 / (cfg.data.task_vocab // 2)}


def run(settings: Settings, out_dir: Path) -> Outcome:
    settings = at_scale(settings)
    grid, runs = {}, []  # grid[variant][pairs][width] = best
    for variant in settings.variants:
        grid[variant] = {p: {w: best_over_lrs(variant, w, p, settings, out_dir / "runs", runs) for w in settings.widths}
                         for p in settings.pairs}
    evidence = {"split": "learning rate chosen on validation examples; accuracy on the test split",
                "grid": {v: {str(p): {str(w): b for w, b in by_w.items()} for p, by_w in by_p.items()}
                        for v, by_p in grid.items()}}
    figure = plot(evidence["grid"], settings.pairs, len(settings.seeds), out_dir / "accuracy_vs_state.png")
    return Outcome(evidence, [figure], runs)


def accuracy_of(cell: dict) -> Measured:
    """A cell's accuracy: a record over seeds, or (older runs) one seed's value with its interval over examples."""
    if isinstance(cell["accuracy"], dict):
        return measured(cell["accuracy"], uncertainty="examples")
    return measured({"value": cell["accuracy"], "ci": cell["ci"]}, uncertainty="examples")


def apart(first: Measured, second: Measured) -> Measured:
    """first - second, from two arms scored on different examples: the conservative interval [lo1 - hi2, hi1 - lo2]."""
    df = None if None in (first.df, second.df) else min(first.df, second.df)  # the fewer: the wider widening
    return Measured(first.estimate - second.estimate, first.lo - second.hi, first.hi - second.lo,
                    first.uncertainty, (min(first.seeds), min(second.seeds)), df=df)


def judge(evidence: dict, settings: Settings) -> list[Check]:
    settings = at_scale(settings)
    grid = evidence["grid"]
    fewest, most = str(min(settings.pairs)), str(max(settings.pairs))
    narrow, wide = str(min(settings.widths)), str(max(settings.widths))
    checks = []
    for variant, by_pairs in grid.items():
        if variant in settings.solvers:
            cells = [accuracy_of(c) for by_width in by_pairs.values() for c in by_width.values()]
            worst = min(cells, key=lambda m: m.lo)
            checks.append(Check(f"{variant}: accuracy at its worst setting",
                                f"{'control: ' if variant == 'softmax' else ''}{variant} solves MQAR at every width "
                               "and number of pairs",
                                worst, "above", settings.solved, control=variant == "softmax"))
            continue
        if fewest != most:
            checks.append(Check(f"{variant}: accuracy, {fewest} pairs - {most} pairs, width {narrow}",
                                f"{variant}'s fixed state recalls fewer pairs better",
                                apart(accuracy_of(by_pairs[fewest][narrow]), accuracy_of(by_pairs[most][narrow])),
                                "above", settings.min_effect, trained_comparison=True))
        if narrow != wide:
            checks.append(Check(f"{variant}: accuracy, width {wide} - width {narrow}, {most} pairs",
                                f"{variant} recalls more pairs with a larger state",
                                apart(accuracy_of(by_pairs[most][wide]), accuracy_of(by_pairs[most][narrow])),
                                "above", settings.min_effect, trained_comparison=True))
    return checks


def plot(grid: dict, pairs: list[int], seeds: int, path: Path) -> str:
    fig, axes = plt.subplots(1, len(pairs), sharey=True, squeeze=False, figsize=(4.2 * len(pairs) + 1.6, 3.8))
    axes = axes[0]
    for ax, p in zip(axes, pairs):
        cells = []
        for index, (variant, by_pairs) in enumerate(grid.items()):
            points = sorted(by_pairs[str(p)].values(), key=lambda b: b["state_floats"])
            values = [accuracy_of(b) for b in points]
            x = [b["state_floats"] for b in points]
            error_bars(ax, spread(x, index, len(grid), width=0.2), [v.estimate for v in values], [v.lo for v in values],
                       [v.hi for v in values], label=variant, **series_style(index))
            cells += points
        if "chance" in cells[0]:
            ax.axhline(cells[0]["chance"], color="grey", linestyle="--", linewidth=0.8, label="chance")
        ax.set_xscale("log")
        label_log_axis(ax, sorted({b["state_floats"] for b in cells}))
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax.set(title=f"MQAR, {p} key-value pairs", xlabel="decoding-state floats per sequence")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"test accuracy (95% interval, {seeds} seed{'s' * (seeds > 1)})")
    save_axes(fig, axes[-1], path, title=f"MQAR, {pairs[-1]} key-value pairs",
              xlabel="decoding-state floats per sequence")
    return str(path)
