"""Train short, test long: RoPE extensions switched on after training against position schemes
built in before it.

One softmax model trained with RoPE is evaluated as trained and with each training-free
extension switched on at evaluation (``pos.kind=pi|ntk|yarn|rerope|leaky_rerope``; the
interpolating ones stretched by the largest evaluation factor). Softmax models trained with
ALiBi and without positions (NoPE), with KeyNorm and as HWFA (window layers under a position-free
top) train on the same budget. Every condition is evaluated by ``lmzoo.eval`` on the same
validation tokens at 1x-8x the training length T.

Judged, as fixed before running, by paired comparisons with plain RoPE on the same token blocks,
each holding when its 95% interval excludes zero in the stated direction:
- each training-free extension: bpb at 8T below plain RoPE's (it extrapolates without training);
- each training-free extension: bpb at T different from plain RoPE's (it gives up being exact
  inside the training length, as the seed says of NTK, YaRN and ReRoPE);
- each scheme trained in: its ratio bpb@8T / bpb@T below plain RoPE's.
All hold: reproduced; at least half: partly; fewer: not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from lmzoo.experiments import Outcome, vote
from lmzoo.experiments.runs import bpb_difference, evaluate_run, ratio_difference, train_run
from lmzoo.plots import error_bars, new_axes, save_axes
from lmzoo.schema import one_of

CLAIM = ("RoPE alone degrades past its training length; training-free extensions (PI, NTK, YaRN, ReRoPE) "
         "extrapolate at the price of exactness inside it, and schemes trained in (ALiBi, NoPE, KeyNorm, HWFA) "
         "extrapolate by themselves.")
SEED = "003"
FACTORS = (1, 2, 4, 8)  # evaluation lengths, in training lengths
STRETCHED = ("pi", "ntk", "yarn")  # extensions that take pos.factor
WINDOWED = ("rerope", "leaky_rerope")  # extensions that keep distances up to pos.window exact
TRAINED_IN = {"alibi": ("softmax", ["pos=alibi"]), "nope": ("softmax", ["pos=none"]),
              "keynorm": ("keynorm", []), "hwfa": ("hwfa", [])}  # name: (variant, training overrides)


@dataclass
class Settings:
    steps: int = 600
    seed: int = 0
    seq_len: int = 128  # the training length T
    eval_tokens: int = 65536  # validation targets scored at every length (the same for every condition)
    extensions: List[str] = field(default_factory=lambda: [*STRETCHED, *WINDOWED])
    trained_in: List[str] = field(default_factory=lambda: list(TRAINED_IN))
    window: int = 64  # ReRoPE's exact window (T / 2 by default)
    overrides: List[str] = field(default_factory=list)  # more training settings, e.g. ["model.n_layers=2"]


QUICK = {"steps": 8, "seq_len": 32, "eval_tokens": 1024, "window": 16, "extensions": ["ntk", "rerope"],
         "trained_in": ["alibi"],
         "overrides": ["train.batch_size=4", "model.n_layers=1", "model.d_model=64", "train.eval_every=8",
                       "train.eval_tokens=512", "train.probe_batch=0"]}


def extension_overrides(kind: str, settings: Settings) -> list[str]:
    if kind in STRETCHED:
        return [f"pos.kind={kind}", f"pos.factor={float(FACTORS[-1])}"]
    if kind in WINDOWED:
        return [f"pos.kind={kind}", f"pos.window={settings.window}"]
    one_of("extensions", kind, STRETCHED + WINDOWED)


def run(settings: Settings, out_dir: Path) -> Outcome:
    for name in settings.trained_in:
        one_of("trained_in", name, list(TRAINED_IN))
    switched = {kind: extension_overrides(kind, settings) for kind in settings.extensions}  # checked before training
    lengths = [f * settings.seq_len for f in FACTORS]
    train_overrides = [f"data.seq_len={settings.seq_len}", *settings.overrides]
    train = lambda name, variant, extra: train_run(  # noqa: E731
        variant, out_dir / "runs" / name, seed=settings.seed, steps=settings.steps, overrides=[*train_overrides, *extra])
    evaluate = lambda name, tag, extra=(): evaluate_run(  # noqa: E731
        out_dir / "runs" / name, tag=tag, lengths=lengths, tokens=settings.eval_tokens, overrides=list(extra))

    train("rope", "softmax", [])
    results = {"rope": evaluate("rope", "position_extrapolation")}
    for kind in settings.extensions:
        results[kind] = evaluate("rope", f"position_extrapolation_{kind}", switched[kind])
    for name in settings.trained_in:
        train(name, *TRAINED_IN[name])
        results[name] = evaluate(name, "position_extrapolation")

    train_len, longest = lengths[0], lengths[-1]
    checks = {}
    for kind in settings.extensions:
        checks[f"{kind}: bpb at {longest} - rope's"] = (bpb_difference(results[kind], results["rope"], longest), "below")
        checks[f"{kind}: bpb at {train_len} - rope's"] = (bpb_difference(results[kind], results["rope"], train_len), "apart")
    for name in settings.trained_in:
        checks[f"{name}: bpb ratio at {longest} - rope's"] = (ratio_difference(results[name], results["rope"], longest), "below")
    holds = {name: supported(record["ci"], direction) for name, (record, direction) in checks.items()}
    evidence = {"paired_differences": {name: record for name, (record, _) in checks.items()}, "holds": holds,
                "conditions": {name: curves(r, lengths) for name, r in results.items()}}
    figures = [plot(results, lengths, "ratio", out_dir / "ratio_vs_length.png"),
               plot(results, lengths, "bpb", out_dir / "bpb_vs_length.png")]
    runs = [out_dir / "runs" / name for name in ("rope", *settings.trained_in)]
    return Outcome(vote(sum(holds.values()), len(holds)), evidence, figures, runs)


def supported(ci: list[float], direction: str) -> bool:
    lo, hi = ci
    return hi < 0 if direction == "below" else lo > 0 or hi < 0


def curves(results: dict, lengths: list[int]) -> dict:
    entries = {str(n): results["lengths"][str(n)] for n in lengths}
    return {key: {n: {"value": e[key], "ci": e[f"{key}_ci"]} for n, e in entries.items()} for key in ("bpb", "ratio")}


def plot(results: dict, lengths: list[int], key: str, path: Path) -> str:
    fig, ax = new_axes((6, 4))
    for name, r in results.items():
        entries = [r["lengths"][str(n)] for n in lengths]
        lo, hi = zip(*(e[f"{key}_ci"] for e in entries))
        error_bars(ax, lengths, [e[key] for e in entries], lo, hi, label=name)
    ax.set_xscale("log", base=2)
    ylabel = "bpb@L / bpb@train (95% interval)" if key == "ratio" else "bits per byte (95% interval)"
    save_axes(fig, ax, path, train_len=lengths[0], xticks=lengths, title="train short, test long",
              xlabel="evaluation length (tokens)", ylabel=ylabel)
    return str(path)
