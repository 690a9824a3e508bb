"""Passkey retrieval (``data=passkey``): a number hidden in filler text, asked for at the end.

One example of ``L`` tokens (``H = L - 2 * (digits + 1)`` of them filler)::

    filler[:p]  SEP d1 .. dk  filler[p:H]  SEP d1 .. dk
                `- needle --'              `- question, then the answer (scored)

SEP plays the phrase "the pass key is" of the literature (Mohtashami & Jaggi, 2023): it
introduces the number in the needle and asks for it at the end. The number is ``digits`` symbols
drawn from the first ``base`` task symbols; the filler is the other symbols in order,
``base, base + 1, ..., task_vocab - 1``, repeated: a fixed sentence, as the repeated "The grass is
green. The sky is blue." of the literature.

Why a fixed sentence rather than random noise: the filler then carries no information, so the
number is the only thing in the context to remember, and answering needs exactly one skill,
fetching it back over the distance to the question. Noise would add a second one (holding the
number against a stream of fresh symbols, a capacity test that ``selective_copy`` already is) and
would make a longer context differ from a training one in more than distance. Digits never occur
in the filler, so the needle is unambiguous, and the task is an induction task: at the second
SEP, copy what followed the first (a tiny model learns the first digit long before the others).

The default training length is short on purpose: retrieval is learnt much faster when the needle
competes with fewer filler tokens (per-digit validation accuracy of the default model after 600
steps: 0.90 at length 32, 0.71 at length 64), and the evaluation grid reaches 16 times further.

Depth is ``p / H``: 0 puts the needle first, 1 right before the question. Training draws ``p``
uniformly. The number of example ``i`` is drawn before its depth, so ``examples_at`` gives example
``i`` the same number at every length and depth: the cells of a depth x length grid differ only in
where the needle sits and how far it is from the question.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Callable, Optional, Sequence

import numpy as np

from lmzoo.data.synthetic import VALIDATION, TaskConfig, TaskTokenizer
from lmzoo.metrics.intervals import LEVEL, Interval, metric_interval
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, positive

GRID_FACTORS = (1, 2, 4, 8, 16)  # default evaluated lengths, in training lengths
Forward = Callable[[np.ndarray], np.ndarray]  # tokens [B, T] -> logits [B, T, V]


@SOURCES.register("passkey")
@dataclass
class PasskeyConfig(TaskConfig):
    source: str = "passkey"
    seq_len: int = 32  # a short haystack: the default model learns the task on a CPU in minutes
    task_vocab: int = 16  # symbols 0 .. base - 1 are digits, the rest make the filler sentence
    digits: int = 5  # symbols in the number
    base: int = 10  # digit alphabet: chance is 1 / base per digit
    # The evaluation grid (extra_evaluation): relative depths of the needle, and examples per cell.
    grid_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    grid_examples: int = 32

    def check(self) -> None:
        super().check()
        positive("data.digits", self.digits)
        if self.base < 2:
            raise ConfigError(f"data.base={self.base} must be at least 2: a one-symbol number has nothing to retrieve")
        if self.task_vocab <= self.base:
            raise ConfigError(
                f"data.task_vocab={self.task_vocab} leaves no filler symbols: it must exceed data.base={self.base}"
            )
        if self.grid_examples < 2:
            raise ConfigError(f"data.grid_examples={self.grid_examples} must be at least 2 (intervals resample them)")
        if not all(0 <= d <= 1 for d in self.grid_depths):
            raise ConfigError(f"data.grid_depths={list(self.grid_depths)} must lie in [0, 1]")
        self.check_length(self.seq_len, "data.seq_len")

    @property
    def min_length(self) -> int:
        """Shortest model input; its example (one token longer) holds the needle, the question, the answer
        and one filler token."""
        return 2 * (self.digits + 1)

    def check_length(self, length: int, key: str = "length") -> None:
        if length < self.min_length:
            need = f"data.digits={self.digits} needs at least {self.min_length}"
            raise ConfigError(f"{key}={length} is too short for passkey: {need}")

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        return self.example_at(rng, length, tok, depth=None)

    def example_at(
        self, rng: np.random.Generator, length: int, tok: TaskTokenizer, depth: Optional[float]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One example of ``length`` tokens with the needle at relative ``depth`` (None: uniformly drawn)."""
        self.check_length(length - 1)
        if depth is not None and not 0 <= depth <= 1:
            raise ValueError(f"a passkey depth is relative: it lies in [0, 1], got {depth}")
        number = rng.integers(0, self.base, size=self.digits)  # first, so it does not depend on the depth
        n_filler = length - 2 * (self.digits + 1)
        at = rng.integers(0, n_filler + 1) if depth is None else round(depth * n_filler)
        filler = np.resize(np.arange(self.base, self.task_vocab), n_filler)
        needle = np.concatenate([[tok.sep_id], number])
        seq = np.concatenate([filler[:at], needle, filler[at:], needle])
        scored = np.zeros(length, bool)
        scored[length - self.digits :] = True
        return seq, scored

    def examples_at(self, length: int, depth: float, n: int, *, seed: int = 0) -> dict[str, np.ndarray]:
        """Validation examples ``0 .. n-1`` at input length ``length`` with the needle at ``depth``, as one batch."""
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
        """The depth x length grid at ``lengths`` (None: 1x to 16x the training length), its heat map
        written to ``out_dir/passkey.png``."""
        lengths = lengths or [self.seq_len * factor for factor in GRID_FACTORS]
        grid = passkey_grid(
            forward, self, lengths, self.grid_depths, self.grid_examples, batch_size,
            seed=seed, plot_path=Path(out_dir) / "passkey.png",
        )
        return {"passkey": grid}


def passkey_grid(
    forward: Forward,
    cfg: PasskeyConfig,
    lengths: Sequence[int],
    depths: Sequence[float],
    n_per_cell: int,
    batch_size: int,
    *,
    seed: int = 0,
    plot_path: Optional[Path] = None,
) -> dict:
    """Retrieval accuracy per (depth, length) cell with 95% intervals, JSON-ready; rows are depths.

    ``accuracy`` is per digit, its interval a percentile bootstrap over the cell's examples (each
    example one block of ``lmzoo.metrics.intervals``: its digits stand or fall together).
    ``answer_accuracy`` counts a number as retrieved when all its digits are predicted; its
    interval is Wilson's, because examples are independent trials and cells at 0 or 1, common
    here, would get a zero-width bootstrap interval. ``plot_path``: where the heat map goes.
    """
    for length in lengths:
        cfg.check_length(length)
    correct = np.array([[digits_correct(forward, cfg.examples_at(length, depth, n_per_cell, seed=seed), batch_size)
                         for length in lengths] for depth in depths])  # (depths, lengths, examples)
    count = np.full(n_per_cell, cfg.digits)
    digit = [[metric_interval(cell, count) for cell in row] for row in correct]
    answer = [[wilson_interval(int((cell == cfg.digits).sum()), n_per_cell) for cell in row] for row in correct]
    result = {
        "lengths": [int(n) for n in lengths],
        "depths": [float(d) for d in depths],
        "train_len": cfg.seq_len,
        "examples_per_cell": n_per_cell,
        "chance": 1 / cfg.base,
        "accuracy": [[ci.estimate for ci in row] for row in digit],
        "accuracy_ci": [[ci.bounds() for ci in row] for row in digit],
        "answer_accuracy": [[ci.estimate for ci in row] for row in answer],
        "answer_accuracy_ci": [[ci.bounds() for ci in row] for row in answer],
        "intervals": {"level": LEVEL, "accuracy": "bootstrap over examples", "answer_accuracy": "Wilson"},
    }
    if plot_path is not None:
        result["plot"] = str(heat_map(result, plot_path))
    return result


def digits_correct(forward: Forward, batch: dict[str, np.ndarray], batch_size: int) -> np.ndarray:
    """Answer digits each example's greedy predictions get right: ``[n]``."""
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


def heat_map(grid: dict, path: Path) -> Path:
    """Answer accuracy over needle depth (y) and length (x, log), numbers in the cells, the training length outlined."""
    from lmzoo import plots  # matplotlib only once a plot is drawn: importing lmzoo.data stays light

    lengths, depths = np.array(grid["lengths"], float), np.array(grid["depths"], float)
    accuracy = np.array(grid["answer_accuracy"])  # (depths, lengths)
    x_edges, y_edges = np.exp(cell_edges(np.log(lengths))), cell_edges(depths)
    fig, ax = plots.new_axes((1.2 * len(lengths) + 2, 0.5 * len(depths) + 2))
    ax.set_axisbelow(True)  # save_axes's grid lines go under the cells, not across the numbers
    ax.set_xscale("log")
    mesh = ax.pcolormesh(x_edges, y_edges, accuracy, cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(mesh, ax=ax, label="answer accuracy")
    for (i, j), value in np.ndenumerate(accuracy):
        colour = "black" if value > 0.6 else "white"  # readable on viridis' light and dark ends
        ax.text(lengths[j], depths[i], f"{value:.2f}", ha="center", va="center", fontsize=8, color=colour)
    if grid["train_len"] in grid["lengths"]:
        column = grid["lengths"].index(grid["train_len"])
        outline_column(ax, x_edges, y_edges, column, label=f"training length ({grid['train_len']})")
    ax.set_yticks(depths)
    ax.set_ylim(y_edges[-1], y_edges[0])  # depth 0 (needle first) at the top, as the text reads
    title = f"passkey retrieval, {grid['examples_per_cell']} examples per cell"
    return plots.save_axes(fig, ax, Path(path), xticks=grid["lengths"], xlabel="length (tokens)",
                           ylabel="needle depth (0: first, 1: last)", title=title)


def outline_column(ax, x_edges: np.ndarray, y_edges: np.ndarray, column: int, label: str) -> None:
    from matplotlib.patches import Rectangle

    corner = (x_edges[column], y_edges[0])
    width, height = x_edges[column + 1] - x_edges[column], y_edges[-1] - y_edges[0]
    ax.add_patch(Rectangle(corner, width, height, fill=False, edgecolor="red", linewidth=2, label=label))


def cell_edges(centres: np.ndarray) -> np.ndarray:
    """Edges of cells around sorted ``centres``: midpoints between them, half a gap beyond the ends."""
    if len(centres) == 1:
        return centres[0] + np.array([-0.5, 0.5])
    mid = (centres[1:] + centres[:-1]) / 2
    return np.concatenate([[2 * centres[0] - mid[0]], mid, [2 * centres[-1] - mid[-1]]])
