"""Decoding cache against quality: MHA, GQA, MQA and MLA trained on an equal budget.

Each variant trains once per seed in ``seeds`` with the same data, model size and number of steps
through the normal trainer (run directories ``<out_dir>/runs/<variant>-s<seed>``; a rerun resumes or
reuses them), is evaluated by ``lmzoo.eval`` at its training length on the same validation tokens,
and reports

- its decoding state per token: ``state_size(T) / T`` floats, what a KV cache grows by per token;
- its bits per byte over seeds, and the bpb difference to every other variant, each with a 95%
  interval counting training noise and text (``lmzoo.stats.trained_models``; text only with one seed).

Judged (``judge``; ``lmzoo.experiments.judging``), each difference by at least ``min_effect`` =
0.01 bpb:
- positive controls: every variant learned context, its bpb below that of a bigram (the next byte from the
  previous one) counted on the training text and scored on the same validation targets
  (``lmzoo.experiments.ngram``: about 3.67 on the default stdlib data, a unigram 4.90, a trigram 2.68).
  It rules out a model that diverged, stalled or learned only byte statistics (frequencies and byte pairs):
  comparing the quality of such models says nothing about their attention;
- MLA scores better than GQA: bpb(MLA) - bpb(GQA) below -0.01;
- sharing keys and values costs quality: bpb(GQA) - bpb(MHA) and bpb(MQA) - bpb(GQA) above +0.01.
Every quality check compares separately trained models: with one seed per arm it stays undecided.
Which variant caches less is not judged: it is arithmetic on the configs (``attn.kv_rank`` against
``attn.n_kv_heads``), known before training; it is reported, and the tests check it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from lmzoo.experiments import Outcome, ngram
from lmzoo.experiments.arms import bpb_difference, bpb_estimate
from lmzoo.experiments.judging import Check, Measured, measured
from lmzoo.experiments.runs import evaluate_run, state_floats, train_runs
from lmzoo.plots import error_bars, new_axes, save_axes, series_style

CLAIM = ("Going from MHA to GQA and MQA shrinks the decoding cache per token at some cost in quality, "
         "and MLA caches less than GQA while scoring better.")
SOURCE = "003"  # the source article whose claim this reruns (docs/seeds.md)
NAMES = {"softmax": "MHA", "gqa": "GQA", "mqa": "MQA", "mla": "MLA"}


@dataclass
class Settings:
    variants: List[str] = field(default_factory=lambda: ["softmax", "gqa", "mqa", "mla"])  # softmax = MHA
    steps: int = 600
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])  # one training run per seed and variant
    eval_tokens: int = 65536  # validation targets scored per variant (the same ones for all)
    min_effect: float = 0.01  # bpb: the smallest difference in quality a check counts
    overrides: List[str] = field(default_factory=list)  # more training settings, e.g. ["data.seq_len=128"]


QUICK = {"steps": 8, "seeds": [0], "eval_tokens": 2048,
         "overrides": ["data.seq_len=64", "train.batch_size=4", "model.n_layers=1", "model.d_model=64",
                       "train.eval_every=8", "train.eval_tokens=512", "train.probe_batch=0"]}


def cache_per_token(cfg) -> float:
    return state_floats(cfg) / cfg.data.seq_len


def run(settings: Settings, out_dir: Path) -> Outcome:
    results, caches, runs = {}, {}, []
    for variant in settings.variants:
        results[variant] = []
        run_dirs = {seed: out_dir / "runs" / f"{variant}-s{seed}" for seed in settings.seeds}
        configs = train_runs(variant, run_dirs, steps=settings.steps, overrides=settings.overrides)
        for seed, run_dir in run_dirs.items():
            cfg = configs[seed]
            results[variant].append(evaluate_run(run_dir, tag="decode_cache", lengths=[cfg.data.seq_len],
                                                 tokens=settings.eval_tokens))
            caches[variant] = cache_per_token(cfg)
            runs.append(run_dir)
    train_len = results[settings.variants[0]][0]["train_seq_len"]
    differences = {f"{a} - {b}": bpb_difference(results[a], results[b], train_len)
                   for a in settings.variants for b in settings.variants if a < b}
    evidence = {"variants": {v: {"cache_floats_per_token": caches[v], "bpb": bpb_estimate(results[v], train_len)}
                             for v in settings.variants},
                "bpb_differences": differences, "ngram_bpb": ngram.measure(*ngram_request(settings))}
    figure = plot(evidence["variants"], out_dir / "cache_vs_bpb.png")
    return Outcome(evidence, [figure], runs)


def ngram_request(settings: Settings) -> tuple:
    """What ``lmzoo.experiments.ngram.measure`` needs to score the n-grams where the variants are scored."""
    return settings.overrides, None, settings.eval_tokens


def bpb_of(entry: dict) -> Measured:
    """A variant's bpb: a record over seeds, or (older runs) the value and text interval of one seed."""
    if isinstance(entry["bpb"], dict):
        return measured(entry["bpb"])
    return measured({"value": entry["bpb"], "ci": entry["bpb_ci"]})


def difference_of(differences: dict, first: str, second: str) -> Measured:
    """bpb(first) - bpb(second), from whichever order the evidence holds it in."""
    if f"{first} - {second}" in differences:
        return measured(differences[f"{first} - {second}"])
    return measured(differences[f"{second} - {first}"]).negated()


def judge(evidence: dict, settings: Settings) -> list[Check]:
    variants, differences = evidence["variants"], evidence["bpb_differences"]
    bigram = ngram.learned_bound(evidence)
    learned = "control: the model learned context (bpb below a bigram's on the same targets)"
    checks = [Check(f"{NAMES.get(v, v)}: bpb", learned, bpb_of(variants[v]), "below", bigram, control=True)
              for v in variants]
    claims = [("mla", "gqa", "below", "MLA scores better than GQA"),
              ("gqa", "softmax", "above", "sharing keys and values across head pairs (GQA) costs quality against MHA"),
              ("mqa", "gqa", "above", "one key and value head (MQA) costs quality against GQA")]
    for first, second, side, tests in claims:
        if {first, second} <= set(variants):
            bound = -settings.min_effect if side == "below" else settings.min_effect
            checks.append(Check(f"bpb {NAMES[first]} - {NAMES[second]}", tests,
                                difference_of(differences, first, second), side, bound, trained_comparison=True))
    return checks


def plot(variants: dict, path: Path) -> str:
    fig, ax = new_axes((5.5, 3.8))
    for index, (variant, entry) in enumerate(variants.items()):
        bpb = bpb_of(entry)
        error_bars(ax, [entry["cache_floats_per_token"]], [bpb.estimate], [bpb.lo], [bpb.hi],
                   label=NAMES.get(variant, variant), **{**series_style(index), "linestyle": "none"})
    ax.set_xscale("log")
    save_axes(fig, ax, path, xticks=sorted({e["cache_floats_per_token"] for e in variants.values()}),
              title="decoding cache against bits per byte", xlabel="decoding-state floats per token",
              ylabel="validation bpb (95% interval)")
    return str(path)
