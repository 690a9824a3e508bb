"""The one scorer behind training-time validation and ``lmzoo.eval``: the same scored tokens at every length.

A data object hands out, per evaluated length, the windows that cover its validation budget
(``validation_windows``): for text, spans spread over the whole validation split, each as long as the
longest length (the lengths' least common multiple) and tiled by windows of every length, so every
length scores the same targets and only the context before each changes
(``lmzoo.data.validation_spans.spread_spans``; with ``eval.min_doc_tokens``, only spans inside documents at
least that long, so no window crosses a document boundary); for synthetic tasks, the same first examples
generated at each length. Every target carries its *unit*, the thing the fixed blocks are made of: its document (its
span, when the scored text is all one document), or its example. Units are numbered in stream order
and blocks are runs of whole units, so the bootstrap resamples documents, never pieces of one document
as if they were independent. The scorer sums, per block, the loss, the scored count and the correct
predictions, and per block and span of positions the loss and count. Those sums are all the bootstrap
of ``lmzoo.stats.bootstrap`` needs, and they stay small however large the budget is. The windows'
``sampling_keys()`` say in ``results.json`` which sampling made them (``sampling_note`` reads them back,
older results included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lmzoo.stats import bootstrap

# Host arrays inputs and targets [rows, L] (and segment_ids [rows, L] when the windows carry them)
# -> per target "loss" (nats) and "correct" (0/1), [rows, L].
Forward = Callable[..., dict]
BATCH_ARGUMENTS = ("inputs", "targets", "segment_ids")  # what a Forward takes of a batch, in order


def logit_scores(logits: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
    """Per target token of logits [B, T, V]: cross-entropy in nats, and whether the most likely token is right."""
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # (B, T)
    return {"loss": loss, "correct": (logits.argmax(-1) == targets).astype(jnp.float32)}


def token_scores(model, inputs: jax.Array, targets: jax.Array, segment_ids=None) -> dict[str, jax.Array]:
    """``logit_scores`` of the model's next-token predictions on ``inputs`` (documents kept apart by
    ``segment_ids`` when given)."""
    return logit_scores(model(inputs, segment_ids=segment_ids), targets)


def windows_per_batch(batch_tokens: int, length: int) -> int:
    """Windows of ``length`` scored together so that a batch holds about ``batch_tokens`` tokens."""
    return max(1, batch_tokens // length)


def position_spans(length: int, n_buckets: int) -> tuple[np.ndarray, list[int]]:
    """(bucket of each position ``[length]``, last position (1-based) of each bucket): ``n_buckets`` equal spans."""
    spans = np.array_split(np.arange(length), min(n_buckets, length))
    bucket_of = np.concatenate([np.full(len(span), i) for i, span in enumerate(spans)])
    return bucket_of, [int(span[-1]) + 1 for span in spans]


@dataclass
class LengthScores:
    """Sums over the fixed blocks of one evaluated length (float64, so no budget loses precision)."""

    length: int
    loss: np.ndarray  # (B,) summed nats of the scored targets
    count: np.ndarray  # (B,) scored targets
    correct: np.ndarray  # (B,) scored targets predicted right
    position_loss: np.ndarray  # (B, buckets)
    position_count: np.ndarray  # (B, buckets)
    positions: list[int]  # last position (1-based) of each bucket
    answers_only: bool  # a synthetic task: only some targets (the answers) are scored

    @classmethod
    def empty(cls, length: int, n_blocks: int, positions: list[int]) -> LengthScores:
        blocks, cells = np.zeros(n_blocks), np.zeros((n_blocks, len(positions)))
        return cls(length, blocks, blocks.copy(), blocks.copy(), cells, cells.copy(), positions, False)

    def add(self, scores: dict, weights: np.ndarray, block: np.ndarray, bucket: np.ndarray) -> None:
        """Add a batch: per target ``scores``, ``weights`` (0 where unscored), ``block`` and position ``bucket``."""
        loss = np.asarray(scores["loss"], np.float64) * weights  # (rows, L)
        correct = np.asarray(scores["correct"], np.float64) * weights
        for total, values in ((self.loss, loss), (self.count, weights), (self.correct, correct)):
            total += np.bincount(block.ravel(), values.ravel(), minlength=len(total))
        cell = (block * len(self.positions) + bucket).ravel()  # block and span of positions, flattened
        for total, values in ((self.position_loss, loss), (self.position_count, weights)):
            total += np.bincount(cell, values.ravel(), minlength=total.size).reshape(total.shape)

    @property
    def mean_loss(self) -> float:
        return float(self.loss.sum() / self.count.sum())

    @property
    def accuracy(self) -> float:
        return float(self.correct.sum() / self.count.sum())

    def summary(self, bits_per_nat: float) -> dict:
        """Loss (nats per scored target), bits per byte, perplexity and accuracy."""
        loss = self.mean_loss
        return {"loss": loss, "bpb": loss * bits_per_nat, "ppl": math.exp(min(loss, 50.0)), "accuracy": self.accuracy}

    def block_sums(self) -> dict:
        """What pairs this length with another length or run: ``{"loss", "count"[, "correct"]}`` per block."""
        sums = {"loss": self.loss, "count": self.count}
        if self.answers_only:
            sums["correct"] = self.correct
        return sums

    def bpb_interval(self, bits_per_nat: float, **bootstrap_args) -> bootstrap.Interval:
        return bootstrap.metric_interval(self.loss, self.count, scale=bits_per_nat, **bootstrap_args)

    def position_interval(self, **bootstrap_args) -> bootstrap.Interval:
        """Loss per bucket of positions with its band: ``[buckets]`` arrays."""
        return bootstrap.metric_interval(self.position_loss, self.position_count, **bootstrap_args)


def block_of_units(units: int, n_blocks: int) -> Callable[[np.ndarray], np.ndarray]:
    """Maps unit indices to their block: ``n_blocks`` contiguous blocks of ``units`` (``bootstrap.block_starts``),
    each a whole unit (a document, an example) or a run of whole units when there are more units than blocks."""
    starts = bootstrap.block_starts(units, n_blocks)
    return lambda unit: np.searchsorted(starts, unit, side="right") - 1


def padded_batches(windows, rows: int):
    """``(batch, real)`` for consecutive ``rows`` windows; the last batch is filled up with copies of the
    first window so every batch has one shape (one compilation), and ``real [rows]`` marks the rows that count."""
    for start in range(0, len(windows), rows):
        indices = np.arange(start, start + rows)
        real = indices < len(windows)
        yield windows(np.where(real, indices, 0)), real


def score_length(
    forward: Forward, windows, *, rows: int, blocks: int, n_buckets: int, on_batch: Optional[Callable] = None
) -> LengthScores:
    """Score every target of ``windows`` (one length), ``rows`` windows at a time, into block sums."""
    n_blocks = min(blocks, windows.units)
    block_of = block_of_units(windows.units, n_blocks)
    bucket_of, positions = position_spans(windows.length, n_buckets)
    scores = LengthScores.empty(windows.length, n_blocks, positions)
    for batch, real in padded_batches(windows, rows):
        weights = batch.get("weights", np.ones(batch["targets"].shape)) * real[:, None]  # (rows, L)
        arguments = [batch[name] for name in BATCH_ARGUMENTS if name in batch]
        scores.add(forward(*arguments), weights, block_of(batch["unit"]), bucket_of)
        scores.answers_only = "weights" in batch
        if on_batch:
            on_batch()
    return scores


def sampling_note(results: dict) -> str:
    """In words, how the targets of a ``results.json`` were chosen and what its blocks are made of. Results
    without a ``sampling`` key come from before it was recorded: they scored the first ``eval_tokens``
    targets of the split in blocks of consecutive targets, and are named so."""
    sampling = results.get("sampling")
    if sampling is None:
        return (f"the first {results.get('eval_tokens', '?')} validation targets, blocks of consecutive targets "
                "(results from before the sampling was recorded)")
    if sampling == "spread":
        return (f"{results['eval_tokens']} targets spread over {results['documents']} documents in spans of "
                f"{results['span']}, blocks of whole {results['block_unit']}s")
    if sampling == "long_documents":
        return (f"{results['eval_tokens']} targets in spans of {results['span']} inside {results['documents']} "
                f"documents of at least {results['scored_documents_of_at_least']} tokens (no window crosses a "
                f"document boundary), blocks of whole {results['block_unit']}s")
    if sampling == "examples":
        return f"{results['examples']} independent examples, blocks of whole examples"
    return f"sampling {sampling!r}"
