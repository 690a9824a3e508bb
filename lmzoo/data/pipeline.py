"""From documents to batches: token streams, windows, train and validation batches.

Each split becomes one int32 token stream (every document followed by EOS,
so the model learns where documents end). The stream is cut into
non-overlapping windows of ``seq_len + 1`` tokens taken every ``seq_len``
tokens, so every token is a prediction target exactly once; a final partial
window is dropped. A window gives ``inputs = w[:-1]`` and ``targets = w[1:]``.

With ``data.document_boundaries=mask`` a batch also carries ``segment_ids`` [rows, L]: the number of
EOS tokens before each input in its window, so each document (its closing EOS included) has its own
id and the model keeps documents apart; positions restart with each document (``lmzoo.model``).

Validation scores the first ``N`` targets of the validation stream, the same ``N`` at every
evaluated length (``ValidationWindows``): only the context each target sees changes with the
window length.

Multi-host data parallelism: batch sizes are always *global*. Every process
builds the same global batch and keeps the contiguous block of rows
``[shard_index * b, (shard_index + 1) * b)`` with ``b = batch_size //
shard_count``, so the global batch (and training) does not depend on the
number of processes, and the blocks line up with a batch axis sharded over
processes in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import grain
import numpy as np

from lmzoo.data.tokenizers import Tokenizer

if TYPE_CHECKING:
    from lmzoo.data.sources import Documents

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
        self._offsets = np.arange(seq_len + 1)

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __call__(self, window_indices: np.ndarray) -> Batch:
        starts = np.asarray(window_indices, dtype=np.int64) * self.seq_len
        windows = self.tokens[starts[:, None] + self._offsets]
        batch = {
            "inputs": np.ascontiguousarray(windows[:, :-1]),
            "targets": np.ascontiguousarray(windows[:, 1:]),
        }
        if self.eos_id is not None:
            batch["segment_ids"] = document_ids(batch["inputs"], self.eos_id)
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


class ValidationWindows:
    """The first ``n_targets`` validation targets cut into non-overlapping windows of ``length``.

    Window ``k`` predicts targets ``k * length .. (k + 1) * length - 1`` (0-based among the scored
    targets; stream positions one later), so every length that divides ``n_targets`` scores the
    same targets, each once. ``unit`` gives each target's index: fixed blocks of the scored
    targets are blocks of units.
    """

    def __init__(self, tokens: np.ndarray, length: int, n_targets: int, eos_id: Optional[int] = None):
        if n_targets % length:
            raise ValueError(f"{n_targets} scored targets do not fill windows of {length}")
        self.windows = TokenWindows(tokens[: n_targets + 1], length, eos_id)
        self.length, self.units = length, n_targets

    def __len__(self) -> int:
        return self.units // self.length

    def __call__(self, window_indices: np.ndarray) -> Batch:
        batch = self.windows(window_indices)
        batch["unit"] = np.asarray(window_indices)[:, None] * self.length + np.arange(self.length)  # (rows, L)
        return batch


def scored_targets(available: int, budget: Optional[int], lengths: Sequence[int]) -> int:
    """Targets scored at every length: the budget (None: all ``available``) rounded down to fill whole
    windows of every length (a multiple of their least common multiple, the longest for powers of two)."""
    step = math.lcm(*lengths)
    n_targets = min(budget or available, available) // step * step
    if n_targets == 0:
        asked = budget or available
        raise ValueError(f"a budget of {asked} validation tokens (of {available}) fills no window of {step}")
    return n_targets


# eq=False: comparing or hashing the token arrays is never wanted.
@dataclass(frozen=True, eq=False)
class Data:
    """Tokenised splits plus this process's place in the data-parallel group."""

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

    @classmethod
    def from_documents(
        cls, documents: "Documents", tokenizer: Tokenizer, *, seq_len: int, seed: int, shard_index: int,
        shard_count: int, document_boundaries: str = "none",
    ) -> "Data":
        """Tokenise both splits of ``documents``; the fingerprint adds the tokenizer and token counts to theirs."""
        train_tokens = token_stream(documents.train, tokenizer)
        val_tokens = token_stream(documents.validation, tokenizer)
        val_bytes = sum(len(document) for document in documents.validation)
        fingerprint = dict(
            documents.fingerprint,
            tokenizer=tokenizer.name,
            vocab_size=tokenizer.vocab_size,
            train_tokens=int(train_tokens.size),
            val_tokens=int(val_tokens.size),
        )
        return cls(
            tokenizer=tokenizer,
            train_tokens=train_tokens,
            val_tokens=val_tokens,
            seq_len=seq_len,
            seed=seed,
            shard_index=shard_index,
            shard_count=shard_count,
            bytes_per_token=val_bytes / val_tokens.size,
            fingerprint=fingerprint,
            document_boundaries=document_boundaries,
        )

    def train_iterator(self, batch_size: int) -> grain.DatasetIterator:
        """Endless shuffled batches ``{"inputs", "targets"}: int32[batch_size // shard_count, seq_len]``."""
        return train_iterator(
            self.train_tokens, self.seq_len, batch_size, self.seed, self.shard_index, self.shard_count, self.eos_id
        )

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int]) -> dict[int, ValidationWindows]:
        """The windows of each length over the same first validation targets (``budget`` tokens; None: all)."""
        n_targets = scored_targets(len(self.val_tokens) - 1, budget, lengths)
        return {length: ValidationWindows(self.val_tokens, length, n_targets, self.eos_id) for length in lengths}
