"""Train short, test long: RoPE extensions switched on after training against position schemes
built in before it.

Softmax models trained with RoPE (one per seed in ``seeds``) are evaluated as trained and with
each training-free extension switched on at evaluation (``pos.kind=pi|ntk|yarn|rerope|leaky_rerope``;
the interpolating ones stretched by the largest evaluation factor). Softmax models trained with
ALiBi and without positions (NoPE), with KeyNorm and as HWFA (window layers under a position-free
top) train on the same budget and seeds. Every condition is evaluated by ``lmzoo.eval`` on the
same validation tokens at 1x-8x the training length T.

Judged (``judge``; ``lmzoo.experiments.judging``), each effect by at least ``min_effect`` = 0.05:
- positive control: plain RoPE degrades, its ratio bpb@8T / bpb@T above ``degrades`` = 1.1:
  where it does not, no scheme has anything to fix;
- each training-free extension but PI: bpb at 8T minus plain RoPE's below -0.05, on the same checkpoints
  (an evaluation-time switch, each checkpoint paired with itself: the interval over the checkpoints' effects,
  seeds+text, decides it; text only with one checkpoint);
- PI is an expected negative, reported and not judged (``EXPECTED_NEGATIVE``): its article interpolates
  positions for fine-tuning; switched on alone at factor 8 it divides every position by 8 and breaks the
  model at every length, T included, so its check could only fail and would vote against the claim by
  construction;
- each scheme trained in: its ratio bpb@8T / bpb@T minus plain RoPE's below -0.05 (separately
  trained models: undecided with one seed per arm).
The extensions' bpb at T against RoPE's is reported, not judged: at factor 8, PI, NTK and YaRN
change the rotation of every position by definition, and ReRoPE with a window below T clips
distances inside it by definition, so "inexact at T" holds by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from lmzoo.experiments import Outcome
from lmzoo.experiments.arms import bpb_estimate, bpb_runs, ratio_difference, ratio_estimate, switch
from lmzoo.experiments.judging import Check, measured
from lmzoo.experiments.runs import evaluate_run, plot_against_length, train_runs
from lmzoo.schema import one_of
from lmzoo.stats.bootstrap import bits_per_nat, ratio_of_sums

CLAIM = ("RoPE alone degrades past its training length; training-free extensions (PI, NTK, YaRN, ReRoPE) "
         "extrapolate at the price of exactness inside it, and schemes trained in (ALiBi, NoPE, KeyNorm, HWFA) "
         "extrapolate by themselves.")
SOURCE = "003"  # the source article whose claim this reruns (docs/seeds.md)
FACTORS = (1, 2, 4, 8)  # evaluation lengths, in training lengths
STRETCHED = ("pi", "ntk", "yarn")  # extensions that take pos.factor
WINDOWED = ("rerope", "leaky_rerope")  # extensions that keep distances up to pos.window exact
EXPECTED_NEGATIVE = {"pi": "made for fine-tuning: switched on alone it breaks the model at every length"}
TRAINED_IN = {"alibi": ("softmax", ["pos=alibi"]), "nope": ("softmax", ["pos=none"]),
              "keynorm": ("keynorm", []), "hwfa": ("hwfa", [])}  # name: (variant, training overrides)


@dataclass
class Settings:
    steps: int = 600
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])  # one training run per seed and model
    seq_len: int = 128  # the training length T
    eval_tokens: int = 65536  # validation targets scored at every length (the same for every condition)
    extensions: List[str] = field(default_factory=lambda: [*STRETCHED, *WINDOWED])
    trained_in: List[str] = field(default_factory=lambda: list(TRAINED_IN))
    window: int = 64  # ReRoPE's exact window (T / 2 by default)
    min_effect: float = 0.05  # the smallest improvement (bpb, or ratio) a check counts
    degrades: float = 1.1  # the control: plain RoPE's ratio at 8T must be above this
    overrides: List[str] = field(default_factory=list)  # more training settings, e.g. ["model.n_layers=2"]


QUICK = {"steps": 8, "seeds": [0], "seq_len": 32, "eval_tokens": 1024, "window": 16, "extensions": ["ntk", "rerope"],
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
    run_dir = lambda name, seed: out_dir / "runs" / f"{name}-s{seed}"  # noqa: E731

    def trained(name: str, variant: str, extra: list[str]) -> list[dict]:
        train_runs(variant, {seed: run_dir(name, seed) for seed in settings.seeds}, steps=settings.steps,
                   overrides=[*train_overrides, *extra])
        return evaluated(name, "position_extrapolation")

    def evaluated(name: str, tag: str, extra=()) -> list[dict]:
        return [evaluate_run(run_dir(name, seed), tag=tag, lengths=lengths, tokens=settings.eval_tokens,
                             overrides=list(extra)) for seed in settings.seeds]

    results = {"rope": trained("rope", "softmax", [])}
    for kind in settings.extensions:
        results[kind] = evaluated("rope", f"position_extrapolation_{kind}", switched[kind])
    for name in settings.trained_in:
        results[name] = trained(name, *TRAINED_IN[name])

    train_len, longest = lengths[0], lengths[-1]
    bpb_switch = lambda kind, n: switch(bpb_runs(results[kind], n), bpb_runs(results["rope"], n), ratio_of_sums,  # noqa: E731
                                        bits_per_nat(results["rope"][0]))
    differences = {f"rope: bpb ratio at {longest}": ratio_estimate(results["rope"], longest)}
    for kind in settings.extensions:
        differences[f"{kind}: bpb at {longest} - rope's"] = bpb_switch(kind, longest)
        differences[f"{kind}: bpb at {train_len} - rope's"] = bpb_switch(kind, train_len)  # reported, not judged
    for name in settings.trained_in:
        differences[f"{name}: bpb ratio at {longest} - rope's"] = ratio_difference(results[name], results["rope"],
                                                                                   longest)
    evidence = {"paired_differences": differences,
                "conditions": {name: curves(r, lengths) for name, r in results.items()}}
    figures = [plot_against_length(evidence["conditions"], lengths, key, len(settings.seeds),
                                   out_dir / f"{key}_vs_length.png", what="train short, test long")
               for key in ("ratio", "bpb")]
    runs = [run_dir(name, seed) for name in ("rope", *settings.trained_in) for seed in settings.seeds]
    return Outcome(evidence, figures, runs)


def judge(evidence: dict, settings: Settings) -> list[Check]:
    longest = FACTORS[-1] * settings.seq_len
    records = evidence["paired_differences"]
    rope = records.get(f"rope: bpb ratio at {longest}") or evidence["conditions"]["rope"]["ratio"][str(longest)]
    checks = [Check(f"rope: bpb ratio at {longest}", "control: RoPE alone degrades past its training length",
                    measured(rope), "above", settings.degrades, control=True)]
    for kind in (k for k in settings.extensions if k not in EXPECTED_NEGATIVE):  # reported, not judged
        key = f"{kind}: bpb at {longest} - rope's"
        checks.append(Check(key,
                            f"{kind}, switched on after training, extrapolates: lower bpb at 8T than RoPE as trained",
                            measured(records[key]), "below", -settings.min_effect))
    for name in settings.trained_in:
        key = f"{name}: bpb ratio at {longest} - rope's"
        checks.append(Check(key, f"{name}, trained in, extrapolates: bpb@8T / bpb@T lower than RoPE's",
                            measured(records[key]), "below", -settings.min_effect, trained_comparison=True))
    return checks


def curves(results: list[dict], lengths: list[int]) -> dict:
    """bpb and ratio at each length, over seeds."""
    return {"bpb": {str(n): bpb_estimate(results, n) for n in lengths},
            "ratio": {str(n): ratio_estimate(results, n) for n in lengths}}
