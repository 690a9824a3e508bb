"""MAD beside its published table: the variants MAD's tables hold (softmax, mamba, gla, deltanet) trained on MAD's
tasks (``lmzoo.data.mad``, ``data=mad``) over MAD's grid of learning rates and weight decays, each task's score
the best grid point's accuracy, and lmzoo's ranking of the variants compared with the paper's, task by task
(``lmzoo.experiments.paper_agreement`` against ``docs/claims/published/mad.yaml``, source ``source``).

Every (variant, task, setting, weight decay, learning rate) trains once per seed (run directories
``<out_dir>/runs/<variant>-<task>[-<setting>]-wd<wd>-lr<lr>-s<seed>``, the baseline setting unnamed; a weight
decay's learning rates and seeds as one vmapped group). Accuracy is MAD's: the macro average over token classes its
released code computes (``mads_accuracy``). The grid point is chosen on validation examples (the best mean
accuracy over seeds); its runs are scored on a held-out test split (data seed + ``test_seed_offset``), the token
accuracy kept beside it. Accuracy counts MAD's scored positions only. Compression is read out as MAD's
encoder-decoder backbone reads it: every symbol decoded from the compression token's state alone
(``lmzoo.model.LastStateReadout``).

As MAD does, the recall tasks train on every next token (``data.train_targets=next_tokens``; the accuracy counts
MAD's scored positions) and fuzzy recall is evaluated on MAD's test split, every key of the largest motif
(``data.eval_keys=largest``). With ``difficulties=all`` a task is trained at each of MAD's difficulty settings
(``lmzoo.data.mad.PROTOCOL``: its vocabulary sizes, lengths, noise shares, tokens to copy) and scored, per seed, by
the mean over them of each setting's best grid point, MAD's task score; by default at MAD's baseline setting only.
How a run trains (``protocol=``): ``steps`` (the default, sized for a CPU) trains ``steps`` batches of
``batch_size`` on fresh examples, but at the settings that change the training-set size (there a fixed set of that
size, ``data.train_examples``, for the same steps); ``mad`` trains as MAD does (``lmzoo.data.mad.TRAINING``): every
task and setting on a fixed set of MAD's size (12,800 examples; memorization 256; the size settings theirs) for
``epochs`` passes at MAD's batch of 128 (``steps = epochs * examples / batch``, ``mad_steps``), and validates and
tests on MAD's 1,280 test examples; a protocol sets the settings left at their defaults (``PROTOCOLS``), its runs
under ``<out_dir>/runs-mad``. What differs from MAD's protocol either way (docs/yardsticks.md): lmzoo's decoder
blocks (mixer + MLP per layer) at ``d_model``, not MAD's width 128; lmzoo's cosine schedule (``protocol=mad`` takes
MAD's betas, no clipping and no warm-up).

Judged (``judge``):
- positive control: softmax's in-context recall accuracy above ``solved`` = 0.9 (MAD's Transformer: 94.1%);
  without it the ranking compares models that did not learn the tasks;
- per task, Kendall's tau between lmzoo's and the paper's ranking of the shared variants above 0, its interval
  the bootstrap over seeds (``paper_agreement``; undecided with one seed per variant; none where fewer than two
  variants are shared with the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import jax.numpy as jnp
import numpy as np

from lmzoo.data.mad import NEXT_TOKEN_TASKS, PROTOCOL, TEST_EXAMPLES, TRAINING
from lmzoo.experiments import Outcome, at_scale
from lmzoo.experiments.judging import Check, Measured
from lmzoo.experiments.paper_agreement import agreement, tau_checks
from lmzoo.experiments.published import column, load
from lmzoo.experiments.runs import counted_once, most_likely, open_run, train_grid
from lmzoo.plots import plt, save_axes, series_style
from lmzoo.schema import one_of, positive
from lmzoo.stats.trained_models import seed_mean

CLAIM = ("On MAD's tasks lmzoo ranks softmax attention, Mamba, GLA and DeltaNet as MAD's published table does "
         "(Kendall's tau above 0 on every task).")
SOURCE = None  # beyond the source articles (docs/seeds.md): the field's shared yardstick (docs/yardsticks.md)
TASKS = ("compression", "in_context_recall", "fuzzy_recall", "noisy_recall", "selective_copying", "memorization")
DIFFICULTIES = ("baseline", "all")


@dataclass
class Settings:
    variants: List[str] = field(default_factory=lambda: ["softmax", "mamba", "gla", "deltanet"])
    tasks: List[str] = field(default_factory=lambda: list(TASKS))
    source: str = "deltanet_mad"  # which printed table of mad.yaml to compare with
    lrs: List[float] = field(default_factory=lambda: [1e-4, 5e-4, 1e-3])  # MAD's grid
    weight_decays: List[float] = field(default_factory=lambda: [0.0, 0.1])
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])
    protocol: str = "steps"  # steps | mad: how each run trains (PROTOCOLS; module docstring)
    steps: int = 2000  # protocol=steps: training steps of every run
    batch_size: int = 32  # train.batch_size (protocol=mad: MAD's 128)
    epochs: int = TRAINING["epochs"]  # protocol=mad: passes over each fixed training set
    d_model: int = 64
    n_layers: int = 2
    seq_len: Dict[str, int] = field(default_factory=lambda: {  # data.seq_len: MAD's baseline lengths
        "compression": 32, "in_context_recall": 127, "fuzzy_recall": 127, "noisy_recall": 127,
        "selective_copying": 256, "memorization": 32})
    # baseline: each task at MAD's baseline setting (at seq_len); all: at every MAD setting lmzoo trains
    # (difficulty_settings), the task's score their mean, as MAD scores a task
    difficulties: str = "baseline"

    test_seed_offset: int = 1000
    eval_examples: int = 128  # validation and test examples of each setting (protocol=mad: MAD's 1,280)
    solved: float = 0.9
    overrides: List[str] = field(default_factory=list)  # trainer key=value of every run (protocol=mad: its spacing)

    def check(self) -> None:
        one_of("difficulties", self.difficulties, DIFFICULTIES)
        one_of("protocol", self.protocol, tuple(PROTOCOLS))
        for key in ("steps", "batch_size", "epochs", "eval_examples"):
            positive(key, getattr(self, key))


QUICK = {"variants": ["softmax", "gla"], "tasks": ["in_context_recall", "memorization"], "lrs": [1e-3],
         "weight_decays": [0.0], "seeds": [0], "steps": 8, "batch_size": 8, "d_model": 32,
         "seq_len": {"in_context_recall": 31, "memorization": 16}, "eval_examples": 16,
         "overrides": ["train.eval_every=8", "train.eval_tokens=256", "train.probe_batch=0"]}

PROTOCOLS = {  # protocol=: the values it gives the settings left at their defaults (key=value still wins)
    "steps": {},
    "mad": {"batch_size": TRAINING["batch_size"], "eval_examples": TEST_EXAMPLES,
            # 20,000 steps at MAD's baseline: validate and checkpoint as often as 2,000 steps at the default do
            "overrides": ["train.eval_every=1000", "train.checkpoint_every=2000", "train.log_every=100",
                          # MAD's optimizer as released: torch's AdamW betas, no gradient clipping, no warm-up
                          "optim.b2=0.999", "optim.grad_clip=null", "optim.warmup_steps=0"]},
}


SIZED = "num_train_examples"  # MAD's training-set size: a fixed set (data.train_examples) where changed or protocol=mad
TASK_KEYS = ("noise_vocab_size", "frac_noise", "k_motif_size", "v_motif_size", "num_tokens_to_copy")  # data.<key>


def difficulty_settings(task: str, settings: Settings) -> dict[str, dict]:
    """The MAD settings of ``task`` the experiment trains, by name: the baseline, and (``difficulties=all``) each of
    ``PROTOCOL[task].settings()`` named by its change (``vocab_size32``, ``seq_len512``, ``num_train_examples800``
    ...)."""
    baseline = PROTOCOL[task].baseline
    named = {"baseline": baseline}
    for setting in PROTOCOL[task].settings()[1:] if settings.difficulties == "all" else []:
        named["-".join(f"{k}{v:g}" for k, v in setting.items() if baseline[k] != v)] = setting
    return named


def data_length(task: str, setting: dict, settings: Settings) -> int:
    """``data.seq_len`` at a MAD setting: ``settings.seq_len[task]`` at the baseline's length; elsewhere the
    positions a model sees of an instance of MAD's ``seq_len`` tokens (one fewer for the next-token tasks)."""
    if setting["seq_len"] == PROTOCOL[task].baseline["seq_len"]:
        return settings.seq_len[task]
    return setting["seq_len"] - (task in NEXT_TOKEN_TASKS)


def with_protocol(settings: Settings) -> Settings:
    """``settings`` with its protocol's values (``PROTOCOLS``) in place of the settings left at their defaults."""
    return at_scale(settings, PROTOCOLS, by="protocol")


def fixed_set(task: str, setting: dict, settings: Settings) -> bool:
    """Whether runs at ``setting`` train on a fixed set of MAD's size: every one under ``protocol=mad``; under
    ``steps`` only where the setting changes that size (elsewhere lmzoo's stream has no size to change)."""
    return settings.protocol == "mad" or setting[SIZED] != PROTOCOL[task].baseline[SIZED]


def mad_steps(setting: dict, settings: Settings) -> int:
    """MAD's training at ``setting``: ``epochs`` passes over its ``num_train_examples`` at ``batch_size``. lmzoo's
    batches are always full and run on across an epoch's end (MAD's last batch of an epoch is short), so the
    examples read are MAD's, in ``ceil(epochs * examples / batch)`` steps."""
    return math.ceil(settings.epochs * setting[SIZED] / settings.batch_size)


def training_steps(setting: dict, settings: Settings) -> int:
    return mad_steps(setting, settings) if settings.protocol == "mad" else settings.steps


def task_overrides(task: str, settings: Settings, setting: dict | None = None) -> list[str]:
    """``data=mad`` at one of MAD's settings of ``task`` (by default its baseline) at lmzoo's length
    (``data_length``), trained and evaluated as MAD does (``mads_splits``): on a fixed training set of MAD's size
    where ``fixed_set`` says so, else on fresh examples."""
    setting = PROTOCOL[task].baseline if setting is None else setting
    sized = [f"data.train_examples={setting[SIZED]}"] if fixed_set(task, setting, settings) else []
    return ["data=mad", f"data.task={task}", f"data.task_vocab={setting['vocab_size']}",
            f"data.seq_len={data_length(task, setting, settings)}",
            *(f"data.{k}={setting[k]}" for k in TASK_KEYS if k in setting), *sized, *mads_splits(task)]


def mads_splits(task: str) -> list[str]:
    """How MAD trains and evaluates ``task``: its recall tasks' loss counts every next token (the accuracy still
    MAD's scored positions), and fuzzy recall is evaluated on keys of the largest motif (MAD's test split)."""
    trained = ["data.train_targets=next_tokens"] if task in NEXT_TOKEN_TASKS else []
    return trained + (["data.eval_keys=largest"] if task == "fuzzy_recall" else [])


def score(variant: str, task: str, settings: Settings, runs_dir: Path, runs: list) -> dict:
    """The task's score for one variant, as MAD scores a task: each difficulty setting's grid (``setting_score``),
    and per seed the mean over the settings of their test accuracies."""
    by_setting = {name: setting_score(variant, task, name, setting, settings, runs_dir, runs)
                  for name, setting in difficulty_settings(task, settings).items()}
    test = np.mean([result["test"] for result in by_setting.values()], axis=0)  # [seeds]
    return {"settings": by_setting, "test": [float(t) for t in test]}


def setting_score(variant: str, task: str, name: str, setting: dict, settings: Settings, runs_dir: Path,
                  runs: list) -> dict:
    """One setting's grid for one variant: validation accuracy of every (wd, lr) (MAD's, the mean over seeds), the
    best, and its runs' test accuracies (one per seed). The baseline's run directories keep the name they had
    before the settings."""
    length, examples = data_length(task, setting, settings), settings.eval_examples
    tag = "" if name == "baseline" else f"-{name}"
    validation, run_dirs = {}, {}
    for wd in settings.weight_decays:
        grid = {(lr, seed): runs_dir / f"{variant}-{task}{tag}-wd{wd:g}-lr{lr:g}-s{seed}"
                for lr in settings.lrs for seed in settings.seeds}
        train_grid(variant, grid, steps=training_steps(setting, settings),
                   overrides=run_overrides(task, setting, wd, settings))
        for lr in settings.lrs:
            dirs = [grid[lr, seed] for seed in settings.seeds]
            validation[f"wd{wd:g}-lr{lr:g}"] = float(np.mean([mads_accuracy(scored_counts(d, length, examples, seed))
                                                              for seed, d in zip(settings.seeds, dirs)]))
            run_dirs[f"wd{wd:g}-lr{lr:g}"] = dirs
            runs += dirs
    best = max(validation, key=validation.get)
    counts = [scored_counts(d, length, examples, seed + settings.test_seed_offset)
              for seed, d in zip(settings.seeds, run_dirs[best])]
    return {"best": best, "validation": validation, "test": [mads_accuracy(c) for c in counts],
            "test_token_accuracy": [token_accuracy(c) for c in counts], "steps": training_steps(setting, settings),
            "train_examples": setting[SIZED] if fixed_set(task, setting, settings) else None}


# ----------------------------------------------------------------------------- MAD's accuracy
# MAD's released code scores a test batch with torchmetrics' MulticlassAccuracy(num_classes, ignore_index) over the
# scored positions (athms/mad-lab, mad/metrics.py and mad/model/pl_model_wrapper.py), whose default average is
# "macro": each token class's recall tp / (tp + fn), averaged over the classes that occur among the batch's targets
# or predictions (tp + fp + fn > 0; a class only predicted counts 0). The value is logged per batch and Lightning's
# epoch value is the mean over the test batches. A class the model overpredicts thus costs more than in the plain
# token accuracy, and a rare value class weighs as much as a common one.

def scored_counts(run_dir: Path, length: int, examples: int, seed: int) -> dict[str, np.ndarray]:
    """``tp``, ``fp``, ``fn`` [batches, vocab]: per batch of MAD's size (the last may be smaller) and token class,
    the counts of the trained model's most likely token against the target at the scored positions of the first
    ``examples`` validation sequences drawn from data seed ``seed`` (the run's own: its validation split; another:
    a test split), and each batch's ``examples``; kept with the run's record."""
    def measure() -> dict[str, np.ndarray]:
        _, data, model, _ = open_run(run_dir, [f"seed={seed}"])
        windows = data.validation_windows([length], examples * length)[length]
        rows, size = np.arange(min(examples, len(windows))), TRAINING["batch_size"]
        batches = [rows[i : i + size] for i in range(0, len(rows), size)]
        vocab = data.tokenizer.vocab_size
        per_batch = [class_counts(*predicted_and_targets(model, windows(b)), vocab) for b in batches]
        return {**{key: np.stack([c[key] for c in per_batch]) for key in ("tp", "fp", "fn")},
                "examples": np.array([len(b) for b in batches])}

    return counted_once(run_dir, f"class_counts-L{length}-n{examples}-seed{seed}", measure)


def predicted_and_targets(model, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """The most likely token and the target at each scored position of ``batch`` (flat)."""
    scored = np.asarray(batch["weights"]) > 0
    predicted = np.asarray(most_likely(model, jnp.asarray(batch["inputs"])))
    return predicted[scored], np.asarray(batch["targets"])[scored]


def class_counts(predicted: np.ndarray, targets: np.ndarray, vocab: int) -> dict[str, np.ndarray]:
    """Per class: ``tp`` (predicted and target), ``fp`` (predicted, another target), ``fn`` (target, another
    prediction)."""
    hit = predicted == targets
    tp = np.bincount(targets[hit], minlength=vocab)
    return {"tp": tp, "fp": np.bincount(predicted[~hit], minlength=vocab),
            "fn": np.bincount(targets[~hit], minlength=vocab)}


def mads_accuracy(counts: dict[str, np.ndarray]) -> float:
    """MAD's accuracy: each batch's macro average of the classes' recall over the classes present (above), then the
    batches' mean weighted by their examples, as Lightning averages a logged value over an epoch."""
    tp, fp, fn = (np.atleast_2d(counts[key]).astype(np.float64) for key in ("tp", "fp", "fn"))
    recall = np.divide(tp, tp + fn, out=np.zeros_like(tp), where=tp + fn > 0)
    present = (tp + fp + fn) > 0
    by_batch = (recall * present).sum(-1) / np.maximum(present.sum(-1), 1)
    return float(np.average(by_batch, weights=np.atleast_1d(counts.get("examples", np.ones(len(by_batch))))))


def token_accuracy(counts: dict[str, np.ndarray]) -> float:
    """The share of scored positions whose most likely token is the target, over every batch."""
    tp, fn = (np.asarray(counts[key], np.float64) for key in ("tp", "fn"))
    return float(tp.sum() / max((tp + fn).sum(), 1.0))


def run_overrides(task: str, setting: dict, weight_decay: float, settings: Settings) -> list[str]:
    """The trainer's settings of one weight decay's runs at ``setting`` (the rates and seeds come with the grid)."""
    return [*task_overrides(task, settings, setting), f"model.d_model={settings.d_model}",
            f"model.n_layers={settings.n_layers}", f"optim.weight_decay={weight_decay}",
            f"train.batch_size={settings.batch_size}", *settings.overrides]


def runs_folder(settings: Settings) -> str:
    """Where the runs live: ``runs`` (protocol=steps, as before protocols), ``runs-<protocol>`` otherwise, so that
    an ``out_dir`` holding both never resumes a run under the other protocol's settings."""
    return "runs" if settings.protocol == "steps" else f"runs-{settings.protocol}"


def run(settings: Settings, out_dir: Path) -> Outcome:
    settings = with_protocol(settings)
    runs = []
    scores = {task: {v: score(v, task, settings, out_dir / runs_folder(settings), runs) for v in settings.variants}
              for task in settings.tasks}
    numbers = load("mad")
    ranking = {task: ranked(by_variant, column(numbers, settings.source, task)) for task, by_variant in scores.items()}
    evidence = {"source": settings.source, "scores": scores, "agreement": ranking,
                "difficulty_settings": {task: difficulty_settings(task, settings) for task in settings.tasks},
                "protocol": settings.protocol, "training_sets": TRAINING_SETS[settings.protocol],
                "published": {task: {v: n.record() for v, n in column(numbers, settings.source, task).items()}
                              for task in settings.tasks}}
    figure = plot(evidence, out_dir / "mad_vs_published.png")
    return Outcome(evidence, [figure], runs)


def ranked(by_variant: dict, printed: dict) -> dict | None:
    """lmzoo's ranking of one task's variants against the printed column; None where fewer than two are shared (no
    ranking to compare)."""
    if len(set(by_variant) & set(printed)) < 2:
        return None
    return agreement({v: [100 * a for a in s["test"]] for v, s in by_variant.items()}, printed).record()


TRAINING_SETS = {  # the evidence's word on how each protocol trains
    "steps": f"a fixed set of {SIZED} examples (data.train_examples) where a setting changes it; fresh examples "
             "every step elsewhere; every run the same steps",
    "mad": f"a fixed set of {SIZED} examples (data.train_examples) at every setting, read for the epochs at the batch "
           "size (each setting's steps in its scores)",
}


def judge(evidence: dict, settings: Settings) -> list[Check]:
    checks = []
    recall = evidence["scores"].get("in_context_recall", {}).get("softmax")
    if recall is not None:
        value = seed_mean(recall["test"]) or Measured(float(np.mean(recall["test"])), np.nan, np.nan, "seeds", (1,))
        checks.append(Check("control: softmax, in-context recall accuracy", "softmax learned MAD's recall",
                            value, "above", settings.solved, control=True))
    for task, record in ((t, r) for t, r in evidence["agreement"].items() if r is not None):
        checks += tau_checks(record, f"{task}: Kendall's tau, lmzoo vs {evidence['source']}",
                             f"lmzoo ranks the variants on {task} as the paper does")
    return checks


def plot(evidence: dict, path: Path) -> str:
    """lmzoo's test accuracy (mean over seeds) against the printed score, one point per (variant, task)."""
    fig, ax = plt.subplots(figsize=(5.0, 4.2))
    variants = sorted({v for by_variant in evidence["scores"].values() for v in by_variant})
    for index, variant in enumerate(variants):
        x, y = [], []
        for task, by_variant in evidence["scores"].items():
            if variant in by_variant and variant in evidence["published"][task]:
                x.append(evidence["published"][task][variant]["range"][0])
                y.append(100 * float(np.mean(by_variant[variant]["test"])))
        style = {k: v for k, v in series_style(index).items() if k != "linestyle"}
        ax.plot(x, y, linestyle="none", label=variant, **style)
    ax.plot([0, 100], [0, 100], color="grey", linestyle="--", linewidth=0.8, label="as published")
    save_axes(fig, ax, path, title="MAD: lmzoo against the published scores",
              xlabel=f"published score (%), {evidence['source']}", ylabel="lmzoo test accuracy (%)")
    return str(path)
