"""Confidence intervals for evaluation metrics: a bootstrap over fixed blocks of scored tokens.

Why blocks. Neighbouring tokens are not independent (they share a document, a function, a
topic), so resampling single tokens would give intervals that are far too narrow. Every scored
target belongs to a *unit*: its document (``lmzoo.data.validation_spans.spread_spans``: the ``N`` scored
targets are spans spread over every document of the validation split), its span when all of them
lie in one document, or its example for a synthetic task. The ``U`` units, in stream order, are
cut into ``B = min(eval.blocks, U)`` contiguous runs of whole units (``block_starts`` over units),
so a block is a document, or a group of whole documents when there are more documents than
blocks: one long file is one block, never many blocks resampled as if independent. Every length
evaluated scores the same ``N`` targets, and every run evaluated on the same data with the same
budget and lengths scores the same targets, so block ``b`` holds the same text at every length
and in every run.

What is bootstrapped. Each metric is a ratio of sums over blocks: mean loss is
``sum(loss) / sum(count)``, bits per byte is that times ``1 / (ln 2 * bytes per token)`` (a
constant of the data), accuracy is ``sum(correct) / sum(count)``. One bootstrap resample draws ``B`` block indices with
replacement and recomputes the metric from the drawn blocks' sums; the 95% interval is the
2.5th and 97.5th percentile of the metric over ``resamples`` draws (the percentile bootstrap).
Draws depend only on ``(B, resamples, seed)``, so intervals are reproducible for a fixed seed.

Paired intervals. A ratio ``metric@L / metric@L0`` (or a difference between two runs) is
computed inside each resample from the *same* drawn blocks for both terms: a hard stretch of
text raises both terms together and cancels, so the paired interval is much narrower than the
two separate intervals suggest, and the ratio of a run against itself is exactly ``[1, 1]``.

``results.json`` (written by ``lmzoo.eval`` into ``<run_dir>/eval/<tag>/``; read by
``lmzoo.compare``, which also reads files without the keys marked *new*; a file without
``sampling`` scored the first ``N`` targets of the split in blocks of consecutive targets, and
readers say so: ``lmzoo.scoring.lengths.sampling_note``)::

    {
      "variant": str, "tag": str, "train_seq_len": int, "step": int,
      "eval_tokens": int,                # new: N, scored target tokens, the same at every length
      "sampling": "spread" | "long_documents" | "examples",
                                         # spans spread over every document (text), or only over documents of at
                                         # least eval.min_doc_tokens, each span inside one; the first examples (tasks)
      "min_doc_tokens": int,             # long_documents: the setting
      "scored_documents_of_at_least": int,   # long_documents: max(min_doc_tokens, span), the documents scored
      "qualifying_documents": {"<L>": int},  # long_documents: validation documents of at least max(n, L) tokens
      "span": int,                       # text: S targets per span, the lengths' least common multiple
      "documents": int,                  # text: validation documents holding at least one scored target
      "block_unit": str,                 # what blocks are made of: "document", "span" (a one-document split), "example"
      "largest_document_share": float,   # text: the largest fraction of the N targets in one document
      "scored_digest": str,              # text: hash of the scored tokens and their spans; equal: the same text
      "examples": int,                   # synthetic tasks: examples scored
      "blocks": int,                     # new: B, blocks of whole units (block_starts over the units)
      "bootstrap": {"resamples": int, "seed": int, "level": 0.95},          # new
      "lengths": {
        "<L>": {
          "loss": float,                 # nats per scored token
          "bpb": float,                  # bits per byte: loss / (ln 2 * bytes per token)
          "ppl": float, "accuracy": float,
          "sparsity": [[...]], "entropy": [[...]],   # optional: per layer, per head
          "first_key": [[...]],          # optional: the share of each row's weight on its first key
          # new, all written by length_intervals(block sums at L, block sums at L0, ...):
          "tokens": int,                 # scored targets at L: sum of count; the same at every L
          "bpb_ci": [lo, hi],            # metric_interval(loss, count, scale=bits_per_nat)
          "ratio": float,                # bpb@L / bpb@train_seq_len (exactly 1.0 at the training length)
          "ratio_ci": [lo, hi],          # paired_ratio_interval(loss@L, count@L, loss@L0, count@L0)
          "accuracy_ci": [lo, hi]        # synthetic tasks only: metric_interval(correct, count)
        }
      },
      "per_position": {
        "<L>": {
          "positions": [int, ...],       # last position (1-based) of each bucket of positions
          "loss": [float, ...],          # sum of loss / sum of count over the bucket's positions
          "loss_ci": [[lo, ...], [hi, ...]],         # new: metric_interval(loss [B, buckets], count [B, buckets])
          "sparsity": [...], "entropy": [...], "first_key": [...]   # optional, per bucket
        }
      },
      "block_sums": {                    # new: what lets compare pair two runs on the same blocks
        "<L>": {"loss": [B floats], "count": [B numbers], "correct": [B numbers]}   # correct: synthetic tasks
      }
    }

Every interval in one ``results.json`` uses the same ``bootstrap`` settings, so all of them are
computed from the same block draws. ``L0`` is ``train_seq_len``; it must be among the lengths.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import numpy as np

from lmzoo.stats.uncertainty import LEVEL, Estimate

Interval = Estimate  # the bootstrap's point estimate and percentile interval (text only), scalars or curves
RESAMPLES = 1000
SEED = 0
# Blocks must be numerous enough for stable 2.5% tails and long compared with the span over which
# text difficulty is correlated; 100 blocks of a 2^18-token budget hold about 2,600 tokens each.
BLOCKS = 100
# Gathered draws are summed a slice of resamples at a time so that curves (blocks x positions)
# never materialise resamples x blocks x positions floats at once.
_GATHER_FLOATS = 1 << 23


def block_starts(n_tokens: int, n_blocks: int) -> np.ndarray:
    """First token index of each of ``n_blocks`` contiguous, near-equal blocks of ``n_tokens`` scored tokens."""
    if not 1 <= n_blocks <= n_tokens:
        raise ValueError(f"cannot cut {n_tokens} scored tokens into {n_blocks} blocks (need 1 <= blocks <= tokens)")
    return np.arange(n_blocks) * n_tokens // n_blocks


def block_sums(per_token: np.ndarray, n_blocks: int) -> np.ndarray:
    """Sum per-token values ``[N, ...]`` (in scored-token order) over the fixed blocks: ``[n_blocks, ...]``."""
    per_token = np.asarray(per_token, dtype=np.float64)
    return np.add.reduceat(per_token, block_starts(len(per_token), n_blocks), axis=0)


def draws(n_blocks: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Block indices of every resample, ``[resamples, n_blocks]``; a function of its arguments only."""
    if n_blocks < 2:
        raise ValueError(f"a bootstrap over blocks needs at least 2 blocks, got {n_blocks}")
    if resamples < 1:
        raise ValueError(f"resamples must be positive, got {resamples}")
    return np.random.default_rng(seed).integers(n_blocks, size=(resamples, n_blocks))


def resampled_sums(blocks: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """``blocks [B, ...]`` summed over each resample's drawn blocks: ``[resamples, ...]``."""
    step = max(1, _GATHER_FLOATS // (blocks[0].size * drawn.shape[1]))
    return np.concatenate([blocks[drawn[i : i + step]].sum(axis=1) for i in range(0, len(drawn), step)])


def bootstrap(
    statistic: Callable[..., np.ndarray],
    blocks: Sequence[np.ndarray],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> Interval:
    """Percentile interval of ``statistic`` of block sums, every array resampled with the same draws.

    ``blocks`` are arrays ``[B, ...]`` of per-block sums over the same B blocks. ``statistic``
    receives one array of sums per block array, each with a leading resample axis, and returns
    the metric per resample; it is called once more on the full sums for the point estimate.
    Resamples where the statistic is NaN (e.g. all drawn blocks unscored) are left out.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    blocks = [np.asarray(b, dtype=np.float64) for b in blocks]
    n_blocks = len(blocks[0])
    if any(len(b) != n_blocks for b in blocks):
        raise ValueError(f"paired block sums must cover the same blocks, got lengths {[len(b) for b in blocks]}")
    drawn = draws(n_blocks, resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):  # an unscored entry is NaN, not an error
        estimate = statistic(*[b.sum(axis=0, keepdims=True) for b in blocks])[0]
        values = statistic(*[resampled_sums(b, drawn) for b in blocks])  # (resamples, ...)
    tail = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an entry no resample scored (a position never scored): NaN
        lo, hi = np.nanpercentile(values, [tail, 100 - tail], axis=0)
    return Interval(_plain(estimate), _plain(lo), _plain(hi), level=level)


def _plain(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else np.asarray(x)


def ratio_of_sums(numerator: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The metric of mean loss and accuracy: ``sum(numerator) / sum(count)`` from summed blocks."""
    return numerator / count


def ratio_to_reference(numerator, count, numerator_ref, count_ref) -> np.ndarray:
    """The metric of extrapolation, ``bpb@L / bpb@L0``: one ratio of sums over another."""
    return (numerator / count) / (numerator_ref / count_ref)


def _check_counts(count: np.ndarray) -> None:
    count = np.asarray(count)
    if (count < 0).any():
        raise ValueError("token counts must be non-negative")
    if not count.any():
        raise ValueError("no scored tokens: every block's count is zero")


def metric_interval(numerator, count, *, scale: float = 1.0, **bootstrap_args) -> Interval:
    """``scale * sum(numerator) / sum(count)`` with its interval.

    Mean loss: ``(loss, count)``; bits per byte: ``(loss, count, scale=1 / (ln 2 * bytes per token))``;
    accuracy: ``(correct, count)``. With ``[B, P]`` arrays (per-block sums per position bucket) it returns
    the curve and its band; a bucket with no scored token is NaN.
    """
    _check_counts(count)
    return bootstrap(lambda n, c: scale * ratio_of_sums(n, c), [numerator, count], **bootstrap_args)


def paired_ratio_interval(numerator, count, numerator_ref, count_ref, **bootstrap_args) -> Interval:
    """``metric / metric_ref`` on the same blocks (metric = sum(numerator) / sum(count)), paired.

    The extrapolation ratio ``bpb@L / bpb@L0`` is ``(loss@L, count@L, loss@L0, count@L0)``; the
    bits-per-byte factor cancels. Identical inputs give exactly ``Interval(1, 1, 1)``.
    """
    _check_counts(count)
    _check_counts(count_ref)
    return bootstrap(ratio_to_reference, [numerator, count, numerator_ref, count_ref], **bootstrap_args)


def paired_difference_interval(
    runs: Sequence[Sequence[np.ndarray]],
    baselines: Sequence[Sequence[np.ndarray]],
    metric: Callable[..., np.ndarray] = ratio_of_sums,
    **bootstrap_args,
) -> Interval:
    """Mean over pairs ``i`` of ``metric(*runs[i]) - metric(*baselines[i])``, all on the same blocks.

    Each run is the tuple of block arrays ``metric`` takes, e.g. ``(loss, count)`` for
    ``ratio_of_sums``. Pairs are runs with the same seed (one pair for single runs); every array of
    every run is resampled with the same draws, so the interval reflects the text once, not
    once per run. A difference whose interval excludes zero is one the data support.
    """
    if len(runs) != len(baselines) or not runs:
        raise ValueError(f"need one baseline per run, got {len(runs)} runs and {len(baselines)} baselines")
    width = len(runs[0])
    flat = [array for run in (*runs, *baselines) for array in run]

    def statistic(*sums):
        values = [metric(*sums[i : i + width]) for i in range(0, len(sums), width)]
        return np.mean([a - b for a, b in zip(values[: len(runs)], values[len(runs) :])], axis=0)

    return bootstrap(statistic, flat, **bootstrap_args)


def bits_per_nat(results: dict) -> float:
    """The bits-per-byte factor per nat of loss that an evaluation's ``results`` applied (at every length the same)."""
    at_train = results["lengths"][str(results["train_seq_len"])]
    return at_train["bpb"] / at_train["loss"]


def length_intervals(sums: dict, train_sums: dict, *, bits_per_nat: float, **bootstrap_args) -> dict:
    """The interval keys of ``results.json["lengths"]["<L>"]`` from the block sums at L and at the training length.

    ``sums`` and ``train_sums`` hold ``[B]`` arrays ``loss`` and ``count``, and ``correct`` for
    synthetic tasks (then ``accuracy_ci`` is added); ``bits_per_nat`` is ``1 / (ln 2 * bytes per token)``.
    """
    loss, count = sums["loss"], sums["count"]
    bpb = metric_interval(loss, count, scale=bits_per_nat, **bootstrap_args)
    ratio = paired_ratio_interval(loss, count, train_sums["loss"], train_sums["count"], **bootstrap_args)
    entry = {"tokens": int(np.sum(count)), "bpb_ci": bpb.bounds()}
    entry.update(ratio=ratio.estimate, ratio_ci=ratio.bounds())
    if "correct" in sums:
        entry["accuracy_ci"] = metric_interval(sums["correct"], count, **bootstrap_args).bounds()
    return entry
