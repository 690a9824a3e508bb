"""Every data source ``build_data`` can make keeps the written contract (lmzoo.data.base): the ``Data``
protocol's members, with the protocol's signatures, behaving as the trainer and the evaluation read them."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

from lmzoo.data import Data, SourceMetrics, Windows, build_data
from lmzoo.data.corpus import CorpusConfig
from lmzoo.registry import SOURCES
from lmzoo.schema import to_dataclass

SEQ_LEN = 64


def corpus(folder) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(12):
        (folder / f"f{i:02d}.txt").write_text(f"document {i}: " + "".join(chr(97 + (i * j) % 26) for j in range(400)))
    return str(folder / "*.txt")


def settings(name: str, tmp_path) -> dict:
    """Small settings that build source ``name`` here, without a download."""
    if name == "text_files":
        return {"paths": corpus(tmp_path / "text"), "val_fraction": 0.5}
    if name == "mix":
        return {"components": {"text": {"source": "text_files", "paths": corpus(tmp_path / "text"), "weight": 0.9,
                                        "val_fraction": 0.5},
                               "passkey": {"source": "passkey", "weight": 0.1, "digits": 3}}}
    return {}  # a synthetic task: its defaults


MEMBERS = list(Data.__annotations__)  # tokenizer, fingerprint ...
METHODS = [name for name, value in vars(Data).items() if inspect.isfunction(value) and not name.startswith("_")]
BUILT_HERE = ["text_files", "mix", *(n for n in SOURCES.names() if not issubclass(SOURCES.lookup(n), CorpusConfig)
                                            and n != "mix")]


def test_every_source_is_built_here_or_builds_as_every_corpus():
    """A corpus not built below (stdlib reads the whole standard library, hf and tfds need their libraries and
    prepared files) builds its data with ``CorpusConfig.build``, as text_files does: a new source builds below
    or shares it."""
    for name in SOURCES.names():
        spec = SOURCES.lookup(name)
        assert name in BUILT_HERE or (issubclass(spec, CorpusConfig) and spec.build is CorpusConfig.build), name


@pytest.mark.parametrize("name", BUILT_HERE)
def test_every_source_keeps_the_data_protocol(name, tmp_path):
    spec = to_dataclass(SOURCES.lookup(name), {"seq_len": SEQ_LEN, **settings(name, tmp_path)}, prefix="data.")
    spec.check()
    data = build_data(spec, seed=0)
    assert isinstance(data, Data), [m for m in [*MEMBERS, *METHODS] if not hasattr(data, m)]
    for method in METHODS:
        wanted = list(inspect.signature(getattr(Data, method)).parameters)[1:]
        assert list(inspect.signature(getattr(data, method)).parameters) == wanted, method

    batch = next(data.train_iterator(4))
    assert batch["inputs"].shape == batch["targets"].shape == (4, SEQ_LEN)
    assert data.document_boundaries in ("none", "mask") and data.bytes_per_token > 0
    json.dumps(data.fingerprint)
    windows = data.validation_windows([SEQ_LEN, 2 * SEQ_LEN], 8 * SEQ_LEN)
    for length, own in windows.items():
        assert isinstance(own, Windows) and own.length == length
        assert own(np.arange(2))["inputs"].shape == (2, length) and len(own) >= 2
    assert isinstance(data.source_metrics(SEQ_LEN, 8 * SEQ_LEN), SourceMetrics)

    if data.streams:
        assert next(data.stream_iterator(4))["continues"].shape == (4,)
    else:
        with pytest.raises(ValueError):
            data.stream_iterator(4)
    if not data.has_documents:
        with pytest.raises(ValueError, match="minimum document length"):
            data.validation_windows([SEQ_LEN], 8 * SEQ_LEN, min_doc_tokens=SEQ_LEN)
