"""Document sources: where the text comes from and how it is split.

Every source registers its spec (``data=<name>`` picks it), whose ``documents()`` returns
``Documents``: train and validation lists of UTF-8 ``bytes`` documents plus a
JSON-serialisable fingerprint that identifies the exact content, so a run can
record (and later check) what it trained on.

Sources:

* ``stdlib``: the running Python's standard-library ``*.py`` files (~12 MB),
  a corpus every machine has.
* ``text_files``: local files matched by globs. ``.jsonl`` files give one
  document per line (the ``text_field`` of each JSON object); any other file
  is one plain-text document.
* ``hf``: a Hugging Face ``datasets`` dataset (a hub name, or a local builder
  such as ``"json"`` with ``data_files``).

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

import glob
import hashlib
import json
import os
import platform
import sysconfig
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from lmzoo.data.pipeline import Data
from lmzoo.data.tokenizers import build_tokenizer
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, DataConfig, one_of

DOCUMENT_BOUNDARIES = ("none", "mask")  # data.document_boundaries: see lmzoo.data.pipeline

# Folders skipped in the stdlib corpus: third-party packages, and the test
# suites, which are large, repetitive and would dominate the corpus.
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


@dataclass(frozen=True)
class Documents:
    """A corpus split into train and validation documents, with its fingerprint."""

    train: list[bytes]
    validation: list[bytes]
    fingerprint: dict[str, Any]


@dataclass(frozen=True)
class _Unit:
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


def _split_units(units: Sequence[_Unit], val_fraction: float) -> tuple[list[_Unit], list[_Unit]]:
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


def _flatten(units: Iterable[_Unit]) -> list[bytes]:
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
    units: Sequence[_Unit], val_fraction: float, what: str, unit_name: str
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
        per_document = [_Unit(f"{only.key}#{index}", [doc]) for index, doc in enumerate(documents)]
        train, validation = _split_units(per_document, val_fraction)
        return _flatten(train), _flatten(validation), "documents"
    head, tail = _split_text(documents[0], val_fraction)
    return [head], [tail], "text"


def _content_fingerprint(units: Sequence[_Unit], unit_name: str = "files") -> dict[str, Any]:
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


def _documents(
    units: Sequence[_Unit], val_fraction: float, what: str, unit_name: str = "files", **fingerprint: Any
) -> Documents:
    train, validation, split_by = _split(units, val_fraction, what, unit_name)
    fingerprint.update(_content_fingerprint(units, unit_name))
    fingerprint.update(
        val_fraction=val_fraction,
        split_by=split_by,
        train_documents=len(train),
        val_documents=len(validation),
    )
    return Documents(train=train, validation=validation, fingerprint=fingerprint)


# --- stdlib -----------------------------------------------------------------


def _stdlib_relpaths(root: str) -> list[str]:
    relpaths = []
    for directory, subdirs, filenames in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages and test suites.
        subdirs[:] = [name for name in subdirs if name not in STDLIB_EXCLUDED_DIRS]
        for filename in filenames:
            if filename.endswith(".py"):
                relpath = os.path.relpath(os.path.join(directory, filename), root)
                relpaths.append(relpath.replace(os.sep, "/"))
    return sorted(relpaths)


def stdlib_documents(val_fraction: float = 0.05, root: Optional[str] = None) -> Documents:
    """The standard-library sources of the running Python, split by file.

    ``root`` defaults to ``sysconfig.get_paths()["stdlib"]``; tests point it
    at a small tree.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    units = []
    for relpath in _stdlib_relpaths(root):
        with open(os.path.join(root, relpath), "rb") as file:
            units.append(_Unit(relpath, [file.read()]))
    documents = _documents(units, val_fraction, f"the standard library at {root}", source="stdlib", python=platform.python_version())
    documents.fingerprint.update(
        train_files=documents.fingerprint["train_documents"],
        val_files=documents.fingerprint["val_documents"],
    )
    return documents


# --- text_files -------------------------------------------------------------


def _as_list(value: Union[str, Sequence[str], None]) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _expand_pattern(pattern: str) -> list[str]:
    pattern = os.path.expanduser(pattern)
    if glob.has_magic(pattern):
        matches = [path for path in glob.glob(pattern, recursive=True) if os.path.isfile(path)]
        if not matches:
            raise FileNotFoundError(f"no files match data.paths pattern {pattern!r}")
        return matches
    if not os.path.isfile(pattern):
        raise FileNotFoundError(f"data.paths file not found: {pattern!r}")
    return [pattern]


def _jsonl_documents(path: str, text_field: str) -> list[bytes]:
    documents = []
    with open(path, "rb") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{line_number}: no string field {text_field!r} (set data.text_field)")
            documents.append(text.encode("utf-8"))
    return documents


def _file_documents(path: str, text_field: str) -> list[bytes]:
    if path.endswith(".jsonl"):
        return _jsonl_documents(path, text_field)
    with open(path, "rb") as file:
        return [file.read()]


def _relative_keys(paths: Sequence[str]) -> list[str]:
    """Keys relative to the files' common folder, so the split does not depend on the cwd."""
    absolute = [os.path.abspath(path) for path in paths]
    root = os.path.commonpath([os.path.dirname(path) for path in absolute])
    return [os.path.relpath(path, root).replace(os.sep, "/") for path in absolute]


def text_file_documents(
    paths: Union[str, Sequence[str]], text_field: str = "text", val_fraction: float = 0.05
) -> Documents:
    """Documents from local ``.txt``/``.jsonl`` (or other plain-text) files."""
    patterns = _as_list(paths)
    if not patterns:
        raise ValueError("data.paths is required for data.source='text_files'")
    files = sorted({os.path.abspath(path) for pattern in patterns for path in _expand_pattern(pattern)})
    units = [_Unit(key, _file_documents(path, text_field)) for key, path in zip(_relative_keys(files), files)]
    return _documents(units, val_fraction, f"data.paths {patterns}", source="text_files", patterns=patterns)


# --- hf ---------------------------------------------------------------------


def _hf_texts(dataset: Any, text_field: str, what: str) -> list[bytes]:
    if text_field not in dataset.column_names:
        raise ValueError(f"{what} has no column {text_field!r} (columns: {dataset.column_names}); set data.text_field")
    # Null cells become empty documents rather than failing the whole load.
    return [(text or "").encode("utf-8") for text in dataset[text_field]]


def _hf_data_files(data_files: Any) -> Union[list[str], dict[str, list[str]], None]:
    """Plain lists/dicts (``datasets`` accepts a file, a list, or a split -> files mapping)."""
    if isinstance(data_files, Mapping):
        return {str(split): _as_list(files) for split, files in data_files.items()}
    return _as_list(data_files) or None


def hf_documents(
    name: str,
    config: Optional[str] = None,
    data_files: Union[str, Sequence[str], Mapping[str, Any], None] = None,
    train_split: str = "train",
    val_split: Optional[str] = None,
    text_field: str = "text",
    val_fraction: float = 0.05,
) -> Documents:
    """Documents from ``datasets.load_dataset``; the whole split is held in memory.

    Without ``val_split`` the train split is divided by the hash of each row's
    index.
    """
    try:
        import datasets  # Imported here: it is slow to import, optional, and only this source needs it.
    except ImportError:
        raise ValueError("data.source=hf needs the Hugging Face datasets package: pip install -e '.[hf]'") from None

    if not name:
        raise ValueError("data.hf_name is required for data.source='hf'")
    data_files = _hf_data_files(data_files)

    def load(split: str) -> list[bytes]:
        dataset = datasets.load_dataset(name, config, split=split, data_files=data_files)
        return _hf_texts(dataset, text_field, f"dataset {name!r} split {split!r}")

    train_rows = load(train_split)
    identity = dict(source="hf", name=name, config=config, data_files=data_files, train_split=train_split, val_split=val_split)
    if val_split is None:
        units = [_Unit(f"row:{index}", [text]) for index, text in enumerate(train_rows)]
        return _documents(units, val_fraction, f"dataset {name!r}", unit_name="rows", **identity)
    validation = load(val_split)
    if not train_rows or not validation:
        raise ValueError(f"dataset {name!r}: split {train_split!r} or {val_split!r} is empty")
    units = [_Unit(f"{train_split}:{i}", [t]) for i, t in enumerate(train_rows)]
    units += [_Unit(f"{val_split}:{i}", [t]) for i, t in enumerate(validation)]
    fingerprint = dict(
        identity,
        **_content_fingerprint(units, "rows"),
        split_by="dataset splits",
        train_documents=len(train_rows),
        val_documents=len(validation),
    )
    return Documents(train=train_rows, validation=validation, fingerprint=fingerprint)


# --- specs ----------------------------------------------------------------


@dataclass
class CorpusConfig(DataConfig):
    """Settings every text corpus has; a corpus source adds where its documents come from."""

    tokenizer: str = "byte"  # "byte" or a path to a tokenizer.json
    val_fraction: float = 0.05
    document_boundaries: str = "none"  # none: packed documents see each other | mask: each is mixed alone

    def check(self) -> None:
        super().check()
        one_of("data.document_boundaries", self.document_boundaries, DOCUMENT_BOUNDARIES)
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction={self.val_fraction} must lie strictly between 0 and 1")
        if self.tokenizer != "byte" and not os.path.isfile(self.tokenizer):
            raise ConfigError(f"data.tokenizer={self.tokenizer!r}: no such file (use 'byte' or a tokenizer.json path)")

    def documents(self) -> Documents:
        raise NotImplementedError(f"{type(self).__name__} does not define documents()")

    def build(self, *, seed: int, shard_index: int, shard_count: int) -> Data:
        documents = self.documents()
        tokenizer = build_tokenizer(self.tokenizer)
        return Data.from_documents(
            documents, tokenizer, seq_len=self.seq_len, seed=seed, shard_index=shard_index, shard_count=shard_count,
            document_boundaries=self.document_boundaries,
        )


@SOURCES.register("stdlib")
@dataclass
class StdlibConfig(CorpusConfig):
    source: str = "stdlib"

    def documents(self) -> Documents:
        return stdlib_documents(self.val_fraction)


@SOURCES.register("text_files")
@dataclass
class TextFilesConfig(CorpusConfig):
    source: str = "text_files"
    # Any (not str | list) so OmegaConf accepts both: a glob or a list of globs ("**" allowed)
    paths: Any = None
    text_field: str = "text"  # the text field of .jsonl lines

    def check(self) -> None:
        super().check()
        _check_globs("data.paths", self.paths, required=True)

    def documents(self) -> Documents:
        return text_file_documents(self.paths, self.text_field, self.val_fraction)


@SOURCES.register("hf")
@dataclass
class HFConfig(CorpusConfig):
    source: str = "hf"
    hf_name: Optional[str] = None  # a hub dataset, or a builder such as "json"
    hf_config: Optional[str] = None
    hf_data_files: Any = None  # a file, a list, or {split: files}
    hf_train_split: str = "train"
    hf_val_split: Optional[str] = None  # None: hash-split the train split
    text_field: str = "text"  # the text field of dataset rows

    def check(self) -> None:
        super().check()
        if not self.hf_name:
            raise ConfigError(
                "data.hf_name must be set for data.source=hf (a hub name, or 'json'/'text' with data.hf_data_files)"
            )
        _check_globs("data.hf_data_files", self.hf_data_files, required=False)

    def documents(self) -> Documents:
        return hf_documents(
            self.hf_name,
            self.hf_config,
            self.hf_data_files,
            self.hf_train_split,
            self.hf_val_split,
            self.text_field,
            self.val_fraction,
        )


def _check_globs(key: str, patterns: Any, *, required: bool) -> None:
    if patterns is None:
        if required:
            raise ConfigError(f"{key} must be set (a glob or a list of globs)")
        return
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        if "://" in pattern:  # remote files are the data library's business
            continue
        if not glob.glob(os.path.expanduser(pattern), recursive=True):
            raise ConfigError(f"{key}: no file matches {pattern!r}")
