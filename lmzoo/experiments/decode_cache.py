"""Decoding cache against quality: MHA, GQA, MQA and MLA trained on an equal budget.

Each variant trains with the same data, seed, model size and number of steps through the normal
trainer (run directories ``<out_dir>/runs/<variant>``; a rerun resumes or reuses them), is
evaluated by ``lmzoo.eval`` at its training length on the same validation tokens, and reports

- its decoding state per token: ``state_size(T) / T`` floats, what a KV cache grows by per token;
- its bits per byte with a 95% block-bootstrap interval, and the bpb difference to every other
  variant with a paired interval (the same token blocks in both runs).

Judged, as fixed before running: the seed's claim about MLA holds in full when MLA's cache per
token is smaller than GQA's *and* MLA's bpb is lower than GQA's with the paired interval of the
difference below zero (reproduced); when only the cache part holds, or only the quality part
(partly); when neither does, not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from lmzoo.experiments import Outcome
from lmzoo.experiments.runs import bpb_difference, evaluate_run, state_floats, train_run
from lmzoo.plots import error_bars, new_axes, save_axes

CLAIM = ("Going from MHA to GQA and MQA shrinks the decoding cache per token at some cost in quality, "
         "and MLA caches less than GQA while scoring better.")
SEED = "003"


@dataclass
class Settings:
    variants: List[str] = field(default_factory=lambda: ["softmax", "gqa", "mqa", "mla"])  # softmax = MHA
    steps: int = 600
    seed: int = 0
    eval_tokens: int = 65536  # validation targets scored per variant (the same ones for all)
    overrides: List[str] = field(default_factory=list)  # more training settings, e.g. ["data.seq_len=128"]


QUICK = {"steps": 8, "eval_tokens": 2048, "overrides": ["data.seq_len=64", "train.batch_size=4", "model.n_layers=1",
                                                         "model.d_model=64", "train.eval_every=8", "train.eval_tokens=512",
                                                         "train.probe_batch=0"]}


def cache_per_token(cfg) -> float:
    return state_floats(cfg) / cfg.data.seq_len


def run(settings: Settings, out_dir: Path) -> Outcome:
    measured, runs = {}, []
    for variant in settings.variants:
        run_dir = out_dir / "runs" / variant
        cfg = train_run(variant, run_dir, seed=settings.seed, steps=settings.steps, overrides=settings.overrides)
        results = evaluate_run(run_dir, tag="decode_cache", lengths=[cfg.data.seq_len], tokens=settings.eval_tokens)
        at_train = results["lengths"][str(cfg.data.seq_len)]
        measured[variant] = {"cache_floats_per_token": cache_per_token(cfg), "bpb": at_train["bpb"],
                             "bpb_ci": at_train["bpb_ci"], "results": results}
        runs.append(run_dir)
    differences = {}
    for a in settings.variants:
        for b in settings.variants:
            if a < b:
                train_len = measured[a]["results"]["train_seq_len"]
                differences[f"{a} - {b}"] = bpb_difference(measured[a]["results"], measured[b]["results"], train_len)
    evidence = {"variants": {v: {k: m[k] for k in ("cache_floats_per_token", "bpb", "bpb_ci")} for v, m in measured.items()},
                "bpb_differences": differences}
    figure = plot(measured, out_dir / "cache_vs_bpb.png")
    return Outcome(judge(measured, differences), evidence, [figure], runs)


def judge(measured: dict, differences: dict) -> str:
    if not {"gqa", "mla"} <= set(measured):
        return "not reproduced"  # the claim is about MLA against GQA: without both there is no evidence for it
    smaller_cache = measured["mla"]["cache_floats_per_token"] < measured["gqa"]["cache_floats_per_token"]
    key = "gqa - mla" if "gqa - mla" in differences else "mla - gqa"
    lo, hi = differences[key]["ci"]
    better = lo > 0 if key == "gqa - mla" else hi < 0  # MLA's bpb lower, the interval clear of zero
    return "reproduced" if smaller_cache and better else "partly" if smaller_cache or better else "not reproduced"


def plot(measured: dict, path: Path) -> str:
    fig, ax = new_axes((5.5, 3.8))
    for variant, m in measured.items():
        lo, hi = m["bpb_ci"]
        error_bars(ax, [m["cache_floats_per_token"]], [m["bpb"]], [lo], [hi], linestyle="none", label=variant)
    ax.set_xscale("log")
    save_axes(fig, ax, path, title="decoding cache against bits per byte", xlabel="decoding-state floats per token",
              ylabel="validation bpb (95% interval)")
    return str(path)
