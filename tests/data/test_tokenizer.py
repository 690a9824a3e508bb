"""``data.tokenizer=bpe``: a byte-level BPE learnt from the training split, cached by the corpus, kept
by the run that trained with it, and scored in bits per byte like the byte tokenizer."""

from __future__ import annotations

import json
import math
import shutil
import sysconfig
from pathlib import Path

import pytest

from conftest import tiny_config
from lmzoo.data import tokenizers
from lmzoo.data.corpus import Documents
from lmzoo.data.text_files import TextFilesConfig, text_file_documents
from lmzoo.record.directory import RunDir
from lmzoo.record.opening import open_trained
from lmzoo.run.loop import train

ROUND_TRIP = ["def f(x):\n\treturn x ** 2  # square\n", "naïve café, 東京, Ελληνικά 🙂\r\n",
              "  leading and trailing  ", "", "\x00\x7f odd bytes \u2028 separators"]


@pytest.fixture
def bpe_trainings(tmp_path, monkeypatch) -> list:
    """A fresh cache, and the BPE trainings that happen in it."""
    monkeypatch.setenv("LMZOO_CACHE", str(tmp_path / "cache"))
    calls, train_bpe = [], tokenizers.train_bpe

    def counted(documents, vocab_size, path):
        calls.append(vocab_size)
        train_bpe(documents, vocab_size, path)

    monkeypatch.setattr(tokenizers, "train_bpe", counted)
    return calls


def test_bpe_learns_the_training_split_once_and_round_trips_any_text(bpe_trainings):
    train_text = [f"import alpha_{i % 7}\nprint(parameter_{i % 5}, 'parameter')\n".encode() for i in range(300)]
    documents = Documents(train=train_text, validation=[b"zyxwvu " * 500], fingerprint={"sha256": "one corpus"})
    spec = TextFilesConfig(paths="unused", tokenizer="bpe", vocab_size=300)
    tokenizer = spec.tokenizer_for(documents)
    assert tokenizers.BPE_MIN_VOCAB < tokenizer.vocab_size <= 300
    assert tokenizer.decode([tokenizer.eos_id]) == "" and tokenizer.eos_id == tokenizer.bos_id == tokenizer.pad_id
    assert len(tokenizer.encode("parameter")) == 1  # a frequent training word is one token
    assert len(tokenizer.encode("zyxwvu")) > 2  # a validation-only word was never learnt
    for text in ROUND_TRIP:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert spec.tokenizer_for(documents).name == tokenizer.name and bpe_trainings == [300]  # cached
    spec.tokenizer_for(Documents(train_text, [b"v"], {"sha256": "another corpus"}))
    TextFilesConfig(paths="unused", tokenizer="bpe", vocab_size=280).tokenizer_for(documents)
    assert bpe_trainings == [300, 300, 280]  # keyed by the corpus and the vocabulary size


def stdlib_corpus(folder: Path) -> Path:
    """A dozen standard-library modules (~170 kB) as text files."""
    folder.mkdir()
    root = Path(sysconfig.get_paths()["stdlib"])
    for name in ("abc", "bisect", "colorsys", "copy", "fnmatch", "functools", "glob", "heapq", "keyword", "locale",
                 "os", "shlex"):
        shutil.copy(root / f"{name}.py", folder / f"{name}.py")
    return folder


@pytest.mark.slow
def test_a_bpe_run_scores_bits_per_byte_and_is_reopened_with_its_own_tokenizer(tmp_path, bpe_trainings, monkeypatch):
    corpus, run = stdlib_corpus(tmp_path / "corpus"), tmp_path / "run"
    train(tiny_config("softmax", "data=text_files", f"data.paths={corpus}/*.py", "data.tokenizer=bpe",
                      "data.vocab_size=400", "train.steps=2", "train.probe_batch=0", "model.n_layers=1", run_dir=run))
    (cached,) = (tmp_path / "cache").glob("tokenizers/*/tokenizer.json")
    assert RunDir(run).tokenizer_path.read_bytes() == cached.read_bytes()

    tokenizer = tokenizers.HFTokenizer(str(cached))
    validation = text_file_documents(f"{corpus}/*.py").validation
    val_bytes = sum(len(document) for document in validation)
    val_tokens = sum(len(tokenizer.encode(document)) + 1 for document in validation)  # each document ends with EOS
    assert val_tokens < 0.8 * val_bytes  # the BPE compresses; bits per byte must undo that
    (row,) = [r for r in RunDir(run).read_metrics() if "val_loss" in r]
    assert row["val_bpb"] == pytest.approx(row["val_loss"] * val_tokens / (val_bytes * math.log(2)), rel=1e-9)

    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setattr(tokenizers, "train_bpe", lambda *args: pytest.fail("reopening the run trained a tokenizer"))
    reopened = open_trained(run)
    assert Path(reopened.data.tokenizer.path) == RunDir(run).tokenizer_path
    assert json.loads(json.dumps(reopened.data.fingerprint)) == RunDir(run).read_fingerprint()
    assert bpe_trainings == [400]
