"""The closed forms of attention sparsity fed with real queries and keys, against the sparsity
trained attention rows actually have.

For every layer and head of a trained softmax, GAU (relu^2) and identity-linear model, on
validation windows of the training length: the keys' mean mu and isotropic spread sigma
(sigma^2 = the mean over dimensions of each dimension's variance over the window), and each
query's vector, give beta_i = scale q_i . mu and gamma_i = scale sigma ||q_i|| (``scored_vectors``:
the vectors whose dot products times ``scale`` are the layer's logits). The source article's closed
form for that weighting (``sparsity_closed_forms``: exp for softmax, relu^2, identity) turns them
into a predicted S for row i; the measured S is that row's own S = E|a| / sqrt(E a^2). Both are
averaged over the rows that see at least half the window (the closed forms describe many keys),
then over windows: one (predicted, measured) point per layer and head.

The closed forms assume the keys are isotropic Gaussian around their mean; this says how far that
carries in trained layers. Each model trains once per seed in ``seeds``; the heads of every seed
are the points (the figure). Each statistic (the heads' correlation, their mean gap, their mean S)
is computed per seed, and its interval is Student's t over the seeds (``uncertainty``
``seeds+heads``): a seed's heads belong to that one model, so the spread between seeds holds both
training noise and which heads a model happens to have, where a bootstrap over the pooled heads
would count them as independent. With one seed the interval is a bootstrap over its heads
(``heads``). Judged (``judge``; ``lmzoo.experiments.judging``):
- positive control: the softmax model's rows attend, its heads' mean measured S below
  ``attends`` = 0.9 (uniform rows have S = 1, and so does the closed form at gamma = 0: rows of an
  untrained model would agree with it without testing anything);
- per model, the correlation across heads of predicted and measured S above ``min_correlation``
  = 0.5 (the assumption orders heads rightly);
- per model, the mean |predicted - measured| below ``tolerance`` = 0.1 (it gets their level right).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lmzoo.experiments import Outcome
from lmzoo.experiments.judging import LEVEL, Check, Measured, measured
from lmzoo.experiments.runs import open_run, train_runs
from lmzoo.experiments.sparsity_closed_forms import closed_exp, closed_identity, closed_relu2
from lmzoo.scoring.sparsity import l1_l2_sparsity
from lmzoo.ops.common import causal_mask
from lmzoo.plots import new_axes, save_axes, series_style
from lmzoo.schema import one_of
from lmzoo.stats.bootstrap import bootstrap
from lmzoo.stats.trained_models import t_interval

CLAIM = ("The closed forms of attention sparsity, fed with the mean and spread of a trained layer's keys and the "
         "norms of its queries (isotropic Gaussian keys), predict the sparsity of its attention rows.")
SOURCE = "001"  # the source article whose claim this reruns (docs/seeds.md)
# name: (+attn variant, training overrides, the closed form of its weighting)
MODELS = {
    "softmax": ("softmax", [], closed_exp),
    "gau relu2": ("gau", ["attn.weights=relu2"], closed_relu2),
    "linear identity": ("linear", ["attn.feature_map=identity", "attn.normalize=false"], closed_identity),
}


@dataclass
class Settings:
    models: List[str] = field(default_factory=lambda: list(MODELS))
    steps: int = 600
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])  # one training run per seed and model: more heads
    seq_len: int = 128  # the training length T: the windows measured
    eval_tokens: int = 65536  # validation targets the windows are cut from
    windows: int = 8
    tolerance: float = 0.1  # the largest mean |predicted - measured| S that counts as the right level
    min_correlation: float = 0.5  # the smallest correlation across heads that counts as ordering them
    attends: float = 0.9  # the control: the softmax heads' mean S must be below this
    overrides: List[str] = field(default_factory=list)  # more training settings


QUICK = {"steps": 8, "seeds": [0], "seq_len": 32, "eval_tokens": 1024, "windows": 2,
         "overrides": ["train.batch_size=4", "model.n_layers=2", "model.d_model=64", "train.eval_every=8",
                       "train.eval_tokens=512", "train.probe_batch=0"]}


@nnx.jit
def scored_layers(model, tokens):
    """Per layer: the scored queries and keys [B,T,H,D], their scale, and the weights [B,H,T,T]."""
    return [(*block.mixer.scored_vectors(x), block.mixer.attention_matrix(x))
            for block, x in zip(model.blocks, model.mixer_inputs(tokens))]


def predicted_and_measured(q, k, scale, weights, closed) -> tuple[np.ndarray, np.ndarray]:
    """Per head [H]: the closed form's S and the measured S, averaged over the rows that see at
    least half the window; q, k [T, H, D], weights [H, T, T] of one window."""
    length = q.shape[0]
    weights = weights[: q.shape[1]]  # a single-head unit (GAU) broadcasts its weights over the model's heads
    mu = k.mean(axis=0)  # (H, D)
    sigma = np.sqrt(k.var(axis=0).mean(axis=-1))  # (H,) isotropic spread
    beta = scale * np.einsum("thd,hd->ht", q, mu)
    gamma = scale * sigma[:, None] * np.linalg.norm(q, axis=-1).T  # (H, T)
    late = slice(length // 2, length)
    predicted = np.vectorize(closed)(gamma[:, late], beta[:, late]).mean(axis=-1)
    measured = np.asarray(l1_l2_sparsity(jnp.asarray(weights), causal_mask(length)))[:, late].mean(axis=-1)
    return predicted, measured


def head_points(run_dir: Path, closed, *, length: int, windows: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, measured) S per layer and head, averaged over the first ``windows`` validation windows."""
    _, data, model, _ = open_run(run_dir)
    cut = data.validation_windows([length], tokens)[length]
    inputs = cut(np.arange(min(windows, len(cut))))["inputs"]
    points = []
    for window in inputs:
        layers = scored_layers(model, jnp.asarray(window[None]))
        per_layer = [predicted_and_measured(np.asarray(q[0], np.float64), np.asarray(k[0], np.float64), float(scale),
                                            np.asarray(w[0], np.float64), closed) for q, k, scale, w in layers]
        points.append(np.stack([np.concatenate(p) for p in zip(*per_layer)]))  # (2, layers x heads)
    predicted, measured = np.mean(points, axis=0)
    return predicted, measured


def correlation(x, y, xx, yy, xy, n):
    """Pearson's r from sums over heads (each argument a sum, with any leading resample axis)."""
    return (n * xy - x * y) / np.sqrt((n * xx - x * x) * (n * yy - y * y))


def mean_of(total, n):
    return total / n


def head_sums(predicted: np.ndarray, measured: np.ndarray) -> dict:
    """Per statistic: (the function of sums over heads, the per-head terms it sums)."""
    ones = np.ones_like(predicted)
    return {"correlation": (correlation, [predicted, measured, predicted**2, measured**2, predicted * measured, ones]),
            "mean_abs_gap": (mean_of, [np.abs(predicted - measured), ones]),
            "mean_measured": (mean_of, [measured, ones])}


def judge_heads(per_seed: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """Each statistic of the heads with its 95% interval: Student's t over the per-seed values with two seeds
    or more (seeds+heads), a bootstrap over the heads of a single seed (heads)."""
    if len(per_seed) == 1:
        return {name: Measured(*bootstrap(statistic, terms), "heads").record()
                for name, (statistic, terms) in head_sums(*per_seed[0]).items()}
    values = {}  # statistic: its value in each seed
    for points in per_seed:
        for name, (statistic, terms) in head_sums(*points).items():
            values.setdefault(name, []).append(float(statistic(*[t.sum() for t in terms])))
    out = {}
    for name, per_seed_values in values.items():
        mean, n = float(np.mean(per_seed_values)), len(per_seed_values)
        spread = [(float(np.var(per_seed_values, ddof=1)) / n, n)]
        lo, hi, df = t_interval(mean, spread, 0.0, LEVEL)
        out[name] = Measured(mean, lo, hi, "seeds+heads", (n,), df=df).record()
    return out


def run(settings: Settings, out_dir: Path) -> Outcome:
    for name in settings.models:
        one_of("models", name, list(MODELS))
    points, runs, records = {}, [], {}
    for name in settings.models:
        variant, extra, closed = MODELS[name]
        points[name] = []
        run_dirs = {seed: out_dir / "runs" / f"{name.replace(' ', '_')}-s{seed}" for seed in settings.seeds}
        train_runs(variant, run_dirs, steps=settings.steps,
                   overrides=[f"data.seq_len={settings.seq_len}", *extra, *settings.overrides])
        for run_dir in run_dirs.values():
            points[name].append(head_points(run_dir, closed, length=settings.seq_len, windows=settings.windows,
                                            tokens=settings.eval_tokens))
            runs.append(run_dir)
        records[name] = judge_heads(points[name])
    evidence = {"checks": records,  # heads per seed: [seed][layer x head]
                "heads": {name: {"predicted": [p.tolist() for p, _ in per_seed],
                                 "measured": [m.tolist() for _, m in per_seed]} for name, per_seed in points.items()}}
    figure = plot(points, len(settings.seeds), out_dir / "predicted_vs_measured.png")
    return Outcome(evidence, [figure], runs)


def judge(evidence: dict, settings: Settings) -> list[Check]:
    checks = []
    if "softmax" in evidence["checks"]:
        checks.append(Check("softmax: mean measured S of its heads", "control: the trained softmax rows attend",
                            softmax_mean_s(evidence), "below", settings.attends, control=True))
    for name, record in evidence["checks"].items():
        checks.append(Check(f"{name}: correlation of predicted and measured S",
                            f"{name}: the closed form orders heads by sparsity",
                            measured(record["correlation"], uncertainty="heads"), "above", settings.min_correlation))
        checks.append(Check(f"{name}: mean |predicted - measured| S",
                            f"{name}: the closed form gets the heads' level of sparsity",
                            measured(record["mean_abs_gap"], uncertainty="heads"), "below", settings.tolerance))
    return checks


def softmax_mean_s(evidence: dict):
    """The control's measurement; runs recorded before it was kept beside the other statistics: from their heads."""
    if "mean_measured" in evidence["checks"]["softmax"]:
        return measured(evidence["checks"]["softmax"]["mean_measured"])
    heads = np.asarray(evidence["heads"]["softmax"]["measured"], dtype=np.float64)
    return measured(judge_heads([(heads, heads)])["mean_measured"])


def plot(points: dict, seeds: int, path: Path) -> str:
    fig, ax = new_axes((5, 5))
    for index, (name, per_seed) in enumerate(points.items()):
        style = series_style(index)
        predicted, measured = (np.concatenate(parts) for parts in zip(*per_seed))
        ax.scatter(predicted, measured, s=22, marker=style["marker"], facecolors="none", edgecolors=[style["color"]],
                   label=name)
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle="--", label="predicted = measured")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    save_axes(fig, ax, path, title=f"closed-form sparsity against trained heads ({seeds} seed{'s' * (seeds > 1)})",
              xlabel="predicted S (isotropic Gaussian keys)", ylabel="measured S of the rows")
    return str(path)
