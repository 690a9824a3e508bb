"""A split as one token stream, and the windows cut from it.

Each split becomes one int32 token stream (every document followed by EOS,
so the model learns where documents end). The stream is cut into
non-overlapping windows of ``seq_len + 1`` tokens taken every ``seq_len``
tokens, so every token is a prediction target exactly once; a final partial
window is dropped. A window gives ``inputs = w[:-1]`` and ``targets = w[1:]``.

With ``data.document_boundaries=mask`` a batch also carries ``segment_ids`` [rows, L]: the number of
EOS tokens before each input in its window, so each document (its closing EOS included) has its own
id and the model keeps documents apart; positions restart with each document (``lmzoo.model``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from lmzoo.data.base import Batch

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
