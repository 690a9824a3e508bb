"""Long-document evaluation (``eval.min_doc_tokens``): every window lies inside one document long enough, every
length still scores the same targets in blocks of whole documents, results count the documents long enough at
each length, and a length or minimum that no document reaches is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.data.text import TextData
from lmzoo.data.token_windows import document_ids
from lmzoo.data.validation_spans import ValidationWindows, share_spans, spread_spans
from lmzoo.data.synthetic import MqarConfig
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.measure.evaluation import eval_settings, validation_windows
from lmzoo.scoring.lengths import sampling_note

EOS = ByteTokenizer.eos_id
SIZES = [5, 40, 17, 130, 64, 3, 90, 33, 200, 48, 70, 16]  # tokens of each document before its EOS


def stream(sizes) -> np.ndarray:
    """Documents of ``sizes`` tokens, each followed by EOS; document ``d``'s tokens are all ``d % 200 + 1``, so
    a token names its document."""
    return np.concatenate([np.append(np.full(n, d % 200 + 1), EOS) for d, n in enumerate(sizes)]).astype(np.int32)


def windows_of(sizes, lengths, budget, min_doc_tokens) -> dict[int, ValidationWindows]:
    tokens = stream(sizes)
    spans = spread_spans(tokens, EOS, lengths, budget, min_doc_tokens)
    return {n: ValidationWindows(tokens, n, spans, EOS) for n in lengths}


@pytest.mark.parametrize("budget", [None, 96])
@pytest.mark.parametrize("min_doc_tokens", [10, 64])
def test_windows_lie_inside_one_long_document_and_score_the_same_targets(budget, min_doc_tokens):
    lengths = [4, 8, 16]
    windows = windows_of(SIZES, lengths, budget, min_doc_tokens)
    tokens = stream(SIZES)
    document = document_ids(tokens[None], EOS)[0]  # of every stream token, its closing EOS included
    targets = {}
    for n, w in windows.items():
        batch = w(np.arange(len(w)))
        assert not (batch["inputs"] == EOS).any()  # no document ends before the last target
        assert (batch["segment_ids"] == 0).all()  # so the whole window is one document
        assert (batch["inputs"] == batch["inputs"][:, :1]).all()  # ... the one its first token names
        docs = document[w.spans.starts]
        assert all(SIZES[d] >= max(min_doc_tokens, 16) for d in docs)
        first = w.spans.starts[np.arange(len(w)) // w.pieces] + np.arange(len(w)) % w.pieces * n
        scored = first[:, None] + np.arange(n)  # target t is stream token t + 1
        np.testing.assert_array_equal(tokens[scored + 1], batch["targets"])
        pairs = set(zip(batch["unit"].ravel(), document[scored + 1].ravel()))
        assert len(pairs) == len({u for u, _ in pairs}) == len({d for _, d in pairs})  # a unit is a document
        targets[n] = np.sort(scored.ravel())
    np.testing.assert_array_equal(targets[4], targets[16])
    np.testing.assert_array_equal(targets[8], targets[16])
    assert len(np.unique(targets[16])) == len(targets[16])  # no target scored twice


def test_results_count_the_documents_long_enough_at_each_length():
    windows = windows_of(SIZES, [8, 16, 48], None, 20)
    keys = windows[48].sampling_keys()
    assert keys["sampling"] == "long_documents" and keys["min_doc_tokens"] == 20
    assert keys["qualifying_documents"] == {"8": 8, "16": 8, "48": 6}  # documents of >= 20 / 20 / 48 tokens
    assert keys["scored_documents_of_at_least"] == 48 and keys["documents"] == 6  # the whole split: all of them
    assert len(windows[48]) * 48 == sum(n // 48 * 48 for n in SIZES if n >= 48)
    assert "inside 6 documents of at least 48 tokens" in sampling_note({**keys, "eval_tokens": 480})


def test_a_small_budget_is_shared_evenly_among_the_long_documents():
    capacity = np.array([0, 2, 8, 1, 4, 0, 6])
    for n_spans in range(1, capacity.sum() + 1):
        share = share_spans(capacity, n_spans)
        assert share.sum() == n_spans and (share <= capacity).all()
        uncapped = share[share < capacity]  # a document below its capacity has at most one span less than any
        assert uncapped.size == 0 or share.max() - uncapped.min() <= 1
    windows = windows_of(SIZES, [8, 16], 64, 16)[16]
    assert windows.spans.documents == 4  # four spans of 16: one in each of four documents, not four in one


def trained_on(sizes) -> TextData:
    tokens = stream(sizes)
    return TextData(tokenizer=ByteTokenizer(), train_tokens=tokens, val_tokens=tokens, seq_len=8, seed=0, shard_index=0,
                shard_count=1, bytes_per_token=1.0, fingerprint={})


@pytest.mark.parametrize("settings, lengths, fragment", [
    (["eval.min_doc_tokens=201"], [8], "no validation document is 201 tokens long (the longest of the 12 has 200"),
    (["eval.min_doc_tokens=8"], [8, 256], "no validation document holds a window of 256"),
    (["eval.min_doc_tokens=8"], [96, 128], "no validation document holds a span of 384, the lengths' least common"),
])
def test_a_length_no_document_reaches_is_refused_in_one_line(settings, lengths, fragment):
    with pytest.raises(ConfigError) as error:
        validation_windows(trained_on(SIZES), eval_settings(settings), lengths)
    message = str(error.value)
    assert fragment in message and "\n" not in message and message.startswith("eval.tokens=")
    assert f"eval.min_doc_tokens={settings[0].split('=')[1]}" in message


def test_generated_examples_refuse_a_minimum_document_length():
    task = MqarConfig(seq_len=32, task_vocab=32, num_pairs=4).build(seed=0, shard_index=0, shard_count=1)
    with pytest.raises(ConfigError, match=r"eval.min_doc_tokens=32: this run's data are generated examples"):
        validation_windows(task, eval_settings(["eval.min_doc_tokens=32"]), [32])


def test_without_a_minimum_the_spread_sampling_is_unchanged():
    tokens = stream(SIZES)
    spans = spread_spans(tokens, EOS, [8, 16], 160)
    assert spans.results_keys()["sampling"] == "spread" and "min_doc_tokens" not in spans.results_keys()
    assert (stream(SIZES)[(spans.starts[:, None] + np.arange(16)).ravel()] == EOS).any()  # windows may cross
