"""State tracking: Gated DeltaProduct with two Householder steps per token and beta in (0, 2) learns
parity and keeps it past its training length; the single-step delta rule with beta in (0, 1) does not.

With unit keys a delta-rule step multiplies the state by ``I - beta k k^T``, whose eigenvalue along k
is ``1 - beta``: in (0, 1) for beta in (0, 1), so no product of such steps can flip a sign, and the
parity of a bit string is a sign that flips with every 1 (Grazzi et al., 2025). beta in (0, 2) reaches
eigenvalue -1; n_h = 2 steps per token give products of two reflections, i.e. rotations
(Siems et al., 2025). Both arms are ``+attn=deltaproduct`` without a decay (``attn.gate=none``), so
they differ only in ``attn.householder_steps`` and ``attn.negative_eigenvalues``; each trains on
``data=parity`` (every position labelled with the parity so far) once per seed through the normal
trainer (run directories ``<out_dir>/runs/<arm>-s<seed>``), and is scored on validation sequences
at three lengths: ``short_len`` (inside the short conv's window, where no state is needed), the
training length, and ``long_len`` (past it: only a model that tracks the state stays right).
Accuracy is over every position, with 95% intervals counting seeds and examples.

Pre-registered rule (``judge``; ``lmzoo.experiments.judging``):
- positive control, for each arm: accuracy at ``short_len`` above ``solved`` = 0.9 (the arm learned
  to read its inputs and the task; without it a failure could be a training failure, not a
  missing state);
- the claim arm's accuracy at ``long_len`` above ``solved``;
- the contrast arm's accuracy at ``long_len`` below ``fails_below`` = 0.6 (chance is 0.5);
- claim minus contrast at ``long_len`` above ``min_effect`` = 0.3 (separately trained models: undecided
  with one seed per arm; the interval of a difference is the conservative [lo1 - hi2, hi1 - lo2]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import numpy as np

from lmzoo.experiments import Outcome
from lmzoo.experiments.arms import estimate
from lmzoo.experiments.judging import Check, Measured, measured
from lmzoo.experiments.runs import accuracy_runs, evaluate_run, train_runs
from lmzoo.plots import error_bars, plt, save_axes, series_style, spread
from lmzoo.stats.bootstrap import ratio_of_sums

CLAIM = ("Gated DeltaProduct with n_h = 2 Householder steps per token and beta in (0, 2) solves parity beyond its "
         "training length, which the single-step delta rule with beta in (0, 1) cannot.")
SOURCE = None  # beyond the source articles (docs/seeds.md): the frontier they point to
CLAIM_ARM, CONTRAST_ARM = "deltaproduct_nh2_beta02", "delta_rule_beta01"


@dataclass
class Settings:
    arms: Dict[str, List[str]] = field(default_factory=lambda: {
        CLAIM_ARM: ["attn.householder_steps=2", "attn.negative_eigenvalues=true", "attn.gate=none"],
        CONTRAST_ARM: ["attn.householder_steps=1", "attn.negative_eigenvalues=false", "attn.gate=none"],
    })  # overrides of +attn=deltaproduct per arm; the checks read the two named above
    task: str = "parity"
    seq_len: int = 32  # training length
    short_len: int = 3  # inside the conv window (4 taps): solvable without a state
    long_len: int = 128  # past the training length
    d_model: int = 32
    n_layers: int = 2
    steps: int = 1000
    lr: float = 3e-3
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])
    eval_tokens: int = 16384  # validation examples x long_len, the same examples for every run
    solved: float = 0.9
    fails_below: float = 0.6
    min_effect: float = 0.3
    overrides: List[str] = field(default_factory=lambda: ["train.batch_size=32"])  # more training settings


QUICK = {"seeds": [0], "steps": 8, "seq_len": 16, "long_len": 32, "eval_tokens": 1024,
         "overrides": ["train.batch_size=8", "train.eval_every=8", "train.eval_tokens=256", "train.probe_batch=0"]}


def lengths(settings: Settings) -> list[int]:
    return [settings.short_len, settings.seq_len, settings.long_len]


def train_and_score(arm: str, overrides: list[str], settings: Settings, runs_dir: Path, runs: list) -> dict:
    """Every seed of one arm trained and evaluated: accuracy at each length over seeds and examples."""
    results = []
    run_dirs = {seed: runs_dir / f"{arm}-s{seed}" for seed in settings.seeds}
    train_runs("deltaproduct", run_dirs, steps=settings.steps,
              overrides=[f"data={settings.task}", f"data.seq_len={settings.seq_len}",
                         f"model.d_model={settings.d_model}", f"model.n_layers={settings.n_layers}",
                         f"optim.lr={settings.lr}", *overrides, *settings.overrides])
    for run_dir in run_dirs.values():
        results.append(evaluate_run(run_dir, tag="state_tracking", lengths=lengths(settings),
                                    tokens=settings.eval_tokens))
        runs.append(run_dir)
    return {str(length): estimate(accuracy_runs(results, length), ratio_of_sums) for length in lengths(settings)}


def run(settings: Settings, out_dir: Path) -> Outcome:
    runs = []
    accuracy = {arm: train_and_score(arm, overrides, settings, out_dir / "runs", runs)
                for arm, overrides in settings.arms.items()}
    evidence = {"task": settings.task, "chance": 0.5 if settings.task == "parity" else None,
                "lengths": lengths(settings), "accuracy": accuracy}
    figure = plot(accuracy, settings, out_dir / "accuracy_vs_length.png")
    return Outcome(evidence, [figure], runs)


def apart(first: Measured, second: Measured) -> Measured:
    """first - second, from two arms scored on the same examples but trained apart: the conservative
    interval [lo1 - hi2, hi1 - lo2]."""
    df = None if None in (first.df, second.df) else min(first.df, second.df)  # the fewer: the wider widening
    return Measured(first.estimate - second.estimate, first.lo - second.hi, first.hi - second.lo,
                    first.uncertainty, (min(first.seeds), min(second.seeds)), df=df)


def judge(evidence: dict, settings: Settings) -> list[Check]:
    accuracy = evidence["accuracy"]
    at = lambda arm, length: measured(accuracy[arm][str(length)], uncertainty="examples")  # noqa: E731
    short, long = settings.short_len, settings.long_len
    checks = [Check(f"control: {arm}, accuracy at {short} tokens",
                    f"{arm} learned to read its inputs (no state needed)",
                    at(arm, short), "above", settings.solved, control=True) for arm in accuracy]
    checks += [
        Check(f"{CLAIM_ARM}: accuracy at {long} tokens", "two Householder steps with beta in (0, 2) track parity past "
              "the training length", at(CLAIM_ARM, long), "above", settings.solved),
        Check(f"{CONTRAST_ARM}: accuracy at {long} tokens", "one step with beta in (0, 1) cannot track parity",
              at(CONTRAST_ARM, long), "below", settings.fails_below),
        Check(f"accuracy at {long} tokens, {CLAIM_ARM} - {CONTRAST_ARM}", "negative eigenvalues and products of "
              "reflections make the difference", apart(at(CLAIM_ARM, long), at(CONTRAST_ARM, long)), "above",
              settings.min_effect, trained_comparison=True),
    ]
    return checks


def plot(accuracy: dict, settings: Settings, path: Path) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    x = np.asarray(lengths(settings), float)
    for index, (arm, by_length) in enumerate(accuracy.items()):
        values = [by_length[str(length)] for length in lengths(settings)]
        error_bars(ax, spread(x, index, len(accuracy)), [v["estimate"] for v in values], [v["lo"] for v in values],
                   [v["hi"] for v in values], label=arm, **series_style(index))
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=0.8, label="chance")
    ax.set_xscale("log")
    seeds = len(settings.seeds)
    save_axes(fig, ax, path, train_len=settings.seq_len, xticks=list(x),
              title=f"{settings.task}: accuracy at every position", xlabel="evaluation length (tokens)",
              ylabel=f"accuracy (95% interval, {seeds} seed{'s' * (seeds > 1)})")
    return str(path)
