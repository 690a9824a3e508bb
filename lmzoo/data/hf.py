"""The ``hf`` corpus (``data=hf data.hf_name=<name>``): a Hugging Face ``datasets`` dataset (a hub name, or
a local builder such as ``"json"`` with ``data.hf_data_files``), held in memory.

``data.hf_max_rows=N`` keeps the first N rows of each split. With ``data.hf_streaming=true`` the rows are
read as a stream, so only those N are downloaded: how a corpus far larger than memory (FineWeb-Edu,
``data=fineweb_edu``) gives a fixed, reproducible sample of itself.

Without a network the Hugging Face libraries retry for about half a minute; when the Hub does not
answer a short connection, they are put in offline mode instead, so a cached dataset still loads and
an uncached one fails at once in one line (``NetworkFault``, exit code 6).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union
from urllib.parse import urlsplit

from lmzoo.data.corpus import CorpusConfig, Documents, Unit, as_list, check_globs, content_fingerprint, split_documents
from lmzoo.faults import NetworkFault, first_line
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, positive


def _hf_texts(dataset: Any, text_field: str, what: str, max_rows: Optional[int] = None) -> list[bytes]:
    if text_field not in dataset.column_names:
        raise ValueError(f"{what} has no column {text_field!r} (columns: {dataset.column_names}); set data.text_field")
    if max_rows is not None:
        dataset = dataset.select(range(min(max_rows, len(dataset))))
    # Null cells become empty documents rather than failing the whole load.
    return [(text or "").encode("utf-8") for text in dataset[text_field]]


def _streamed_texts(rows: Iterable[dict], text_field: str, what: str, max_rows: Optional[int]) -> list[bytes]:
    """The first ``max_rows`` rows' texts of a streamed split (all of them when None)."""
    texts = []
    for row in itertools.islice(rows, max_rows):
        if text_field not in row:
            raise ValueError(f"{what} has no column {text_field!r} (columns: {sorted(row)}); set data.text_field")
        texts.append((row[text_field] or "").encode("utf-8"))
    return texts


def _hf_data_files(data_files: Any) -> Union[list[str], dict[str, list[str]], None]:
    """Plain lists/dicts (``datasets`` accepts a file, a list, or a split -> files mapping)."""
    if isinstance(data_files, Mapping):
        return {str(split): as_list(files) for split, files in data_files.items()}
    return as_list(data_files) or None


HUB = "huggingface.co"
LOCAL_BUILDERS = ("json", "text", "csv", "parquet", "arrow", "webdataset")  # read data.hf_data_files; no download


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub (``HF_ENDPOINT`` or huggingface.co) answers a TCP connection within ``timeout`` seconds."""
    host = urlsplit(os.environ.get("HF_ENDPOINT", f"https://{HUB}"))
    try:
        socket.create_connection((host.hostname, host.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def go_offline_without_network(name: str, data_files: Any) -> str | None:
    """Without a network, Hugging Face's libraries retry for about half a minute before failing; set their offline
    mode instead when the Hub does not answer, so a cached dataset still loads and an uncached one fails at once.
    Returns why it went offline (None: it did not)."""
    remote_files = any("://" in f for f in jsonable_files(data_files))
    if (name in LOCAL_BUILDERS and not remote_files) or os.path.isdir(name) or os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    if hub_reachable():
        return None
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets.config
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True  # read at their import
    return f"{HUB} did not answer within 3 s"


@contextmanager
def local_files_read_quietly(name: str, datasets):
    """A local builder (json, text ...) reads files in moments: no progress bar, and a file that does not parse
    logs no error of its own (the one line the caller raises names it)."""
    if name not in LOCAL_BUILDERS:
        yield
        return
    logger = logging.getLogger("datasets")
    level, bars = logger.level, datasets.is_progress_bar_enabled()
    logger.setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def innermost(error: BaseException) -> BaseException:
    """The first cause in a chain of ``raise ... from`` (what a file's parser said, under the library's wrappers)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def first_bad_json_line(files: list[str]) -> str | None:
    """Where the first line of JSON-lines ``files`` that does not parse is, counted from 1 as an editor counts
    (the JSON builder's own message counts rows from 0, within a block of the file), or None."""
    for file in files:
        try:
            text = Path(file).read_text()
        except (OSError, ValueError):
            continue
        try:
            json.loads(text)  # a whole JSON document, not lines
            continue
        except ValueError:
            pass
        for number, line in enumerate(text.splitlines(), 1):
            try:
                line.strip() and json.loads(line)
            except ValueError as e:
                return f"{file}, line {number}: {first_line(e)}"
    return None


def jsonable_files(data_files: Any) -> list[str]:
    if isinstance(data_files, dict):
        return [f for files in data_files.values() for f in files]
    return list(data_files or [])


def hf_documents(
    name: str,
    config: Optional[str] = None,
    data_files: Union[str, Sequence[str], Mapping[str, Any], None] = None,
    train_split: str = "train",
    val_split: Optional[str] = None,
    text_field: str = "text",
    val_fraction: float = 0.05,
    streaming: bool = False,
    max_rows: Optional[int] = None,
) -> Documents:
    """Documents from ``datasets.load_dataset``: each split's first ``max_rows`` rows (all when None), held in
    memory; ``streaming`` reads them as a stream instead of downloading the whole split first.

    Without ``val_split`` the train split is divided by the hash of each row's
    index.
    """
    logging.getLogger("datasets").setLevel(logging.WARNING)  # its import announces each framework it finds
    try:
        import datasets  # Imported here: it is slow to import, optional, and only this source needs it.
    except ImportError:
        raise ValueError("data.source=hf needs the Hugging Face datasets package: pip install -e '.[hf]'") from None

    if not name:
        raise ValueError("data.hf_name is required for data.source='hf'")
    data_files = _hf_data_files(data_files)
    offline = go_offline_without_network(name, data_files)

    def load(split: str) -> list[bytes]:
        what = f"dataset {name!r} split {split!r}"
        try:
            with local_files_read_quietly(name, datasets):
                dataset = datasets.load_dataset(name, config, split=split, data_files=data_files, streaming=streaming)
            if streaming:  # the rows arrive (and a network can fail) while they are read
                return _streamed_texts(dataset, text_field, what, max_rows)
        except ConnectionError as e:  # datasets' own ConnectionError is a subclass, as are requests' and socket's
            raise NetworkFault(f"data.hf_name={name!r} could not be downloaded ({offline or first_line(e)}) and is not "
                               "in the local Hugging Face cache; connect to the network, or use data=text_files"
                               ) from None
        except datasets.exceptions.DatasetGenerationError as e:  # a local file that does not parse, deep inside
            files = jsonable_files(data_files)
            why = (name == "json" and first_bad_json_line(files)) or first_line(innermost(e))
            raise ValueError(f"data.hf_data_files={files} could not be read by the {name!r} builder ({why}); "
                             f"fix that file") from None
        return _hf_texts(dataset, text_field, what, max_rows)

    train_rows = load(train_split)
    identity = dict(source="hf", name=name, config=config, data_files=data_files, train_split=train_split,
                    val_split=val_split)
    if max_rows is not None:  # only when set, so the fingerprints of runs from before the setting stay as they were
        identity.update(max_rows=max_rows)
    if val_split is None:
        units = [Unit(f"row:{index}", [text]) for index, text in enumerate(train_rows)]
        return split_documents(units, val_fraction, f"dataset {name!r}", unit_name="rows", **identity)
    validation = load(val_split)
    if not train_rows or not validation:
        raise ValueError(f"dataset {name!r}: split {train_split!r} or {val_split!r} is empty")
    units = [Unit(f"{train_split}:{i}", [t]) for i, t in enumerate(train_rows)]
    units += [Unit(f"{val_split}:{i}", [t]) for i, t in enumerate(validation)]
    fingerprint = dict(
        identity,
        **content_fingerprint(units, "rows"),
        split_by="dataset splits",
        train_documents=len(train_rows),
        val_documents=len(validation),
    )
    return Documents(train=train_rows, validation=validation, fingerprint=fingerprint)


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
    hf_streaming: bool = False  # read the rows as a stream: only those kept are downloaded
    hf_max_rows: Optional[int] = None  # keep each split's first this many rows; None: all

    def check(self) -> None:
        super().check()
        if self.hf_max_rows is not None:
            positive("data.hf_max_rows", self.hf_max_rows)
        if not self.hf_name:
            raise ConfigError(
                "data.hf_name must be set for data.source=hf (a hub name, or 'json'/'text' with data.hf_data_files)"
            )
        check_globs("data.hf_data_files", self.hf_data_files, required=False)

    def documents(self) -> Documents:
        return hf_documents(
            self.hf_name,
            self.hf_config,
            self.hf_data_files,
            self.hf_train_split,
            self.hf_val_split,
            self.text_field,
            self.val_fraction,
            self.hf_streaming,
            self.hf_max_rows,
        )
