"""State tracking at Grazzi et al.'s protocol (ICLR 2025, arXiv:2411.12537, section 5.1, Table 3): parity and
modular arithmetic without and with brackets, learned on lengths up to 40 and scored on lengths 40 to 256, in scaled
accuracy; per column of the table, the published separation as a pre-registered claim and lmzoo's ranking of the
shared rows against the printed one (``paper_agreement`` on ``docs/claims/published/state_tracking.yaml``).

Each arm is a variant with its ``attn.*`` overrides (``ARMS``, or any variant by its name at its defaults, as
``+attn=<name>`` gives it; ``Settings.arms`` names those run); an arm whose
(variant, overrides) is a row of the table (``published.Published``'s variant and overrides) is compared with
it: softmax (Transformer), mlstm (mLSTM), mamba (Mamba [0, 1]), mamba with ``attn.negative_eigenvalues=true`` (Mamba
[-1, 1], the transition 2 exp(delta A) - 1), deltanet (DeltaNet [0, 1]) and ``deltaproduct`` with one Householder
step, beta in (0, 2) and no decay (DeltaNet [-1, 1]). The other arms (gated_deltanet, rwkv7,
two Householder steps) are reported beside them without a row.

Each column is an lmzoo data task (``TASKS``: ``data=parity``, ``data=modular_arithmetic``,
``data=modular_arithmetic_brackets``, ``lmzoo.data.modular_arithmetic``). Every arm trains once per seed and column
at ``train_len`` (run directories ``<out_dir>/runs/<task>/<arm>-s<seed>``) and is scored on ``eval_examples``
validation sequences of ``test_max`` tokens. For a causal model the prediction at position p is its answer for the
string of the first p tokens: parity answers every prefix and modular arithmetic without brackets every prefix that
ends on a residue, so one sequence holds an answer at every length; with brackets each sequence holds one
expression of a length uniform up to ``test_max`` and its one answer. Either way the accuracy over the answers at
positions ``test_min`` .. ``test_max`` is the accuracy over strings of lengths drawn uniformly from that range, the
paper's test set; over positions ``train_min`` .. ``train_len`` it is the accuracy in the training range. Scaled
accuracy is ``(accuracy - chance) / (1 - chance)``, chance = 1 / classes (1/2 for parity, 1/5 for the residues
modulo 5; 1.0 perfect, 0.0 guessing), the paper's metric; each seed's score and the arm's mean carry a 95%
interval over seeds and examples.

Pre-registered rule (``judge``), per column:
- positive control, for each arm: scaled accuracy on the column's shortest strings (``Task.control_len`` tokens:
  1 to 3 bits, ``d`` and ``d op d``, the bracketed ``-d``, ``(d)`` and ``(-d)``; validation sequences of that
  length, inside the short convolution's window) above ``solved`` = 0.9 (the arm read its inputs and learned the
  task);
- each arm with a printed cell: the separation the paper prints. A cell of 0.5 or more is "solves" (scaled
  accuracy at the test lengths above ``solved``); below 0.5 "does not": below ``fails_below`` = 0.2 where the cell
  is below it, else (a partial score, e.g. DeltaNet [0, 1]'s 0.314) below 0.5;
- Kendall's tau between lmzoo's ranking of the shared rows and the printed one above 0, its interval the bootstrap
  over seeds (undecided with one seed).
The verdict is over every column's checks; each column's own verdict is in the evidence (``verdicts``).

Scales (``scale=``): ``cpu`` (the defaults), a 2-core CPU's run; ``paper``, the protocol at the paper's lengths with
every arm, three seeds and the model and budget of the authors' released configurations (``SCALES``: each column's
steps, warm-up and weight decay, ``column_steps``, ``column_overrides`` and ``arm_overrides``; docs/yardsticks.md:
what differs from the paper and why).

The group word problems (``scale=word_problems``, a CPU's, S3 alone; ``word_problems_paper``, the README's budget,
S3 and S5): columns ``S3`` and ``S5`` (``data=permutation``, every position labelled with the running product,
chance 1 / |G|; runs under ``runs/permutation_s3`` and ``runs/permutation_s5``) at the protocol of the DeltaProduct
authors' README: one layer, trained on 128 elements, scored on positions 128 to 512. Their published results are
figures, so no number is typed; what is typed are separations the sources state in words
(``docs/claims/published/separations/word_problems.yaml``): on S3 the README's four configurations
(DeltaProduct_2[-1, 1] trains, DeltaProduct_1[-1, 1], DeltaProduct_1[0, 1] and DeltaProduct_2[0, 1] do not: arms
``deltaproduct_nh2_neg``, ``deltanet_neg``, ``deltaproduct_nh1``, ``deltaproduct_nh2``), on S5 Merrill et al.'s
statement that transformers and Mamba cannot express permutation composition (``softmax``, ``mamba``). A stated
"solves" is judged as a cell of 0.5 or more, a stated "fails" as scaled accuracy at the test lengths below 0.5 (a
model that tracks only a quotient of the group, S3's sign say, scores 0.2 without solving it). Words give no
ranking: those columns have no Kendall's tau. gated_deltanet and rwkv7 are reported beside them without a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple

import jax.numpy as jnp
import numpy as np

from lmzoo.config import ConfigError, variant_names
from lmzoo.experiments import Outcome, at_scale
from lmzoo.experiments.arms import estimate
from lmzoo.experiments.judging import Check, familywise, measured, outcome
from lmzoo.experiments.paper_agreement import agreement, tau_checks
from lmzoo.experiments.published import Published, Separation, column, load, load_separations, stated
from lmzoo.experiments.runs import measured_once, most_likely, open_run, train_runs
from lmzoo.plots import error_bars, plt, save_axes, series_style
from lmzoo.schema import one_of, positive
from lmzoo.stats.bootstrap import ratio_of_sums

CLAIM = ("At Grazzi et al.'s formal-language protocol (trained on lengths up to 40, scored on 40 to 256) the models "
         "whose state transitions reach negative eigenvalues (mamba and deltanet with the switch) solve parity and "
         "softmax, mlstm, mamba and deltanet do not, "
         "each row of Table 3 scores parity and modular arithmetic without and with brackets on the side of 0.5 the "
         "table prints, and lmzoo ranks the shared rows as Table 3 does in each column (Kendall's tau above 0); at the "
         "word problems' protocol (one layer, trained on 128 elements, scored to 512) DeltaProduct with two "
         "Householder steps and negative eigenvalues solves S3 where one step or eigenvalues in [0, 1] do not, and "
         "softmax and mamba do not solve S5, as the sources state.")
SOURCE = None  # beyond the source articles (docs/seeds.md): the field's shared yardstick (docs/yardsticks.md)
PAPER = "grazzi_formal_languages"


class Printed(NamedTuple):
    """Where a column's published rows are: printed numbers (``published.load``) or separations stated in words
    (``published.load_separations``), the file and the source in it."""

    kind: str  # numbers | separations
    file: str
    source: str


GRAZZI_TABLE_3 = Printed("numbers", "state_tracking", PAPER)
DELTAPRODUCT_S3 = Printed("separations", "word_problems", "deltaproduct_readme_s3")
ILLUSION_S5 = Printed("separations", "word_problems", "illusion_of_state_s5")


class Task(NamedTuple):
    data: str  # the lmzoo data task (data=<data>)
    chance: float  # 1 / classes: the scaled accuracy's zero
    control_len: int  # the control's strings: validation sequences of this many tokens
    printed: Printed | None  # the column's published rows; None: none typed (its arms are reported, not judged)
    data_overrides: tuple[str, ...] = ()  # the data.* settings that make ``data`` the column's task
    folder: str = ""  # its runs' folder under runs/ (default: ``data``)


TASKS = {  # column -> its task: Table 3's three, then the group word problems (scale=word_problems)
    "parity": Task("parity", 1 / 2, 3, GRAZZI_TABLE_3),
    "modular_arithmetic_without_brackets": Task("modular_arithmetic", 1 / 5, 3, GRAZZI_TABLE_3),
    "modular_arithmetic_with_brackets": Task("modular_arithmetic_brackets", 1 / 5, 5, GRAZZI_TABLE_3),
    # S_n's running products, every position answered; the control's strings (1 to 3 elements, 1 to 2 for S5's
    # 120) are inside the short convolution's window
    "S3": Task("permutation", 1 / 6, 3, DELTAPRODUCT_S3, ("data.degree=3", "data.task_vocab=6"), "permutation_s3"),
    "S5": Task("permutation", 1 / 120, 2, ILLUSION_S5, ("data.degree=5", "data.task_vocab=120"), "permutation_s5"),
}
TABLE_3 = [task for task, column in TASKS.items() if column.printed == GRAZZI_TABLE_3]
ARMS = {  # arm -> [variant, attn.* overrides ...]
    "softmax": ["softmax"],
    "mlstm": ["mlstm"],
    "mamba": ["mamba"],
    "mamba_neg": ["mamba", "attn.negative_eigenvalues=true"],
    "deltanet": ["deltanet"],
    "deltanet_neg": ["deltaproduct", "attn.householder_steps=1", "attn.negative_eigenvalues=true", "attn.gate=none"],
    "gated_deltanet": ["gated_deltanet"],
    "rwkv7": ["rwkv7"],
    "deltaproduct_nh2_neg": ["deltaproduct", "attn.householder_steps=2", "attn.negative_eigenvalues=true",
                             "attn.gate=none"],
    # DeltaProduct_1[0, 1] and DeltaProduct_2[0, 1] of the word problems (deltanet_neg and deltaproduct_nh2_neg
    # are their [-1, 1] rows)
    "deltaproduct_nh1": ["deltaproduct", "attn.householder_steps=1", "attn.negative_eigenvalues=false",
                         "attn.gate=none"],
    "deltaproduct_nh2": ["deltaproduct", "attn.householder_steps=2", "attn.negative_eigenvalues=false",
                         "attn.gate=none"],
}
TABLE_3_ARMS = ["softmax", "mlstm", "mamba", "mamba_neg", "deltanet", "deltanet_neg", "gated_deltanet", "rwkv7",
                "deltaproduct_nh2_neg"]
WORD_PROBLEM_ARMS = ["softmax", "mamba", "gated_deltanet", "rwkv7", "deltanet_neg", "deltaproduct_nh2_neg",
                     "deltaproduct_nh1", "deltaproduct_nh2"]


def arm_of(arm: str) -> list[str]:
    """[variant, attn.* overrides ...] of an arm: its entry in ARMS, else the variant of that name at its defaults."""
    return ARMS.get(arm, [arm])


PARTLY = 0.5  # a printed cell at or above it "solves"; below it, a score below it "does not solve"


@dataclass
class Settings:
    # of ARMS: by default every row of Table 3 lmzoo has
    arms: List[str] = field(default_factory=lambda: ["softmax", "mlstm", "mamba", "mamba_neg", "deltanet",
                                                     "deltanet_neg"])
    tasks: List[str] = field(default_factory=lambda: list(TABLE_3))  # the columns run (TASKS): Table 3's
    train_min: int = 3  # the paper's shortest training string (the training range's first position)
    train_len: int = 40  # the paper's longest training string: data.seq_len
    test_min: int = 40
    test_max: int = 256
    d_model: int = 32
    n_layers: int = 2
    steps: int = 1000
    lr: float = 3e-3
    # Where a source's budget differs by column or by arm (scale=paper): a column's own steps (the others train
    # ``steps``), its trainer settings after ``overrides``, and one arm's settings on one column after those
    column_steps: Dict[str, int] = field(default_factory=dict)  # column -> its training steps
    column_overrides: Dict[str, List[str]] = field(default_factory=dict)  # column -> [key=value ...]
    arm_overrides: Dict[str, Dict[str, List[str]]] = field(default_factory=dict)  # arm -> column -> [key=value ...]
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])
    eval_examples: int = 128  # validation sequences of test_max tokens, the same for every run
    solved: float = 0.9  # scaled accuracy
    fails_below: float = 0.2
    overrides: List[str] = field(default_factory=lambda: [
        "train.batch_size=32", "train.eval_every=100000", "train.probe_batch=0", "train.log_every=50"])
    scale: str = "cpu"  # cpu | paper: the settings SCALES names, in place of those left at their defaults

    def check(self) -> None:
        if not 1 <= self.train_min <= self.train_len <= self.test_min <= self.test_max:
            raise ConfigError(f"train_min={self.train_min}, train_len={self.train_len}, test_min={self.test_min}, "
                              f"test_max={self.test_max} must rise in that order")
        for task in self.tasks:
            one_of("tasks", task, tuple(TASKS))
        for arm in self.arms:
            one_of("arms", arm, (*ARMS, *variant_names()))
        for task, steps in self.column_steps.items():
            one_of("column_steps", task, tuple(TASKS))
            positive(f"column_steps.{task}", steps)
        for task in self.column_overrides:
            one_of("column_overrides", task, tuple(TASKS))
        for arm, by_column in self.arm_overrides.items():
            one_of("arm_overrides", arm, (*ARMS, *variant_names()))
            for task in by_column:
                one_of(f"arm_overrides.{arm}", task, tuple(TASKS))


QUICK = {"arms": ["deltanet_neg"], "tasks": ["modular_arithmetic_with_brackets"], "seeds": [0],
         "steps": 8, "train_len": 16, "test_min": 16, "test_max": 24, "d_model": 16, "n_layers": 1,
         "eval_examples": 8,
         "overrides": ["train.batch_size=8", "train.eval_every=8", "train.eval_tokens=128", "train.probe_batch=0"]}

# The word problems at the DeltaProduct README's protocol: one layer, trained on 128 elements, tested to 512
WORD_PROBLEMS = {"tasks": ["S3", "S5"], "train_min": 1, "train_len": 128, "test_min": 128, "test_max": 512,
                 "n_layers": 1}
# Table 3's runs as Grazzi et al. released them: the configurations their README runs per row (the authors'
# repository, unlocking_state_tracking, commit 68f8e5f, xlstm/experiments/{parity,mod_arithmetic,
# mod_arithmetic_with_brackets}_{mamba,mamba_2,delta_net,delta_net_2,xlstm10}.yaml, and experiments/main.py), the
# model size and budget of the formal-language setup of Beck et al. (2024) they follow. Every row: 2 layers of width
# 128 (DeltaNet and mLSTM with 4 heads), batch 256, torch's AdamW (betas 0.9, 0.999) at 1e-3, a linear warm-up, then
# cosine decay to 1e-3 of the peak at the last step, no gradient clipping. Parity: 20,000 steps, warm-up 2,000, no
# weight decay (mLSTM: no warm-up, weight decay 0.1); modular arithmetic, both columns: 100,000 steps, warm-up 10,000,
# weight decay 0.1. The paper's text was not read: these are the released files' values (docs/yardsticks.md).
PAPER_MODULAR_STEPS = 100_000
PAPER_PARITY = ["optim.warmup_steps=2000", "optim.weight_decay=0.0"]
PAPER_MODULAR = ["optim.warmup_steps=10000", "optim.weight_decay=0.1"]
PAPER_MLSTM_PARITY = ["optim.warmup_steps=0", "optim.weight_decay=0.1"]  # parity_xlstm10.yaml
SCALES = {
    "cpu": {},
    "paper": {  # Grazzi et al.'s rows and lmzoo's other state-tracking arms at the released budget, three seeds
        "arms": TABLE_3_ARMS,
        "d_model": 128, "n_layers": 2, "steps": 20000, "lr": 1e-3, "eval_examples": 1024,
        "column_steps": {"modular_arithmetic_without_brackets": PAPER_MODULAR_STEPS,
                         "modular_arithmetic_with_brackets": PAPER_MODULAR_STEPS},
        "column_overrides": {"parity": PAPER_PARITY, "modular_arithmetic_without_brackets": PAPER_MODULAR,
                             "modular_arithmetic_with_brackets": PAPER_MODULAR},
        "arm_overrides": {"mlstm": {"parity": PAPER_MLSTM_PARITY}},
        "overrides": ["train.batch_size=256", "model.n_heads=4", "optim.b2=0.999", "optim.min_lr_ratio=0.001",
                      "optim.grad_clip=null", "train.eval_every=100000", "train.probe_batch=0", "train.log_every=500",
                      "train.checkpoint_every=5000"],
    },
    "word_problems": {  # a 2-core CPU's: S3 alone (S5's 120 classes need the paper's budget), every arm, width 32
        **WORD_PROBLEMS, "tasks": ["S3"], "arms": WORD_PROBLEM_ARMS, "eval_examples": 64,
    },
    "word_problems_paper": {  # the README's budget: 100 epochs of 100,000 sequences in batches of 2048 (4,883 steps)
        **WORD_PROBLEMS, "arms": WORD_PROBLEM_ARMS, "d_model": 128, "steps": 4883, "lr": 1e-3, "eval_examples": 1024,
        "overrides": ["train.batch_size=2048", "model.n_heads=8", "train.eval_every=100000", "train.probe_batch=0",
                      "train.log_every=100", "train.checkpoint_every=1000"],
    },
}


def published_rows(settings: Settings, task: str) -> dict[str, Published | Separation]:
    """The arms that are published rows of column ``task``, each with its printed cell (Table 3) or its stated
    separation (the word problems), matched on variant and the set of overrides; none for a column without any."""
    where = TASKS[task].printed
    if where is None:
        return {}
    if where.kind == "numbers":
        printed = column(load(where.file), where.source, task)
    else:
        printed = stated(load_separations(where.file), where.source, task)
    by_key = {(n.variant, frozenset(n.overrides)): n for n in printed.values()}
    keys = {arm: (arm_of(arm)[0], frozenset(arm_of(arm)[1:])) for arm in settings.arms}
    return {arm: by_key[key] for arm, key in keys.items() if key in by_key}


def position_correct(run_dir: Path, length: int, examples: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct, scored), each (examples, length) 0/1: whether the trained model's most likely token is the target at
    each position of the first ``examples`` validation sequences of ``length`` tokens (drawn from the run's own data
    seed, as many for every run), and whether the position holds an answer; kept with the run's record
    (``measured_once``)."""
    def measure() -> dict[str, np.ndarray]:
        _, data, model, _ = open_run(run_dir)
        windows = data.validation_windows([length], examples * length)[length]
        batch = windows(np.arange(min(examples, len(windows))))
        predicted = np.asarray(most_likely(model, jnp.asarray(batch["inputs"])))
        return {"correct": (predicted == batch["targets"]).astype(np.float64),
                "scored": (batch["weights"] > 0).astype(np.float64)}

    measured = measured_once(run_dir, f"position_correct-L{length}-n{examples}", measure)
    return measured["correct"], measured["scored"]


def scaled(record: dict, chance: float) -> dict:
    """An accuracy record (estimate, lo, hi) as scaled accuracy: (accuracy - chance) / (1 - chance); its
    ``significant`` (an accuracy apart from 0) says nothing about the scaled one and is dropped."""
    rescale = lambda x: None if x is None else (x - chance) / (1 - chance)  # noqa: E731
    kept = {k: v for k, v in record.items() if k != "significant"}
    return {**kept, **{k: rescale(record[k]) for k in ("estimate", "lo", "hi") if k in record}}


def positions(evaluated: tuple[np.ndarray, np.ndarray], first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct, count) per example over its answers for strings of ``first`` .. ``last`` tokens (positions 1-based).
    An example without an answer there (one-answer tasks) counts 0 rather than being left out: each seed draws its own
    examples, so leaving them out gave the seeds different numbers of blocks, which an arm's interval refuses."""
    correct, scored = (a[:, first - 1 : last] for a in evaluated)
    return (correct * scored).sum(axis=1), scored.sum(axis=1)


def train_overrides(arm: str, task: str, settings: Settings) -> list[str]:
    """The task at the training length, the model, the arm's own ``attn.*`` settings, then the trainer's: every
    run's, the column's own and this arm's on this column (the later wins)."""
    return [f"data={TASKS[task].data}", *TASKS[task].data_overrides, f"data.seq_len={settings.train_len}",
            f"model.d_model={settings.d_model}", f"model.n_layers={settings.n_layers}", f"optim.lr={settings.lr}",
            *arm_of(arm)[1:], *settings.overrides, *settings.column_overrides.get(task, []),
            *settings.arm_overrides.get(arm, {}).get(task, [])]


def steps_for(task: str, settings: Settings) -> int:
    """Training steps of a run on column ``task``: the column's own where it has them."""
    return settings.column_steps.get(task, settings.steps)


def train_arm(arm: str, task: str, settings: Settings, runs_dir: Path) -> dict[int, Path]:
    folder = TASKS[task].folder or TASKS[task].data
    run_dirs = {seed: runs_dir / folder / f"{arm}-s{seed}" for seed in settings.seeds}
    train_runs(arm_of(arm)[0], run_dirs, steps=steps_for(task, settings),
               overrides=train_overrides(arm, task, settings))
    return run_dirs


def score_arm(long: list, short: list, settings: Settings, task: str) -> dict:
    """Scaled accuracy of each range from each seed's ``position_correct``: the training and test ranges on the
    ``test_max`` sequences (``long``), the control on the ``control_len`` ones (``short``); the arm's mean with its
    interval over seeds and examples, and each seed's score."""
    control_len, chance = TASKS[task].control_len, TASKS[task].chance
    ranges = {"control": (short, 1, control_len), "train": (long, settings.train_min, settings.train_len),
              "test": (long, settings.test_min, settings.test_max)}
    scores = {}
    for name, (evaluated, first, last) in ranges.items():
        runs = [positions(e, first, last) for e in evaluated]
        scores[name] = scaled(estimate(runs, ratio_of_sums), chance)
        scores[f"{name}_seeds"] = [(float(s.sum() / n.sum()) - chance) / (1 - chance) for s, n in runs]
    return scores


def compared(scores: dict, rows: dict[str, Published]) -> dict | None:
    """lmzoo's ranking of the arms that are rows of the table against the printed one (None: fewer than two)."""
    if len(rows) < 2 or not all(isinstance(n, Published) for n in rows.values()):  # stated words: no ranking
        return None
    return agreement({arm: scores[arm]["test_seeds"] for arm in rows}, rows).record()


def run_column(task: str, settings: Settings, out_dir: Path) -> tuple[dict, list[Path]]:
    """Every arm trained and scored on one column's task: the column's evidence and its run directories."""
    rows = published_rows(settings, task)
    runs, scores = [], {}
    for arm in settings.arms:
        run_dirs = list(train_arm(arm, task, settings, out_dir / "runs").values())
        runs += run_dirs
        long = [position_correct(d, settings.test_max, settings.eval_examples) for d in run_dirs]
        short = [position_correct(d, TASKS[task].control_len, settings.eval_examples) for d in run_dirs]
        scores[arm] = score_arm(long, short, settings, task)
    return {"data": TASKS[task].data, "chance": TASKS[task].chance, "scaled_accuracy": scores,
            "published": {arm: n.record() for arm, n in rows.items()}, "agreement": compared(scores, rows)}, runs


def run(settings: Settings, out_dir: Path) -> Outcome:
    settings = at_scale(settings, SCALES)
    settings.check()
    runs, columns = [], {}
    for task in settings.tasks:
        columns[task], task_runs = run_column(task, settings, out_dir)
        runs += task_runs
    evidence = {"metric": "scaled accuracy", "test_lengths": [settings.test_min, settings.test_max],
                "train_len": settings.train_len, "steps": {task: steps_for(task, settings) for task in settings.tasks},
                "arms": {arm: {"variant": arm_of(arm)[0], "overrides": arm_of(arm)[1:]} for arm in settings.arms},
                "columns": columns}
    evidence["verdicts"] = column_verdicts(evidence, settings)
    figures = [plot(task, evidence, settings, out_dir / f"scaled_accuracy_{task}.png") for task in columns]
    return Outcome(evidence, figures, runs)


def expected(printed: dict, settings: Settings) -> tuple[str, str, float]:
    """What a printed cell says the row does, as a check: (what, side, bound). 0.5 or more: solves (above
    ``solved``); below: does not (below ``fails_below``, or below 0.5 for a partial score above ``fails_below``).
    A separation stated in words: "solves" above ``solved``, "fails" below 0.5 (a model that tracks only a quotient
    of the group, S3's sign say, scores a third of S3's answers, 0.2 scaled, without solving it)."""
    if "says" in printed:
        return ("solves", "above", settings.solved) if printed["says"] == "solves" else ("does not solve", "below",
                                                                                          PARTLY)
    cell = float(printed["printed"])
    if cell >= PARTLY:
        return "solves", "above", settings.solved
    return "does not solve", "below", settings.fails_below if cell < settings.fails_below else PARTLY


def column_checks(task: str, evidence: dict, settings: Settings) -> list[Check]:
    """One column's checks: a control per arm, the printed separation per row, the ranking."""
    scores, control_len = evidence["scaled_accuracy"], TASKS[task].control_len
    at = lambda arm, name: measured(scores[arm][name], uncertainty="examples")  # noqa: E731
    if not evidence["published"]:
        return []  # no published row typed (S5): its arms are reported beside the others, not judged
    checks = [Check(f"{task}, control: {arm}, scaled accuracy on strings of 1 to {control_len} tokens",
                    f"{arm} read its inputs and learned {task}", at(arm, "control"), "above", settings.solved,
                    control=True) for arm in scores]
    # A row said to solve the task must first have learned it at the lengths it trained on: one that did not (too
    # short a budget) leaves its claim untested, not refuted (the shortest strings fit the short convolution, so
    # the control above passes without any state)
    checks += [Check(f"{task}, control: {arm}, scaled accuracy inside its training lengths ({settings.train_min} to "
                     f"{settings.train_len} tokens)", f"{arm} learned {task} where it was trained", at(arm, "train"),
                     "above", settings.solved, control=True)
               for arm, printed in evidence["published"].items() if expected(printed, settings)[1] == "above"]
    for arm, printed in evidence["published"].items():
        what, side, bound = expected(printed, settings)
        words = "says" in printed  # a separation stated in words, not a printed cell
        cell, source = (f"says {printed['says']}", "source states") if words else (f"printed {printed['printed']}",
                                                                                 "paper prints")
        checks.append(Check(
            f"{task}, {arm} ({printed['row']}, {cell}): scaled accuracy on {settings.test_min} to {settings.test_max} "
            f"tokens", f"{arm} {what} {task} past its training lengths, as the {source}", at(arm, "test"), side,
            bound))
    checks += tau_checks(evidence["agreement"], f"{task}, Kendall's tau, lmzoo vs {PAPER}",
                         f"lmzoo ranks the shared rows as Table 3 does on {task}")
    return checks


def judge(evidence: dict, settings: Settings) -> list[Check]:
    settings = at_scale(settings, SCALES)
    return [c for task, column_evidence in evidence["columns"].items()
            for c in column_checks(task, column_evidence, settings)]


def column_verdicts(evidence: dict, settings: Settings) -> dict[str, dict]:
    """Each column's outcome on its own checks (family-wise over that column's claim checks), as the verdict's."""
    verdicts = {}
    for task, column_evidence in evidence["columns"].items():
        checks = column_checks(task, column_evidence, settings)
        if not checks:
            verdicts[task] = {"verdict": None, "reason": "no published row typed: reported, not judged"}
            continue
        word, reason = outcome(familywise(checks))
        verdicts[task] = {"verdict": word, "reason": reason}
    return verdicts


def published_mark(printed: dict) -> float:
    """Where a published row is drawn: its printed cell's lower end, or 1 (solves) and 0 (fails) for words."""
    if "says" in printed:
        return 1.0 if printed["says"] == "solves" else 0.0
    return printed["range"][0]


def plot(task: str, evidence: dict, settings: Settings, path: Path) -> str:
    """One column: scaled accuracy per arm in the training range and at the test lengths, with the printed cell (a
    star)."""
    scores, published = (evidence["columns"][task][key] for key in ("scaled_accuracy", "published"))
    fig, ax = plt.subplots(figsize=(1.1 * len(scores) + 3.0, 3.6))
    x = np.arange(len(scores), dtype=float)
    for index, name in enumerate(("train", "test")):
        values = [measured(s[name], uncertainty="examples") for s in scores.values()]
        error_bars(ax, x + (index - 0.5) * 0.25, [v.estimate for v in values], [v.lo for v in values],
                   [v.hi for v in values], label=f"lmzoo, {name} lengths",
                   **{**series_style(index), "linestyle": "none"})  # arms are categories: no line between them
    stars = [(i + 0.25, published_mark(published[arm])) for i, arm in enumerate(scores) if arm in published]
    if stars:
        words = any("says" in p for p in published.values())
        ax.plot(*zip(*stars), linestyle="none", marker="*", markersize=11, color="black",
                label="stated separation (solves 1, fails 0)" if words else "Grazzi et al., Table 3 (test lengths)")
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8, label="chance")
    ax.set_xticks(x, list(scores), rotation=20)
    seeds = len(settings.seeds)
    save_axes(fig, ax, path, title=f"{task}: trained to {settings.train_len}, tested "
                                   f"{settings.test_min}-{settings.test_max}",
              xlabel="arm", ylabel=f"scaled accuracy (95% interval, {seeds} seed{'s' * (seeds > 1)})")
    return str(path)
