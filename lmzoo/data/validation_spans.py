"""Which validation targets a text corpus scores, and the windows of every length that tile them.

Validation scores ``N`` targets spread over the whole validation stream (``spread_spans``): spans of
``S`` targets, ``S`` the least common multiple of the evaluated lengths (the longest, for doubling
lengths), so windows of every length tile every span and every length scores the same targets; only
the context each target sees changes with the window length. The budget is spread evenly over the
documents: each document weighs the smaller of its size and a common level, the level at which the
weights add up to ``N``, and the spans are evenly spaced in that weight. Short documents are scored
whole, long ones in evenly spaced spans, and no document takes more than about an equal share, while a
budget as large as the split scores all of it. Each scored target carries its document, the unit the
bootstrap's blocks are made of (``lmzoo.scoring.lengths``); a split whose scored targets all lie in one
document falls back to its spans as units. With a minimum document length (``eval.min_doc_tokens``,
``long_document_spans``) every span lies inside one document at least that long (and at least ``S``), so no
window crosses a document boundary and every input at position ``p`` has ``p`` tokens of its own document
before it; the spans are still tiled by every length, so every length still scores the same targets.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from lmzoo.data.base import Batch
from lmzoo.data.token_windows import document_ids, gather_windows


def scored_targets(available: int, budget: Optional[int], lengths: Sequence[int]) -> int:
    """Targets scored at every length: the budget (None: all ``available``) rounded down to fill whole
    windows of every length (a multiple of their least common multiple, the longest for powers of two)."""
    step = math.lcm(*lengths)
    n_targets = min(budget or available, available) // step * step
    if n_targets == 0:
        asked = budget or available
        raise ValueError(f"a budget of {asked} validation tokens (of {available}) fills no window of {step}")
    return n_targets


def water_level(sizes: np.ndarray, total: float) -> float:
    """The level ``c`` at which ``sum(min(sizes, c)) == total`` (``total <= sum(sizes)``): what each document
    may weigh when ``total`` is shared as evenly as the documents' sizes allow."""
    ordered = np.sort(np.asarray(sizes, dtype=np.float64))
    smaller = np.concatenate([[0.0], np.cumsum(ordered)[:-1]])  # total size of the documents below each
    levels = (total - smaller) / (len(ordered) - np.arange(len(ordered)))  # if this and all larger ones are capped
    return float(levels[np.argmax(levels <= ordered)])


def spread_starts(sizes: np.ndarray, n_spans: int, span: int) -> np.ndarray:
    """First target index of each of ``n_spans`` non-overlapping spans of ``span`` targets over documents of
    ``sizes`` targets (in stream order), spread evenly over the documents.

    Each document weighs ``min(size, level)`` (``water_level``: the weights add up to the scored targets), and
    the spans start every ``span`` of weight, mapped linearly into each document's targets. A document below
    the level is covered end to end (but for less than a span at its start, where a span of a longer document
    before it ends short of it); one above it gets spans evenly spaced through it, about ``level`` targets in
    all. The map from weight to targets never shrinks distances, so spans a ``span`` of weight apart never
    overlap (the clamps below only absorb rounding)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    weights = np.minimum(sizes, water_level(sizes, n_spans * span))
    weight_edges = np.concatenate([[0.0], np.cumsum(weights)])
    target_edges = np.concatenate([[0], np.cumsum(sizes)])
    points = np.arange(n_spans, dtype=np.float64) * span
    document = np.minimum(np.searchsorted(weight_edges, points, side="right") - 1, len(sizes) - 1)
    stretch = sizes[document] / np.maximum(weights[document], 1e-12)
    starts = np.floor(target_edges[document] + (points - weight_edges[document]) * stretch).astype(np.int64)
    offsets = np.arange(n_spans, dtype=np.int64) * span
    starts = np.maximum.accumulate(starts - offsets) + offsets  # at least a span apart
    return np.minimum(starts, target_edges[-1] - (n_spans - np.arange(n_spans)) * span)  # the last ends in the split


@dataclass(frozen=True, eq=False)
class ScoredSpans:
    """Where validation is scored: spans of ``length`` targets starting at targets ``starts`` [K] (target ``t`` is
    stream token ``t + 1``), and the unit of every scored target, span by span (``unit`` [K * length]): its
    document, or its span when all scored targets lie in one document. Blocks are made of units."""

    starts: np.ndarray
    length: int
    unit: np.ndarray
    units: int
    block_unit: str  # "document" or "span"
    documents: int  # documents with at least one scored target
    largest_share: float  # the largest fraction of the scored targets that one document holds
    digest: str  # identifies the scored target tokens and their spans
    long_documents: Optional[dict] = None  # with a minimum document length: ``long_document_spans``'s record

    def results_keys(self) -> dict:
        """What ``results.json`` records about the scored text (``lmzoo.stats.bootstrap``)."""
        sampling = {"sampling": "spread"}
        if self.long_documents:
            sampling = {"sampling": "long_documents", **self.long_documents}
        return {**sampling, "span": self.length, "documents": self.documents,
                "block_unit": self.block_unit, "largest_document_share": round(self.largest_share, 4),
                "scored_digest": self.digest}


def spread_spans(tokens: np.ndarray, eos_id: int, lengths: Sequence[int], budget: Optional[int],
                 min_doc_tokens: Optional[int] = None) -> ScoredSpans:
    """The spans scored at every one of ``lengths`` in the validation stream ``tokens`` (``budget`` targets,
    None: all), spread over its documents (``spread_starts``); a document ends at its EOS. With
    ``min_doc_tokens``, each span lies inside one document at least that long (``long_document_spans``)."""
    span = math.lcm(*lengths)
    document = document_ids(tokens[None], eos_id)[0, 1:].astype(np.int64)  # the document of each target
    long_documents = None
    if min_doc_tokens is None:
        n_spans = scored_targets(len(tokens) - 1, budget, lengths) // span
        starts = spread_starts(np.bincount(document), n_spans, span)
    else:
        starts, long_documents = long_document_spans(tokens, eos_id, lengths, budget, min_doc_tokens)
        n_spans = len(starts)
    scored = (starts[:, None] + np.arange(span)).ravel()
    present, unit = np.unique(document[scored], return_inverse=True)
    block_unit = "document"
    if len(present) < 2:
        if n_spans < 2:
            raise ValueError(f"a budget of {budget} validation tokens scores one span of {span} targets, in one "
                             "document: an interval needs two blocks (a larger budget or shorter lengths)")
        unit, block_unit = np.repeat(np.arange(n_spans), span), "span"
    digest = hashlib.sha256(starts.tobytes() + tokens[scored + 1].astype(np.int32).tobytes()).hexdigest()[:16]
    largest = np.bincount(document[scored]).max() / len(scored)
    return ScoredSpans(starts, span, unit, int(unit.max()) + 1, block_unit, len(present), float(largest), digest,
                       long_documents)


def document_extents(tokens: np.ndarray, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(first stream index, tokens before its EOS) of every document of ``tokens``. A document of ``n`` such
    tokens holds windows of up to ``n`` inputs whose targets (its own tokens, then its EOS) all follow
    inputs of the same document."""
    ends = np.flatnonzero(tokens == eos_id)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    return starts, ends - starts


def share_spans(capacity: np.ndarray, n_spans: int) -> np.ndarray:
    """Spans per document: ``n_spans`` (at most ``capacity.sum()``) shared as evenly as the documents'
    ``capacity`` allows, the integer form of ``water_level``. Every document gets ``min(capacity, level)``
    at the largest level that does not overshoot; the few spans left go one each to documents with room
    left, evenly spaced among them in stream order."""
    low, high = 0, int(capacity.max())
    while low < high:  # the largest level whose shares fit in n_spans
        level = (low + high + 1) // 2
        low, high = (level, high) if np.minimum(capacity, level).sum() <= n_spans else (low, level - 1)
    share = np.minimum(capacity, low)
    rest = n_spans - int(share.sum())
    room = np.flatnonzero(capacity > low)  # more than `rest` documents, or `low` was not the largest level
    share[room[np.arange(rest) * len(room) // max(rest, 1)]] += 1
    return share


def long_document_spans(tokens: np.ndarray, eos_id: int, lengths: Sequence[int], budget: Optional[int],
                        min_doc_tokens: int) -> tuple[np.ndarray, dict]:
    """(first target of every span, what ``results.json`` records) for spans that each lie inside one document
    of at least ``min_doc_tokens`` tokens, so every window of every length lies inside one document and the
    input at position ``p`` has ``p`` tokens of its own document before it.

    Spans are ``S`` (the lengths' least common multiple) long, so the scored documents are those of at least
    ``max(min_doc_tokens, S)`` tokens; a document of ``n`` tokens holds ``n // S`` spans, the budget is shared
    among the documents as evenly as that allows (``share_spans``), and a document's spans sit at the middles
    of equal parts of it. The record counts the documents long enough for each length alone. ValueError in one
    line for a length, span or minimum that no document reaches."""
    span = math.lcm(*lengths)
    starts, sizes = document_extents(tokens, eos_id)
    longest = int(sizes.max(initial=0))
    than = f"(the longest of the {len(sizes)} has {longest} tokens)"
    if min_doc_tokens > longest:
        raise ValueError(f"no validation document is {min_doc_tokens} tokens long {than}")
    for length in lengths:
        if length > longest:
            raise ValueError(f"no validation document holds a window of {length} {than}")
    if span > longest:
        raise ValueError(f"no validation document holds a span of {span}, the lengths' least common multiple {than}: "
                         "evaluate lengths that divide the longest")
    required = max(min_doc_tokens, span)
    capacity = np.where(sizes >= required, sizes // span, 0)
    n_spans = scored_targets(int(capacity.sum()) * span, budget, lengths) // span
    share = share_spans(capacity, n_spans)
    document = np.repeat(np.arange(len(sizes)), share)
    part = sizes[document] / share[document]  # at least a span: share <= capacity
    nth = np.arange(n_spans) - np.repeat(np.cumsum(share) - share, share)  # the span's place in its document
    span_starts = starts[document] + np.floor((nth + 0.5) * part - span / 2).astype(np.int64)
    record = {"min_doc_tokens": min_doc_tokens, "scored_documents_of_at_least": required,
              "qualifying_documents": {str(n): int((sizes >= max(min_doc_tokens, n)).sum()) for n in lengths}}
    return span_starts, record


class ValidationWindows:
    """Windows of ``length`` tiling the scored spans: window ``k`` is piece ``k % (S / length)`` of span
    ``k // (S / length)``, so every length that divides the span length ``S`` scores the same targets, each
    once. A batch's ``unit`` [rows, length] gives each target's unit (``ScoredSpans``): fixed blocks of the
    scored targets are blocks of units, in stream order."""

    def __init__(self, tokens: np.ndarray, length: int, spans: ScoredSpans, eos_id: Optional[int] = None):
        if spans.length % length:
            raise ValueError(f"spans of {spans.length} scored targets do not fill windows of {length}")
        self.tokens, self.length, self.spans, self.eos_id = tokens, length, spans, eos_id
        self.pieces = spans.length // length  # windows per span
        self.units = spans.units

    def __len__(self) -> int:
        return len(self.spans.starts) * self.pieces

    def __call__(self, window_indices: np.ndarray) -> Batch:
        span, piece = np.divmod(np.asarray(window_indices, dtype=np.int64), self.pieces)
        batch = gather_windows(self.tokens, self.spans.starts[span] + piece * self.length, self.length, self.eos_id)
        first = span * self.spans.length + piece * self.length  # the window's first target among the scored ones
        batch["unit"] = self.spans.unit[first[:, None] + np.arange(self.length)]  # (rows, L)
        return batch

    def sampling_keys(self) -> dict:
        """The ``results.json`` keys that say which text was scored and what the blocks are made of."""
        return self.spans.results_keys()
