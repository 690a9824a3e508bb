"""From documents to batches: token streams, windows, train and validation batches.

Each split becomes one int32 token stream (every document followed by EOS,
so the model learns where documents end). The stream is cut into
non-overlapping windows of ``seq_len + 1`` tokens taken every ``seq_len``
tokens, so every token is a prediction target exactly once; a final partial
window is dropped. A window gives ``inputs = w[:-1]`` and ``targets = w[1:]``.

With ``data.document_boundaries=mask`` a batch also carries ``segment_ids`` [rows, L]: the number of
EOS tokens before each input in its window, so each document (its closing EOS included) has its own
id and the model keeps documents apart; positions restart with each document (``lmzoo.model``).

With ``train.state_passing`` the training batches come from ``stream_iterator`` instead: row ``r`` of each
batch is the window right after row ``r``'s window in the batch before (``StreamLanes``), and ``continues``
[rows] says whether it follows on from it, so that a recurrent model can carry each row's state on.

Validation scores ``N`` targets spread over the whole validation stream (``spread_spans``): spans of
``S`` targets, ``S`` the least common multiple of the evaluated lengths (the longest, for doubling
lengths), so windows of every length tile every span and every length scores the same targets; only
the context each target sees changes with the window length. The budget is spread evenly over the
documents: each document weighs the smaller of its size and a common level, the level at which the
weights add up to ``N``, and the spans are evenly spaced in that weight. Short documents are scored
whole, long ones in evenly spaced spans, and no document takes more than about an equal share, while a
budget as large as the split scores all of it. Each scored target carries its document, the unit the
bootstrap's blocks are made of (``lmzoo.metrics.scoring``); a split whose scored targets all lie in one
document falls back to its spans as units. With a minimum document length (``eval.min_doc_tokens``,
``long_document_spans``) every span lies inside one document at least that long (and at least ``S``), so no
window crosses a document boundary and every input at position ``p`` has ``p`` tokens of its own document
before it; the spans are still tiled by every length, so every length still scores the same targets.

Multi-host data parallelism: batch sizes are always *global*. Every process
builds the same global batch and keeps the contiguous block of rows
``[shard_index * b, (shard_index + 1) * b)`` with ``b = batch_size //
shard_count``, so the global batch (and training) does not depend on the
number of processes, and the blocks line up with a batch axis sharded over
processes in order.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import grain
import numpy as np

from lmzoo.data.tokenizers import Tokenizer

Batch = dict[str, np.ndarray]

# A batch is one numpy gather, so a couple of threads and a short queue keep
# up with the accelerator; grain's defaults (16 threads, 500 batches queued)
# would hold gigabytes for large batches.
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)

# Documents are encoded this many at a time: large enough for the Hugging Face
# tokenizer's parallel batch encoding, small enough to bound its temporaries.
_ENCODE_CHUNK = 1024


def token_stream(documents: Sequence[bytes], tokenizer: Any) -> np.ndarray:
    """Concatenate the tokenised documents, each followed by EOS, into int32 ids."""
    eos = np.array([tokenizer.eos_id], dtype=np.int32)
    pieces = []
    for start in range(0, len(documents), _ENCODE_CHUNK):
        for ids in tokenizer.encode_batch(documents[start : start + _ENCODE_CHUNK]):
            pieces.append(ids)
            pieces.append(eos)
    if not pieces:
        return np.zeros((0,), dtype=np.int32)
    return np.concatenate(pieces).astype(np.int32, copy=False)


class TokenWindows:
    """A token stream seen as ``len(self)`` windows of ``seq_len + 1`` tokens.

    Grain shuffles and batches window *indices*; calling this object on a
    batch of indices gathers all its windows in one numpy indexing operation,
    which is far cheaper than assembling a batch window by window.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, eos_id: Optional[int] = None):
        if seq_len < 1:
            raise ValueError(f"data.seq_len must be positive, got {seq_len}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.eos_id = eos_id  # None: no segment ids

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __call__(self, window_indices: np.ndarray) -> Batch:
        starts = np.asarray(window_indices, dtype=np.int64) * self.seq_len
        return gather_windows(self.tokens, starts, self.seq_len, self.eos_id)


def gather_windows(tokens: np.ndarray, starts: np.ndarray, length: int, eos_id: Optional[int] = None) -> Batch:
    """The windows of ``length + 1`` tokens beginning at ``starts`` as ``inputs``/``targets`` [rows, length] (with
    ``eos_id``, also their ``segment_ids``), in one numpy gather."""
    windows = tokens[np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length + 1)]
    batch = {
        "inputs": np.ascontiguousarray(windows[:, :-1]),
        "targets": np.ascontiguousarray(windows[:, 1:]),
    }
    if eos_id is not None:
        batch["segment_ids"] = document_ids(batch["inputs"], eos_id)
    return batch


def document_ids(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """int32 [rows, L]: how many EOS tokens precede each input in its window (an EOS ends its document)."""
    ends = inputs == eos_id
    return (np.cumsum(ends, axis=1) - ends).astype(np.int32)


def _rows_per_process(batch_size: int, shard_count: int) -> int:
    if batch_size % shard_count:
        raise ValueError(f"batch size {batch_size} is not divisible by the number of data shards {shard_count}")
    return batch_size // shard_count


class _ProcessRows:
    """Keeps this process's contiguous block of a global batch of window indices."""

    def __init__(self, shard_index: int, rows: int):
        self.start = shard_index * rows
        self.stop = self.start + rows

    def __call__(self, window_indices: np.ndarray) -> np.ndarray:
        return window_indices[self.start : self.stop]


def train_iterator(
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
    eos_id: Optional[int] = None,
) -> grain.DatasetIterator:
    """Endless shuffled batches of ``int32[batch_size // shard_count, seq_len]`` (with ``eos_id``, also
    their ``segment_ids``).

    Every epoch is a fresh permutation of the windows (derived from ``seed``);
    a batch may straddle two epochs. The iterator's ``get_state()`` /
    ``set_state()`` resume exactly.
    """
    windows = TokenWindows(tokens, seq_len, eos_id)
    if len(windows) < batch_size:
        raise ValueError(
            f"the training split has {len(windows)} windows of data.seq_len={seq_len}, "
            f"fewer than train.batch_size={batch_size}"
        )
    rows = _rows_per_process(batch_size, shard_count)
    dataset = (
        grain.MapDataset.range(len(windows))
        .shuffle(seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .map(_ProcessRows(shard_index, rows))
        .map(windows)
    )
    return iter(dataset.to_iter_dataset(_READ_OPTIONS))


class StreamLanes:
    """Step ``s``'s batch of windows for state passing: row ``r`` reads lane ``r`` of the stream, one window a step.

    The stream's W windows make ``batch_size`` lanes of L = W // batch_size consecutive windows, lane ``r``
    beginning at window ``offset + r L`` (mod W; ``offset`` drawn from the seed, so that seeds cut the
    stream differently). Step ``s`` reads window ``s mod L`` of every lane: each pass of L steps reads
    L * batch_size windows once, and a lane that runs out wraps to its start. ``continues`` [rows] bool is
    whether a row's window follows on from its window at the step before: False on a lane's first window
    (each pass), on the stream's first (a lane running past the end wraps to it) and, with ``eos_id``,
    after a window that ended with EOS (a new document begins: documents are mixed alone). This process
    keeps its contiguous block of rows, as ``train_iterator`` does.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, shard_index: int = 0,
                 shard_count: int = 1, eos_id: Optional[int] = None):
        self.windows = TokenWindows(tokens, seq_len, eos_id)
        if len(self.windows) < batch_size:
            raise ValueError(f"the training split has {len(self.windows)} windows of data.seq_len={seq_len}, "
                             f"fewer than train.batch_size={batch_size} lanes")
        self.steps_per_pass = len(self.windows) // batch_size
        offset = int(np.random.default_rng(seed).integers(len(self.windows)))
        lanes = (offset + np.arange(batch_size) * self.steps_per_pass) % len(self.windows)
        rows = _rows_per_process(batch_size, shard_count)
        self.lane_starts = lanes[shard_index * rows : (shard_index + 1) * rows]

    def __call__(self, step: int) -> Batch:
        """The batch of ``step`` within a pass (0 .. steps_per_pass - 1)."""
        index = (self.lane_starts + step) % len(self.windows)
        batch = self.windows(index)
        batch["continues"] = self.continues(index, step)
        return batch

    def continues(self, index: np.ndarray, step: int) -> np.ndarray:
        follows = (index > 0) & (step > 0)
        eos = self.windows.eos_id
        if eos is not None:  # the input before the window (index 0 reads the stream's last, masked above)
            follows &= self.windows.tokens[index * self.windows.seq_len - 1] != eos
        return follows


def stream_iterator(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, shard_index: int = 0,
                    shard_count: int = 1, eos_id: Optional[int] = None) -> grain.DatasetIterator:
    """Endless ``StreamLanes`` batches (``inputs``, ``targets``, ``continues`` and with ``eos_id`` ``segment_ids``);
    ``get_state()`` / ``set_state()`` resume exactly, as ``train_iterator``'s do."""
    lanes = StreamLanes(tokens, seq_len, batch_size, seed, shard_index, shard_count, eos_id)
    dataset = grain.MapDataset.range(lanes.steps_per_pass).repeat().map(lanes)
    return iter(dataset.to_iter_dataset(_READ_OPTIONS))


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


class SourceMetrics:
    """What a data source logs beyond the loss, through hooks the trainer calls without naming the source.

    ``step_terms(token_loss, batch)``, traced inside the jitted step, returns arrays added to the step's
    metrics (None: nothing); ``add`` keeps a call's metrics on the device until ``pop`` averages them into a
    log row; ``validation`` scores the source's own validation windows. This default logs nothing; a source
    that logs more has ``source_metrics(length, budget)`` return its own (a mix: loss per component).
    """

    step_terms = None

    def add(self, metrics: dict, steps_per_call: int) -> None:
        """One call's metrics (stacked [k, ...] when a call runs k > 1 steps)."""

    def pop(self) -> dict[str, float]:
        """The log row's terms over the calls added since the last ``pop``."""
        return {}

    def validation(self, score_windows, *, scored: Optional[tuple] = None) -> dict[str, float]:
        """Terms scored on the source's own validation windows by ``score_windows`` (windows -> their
        ``LengthScores``, the trainer's scorer); ``scored`` = (windows, their scores) already scored by the trainer,
        not scored again."""
        return {}


def source_metrics(data, length: int, budget: int) -> SourceMetrics:
    """The ``SourceMetrics`` that ``data`` logs at training length ``length`` with ``budget`` validation targets."""
    own = getattr(data, "source_metrics", None)
    return own(length, budget) if own is not None else SourceMetrics()


# eq=False: comparing or hashing the token arrays is never wanted.
@dataclass(frozen=True, eq=False)
class Data:
    """Tokenised splits plus this process's place in the data-parallel group (a corpus makes one with
    ``lmzoo.data.corpus.tokenized``)."""

    tokenizer: Tokenizer
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    seq_len: int
    seed: int
    shard_index: int
    shard_count: int
    # Total UTF-8 bytes of the validation documents / validation tokens
    # (EOS included): multiply nats/token by 1 / (ln 2 * bytes_per_token)
    # to get bits per byte, which is comparable across tokenizers.
    bytes_per_token: float
    fingerprint: dict[str, Any]
    document_boundaries: str = "none"  # "mask": batches carry segment ids (see the module docstring)

    @property
    def eos_id(self) -> Optional[int]:
        """The token that ends a document when batches carry segment ids, else None."""
        return self.tokenizer.eos_id if self.document_boundaries == "mask" else None

    def train_iterator(self, batch_size: int) -> grain.DatasetIterator:
        """Endless shuffled batches ``{"inputs", "targets"}: int32[batch_size // shard_count, seq_len]``."""
        return train_iterator(
            self.train_tokens, self.seq_len, batch_size, self.seed, self.shard_index, self.shard_count, self.eos_id
        )

    def stream_iterator(self, batch_size: int) -> grain.DatasetIterator:
        """Endless batches for state passing (``StreamLanes``): each row continues the row of the batch before."""
        return stream_iterator(
            self.train_tokens, self.seq_len, batch_size, self.seed, self.shard_index, self.shard_count, self.eos_id
        )

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int],
                           min_doc_tokens: Optional[int] = None) -> dict[int, ValidationWindows]:
        """The windows of each length over the same validation targets, ``budget`` of them (None: all) spread
        over the split's documents (``spread_spans``); with ``min_doc_tokens``, only inside documents at least
        that long."""
        spans = spread_spans(self.val_tokens, self.tokenizer.eos_id, lengths, budget, min_doc_tokens)
        return {length: ValidationWindows(self.val_tokens, length, spans, self.eos_id) for length in lengths}
