"""Training and validation data for lmzoo.

``build_data(cfg, seed=...)`` is the single entry point: it loads the
documents of ``cfg.source`` (see ``sources``), tokenises them (see
``tokenizers``) and returns a ``Data`` whose methods hand out batches (see
``pipeline``). Batch sizes passed to ``Data`` are global; each process gets
its own rows of every batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import grain
import numpy as np

from lmzoo.data import pipeline
from lmzoo.data.pipeline import Batch, token_stream
from lmzoo.data.sources import SOURCES as CORPORA, Documents, load_documents
from lmzoo.data.synthetic import TASKS, TaskData
from lmzoo.data.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, build_tokenizer

SOURCES = (*CORPORA, *TASKS)

__all__ = [
    "SOURCES",
    "ByteTokenizer",
    "Data",
    "DataConfig",
    "Documents",
    "HFTokenizer",
    "build_data",
    "build_tokenizer",
    "load_documents",
]


@dataclass
class DataConfig:
    """Data settings; ``build_data`` accepts any object with these attributes.

    Typed with ``Optional``/``Any`` (not ``X | Y``) so OmegaConf structured
    configs accept it; ``Any`` fields take a string or a list of strings.
    """

    source: str = "stdlib"  # stdlib | text_files | hf | mqar | induction | selective_copy
    seq_len: int = 256
    tokenizer: str = "byte"  # "byte" or a path to a tokenizer.json
    val_fraction: float = 0.05
    paths: Any = None  # text_files: a glob or a list of globs ("**" allowed)
    text_field: str = "text"  # the text field of .jsonl lines / dataset rows
    hf_name: Optional[str] = None  # a hub dataset, or a builder such as "json"
    hf_config: Optional[str] = None
    hf_data_files: Any = None  # a file, a list, or {split: files}
    hf_train_split: str = "train"
    hf_val_split: Optional[str] = None  # None: hash-split the train split
    # synthetic tasks (source = mqar | induction | selective_copy)
    task_vocab: int = 64  # task symbols (mqar: half keys, half values)
    num_pairs: int = 8  # mqar: key-value pairs in the context
    num_queries: Optional[int] = None  # mqar: keys asked; None = num_pairs
    num_marked: int = 8  # selective_copy: symbols to copy


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

    def train_iterator(self, batch_size: int) -> grain.DatasetIterator:
        """Endless shuffled batches ``{"inputs", "targets"}: int32[batch_size // shard_count, seq_len]``."""
        return pipeline.train_iterator(
            self.train_tokens, self.seq_len, batch_size, self.seed, self.shard_index, self.shard_count
        )

    def val_batches(
        self, batch_size: int, n_batches: Optional[int] = None, seq_len: Optional[int] = None
    ) -> list[Batch]:
        """The same first ``n_batches`` (None: all) validation batches on every call.

        ``seq_len`` defaults to the training one; a longer one evaluates
        longer contexts.
        """
        return pipeline.validation_batches(
            self.val_tokens, seq_len or self.seq_len, batch_size, n_batches, self.shard_index, self.shard_count
        )


def _check_shard(shard_index: int, shard_count: int) -> None:
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got shard_index={shard_index}, shard_count={shard_count}")


def build_data(cfg: Any, *, seed: int, shard_index: int = 0, shard_count: int = 1) -> Data | TaskData:
    """Load, split and tokenise ``cfg``'s corpus (see ``DataConfig`` for the fields)."""
    _check_shard(shard_index, shard_count)
    if cfg.source in TASKS:
        return TaskData(cfg, seed, shard_index, shard_count)
    documents = load_documents(cfg)
    tokenizer = build_tokenizer(cfg.tokenizer)
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
    return Data(
        tokenizer=tokenizer,
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        seq_len=cfg.seq_len,
        seed=seed,
        shard_index=shard_index,
        shard_count=shard_count,
        bytes_per_token=val_bytes / val_tokens.size,
        fingerprint=fingerprint,
    )
