"""The ``tfds`` corpus (``data=tfds data.tfds_name=<name>``): a TensorFlow Datasets dataset prepared as ArrayRecord
files (``pg19``, ``wiki40b/en``, ``c4/en``, ``lm1b`` ...), read through TFDS's data-source API.

``tfds.data_source`` opens a prepared split for random access without TensorFlow: this source reads the
rows it needs by index (all of them, or ``data.tfds_max_documents`` evenly spaced through each split) and
hands their text to the same pipeline as every corpus (``lmzoo.data.corpus``), so training batches, the
checkpointed data position and validation work as for local files. Nothing is downloaded: a dataset that
is not prepared under ``data.tfds_dir`` is refused in one line naming the ``tfds build`` command that
prepares it. Building pg19, wiki40b or c4 runs their TFDS builders, which need TensorFlow (and Apache Beam
for the large ones) once, on any machine; reading the result needs neither.

Validation is the dataset's own ``validation`` split where it has one (``data.tfds_val_split`` names
another, e.g. ``test`` for lm1b); without one, rows of the training split are hash-split by index
(``lmzoo.data.corpus``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from lmzoo.data.corpus import CorpusConfig, Documents, Unit, content_fingerprint, split_documents
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, positive

log = logging.getLogger("lmzoo.data")

INSTALL = "pip install -e '.[tfds]'"
READ_CHUNK = 1024  # rows fetched per random-access call: large enough to amortise it, small enough to bound memory


def import_tfds():
    """``tensorflow_datasets``, imported here: slow to import, optional, and only this source needs it."""
    logging.getLogger("absl").setLevel(logging.ERROR)  # it warns about every folder it looks into
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ConfigError(f"data=tfds needs the tensorflow-datasets package: {INSTALL}") from None
    return tfds


def build_command(name: str, data_dir: Optional[str]) -> str:
    where = f" --data_dir={data_dir}" if data_dir else ""
    return f"tfds build {name.split(':')[0]} --file_format=array_record{where}"


def open_split(name: str, split: str, data_dir: Optional[str], key: str):
    """The prepared ``split`` (the setting ``key``) of ``name`` as a random-access data source; ConfigError in one
    line when the dataset is not prepared, is prepared as TFRecord files only, or has no such split."""
    tfds = import_tfds()
    where = data_dir or tfds.core.constants.DATA_DIR

    def not_prepared(why: str) -> ConfigError:
        return ConfigError(f"data.tfds_name={name!r} is not prepared as ArrayRecord files under {where} ({why}); "
                           f"prepare it once with TensorFlow installed: {build_command(name, data_dir)}")

    try:
        info = tfds.builder(name, data_dir=data_dir).info
    except Exception as e:  # an unknown name with no prepared files: DatasetNotFoundError, a ValueError
        raise not_prepared(str(e).splitlines()[0][:120]) from None
    if not info.splits:
        raise not_prepared("no prepared splits")
    if info.file_format is None or info.file_format.value != "array_record":
        raise not_prepared(f"its files are {info.file_format.value if info.file_format else 'of no known format'}")
    if split.split("[")[0] not in info.splits:
        raise ConfigError(f"{key}={split!r}: dataset {info.full_name} has the splits {', '.join(info.splits)}")
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # e.g. a malformed slice
        raise ConfigError(f"{key}={split!r}: TFDS cannot open it ({str(e).splitlines()[0][:160]})") from None


def text_feature(features: Any, text_field: Optional[str], name: str) -> str:
    """The feature holding each row's text: ``text_field``, else ``text``, else the dataset's only text feature,
    else its only text feature whose name ends in ``text``."""
    tfds = import_tfds()
    texts = [key for key, feature in features.items()  # Text features, and plain string scalars (np.str_)
             if isinstance(feature, tfds.features.Tensor) and feature.shape == () and feature.np_dtype == np.object_]
    if text_field is not None:
        if text_field not in texts:
            raise ConfigError(f"data.text_field={text_field!r}: dataset {name!r} has no such text feature "
                              f"(text features: {', '.join(texts) or 'none'})")
        return text_field
    named = [key for key in texts if key.endswith("text")]  # e.g. pg19's book_text beside book_title and url
    for candidates in (["text"] if "text" in texts else [], texts, named):
        if len(candidates) == 1:
            return candidates[0]
    raise ConfigError(f"dataset {name!r} has {len(texts)} text features ({', '.join(texts) or 'none'}) and not one "
                      "called 'text' or '*text': name one with data.text_field")


def spread_indices(rows: int, limit: Optional[int]) -> np.ndarray:
    """``limit`` row indices evenly spaced through ``rows`` rows (all of them when ``limit`` is None or larger)."""
    if limit is None or limit >= rows:
        return np.arange(rows)
    return np.arange(limit, dtype=np.int64) * rows // limit


def read_texts(source: Any, field: str, limit: Optional[int]) -> list[bytes]:
    """The UTF-8 text of the rows ``spread_indices`` picks, in row order; a null text becomes an empty document."""
    indices = spread_indices(len(source), limit).tolist()
    texts = []
    for start in range(0, len(indices), READ_CHUNK):
        for row in source.__getitems__(indices[start : start + READ_CHUNK]):
            text = row[field]
            texts.append(text.encode("utf-8") if isinstance(text, str) else bytes(text or b""))
    return texts


def tfds_documents(
    name: str,
    train_split: str = "train",
    val_split: Optional[str] = None,
    text_field: Optional[str] = None,
    data_dir: Optional[str] = None,
    max_documents: Optional[int] = None,
    val_fraction: float = 0.05,
) -> Documents:
    """Documents of a prepared TFDS dataset (``max_documents`` of each split, None: all), held in memory.

    Without ``val_split`` the dataset's ``validation`` split is used, or, where it has none, the training
    split is divided by the hash of each row's index."""
    train_source = open_split(name, train_split, data_dir, "data.tfds_split")
    info = train_source.dataset_info
    field = text_feature(info.features, text_field, name)
    if val_split is None and "validation" in info.splits:
        val_split = "validation"
    log.info("reading %d rows of %s split %r", len(spread_indices(len(train_source), max_documents)), info.full_name,
             train_split)
    train_rows = read_texts(train_source, field, max_documents)
    identity = dict(source="tfds", name=info.full_name, train_split=train_split, val_split=val_split,
                    text_field=field, max_documents=max_documents)
    if val_split is None:
        units = [Unit(f"row:{index}", [text]) for index, text in enumerate(train_rows)]
        return split_documents(units, val_fraction, f"dataset {name!r}", unit_name="rows", **identity)
    validation = read_texts(open_split(name, val_split, data_dir, "data.tfds_val_split"), field, max_documents)
    if not train_rows or not validation:
        raise ConfigError(f"dataset {name!r}: split {train_split!r} or {val_split!r} is empty")
    units = [Unit(f"{train_split}:{i}", [t]) for i, t in enumerate(train_rows)]
    units += [Unit(f"{val_split}:{i}", [t]) for i, t in enumerate(validation)]
    fingerprint = dict(identity, **content_fingerprint(units, "rows"), split_by="dataset splits",
                       train_documents=len(train_rows), val_documents=len(validation))
    return Documents(train=train_rows, validation=validation, fingerprint=fingerprint)


@SOURCES.register("tfds")
@dataclass
class TFDSConfig(CorpusConfig):
    source: str = "tfds"
    tfds_name: Optional[str] = None  # name[/config][:version], e.g. pg19, wiki40b/en, c4/en, lm1b
    tfds_split: str = "train"  # the training split (TFDS slicing such as train[:10%] works)
    tfds_val_split: Optional[str] = None  # None: the dataset's validation split, else a hash split of the training one
    text_field: Optional[str] = None  # None: the text feature "text", the only one, or the only "*text" (book_text)
    tfds_dir: Optional[str] = None  # where the prepared data lies; None: $TFDS_DATA_DIR or ~/tensorflow_datasets
    tfds_max_documents: Optional[int] = None  # rows read from each split, evenly spaced through it; None: all

    def check(self) -> None:
        super().check()
        if not self.tfds_name:
            raise ConfigError("data.tfds_name must be set for data=tfds (e.g. pg19, wiki40b/en, c4/en, lm1b)")
        if self.tfds_max_documents is not None:
            positive("data.tfds_max_documents", self.tfds_max_documents)

    def documents(self) -> Documents:
        return tfds_documents(self.tfds_name, self.tfds_split, self.tfds_val_split, self.text_field, self.tfds_dir,
                              self.tfds_max_documents, self.val_fraction)
