"""Every measurement of a run defined once: where it is kept, logged, written and shown.

A ``Measurement`` names its key in ``results.json`` (per evaluated length), its ``results.csv`` column, the key a
training run logs to ``metrics.jsonl`` and TensorBoard, its column in the comparison's tables and its figure.
``lmzoo.measure.outputs``, ``lmzoo.measure.comparison`` and ``lmzoo.run.loop`` read these tuples instead of
lists of their own, so a new attention probe is its row statistic (``lmzoo.scoring.sparsity``) and one entry of
``PROBES`` here.

The tuples' order is the order of the columns: ``SCORES`` then ``PROBES`` in ``results.csv``; in the comparison
table the probes' columns, then the scores read from the training log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from lmzoo.scoring.sparsity import attention_entropy, first_key_share, l1_l2_sparsity


@dataclass(frozen=True)
class Figure:
    """A probe's figure against evaluation length: per layer in one run's evaluation, per arm in a comparison."""

    stem: str  # <stem>.png, in eval/<tag>/ and in the comparison's folder
    subject: str  # the titles' first words
    run_ylabel: str  # one run's evaluation: the mean over heads of each layer
    arms_ylabel: str  # a comparison: the mean over layers and heads of each arm


@dataclass(frozen=True)
class Measurement:
    """One measurement and every name it goes by.

    ``name`` is its key in ``results.json``'s ``lengths`` (a probe: ``[layer][head]``, and ``<name>_by_position``
    in ``per_position``). ``None`` in a field: the measurement is not shown there."""

    name: str
    csv: Optional[str] = None  # results.csv column (of a probe: its mean over layers and heads)
    interval: bool = False  # results.json has <name>_ci, written as the columns <csv>_lo and <csv>_hi
    logged: Optional[str] = None  # the training run's validation key in metrics.jsonl (a probe's mean)
    per_layer: bool = False  # a probe the training run also logs per layer, as probe/<name>/layer<i>
    tensorboard: bool = False  # lmzoo.eval writes eval/<tag>/<name>_vs_length (probes: wherever probed)
    table: Optional[str] = None  # comparison-table column (a probe: at the training length)
    spec: str = ".3f"  # format of its table cells
    difference: Optional[str] = None  # a probe's column in the differences to a baseline: "Δ <difference>@..."
    difference_by_length: bool = False  # that difference also at the longest evaluated length
    row_statistic: Optional[Callable] = None  # a probe's (weights, visible) -> value per attention row
    figure: Optional[Figure] = None

    @property
    def is_probe(self) -> bool:
        return self.row_statistic is not None


# What the scorer sums per block (``lmzoo.scoring.lengths``): ``LengthScores.summary`` and ``length_intervals``.
SCORES = (
    Measurement("loss", csv="loss", logged="val_loss", tensorboard=True),
    Measurement("bpb", csv="bpb", interval=True, logged="val_bpb", tensorboard=True),
    Measurement("ppl", logged="val_ppl"),
    Measurement("ratio", csv="ratio", interval=True),
    Measurement("accuracy", csv="accuracy", logged="val_accuracy", table="accuracy"),
)

# The attention probes (``lmzoo.scoring.probes``), on the first windows of each length.
PROBES = (
    Measurement("sparsity", csv="mean_sparsity", logged="val_sparsity", per_layer=True, tensorboard=True,
                table="mean S", difference="mean S", difference_by_length=True, row_statistic=l1_l2_sparsity,
                figure=Figure("sparsity_vs_length", "Attention sparsity", "mean row sparsity S (1 = uniform)",
                              "mean attention sparsity S (1 = uniform)")),
    Measurement("entropy", csv="mean_entropy", logged="val_entropy", per_layer=True, tensorboard=True,
                table="entropy", row_statistic=attention_entropy),
    Measurement("first_key", csv="mean_first_key", tensorboard=True, table="first key", difference="first key",
                difference_by_length=True, row_statistic=first_key_share),
)

MEASUREMENTS = SCORES + PROBES


def measurement(name: str) -> Measurement:
    """The measurement called ``name``."""
    return next(m for m in MEASUREMENTS if m.name == name)
