"""``TextData``: a tokenised corpus's two splits and the batches cut from them (``lmzoo.data.base.Data``).

A corpus makes one with ``lmzoo.data.corpus.tokenized``: the training split's windows come shuffled
(``train_iterator``) or as lanes of the stream (``stream_iterator``, ``lmzoo.data.train_iterators``), the
validation split's as windows of every length over the same scored targets (``lmzoo.data.validation_spans``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import grain
import numpy as np

from lmzoo.data.base import DataDefaults
from lmzoo.data.tokenizers import Tokenizer
from lmzoo.data.train_iterators import stream_iterator, train_iterator
from lmzoo.data.validation_spans import ValidationWindows, spread_spans


# eq=False: comparing or hashing the token arrays is never wanted.
@dataclass(frozen=True, eq=False)
class TextData(DataDefaults):
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
    document_boundaries: str = "none"  # "mask": batches carry segment ids (``lmzoo.data.token_windows``)

    streams = True  # one stream of documents: its windows run on from batch to batch
    has_documents = True

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
