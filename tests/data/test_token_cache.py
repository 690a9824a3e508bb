"""The token ids of a vocabulary are computed once per corpus and tokenizer: later starts read them from the
cache, a damaged cache file is redone with a warning, and a cache that cannot be written costs nothing else."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from lmzoo.data import corpus
from lmzoo.data.corpus import Documents, cached_streams
from lmzoo.data.tokenizers import ByteTokenizer, bpe_tokenizer, cache_dir

pytest.importorskip("tokenizers")

DOCS = Documents(train=[b"the cat sat on the mat " * 20, b"a dog ran far " * 30],
                 validation=[b"the dog sat " * 10], fingerprint={"sha256": "corpus-1"})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LMZOO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def untokenisable(*args):
    raise AssertionError("the ids should have come from the cache")


def test_the_ids_are_computed_once_then_read_and_equal(cache, monkeypatch):
    tokenizer = bpe_tokenizer(DOCS.train, 300, DOCS.fingerprint)
    first = cached_streams(DOCS, tokenizer)
    assert len(list((cache_dir() / "tokens").glob("*.npz"))) == 1 and not list(cache.rglob("*.tmp"))
    monkeypatch.setattr(corpus, "token_stream", untokenisable)
    again = cached_streams(DOCS, tokenizer)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
        assert b.dtype == np.int32
    other = Documents(DOCS.train, DOCS.validation, {"sha256": "corpus-2"})  # another corpus: not those ids
    with pytest.raises(AssertionError, match="from the cache"):
        cached_streams(other, tokenizer)


def test_a_damaged_cache_file_is_redone_with_a_warning(cache, caplog):
    tokenizer = bpe_tokenizer(DOCS.train, 300, DOCS.fingerprint)
    first = cached_streams(DOCS, tokenizer)
    (saved,) = (cache_dir() / "tokens").glob("*.npz")
    saved.write_bytes(saved.read_bytes()[:40])  # a copy cut short
    with caplog.at_level(logging.WARNING):
        again = cached_streams(DOCS, tokenizer)
    np.testing.assert_array_equal(first[0], again[0])
    assert any("cannot be read" in r.getMessage() and "tokenising again" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(np.load(saved)["train"], first[0])  # rewritten whole


def test_bytes_are_not_cached(cache):
    train, _ = cached_streams(DOCS, ByteTokenizer())
    assert train.size and not (cache / "tokens").exists()
