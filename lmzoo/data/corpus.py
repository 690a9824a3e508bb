"""Text corpora: documents, how they are split into train and validation, and the spec every corpus shares.

A corpus source is a module of this package (``stdlib``, ``text_files``, ``hf``) that registers a
``CorpusConfig`` subclass (``data=<name>`` picks it) whose ``documents()`` returns ``Documents``:
train and validation lists of UTF-8 ``bytes`` documents plus a JSON-serialisable fingerprint that
identifies the exact content, so a run can record (and later check) what it trained on.
``CorpusConfig.build`` tokenises them into a ``lmzoo.data.text.TextData`` (``tokenized``); a vocabulary's ids
(BPE, a tokenizer.json) are cached by tokenizer and corpus fingerprint, so only the first start pays for them.

Splitting rule (deterministic across runs, processes and machines, because it
uses SHA-256 rather than Python's salted ``hash()``): every split unit has a
key (a file's relative path, a row index); a unit goes to validation when the
hash of its key, read as a number in [0, 1), is below ``val_fraction``.
The units are:

* files, when there are two or more (no file is in both splits);
* the documents of the only file, when a single file holds several (e.g. one
  ``.jsonl`` file is split by line index);
* the text of the only document, when there is a single document: the last
  ``val_fraction`` of it, cut at a line break, becomes validation.

If hashing leaves either split empty, the unit closest to the threshold is
moved over, so both splits always have at least one document.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from lmzoo.data.text import TextData
from lmzoo.data.token_windows import token_stream
from lmzoo.data.tokenizers import BPE, BPE_MIN_VOCAB, Tokenizer, bpe_tokenizer, build_tokenizer, cache_dir
from lmzoo.faults import first_line
from lmzoo.schema import ConfigError, DataConfig, one_of

log = logging.getLogger("lmzoo.data")

DOCUMENT_BOUNDARIES = ("none", "mask")  # data.document_boundaries: see lmzoo.data.token_windows


@dataclass(frozen=True)
class Documents:
    """A corpus split into train and validation documents, with its fingerprint."""

    train: list[bytes]
    validation: list[bytes]
    fingerprint: dict[str, Any]


@dataclass(frozen=True)
class Unit:
    """The smallest piece the splitter keeps together (a file, a row)."""

    key: str
    documents: list[bytes]


def stable_fraction(key: str) -> float:
    """Map ``key`` to [0, 1), identically in every process and on every machine."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")


def _split_units(units: Sequence[Unit], val_fraction: float) -> tuple[list[Unit], list[Unit]]:
    """Hash-split units, then make sure neither side is empty (needs 2+ units)."""
    ranked = sorted(units, key=lambda unit: stable_fraction(unit.key))
    n_val = sum(stable_fraction(unit.key) < val_fraction for unit in ranked)
    # Units with the smallest hashes are exactly the validation ones, so
    # clamping the count moves the units nearest the threshold.
    n_val = min(max(n_val, 1), len(ranked) - 1)
    val_keys = {unit.key for unit in ranked[:n_val]}
    train = [unit for unit in units if unit.key not in val_keys]
    validation = [unit for unit in units if unit.key in val_keys]
    return train, validation


def _flatten(units: Iterable[Unit]) -> list[bytes]:
    return [document for unit in units for document in unit.documents]


def _split_text(document: bytes, val_fraction: float) -> tuple[bytes, bytes]:
    """Cut one document into a head (train) and a tail (validation)."""
    # Even val_fraction=0 keeps a small tail: validation must not be empty.
    cut = int(len(document) * (1.0 - max(val_fraction, 0.01)))
    line_break = document.rfind(b"\n", 0, cut)
    if line_break > 0:
        cut = line_break + 1
    # Never cut inside a multi-byte UTF-8 character (continuation bytes are 0b10xxxxxx).
    while 0 < cut < len(document) and document[cut] & 0xC0 == 0x80:
        cut -= 1
    head, tail = document[:cut], document[cut:]
    if not head or not tail:
        raise ValueError(f"a single document of {len(document)} bytes is too short to split into train and validation")
    return head, tail


def _split(
    units: Sequence[Unit], val_fraction: float, what: str, unit_name: str
) -> tuple[list[bytes], list[bytes], str]:
    """Apply the module's splitting rule; returns (train, validation, what was split)."""
    _check_val_fraction(val_fraction)
    # A unit without documents (an empty .jsonl) must not be the one that
    # "fills" a split.
    units = [unit for unit in units if unit.documents]
    documents = _flatten(units)
    if not documents:
        raise ValueError(f"no documents found in {what}")
    if len(units) >= 2:
        train, validation = _split_units(units, val_fraction)
        return _flatten(train), _flatten(validation), unit_name
    if len(documents) >= 2:
        (only,) = units
        per_document = [Unit(f"{only.key}#{index}", [doc]) for index, doc in enumerate(documents)]
        train, validation = _split_units(per_document, val_fraction)
        return _flatten(train), _flatten(validation), "documents"
    head, tail = _split_text(documents[0], val_fraction)
    return [head], [tail], "text"


def content_fingerprint(units: Sequence[Unit], unit_name: str = "files") -> dict[str, Any]:
    """Counts and a SHA-256 over every (key, document) pair, in order."""
    digest = hashlib.sha256()
    n_documents = n_bytes = 0
    for unit in units:
        for document in unit.documents:
            digest.update(unit.key.encode("utf-8") + b"\0")
            digest.update(len(document).to_bytes(8, "little"))
            digest.update(document)
            n_documents += 1
            n_bytes += len(document)
    return {unit_name: len(units), "documents": n_documents, "bytes": n_bytes, "sha256": digest.hexdigest()}


def split_documents(
    units: Sequence[Unit], val_fraction: float, what: str, unit_name: str = "files", **fingerprint: Any
) -> Documents:
    train, validation, split_by = _split(units, val_fraction, what, unit_name)
    fingerprint.update(content_fingerprint(units, unit_name))
    fingerprint.update(
        val_fraction=val_fraction,
        split_by=split_by,
        train_documents=len(train),
        val_documents=len(validation),
    )
    return Documents(train=train, validation=validation, fingerprint=fingerprint)


TOKENS_RECIPE = "token_stream/eos-after-each/v1"  # how a split becomes ids; a change to token_stream changes it


def cached_streams(documents: Documents, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(train ids, validation ids) of ``documents``. A vocabulary's (BPE or a tokenizer.json: slow to apply to a
    large corpus) are kept under the cache by the corpus fingerprint and the tokenizer's name (its file's digest
    in it), written whole and renamed, so every later start reads them; bytes are ids already, and not kept."""
    compute = lambda: (token_stream(documents.train, tokenizer), token_stream(documents.validation, tokenizer))  # noqa: E731
    if tokenizer.name == "byte":
        return compute()
    key = json.dumps({"recipe": TOKENS_RECIPE, "tokenizer": tokenizer.name, "corpus": documents.fingerprint},
                     sort_keys=True, default=str)
    path = cache_dir() / "tokens" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"
    try:
        with np.load(path) as saved:
            return saved["train"], saved["validation"]
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # a damaged cache file is only redone
        log.warning("warning: the cached token ids %s cannot be read (%s); tokenising again", path, first_line(e))
    train, validation = compute()
    keep_whole(path, train, validation)
    return train, validation


def keep_whole(path: Path, train: np.ndarray, validation: np.ndarray) -> None:
    """Write the ids to a temporary file beside ``path`` and rename it over: readers see all of it or none. A cache
    that cannot be written (a full disk, a read-only home) costs the next start its tokenising, nothing more."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(handle, "wb") as f:
            np.savez(f, train=train, validation=validation)
        os.replace(temporary, path)
    except OSError as e:
        log.warning("warning: the token ids could not be cached in %s (%s)", path.parent, e.strerror or first_line(e))
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def tokenized(
    documents: Documents, tokenizer: Tokenizer, *, seq_len: int, seed: int, shard_index: int, shard_count: int,
    document_boundaries: str = "none",
) -> TextData:
    """Tokenise both splits of ``documents`` (a vocabulary's, once per corpus: ``cached_streams``); the fingerprint
    adds the tokenizer and token counts to theirs."""
    train_tokens, val_tokens = cached_streams(documents, tokenizer)
    val_bytes = sum(len(document) for document in documents.validation)
    fingerprint = dict(
        documents.fingerprint,
        tokenizer=tokenizer.name,
        vocab_size=tokenizer.vocab_size,
        train_tokens=int(train_tokens.size),
        val_tokens=int(val_tokens.size),
    )
    return TextData(
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


def as_list(value: Union[str, Sequence[str], None]) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


@dataclass
class CorpusConfig(DataConfig):
    """Settings every text corpus has; a corpus source adds where its documents come from."""

    tokenizer: str = "byte"  # byte | bpe (trained on the training split, cached) | a path to a tokenizer.json
    val_fraction: float = 0.05
    document_boundaries: str = "none"  # none: packed documents see each other | mask: each is mixed alone
    vocab_size: int = 8192  # tokenizer=bpe: ids in all (256 bytes, merges, end-of-text)

    def check(self) -> None:
        super().check()
        one_of("data.document_boundaries", self.document_boundaries, DOCUMENT_BOUNDARIES)
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction={self.val_fraction} must lie strictly between 0 and 1")
        if self.tokenizer not in ("byte", BPE) and not os.path.isfile(self.tokenizer):
            raise ConfigError(f"data.tokenizer={self.tokenizer!r}: no such file "
                              "(use 'byte', 'bpe' or a tokenizer.json path)")
        if self.tokenizer == BPE and self.vocab_size < BPE_MIN_VOCAB:
            raise ConfigError(f"data.vocab_size={self.vocab_size} must be at least {BPE_MIN_VOCAB} for "
                              "data.tokenizer=bpe (256 byte values and the end-of-text token)")

    def documents(self) -> Documents:
        raise NotImplementedError(f"{type(self).__name__} does not define documents()")

    def build(self, *, seed: int, shard_index: int, shard_count: int) -> TextData:
        documents = self.documents()
        tokenizer = self.tokenizer_for(documents)
        return tokenized(
            documents, tokenizer, seq_len=self.seq_len, seed=seed, shard_index=shard_index, shard_count=shard_count,
            document_boundaries=self.document_boundaries,
        )


    def tokenizer_for(self, documents: Documents) -> Tokenizer:
        """``data.tokenizer``; a BPE learns from the training split only, so validation text stays unseen."""
        if self.tokenizer == BPE:
            return bpe_tokenizer(documents.train, self.vocab_size, documents.fingerprint)
        return build_tokenizer(self.tokenizer)


def with_saved_tokenizer(spec: DataConfig, saved: str | os.PathLike) -> DataConfig:
    """``spec`` reading its tokenizer from ``saved`` (a run's own copy) when it would train a BPE and that file
    exists: a resumed, evaluated or sampled run tokenises as it trained, whatever the cache holds."""
    if getattr(spec, "tokenizer", None) == BPE and os.path.isfile(saved):
        return dataclasses.replace(spec, tokenizer=os.fspath(saved))
    return spec


def check_globs(key: str, patterns: Any, *, required: bool) -> None:
    if patterns is None:
        if required:
            raise ConfigError(f"{key} must be set (a glob or a list of globs)")
        return
    if isinstance(patterns, Mapping):  # {split: files}, as data.hf_data_files may be
        patterns = [pattern for files in patterns.values() for pattern in as_list(files)]
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        if "://" in pattern:  # remote files are the data library's business
            continue
        if not glob.glob(os.path.expanduser(pattern), recursive=True):
            raise ConfigError(f"{key}: no file matches {pattern!r}")
