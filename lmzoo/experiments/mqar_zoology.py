"""Zoology's MQAR sweep (Arora et al. 2023, "Zoology", arXiv:2312.04927, Figure 2): accuracy against model width at
several (sequence length, key-value pairs) settings, for the variants zoology plots that lmzoo has, each cell the best
of a learning-rate sweep; lmzoo's ranking of the variants compared with a printed table (``paper_agreement`` against
``docs/claims/published/mqar.yaml``, source ``source``).

Every (variant, setting, width) trains each learning rate and seed on ``data=mqar`` (run directories
``<out_dir>/runs/<variant>-T<seq_len>-p<pairs>-d<width>-lr<lr>-s<seed>``), the rates and seeds as one vmapped group
where ``seed_groups`` says so (``lmzoo.experiments.runs.train_grid``). The rate is chosen on validation examples (the
best mean accuracy over seeds) and its runs are scored on a held-out test split (data seed + ``test_seed_offset``).
Accuracy counts the answers only, with a 95% interval over seeds and examples (``lmzoo.stats.trained_models``).

Two scales (``scale=``): ``cpu``, the defaults below, widths 32 and 64 at one short setting, sized so that softmax
solves it (docs/yardsticks.md: at width 16 it stayed on MQAR's plateau, at 3e-3 two seeds of three did); ``full``,
zoology's grid (widths 64-512, lengths 64-512 with 4-64 pairs, vocabulary 8,192, four learning rates from 1e-4 to
1e-2, zoology's batch sizes and 100,000 examples x 64 epochs of training), a prepared GPU command
(docs/yardsticks.md). A scale sets the settings left at their defaults; ``key=value`` still wins.

The task is lmzoo's MQAR with zoology's query placement (``data.query_placement=power_law``, ``power_a`` 0.01: the
queries in slots after the pairs drawn by a power law of their distance, as zoology's generator places them) and
its values (``data.distinct_values=true``: the values of one example distinct, as zoology draws them), at both
scales. What differs from zoology's protocol (docs/yardsticks.md): each query followed by its value and PAD between
the slots (zoology: a zero after each query and between them);
fresh examples every step rather than one training set of 100,000 read 64 times; lmzoo's blocks (mixer + SwiGLU
MLP; zoology's Figure 2 has no MLP); the rate chosen on validation and reported on a test split rather than the best
test accuracy over rates; lmzoo's mixers for zoology's (``linear`` for Based, ``rwkv6`` for RWKV-4's time mixer).

Judged (``judge``):
- positive control: softmax attention solves every setting at its smallest width, test accuracy above ``solved`` =
  0.9 at its worst cell (zoology: attention recalls at every width; MetaLA prints ">99.0" at length 512);
- Kendall's tau between lmzoo's ranking of the shared variants (at the hardest setting, smallest width) and the
  printed one above 0, its interval the bootstrap over seeds (``paper_agreement``; undecided with one seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import numpy as np

from lmzoo.config import ConfigError
from lmzoo.experiments import Outcome, at_scale
from lmzoo.experiments.arms import estimate
from lmzoo.experiments.judging import Check, measured
from lmzoo.experiments.paper_agreement import agreement, tau_checks
from lmzoo.experiments.published import column, load
from lmzoo.experiments.runs import accuracy_runs, evaluate_run, train_grid
from lmzoo.plots import error_bars, interval_rows, label_log_axis, plt, save_axes, series_style, spread
from lmzoo.schema import one_of
from lmzoo.stats.bootstrap import ratio_of_sums

CLAIM = ("On zoology's MQAR sweep softmax attention recalls at every width, and lmzoo ranks the variants zoology "
         "plots as the printed MQAR table does (Kendall's tau above 0).")
SOURCE = None  # beyond the source articles (docs/seeds.md): the field's shared yardstick (docs/yardsticks.md)
ZOOLOGY_VOCAB = 8192  # zoology's vocabulary (half keys, half values)
ZOOLOGY_EXAMPLES = 100_000 * 64  # 100,000 training examples, 64 epochs
ZOOLOGY_POWER_A = 0.01  # the queries' gaps after the pairs: probability ∝ gap ** (0.01 - 1) (its Figure 2 configs)


@dataclass
class Settings:
    # zoology's Figure 2 variants lmzoo has: attention, Based (linear attention), H3, Mamba, RWKV
    variants: List[str] = field(default_factory=lambda: ["softmax", "linear", "h3", "mamba"])
    widths: List[int] = field(default_factory=lambda: [32, 64])  # model.d_model
    seq_lens: List[int] = field(default_factory=lambda: [32])  # data.seq_len of each setting
    pairs: List[int] = field(default_factory=lambda: [4])  # data.num_pairs of each setting (one per seq_len)
    batch_sizes: List[int] = field(default_factory=lambda: [64])  # train.batch_size of each setting
    vocab: int = 64  # data.task_vocab
    lrs: List[float] = field(default_factory=lambda: [1e-3, 3e-3])
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])
    train_examples: int = 256_000  # examples drawn in training per run: steps = train_examples / batch size
    n_layers: int = 4  # zoology: four layers for every mixer but attention
    layers: Dict[str, int] = field(default_factory=lambda: {"softmax": 2})  # zoology's attention has two
    n_heads: int = 1  # zoology's attention and Based use one head
    variant_overrides: Dict[str, List[str]] = field(default_factory=dict)  # variant -> its own [key=value ...]
    eval_examples: int = 256  # validation and test examples of each setting
    test_seed_offset: int = 1000
    solved: float = 0.9
    source: str = "metala_mqar_512_80"  # the printed table of mqar.yaml to compare with
    source_width: int = 64  # its model dimension (where the figure puts its points)
    overrides: List[str] = field(default_factory=lambda: ["train.eval_every=100000", "train.probe_batch=0",
                                                          "train.log_every=50"])
    scale: str = "cpu"  # cpu | full: the grid SCALES names, in place of the settings left at their defaults

    def check(self) -> None:
        for variant in self.variant_overrides:
            one_of("variant_overrides", variant, tuple(self.variants))
        if not len(self.seq_lens) == len(self.pairs) == len(self.batch_sizes):
            raise ConfigError(f"seq_lens={self.seq_lens}, pairs={self.pairs} and batch_sizes={self.batch_sizes} "
                              "name one setting per entry: give them the same length")


QUICK = {"variants": ["softmax"], "widths": [16], "seq_lens": [16], "pairs": [2], "batch_sizes": [8],
         "vocab": 16, "lrs": [1e-2], "seeds": [0], "train_examples": 64, "n_layers": 1, "layers": {"softmax": 1},
         "eval_examples": 16, "overrides": ["train.eval_every=8", "train.eval_tokens=128", "train.probe_batch=0"]}

FULL_LENGTHS = [64, 128, 256, 512]
SCALES = {
    "cpu": {},
    "full": {  # zoology's Figure 2 grid (its released configuration), for one GPU
        "variants": ["softmax", "linear", "h3", "mamba", "rwkv6", "gla", "retnet"],
        "widths": [64, 128, 256, 512],
        "seq_lens": FULL_LENGTHS,
        "pairs": [4, 8, 16, 64],
        "batch_sizes": [512, 512, 256, 128],  # zoology's per length
        "vocab": ZOOLOGY_VOCAB,
        "lrs": [float(lr) for lr in np.logspace(-4, -2, 4)],
        "train_examples": ZOOLOGY_EXAMPLES,
        "eval_examples": 3000,  # zoology's test set
        "overrides": ["train.steps_per_call=10", "train.eval_every=100000", "train.probe_batch=0",
                      "train.log_every=500", "train.checkpoint_every=5000"],
    },
}


def steps_for(settings: Settings, batch_size: int) -> int:
    """Training steps of one run: ``train_examples`` drawn ``batch_size`` at a time."""
    return max(1, math.ceil(settings.train_examples / batch_size))


def run_name(variant: str, seq_len: int, pairs: int, width: int, lr: float, seed: int) -> str:
    return f"{variant}-T{seq_len}-p{pairs}-d{width}-lr{lr:g}-s{seed}"


def train_overrides(variant: str, seq_len: int, pairs: int, width: int, batch_size: int,
                    settings: Settings) -> list[str]:
    """``data=mqar`` at the setting with zoology's query placement and distinct values, the model at ``width``,
    zoology's depth and heads, then the variant's own settings (``variant_overrides``)."""
    return ["data=mqar", f"data.seq_len={seq_len}", f"data.num_pairs={pairs}", f"data.task_vocab={settings.vocab}",
            "data.query_placement=power_law", f"data.power_a={ZOOLOGY_POWER_A}", "data.distinct_values=true",
            f"model.d_model={width}", f"model.n_layers={settings.layers.get(variant, settings.n_layers)}",
            f"model.n_heads={settings.n_heads}", f"train.batch_size={batch_size}", *settings.overrides,
            *settings.variant_overrides.get(variant, [])]


def cell(variant: str, setting: tuple[int, int, int], width: int, settings: Settings, runs_dir: Path,
         runs: list) -> dict:
    """One (variant, setting, width): every rate's validation accuracy (mean over seeds), the best rate, and its
    runs' test accuracy per seed and with its interval over seeds and examples."""
    seq_len, pairs, batch_size = setting
    grid = {(lr, seed): runs_dir / run_name(variant, seq_len, pairs, width, lr, seed)
            for lr in settings.lrs for seed in settings.seeds}
    train_grid(variant, grid, steps=steps_for(settings, batch_size),
               overrides=train_overrides(variant, seq_len, pairs, width, batch_size, settings))
    tokens = settings.eval_examples * seq_len
    evaluate = lambda run_dir, tag, extra=(): evaluate_run(  # noqa: E731
        run_dir, tag=tag, lengths=[seq_len], tokens=tokens, overrides=list(extra))
    validation = {}
    for lr in settings.lrs:
        runs += [grid[lr, seed] for seed in settings.seeds]
        if len(settings.lrs) > 1:  # one rate: nothing to choose, no validation examples scored
            results = [evaluate(grid[lr, seed], "mqar_zoology") for seed in settings.seeds]
            validation[f"{lr:g}"] = float(np.mean([r["lengths"][str(seq_len)]["accuracy"] for r in results]))
    best = max(settings.lrs, key=lambda lr: validation.get(f"{lr:g}", 0.0))
    test = [evaluate(grid[best, seed], "mqar_zoology_test", [f"seed={seed + settings.test_seed_offset}"])
            for seed in settings.seeds]
    return {"lr": best, "validation_accuracy": validation,
            "test": [float(r["lengths"][str(seq_len)]["accuracy"]) for r in test],
            "accuracy": estimate(accuracy_runs(test, seq_len), ratio_of_sums), "chance": chance(settings)}


def chance(settings: Settings) -> float:
    """A uniform guess among the values: they are the vocabulary's second half."""
    return 2 / settings.vocab


def setting_key(seq_len: int, pairs: int) -> str:
    return f"T{seq_len}-p{pairs}"


def compared(grid: dict, settings: Settings) -> dict | None:
    """lmzoo's ranking at the hardest setting (the last) and smallest width against the printed source; None when
    fewer than two variants are shared with it."""
    hardest, narrow = setting_key(settings.seq_lens[-1], settings.pairs[-1]), str(min(settings.widths))
    printed = column(load("mqar"), settings.source, "accuracy")
    scores = {v: [100 * a for a in by_setting[hardest][narrow]["test"]] for v, by_setting in grid.items()}
    if len(set(scores) & set(printed)) < 2:
        return None
    return {"lmzoo_setting": f"MQAR length {settings.seq_lens[-1]}, {settings.pairs[-1]} pairs, width {narrow}, "
                             f"vocabulary {settings.vocab}",
            "paper_setting": printed[next(iter(printed))].citation.setting,
            "published": {v: n.record() for v, n in printed.items()},
            **agreement(scores, printed).record()}


def run(settings: Settings, out_dir: Path) -> Outcome:
    settings = at_scale(settings, SCALES)
    runs = []
    grid = {v: {setting_key(t, p): {str(w): cell(v, (t, p, b), w, settings, out_dir / "runs", runs)
                                    for w in settings.widths}
                for t, p, b in zip(settings.seq_lens, settings.pairs, settings.batch_sizes)}
            for v in settings.variants}
    evidence = {"split": "learning rate chosen on validation examples; accuracy on the test split",
                "grid": grid, "source": settings.source, "agreement": compared(grid, settings)}
    figure = plot(evidence, settings, out_dir / "accuracy_vs_width.png")
    return Outcome(evidence, [figure], runs)


def judge(evidence: dict, settings: Settings) -> list[Check]:
    settings = at_scale(settings, SCALES)
    checks = []
    softmax = evidence["grid"].get("softmax")
    if softmax is not None:
        narrow = str(min(settings.widths))
        worst = min((measured(by_width[narrow]["accuracy"], uncertainty="examples") for by_width in softmax.values()),
                    key=lambda m: m.lo)
        checks.append(Check("control: softmax, accuracy at its worst setting, smallest width",
                            "softmax attention solves MQAR at every setting", worst, "above", settings.solved,
                            control=True))
    checks += tau_checks(evidence["agreement"], f"Kendall's tau, lmzoo vs {evidence['source']}",
                         "lmzoo ranks the shared variants as the printed table does")
    return checks


def percent_bounds(values: list) -> tuple[np.ndarray, np.ndarray]:
    """The intervals' ends in %, cut at the bounds an accuracy can take: an interval over three seeds that split
    between solving and not runs past 0 or 100%, and the axis stays an accuracy's."""
    return tuple(np.clip([100 * getattr(v, end) for v in values], 0, 100) for end in ("lo", "hi"))


def plot(evidence: dict, settings: Settings, path: Path) -> str:
    """Test accuracy against width, one panel per setting, a line per variant (95% interval over seeds and
    examples); the printed points of the source on the hardest setting's panel, at the source's width. At one
    width, a row per variant instead (``plot_rows``)."""
    if len(settings.widths) == 1:
        return plot_rows(evidence, settings, path)
    keys = [setting_key(t, p) for t, p in zip(settings.seq_lens, settings.pairs)]
    fig, axes = plt.subplots(1, len(keys), sharey=True, squeeze=False, figsize=(4.0 * len(keys) + 1.8, 3.6))
    axes = axes[0]
    grid, widths = evidence["grid"], sorted(settings.widths)
    for ax, key in zip(axes, keys):
        for index, (variant, by_setting) in enumerate(grid.items()):
            values = [measured(by_setting[key][str(w)]["accuracy"], uncertainty="examples") for w in widths]
            lo, hi = percent_bounds(values)
            error_bars(ax, spread(widths, index, len(grid)), [100 * v.estimate for v in values], lo, hi,
                       label=variant, **series_style(index))
        ax.axhline(100 * chance(settings), color="grey", linestyle=":", label="chance" if ax is axes[-1] else None)
        ax.set_xscale("log", base=2)
        label_log_axis(ax, widths)
        ax.set(title=f"MQAR, length {key[1:].replace('-p', ', ')} pairs", xlabel="model width (d_model)",
               ylim=(-3, 103))
        ax.grid(alpha=0.3)
    if evidence["agreement"] is not None:
        xs = sorted({*widths, settings.source_width})
        for variant, number in evidence["agreement"]["published"].items():
            axes[-1].plot([settings.source_width], [number["range"][0]], linestyle="none", marker="*", markersize=11,
                          color=plt.cm.tab10(list(grid).index(variant) % 10) if variant in grid else "black",
                          label=f"{variant}, {evidence['source']} (printed, at its own length and pairs)")
        label_log_axis(axes[-1], xs)
    seeds = len(settings.seeds)
    axes[0].set_ylabel(f"test accuracy, %\n(95% interval, {seeds} seed{'s' * (seeds > 1)}; cut at 0 and 100)")
    save_axes(fig, axes[-1], path, title=axes[-1].get_title(), xlabel="model width (d_model)")
    return str(path)


def plot_rows(evidence: dict, settings: Settings, path: Path) -> str:
    """At one width: a row per variant, best on top, its test accuracy with the 95% interval over seeds and
    examples, one panel per setting (many variants at one width would stack into one column of points); the
    source's printed points as stars on their variants' rows of the hardest setting's panel."""
    keys = [setting_key(t, p) for t, p in zip(settings.seq_lens, settings.pairs)]
    grid, (width,) = evidence["grid"], settings.widths
    fig, axes = plt.subplots(1, len(keys), squeeze=False, figsize=(4.5 * len(keys) + 1.8, 1.2 + 0.24 * len(grid)))
    axes = axes[0]
    variants = list(grid)
    for ax, key in zip(axes, keys):
        cells = [grid[v][key][str(width)] for v in variants]
        values = [measured(c["accuracy"], uncertainty="examples") for c in cells]
        lo, hi = percent_bounds(values)
        order = interval_rows(ax, variants, [100 * v.estimate for v in values], lo, hi, color="tab:blue",
                              markerfacecolor="none",
                              points=[[100 * a for a in c["test"]] for c in cells])
        ax.set(title=f"MQAR, length {key[1:].replace('-p', ', ')} pairs, width {width}", xlim=(-3, 103),
               xlabel=f"test accuracy, % (95% interval over {len(settings.seeds)} seeds, cut at 0 and 100; "
                      "dots: each seed)")
        ax.axvline(100 * cells[0]["chance"], color="grey", linestyle=":", label="chance")
        ax.grid(alpha=0.3)
    if evidence["agreement"] is not None:  # the stars go on the last panel: the rows of its order
        rows = {variants[i]: len(order) - 1 - row for row, i in enumerate(order)}
        for variant, number in evidence["agreement"]["published"].items():
            if variant in rows:
                axes[-1].plot([number["range"][0]], [rows[variant]], linestyle="none", marker="*", markersize=11,
                              color="black")
        axes[-1].plot([], [], linestyle="none", marker="*", markersize=11, color="black",
                      label=f"{evidence['source']} (printed, width {settings.source_width})")
    save_axes(fig, axes[-1], path)
    return str(path)
