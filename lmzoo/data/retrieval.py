"""Retrieval at length: needles hidden in a haystack, asked for at the end; the depth x length grid that scores them.

The RULER family of tasks (Hsieh et al., 2024), generated on task symbols. One example of ``L`` tokens::

    filler .. needle .. filler .. needle .. filler   question answer [question answer ..]
                                                              `- scored, nothing else

A needle is SEP and a few symbols (a number of ``digits`` symbols from ``0 .. base - 1``, a key, a
variable name); the filler uses none of them, so every needle is unambiguous. The filler is a fixed
sentence (its symbols in order, repeated, as the "The grass is green. The sky is blue." of the
literature: it carries no information, so answering needs only the retrieval) or noise (its symbols
drawn uniformly: the needles must be told from a stream of fresh symbols too). The tasks
(``data=<name>``):

- ``passkey`` (``lmzoo.data.passkey``): one number, asked for: ``SEP d1..dk`` in the haystack, then
  ``SEP`` -> ``d1..dk``.
- ``niah_multikey``: numbers filed under distinct keys (``SEP key d1..dk``); one key asked
  (``SEP key`` -> its number), the other needles are distractors.
- ``niah_multivalue``: several numbers under one key; the question asks for all of them, in the
  order they appear.
- ``niah_multiquery``: several keys asked one after another, each followed by its number.
- ``variable_tracking``: a chain of assignments ``X1 = value, X2 = X1, ..., Xn = Xn-1`` written
  ``SEP X1 d1..dk``, ``SEP X2 X1`` ... (distractor chains hold other values); the question
  ``SEP d1..dk`` asks which variables hold the value: ``X1 X2 .. Xn``, in chain order.

Depth. A depth ``d`` in [0, 1] puts the earliest needle the answer needs at filler position
``round(d * H)`` (``H`` filler tokens; 0: first, 1: right before the question); the answer's other
needles are drawn uniformly after it and distractors anywhere. Training draws every needle
uniformly, so the grid cell at depth ``d`` holds training examples conditioned on the answer
reaching back to ``d``. What the needles say (numbers, keys, variables) is drawn before where they
go, so example ``i`` carries the same content at every length and depth: the cells of the grid
differ only in where the needles sit and how far they are from the question.

The grid (``extra_evaluation``, run by ``lmzoo.eval``): greedy predictions scored on the answer
tokens alone, per (depth, length) cell at 1x to 16x the training length, with intervals; its heat
map is written to ``<task>.png``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Callable, ClassVar, Optional, Sequence

import numpy as np

from lmzoo.data.synthetic import VALIDATION, TaskConfig, TaskTokenizer
from lmzoo.schema import ConfigError, one_of, positive
from lmzoo.stats.bootstrap import LEVEL, Interval, metric_interval

GRID_FACTORS = (1, 2, 4, 8, 16)  # default evaluated lengths, in training lengths
FILLERS = ("sentence", "noise")
Forward = Callable[[np.ndarray], np.ndarray]  # tokens [B, T] -> logits [B, T, V]


@dataclass
class RetrievalTask(TaskConfig):
    """A task of the family: how one example is drawn with its needles at a given depth (``draw``), and its grid."""

    digits: int = 5  # symbols in a number
    base: int = 10  # number alphabet, symbols 0 .. base - 1: chance is 1 / base per digit
    # The evaluation grid (extra_evaluation): relative depths of the needle, and examples per cell.
    grid_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    grid_examples: int = 32

    depth_label: ClassVar[str] = "needle depth (0: first, 1: last)"  # the heat map's y axis
    filler = "sentence"  # a task with a filler setting makes this a dataclass field (passkey has none)

    def check(self) -> None:
        super().check()
        positive("data.digits", self.digits)
        one_of("data.filler", self.filler, FILLERS)
        if self.base < 2:
            raise ConfigError(f"data.base={self.base} must be at least 2: a one-symbol number has nothing to retrieve")
        if self.task_vocab <= self.first_filler:
            reserved = " + ".join(f"{key}={value}" for key, value in self.reserved_symbols().items())
            raise ConfigError(f"data.task_vocab={self.task_vocab} leaves no filler symbols: it must exceed {reserved}")
        if self.grid_examples < 2:
            raise ConfigError(f"data.grid_examples={self.grid_examples} must be at least 2 (intervals resample them)")
        if not all(0 <= d <= 1 for d in self.grid_depths):
            raise ConfigError(f"data.grid_depths={list(self.grid_depths)} must lie in [0, 1]")
        self.check_length(self.seq_len, "data.seq_len")

    # --- what a task defines ----------------------------------------------------------------------

    def reserved_symbols(self) -> dict[str, int]:
        """The settings counting the task symbols that needles use (the filler gets the rest)."""
        return {"data.base": self.base}

    def length_settings(self) -> dict[str, int]:
        """The settings that fix ``min_length``, for the message refusing a shorter length."""
        raise NotImplementedError(f"{type(self).__name__} does not define length_settings()")

    @property
    def min_length(self) -> int:
        """Tokens of needles, questions and answers: the shortest model input (its example, one token
        longer, holds one filler token too)."""
        raise NotImplementedError(f"{type(self).__name__} does not define min_length")

    @property
    def answer_tokens(self) -> int:
        """Scored tokens per example."""
        raise NotImplementedError(f"{type(self).__name__} does not define answer_tokens")

    @property
    def chance(self) -> float:
        """Accuracy per answer token of a uniform guess among the symbols an answer token can be."""
        return 1 / self.base

    def draw(
        self, rng: np.random.Generator, length: int, tok: TaskTokenizer, depth: Optional[float]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One sequence of ``length`` tokens and its scored positions, the answer's first needle at ``depth``."""
        raise NotImplementedError(f"{type(self).__name__} does not define draw()")

    # --- shared ------------------------------------------------------------------------------------

    @property
    def first_filler(self) -> int:
        return sum(self.reserved_symbols().values())

    def check_length(self, length: int, key: str = "length") -> None:
        if length < self.min_length:
            settings = self.length_settings()
            named = [f"{k}={v}" for k, v in settings.items()]
            listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
            verb = "needs" if len(named) == 1 else "need"
            need = f"{listed} {verb} at least {self.min_length}"
            raise ConfigError(f"{key}={length} is too short for {self.source}: {need}")

    def draw_filler(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` tokens of filler of the task's kind: symbols ``first_filler .. task_vocab - 1``."""
        return filler_tokens(self.filler, rng, n, self.first_filler, self.task_vocab)

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        return self.example_at(rng, length, tok, depth=None)

    def example_at(
        self, rng: np.random.Generator, length: int, tok: TaskTokenizer, depth: Optional[float]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One example of ``length`` tokens, the answer's first needle at relative ``depth`` (None: drawn)."""
        self.check_length(length - 1)
        if depth is not None and not 0 <= depth <= 1:
            raise ValueError(f"a needle depth is relative: it lies in [0, 1], got {depth}")
        return self.draw(rng, length, tok, depth)

    def examples_at(self, length: int, depth: float, n: int, *, seed: int = 0) -> dict[str, np.ndarray]:
        """Validation examples ``0 .. n-1`` at input length ``length``, the answer's first needle at ``depth``, as
        one batch."""
        tok = TaskTokenizer(self.task_vocab)
        rows = []
        for index in range(n):
            seq, scored = self.example_at(np.random.default_rng([seed, VALIDATION, index]), length + 1, tok, depth)
            inputs, targets = seq[:-1].astype(np.int32), seq[1:].astype(np.int32)
            rows.append({"inputs": inputs, "targets": targets, "weights": scored[1:].astype(np.float32)})
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    def extra_evaluation(
        self, forward: Forward, lengths: Optional[Sequence[int]], out_dir: Path, *, seed: int = 0, batch_size: int = 8
    ) -> dict:
        """The depth x length grid at ``lengths`` (None: 1x to 16x the training length), named after the
        task, its heat map written to ``out_dir/<task>.png``."""
        lengths = lengths or [self.seq_len * factor for factor in GRID_FACTORS]
        grid = retrieval_grid(
            forward, self, lengths, self.grid_depths, self.grid_examples, batch_size,
            seed=seed, plot_path=Path(out_dir) / f"{self.source}.png",
        )
        return {self.source: grid}


# --- the haystack ------------------------------------------------------------------------------------


def answer_positions(rng: np.random.Generator, n_filler: int, count: int, depth: Optional[float]) -> np.ndarray:
    """Where the ``count`` needles an answer needs go (insertion points ``0 .. n_filler``: before that
    filler token): uniform, or with a depth the first at ``round(depth * n_filler)``, the others uniform after it."""
    if depth is None:
        return rng.integers(0, n_filler + 1, size=count)
    first = round(depth * n_filler)
    return np.concatenate([[first], rng.integers(first, n_filler + 1, size=count - 1)])


def uniform_positions(rng: np.random.Generator, n_filler: int, count: int) -> np.ndarray:
    return rng.integers(0, n_filler + 1, size=count)


def filler_tokens(kind: str, rng: np.random.Generator, n: int, first: int, stop: int) -> np.ndarray:
    """``n`` tokens of symbols ``first .. stop - 1``: in order, repeated (``sentence``), or drawn uniformly
    (``noise``)."""
    if kind == "sentence":
        return np.resize(np.arange(first, stop), n)
    return rng.integers(first, stop, size=n)


def lay_out(filler: np.ndarray, needles: Sequence[np.ndarray], positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``filler`` with ``needles[i]`` inserted before filler token ``positions[i]`` (needles at one point in
    list order), and the needle indices in order of appearance."""
    order = np.argsort(positions, kind="stable")
    pieces, start = [], 0
    for i in order:
        pieces += [filler[start : positions[i]], needles[i]]
        start = positions[i]
    pieces.append(filler[start:])
    return np.concatenate(pieces), order


def with_questions(
    haystack: np.ndarray, tail: Sequence[tuple[Sequence[int], np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The haystack followed by each (question, answer) pair; only the answers are scored."""
    pieces = [(np.asarray(haystack), False)]
    for question, answer in tail:
        pieces += [(np.asarray(question, dtype=np.int64), False), (np.asarray(answer), True)]
    seq = np.concatenate([tokens for tokens, _ in pieces])
    scored = np.concatenate([np.full(len(tokens), is_answer) for tokens, is_answer in pieces])
    return seq, scored


# --- needles filed under keys: passkey and the niah_* tasks -------------------------------------------


@dataclass
class NeedleTask(RetrievalTask):
    """Numbers filed under keys: needles ``SEP key d1..dk``, questions ``SEP key``, answers the numbers.

    ``num_keys`` distinct keys (from the ``key_vocab`` symbols after the digits) each file ``num_values``
    numbers; ``num_queries`` of the keys are asked, in random order, each answered by its numbers in
    the order they appear. A lone key is left out of needles and questions (with one key there is
    nothing to tell apart), which makes one key, one value and one query the passkey task. Passkey
    fixes these four and the sentence filler as the class attributes below; the ``niah_*`` tasks make
    them settings (passkey has no such settings, so its recorded data fingerprint stays as it was).
    """

    num_keys = 1
    num_values = 1
    num_queries = 1
    key_vocab = 0

    def check(self) -> None:
        for key in ("num_keys", "num_values", "num_queries"):
            positive(f"data.{key}", getattr(self, key))
        if self.num_queries > self.num_keys:
            raise ConfigError(f"data.num_queries={self.num_queries} exceeds data.num_keys={self.num_keys}: "
                              "each query asks a different key")
        if self.num_keys > 1 and self.key_vocab < self.num_keys:
            raise ConfigError(
                f"data.key_vocab={self.key_vocab} is too small for data.num_keys={self.num_keys} distinct keys"
            )
        super().check()

    @property
    def named(self) -> bool:
        """Whether needles and questions name their key."""
        return self.num_keys > 1

    def reserved_symbols(self) -> dict[str, int]:
        return {"data.base": self.base, **({"data.key_vocab": self.key_vocab} if self.named else {})}

    def length_settings(self) -> dict[str, int]:
        counts = {f"data.{k}": getattr(self, k) for k in ("num_keys", "num_values", "num_queries")}
        return {"data.digits": self.digits, **{k: v for k, v in counts.items() if v > 1}}

    @property
    def min_length(self) -> int:
        ask = 1 + self.named  # SEP, then the key where there are several
        needles = self.num_keys * self.num_values * (ask + self.digits)
        return needles + self.num_queries * ask + self.answer_tokens

    @property
    def answer_tokens(self) -> int:
        return self.num_queries * self.num_values * self.digits

    def draw(self, rng, length, tok, depth):
        n_keys, n_values = self.num_keys, self.num_values
        keys = self.base + rng.choice(self.key_vocab, size=n_keys, replace=False) if self.named else None
        numbers = rng.integers(0, self.base, size=(n_keys * n_values, self.digits))  # passkey: its number, drawn first
        asked = rng.choice(n_keys, size=self.num_queries, replace=False) if self.named else np.zeros(1, int)

        def ask(key: int) -> list[int]:
            return [tok.sep_id, *([keys[key]] if self.named else [])]

        owner = np.repeat(np.arange(n_keys), n_values)  # needle i files numbers[i] under key owner[i]
        needles = [np.concatenate([ask(k), number]) for k, number in zip(owner, numbers)]
        n_filler = length - self.min_length
        wanted = np.isin(owner, asked)
        positions = np.empty(len(needles), int)
        needed = answer_positions(rng, n_filler, int(wanted.sum()), depth)
        positions[wanted] = rng.permutation(needed) if len(needed) > 1 else needed  # any asked needle may be the first
        positions[~wanted] = uniform_positions(rng, n_filler, int((~wanted).sum()))
        haystack, appearance = lay_out(self.draw_filler(rng, n_filler), needles, positions)
        filed = [appearance[owner[appearance] == k] for k in asked]  # each asked key's needles, as they appear
        return with_questions(haystack, [(ask(k), numbers[mine].ravel()) for k, mine in zip(asked, filed)])


# --- the grid ----------------------------------------------------------------------------------------


def retrieval_grid(
    forward: Forward,
    cfg: RetrievalTask,
    lengths: Sequence[int],
    depths: Sequence[float],
    n_per_cell: int,
    batch_size: int,
    *,
    seed: int = 0,
    plot_path: Optional[Path] = None,
) -> dict:
    """Retrieval accuracy per (depth, length) cell with 95% intervals, JSON-ready; rows are depths.

    ``accuracy`` is per answer token, its interval a percentile bootstrap over the cell's examples
    (each example one block of ``lmzoo.stats.bootstrap``: its answer tokens stand or fall together).
    ``answer_accuracy`` counts an example as retrieved when all its answer tokens are predicted; its
    interval is Wilson's, because examples are independent trials and cells at 0 or 1, common here,
    would get a zero-width bootstrap interval. ``plot_path``: where the heat map goes.
    """
    for length in lengths:
        cfg.check_length(length)
    correct = np.array([[answers_correct(forward, cfg.examples_at(length, depth, n_per_cell, seed=seed), batch_size)
                         for length in lengths] for depth in depths])  # (depths, lengths, examples)
    count = np.full(n_per_cell, cfg.answer_tokens)
    token = [[metric_interval(cell, count) for cell in row] for row in correct]
    answer = [[wilson_interval(int((cell == cfg.answer_tokens).sum()), n_per_cell) for cell in row] for row in correct]
    result = {
        "task": cfg.source,
        "lengths": [int(n) for n in lengths],
        "depths": [float(d) for d in depths],
        "train_len": cfg.seq_len,
        "examples_per_cell": n_per_cell,
        "answer_tokens": cfg.answer_tokens,
        "chance": cfg.chance,
        "accuracy": [[ci.estimate for ci in row] for row in token],
        "accuracy_ci": [[ci.bounds() for ci in row] for row in token],
        "answer_accuracy": [[ci.estimate for ci in row] for row in answer],
        "answer_accuracy_ci": [[ci.bounds() for ci in row] for row in answer],
        "intervals": {"level": LEVEL, "accuracy": "bootstrap over examples", "answer_accuracy": "Wilson"},
    }
    if plot_path is not None:
        result["plot"] = str(heat_map(result, plot_path, depth_label=cfg.depth_label))
    return result


def answers_correct(forward: Forward, batch: dict[str, np.ndarray], batch_size: int) -> np.ndarray:
    """Scored (answer) tokens each example's greedy predictions get right: ``[n]``."""
    hits = []
    for start in range(0, len(batch["inputs"]), batch_size):
        rows = slice(start, start + batch_size)
        predicted = np.asarray(forward(batch["inputs"][rows])).argmax(-1)  # (b, T)
        hits.append(((predicted == batch["targets"][rows]) * batch["weights"][rows]).sum(-1))
    return np.concatenate(hits)


def wilson_interval(successes: int, trials: int, level: float = LEVEL) -> Interval:
    """Wilson's score interval for a binomial proportion: never empty, and inside [0, 1]."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / trials
    centre = (p + z**2 / (2 * trials)) / (1 + z**2 / trials)
    half = z / (1 + z**2 / trials) * np.sqrt(p * (1 - p) / trials + z**2 / (4 * trials**2))
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


# --- the heat map ------------------------------------------------------------------------------------


def heat_map(grid: dict, path: Path, *, depth_label: str = RetrievalTask.depth_label) -> Path:
    """Two panels over depth (y) and length (x, log): accuracy per answer token and whole answers right,
    numbers in the cells, the training length outlined in red."""
    from lmzoo import plots  # matplotlib only once a plot is drawn: importing lmzoo.data stays light

    size = (2.4 * len(grid["lengths"]) + 4, 0.5 * len(grid["depths"]) + 2.5)
    fig, (tokens, answers) = plots.plt.subplots(1, 2, figsize=size)
    draw_cells(fig, tokens, grid, "accuracy", f"accuracy per answer token (chance {grid['chance']:.2g})")
    tokens.set(xlabel="length (tokens)", ylabel=depth_label)
    plots.label_log_axis(tokens, grid["lengths"])
    draw_cells(fig, answers, grid, "answer_accuracy", "answer accuracy (every answer token right)")
    fig.suptitle(f"{grid['task']}: {grid['examples_per_cell']} examples per cell, {grid['answer_tokens']} answer "
                 f"tokens each; training length ({grid['train_len']}) outlined in red")
    return plots.save_axes(fig, answers, Path(path), xticks=grid["lengths"], xlabel="length (tokens)")


def draw_cells(fig, ax, grid: dict, key: str, label: str) -> None:
    lengths, depths = np.array(grid["lengths"], float), np.array(grid["depths"], float)
    values = np.array(grid[key])  # (depths, lengths)
    x_edges, y_edges = np.exp(cell_edges(np.log(lengths))), cell_edges(depths)
    ax.set_axisbelow(True)  # save_axes's grid lines go under the cells, not across the numbers
    ax.set_xscale("log")
    mesh = ax.pcolormesh(x_edges, y_edges, values, cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(mesh, ax=ax, label=label)
    for (i, j), value in np.ndenumerate(values):
        colour = "black" if value > 0.6 else "white"  # readable on viridis' light and dark ends
        ax.text(lengths[j], depths[i], f"{value:.2f}", ha="center", va="center", fontsize=8, color=colour)
    if grid["train_len"] in grid["lengths"]:  # named in the title: a legend beside would cover the colour bar
        outline_column(ax, x_edges, y_edges, grid["lengths"].index(grid["train_len"]))
    ax.set_yticks(depths)
    ax.set_ylim(y_edges[-1], y_edges[0])  # depth 0 (needle first) at the top, as the text reads


def outline_column(ax, x_edges: np.ndarray, y_edges: np.ndarray, column: int) -> None:
    from matplotlib.patches import Rectangle

    corner = (x_edges[column], y_edges[0])
    width, height = x_edges[column + 1] - x_edges[column], y_edges[-1] - y_edges[0]
    ax.add_patch(Rectangle(corner, width, height, fill=False, edgecolor="red", linewidth=2))


def cell_edges(centres: np.ndarray) -> np.ndarray:
    """Edges of cells around sorted ``centres``: midpoints between them, half a gap beyond the ends."""
    if len(centres) == 1:
        return centres[0] + np.array([-0.5, 0.5])
    mid = (centres[1:] + centres[:-1]) / 2
    return np.concatenate([[2 * centres[0] - mid[0]], mid, [2 * centres[-1] - mid[-1]]])
