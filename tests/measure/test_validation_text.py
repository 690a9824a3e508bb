"""Which validation text is scored: spans spread over every document, the same targets at every length,
and blocks made of whole documents."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.data import build_data
from lmzoo.data.token_windows import document_ids
from lmzoo.data.validation_spans import ValidationWindows, spread_spans, spread_starts
from lmzoo.data.synthetic import MqarConfig
from lmzoo.data.text_files import TextFilesConfig
from lmzoo.scoring.lengths import block_of_units, sampling_note, score_length
from lmzoo.stats.bootstrap import block_starts

EOS = 0


def stream(sizes) -> np.ndarray:
    """Documents of ``sizes`` tokens, each ending in EOS (0); every other token is its position + 1, so a
    target names where it stands in the stream."""
    tokens = np.arange(1, sum(sizes) + 1, dtype=np.int32)
    tokens[np.cumsum(sizes) - 1] = EOS
    return tokens


def document_of_targets(tokens) -> np.ndarray:
    """The document of every target (stream token 1 onwards): EOS tokens before it."""
    return document_ids(tokens[None], EOS)[0, 1:]


def scored_positions(spans) -> np.ndarray:
    """Target indices of every scored target, span by span."""
    return (spans.starts[:, None] + np.arange(spans.length)).ravel()


def every_window(windows) -> dict:
    return windows(np.arange(len(windows)))


def token_ids(inputs, targets, segment_ids=None):
    """A stand-in forward whose "loss" of a target is its token id: equal sums mean the same tokens."""
    return {"loss": targets.astype(float), "correct": np.zeros(targets.shape)}


# A long file beside many short ones, as the stdlib's validation split has (one file is 62% of it).
SIZES = [700, 40, 3000, 90, 25, 60_000, 400, 1200, 15, 800, 5000, 333]


def test_every_length_scores_the_same_targets_in_the_same_units():
    tokens = stream(SIZES)
    spans = spread_spans(tokens, EOS, [32, 48, 96], budget=6000)  # spans of lcm(32, 48, 96) = 96
    assert spans.length == 96 and len(spans.starts) == 6000 // 96
    positions = scored_positions(spans)
    assert len(np.unique(positions)) == len(positions) and positions.max() < len(tokens) - 1  # each target once
    batches = {n: every_window(ValidationWindows(tokens, n, spans)) for n in (32, 48, 96)}
    for n, batch in batches.items():
        np.testing.assert_array_equal(batch["targets"].ravel(), tokens[positions + 1])
        np.testing.assert_array_equal(batch["unit"].ravel(), batches[96]["unit"].ravel())
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])  # windows are contiguous
    sums = {n: score_length(token_ids, ValidationWindows(tokens, n, spans), rows=5, blocks=4, n_buckets=3)
            for n in (32, 48, 96)}
    for n in (32, 48):
        np.testing.assert_array_equal(sums[n].loss, sums[96].loss)
        np.testing.assert_array_equal(sums[n].count, sums[96].count)


def test_the_budget_is_spread_over_every_document_not_the_first_ones():
    tokens = stream(SIZES)
    spans = spread_spans(tokens, EOS, [16], budget=4800)
    document = document_of_targets(tokens)
    per_document = np.bincount(document[scored_positions(spans)], minlength=len(SIZES))
    assert spans.documents == len(SIZES) and (per_document > 0).all()  # the last documents too
    assert spans.block_unit == "document" and spans.units == len(SIZES)
    # short documents whole (but for less than a span at a start), long ones about an equal share (600 targets
    # each here): the 60,000-token file is not 78% of the score
    for short in (1, 3, 4, 6, 8):
        assert SIZES[short] - 16 < per_document[short] <= SIZES[short] + 16
    assert 500 < per_document[5] < 700
    assert spans.largest_share == per_document.max() / 4800 < 0.2
    first_n = np.bincount(document[:4800], minlength=len(SIZES))  # what scoring the first targets covered
    assert (first_n > 0).sum() == 6  # ...half the documents


def test_a_budget_as_large_as_the_split_scores_all_of_it():
    tokens = stream(SIZES)
    available = len(tokens) - 1
    for budget in (None, 10 * available):
        spans = spread_spans(tokens, EOS, [64, 128], budget)
        positions = scored_positions(spans)
        assert len(positions) == available // 128 * 128 and len(np.unique(positions)) == len(positions)
        assert spans.documents == len(SIZES)


def test_spans_never_overlap_and_stay_in_the_split_for_any_document_sizes():
    rng = np.random.default_rng(0)
    for _ in range(30):
        sizes = rng.integers(1, 3000, size=rng.integers(1, 40)) * rng.choice([1, 1, 1, 40], size=1)
        available = int(sizes.sum())
        span = int(rng.choice([8, 24, 64]))
        n_spans = int(rng.integers(1, available // span + 1))
        starts = spread_starts(sizes, n_spans, span)
        assert len(starts) == n_spans and starts[0] >= 0 and starts[-1] + span <= available
        assert (np.diff(starts) >= span).all()


def test_blocks_hold_whole_documents():
    tokens = stream(SIZES)
    document = document_of_targets(tokens)
    windows = ValidationWindows(tokens, 32, spread_spans(tokens, EOS, [32], budget=4800))
    batch = every_window(windows)
    scored = document[scored_positions(windows.spans)]  # the document of every scored target, in batch order
    for n_blocks in (windows.units, 5, 2):  # a block per document, then groups of whole documents
        block = block_of_units(windows.units, n_blocks)(batch["unit"]).ravel()
        for d in np.unique(scored):
            assert len(np.unique(block[scored == d])) == 1  # no document's spans in two blocks
        counts = score_length(token_ids, windows, rows=4, blocks=n_blocks, n_buckets=1).count
        per_document = np.unique(scored, return_counts=True)[1]  # the scored documents, in stream order
        whole = np.add.reduceat(per_document, block_starts(windows.units, n_blocks))
        np.testing.assert_array_equal(counts, whole)


def test_a_one_document_split_blocks_its_spans_and_says_so():
    tokens = stream([5000])
    spans = spread_spans(tokens, EOS, [32, 64], budget=1024)
    assert (spans.block_unit, spans.documents, spans.units) == ("span", 1, 16)
    assert spans.results_keys()["block_unit"] == "span" and spans.results_keys()["documents"] == 1
    batch = every_window(ValidationWindows(tokens, 32, spans))
    np.testing.assert_array_equal(batch["unit"], np.repeat(np.arange(16), 2)[:, None] * np.ones(32, int))
    with pytest.raises(ValueError, match="two blocks"):
        spread_spans(tokens, EOS, [64], budget=64)  # one span of one document: no interval


def write_documents(folder, count):
    for i in range(count):
        (folder / f"{i:02d}.txt").write_text(f"document {i}\n" * (3 + 7 * i))
    return str(folder / "*.txt")


def test_masked_documents_score_the_same_spans_with_segment_ids(tmp_path):
    paths = write_documents(tmp_path, 30)
    packed = build_data(TextFilesConfig(paths=paths, seq_len=16, val_fraction=0.4), seed=0)
    masked = build_data(TextFilesConfig(paths=paths, seq_len=16, val_fraction=0.4, document_boundaries="mask"), seed=0)
    for length in (16, 32):
        plain = every_window(packed.validation_windows([16, 32], 640)[length])
        kept_apart = every_window(masked.validation_windows([16, 32], 640)[length])
        for key in ("inputs", "targets", "unit"):
            np.testing.assert_array_equal(kept_apart[key], plain[key])
        np.testing.assert_array_equal(kept_apart["segment_ids"],
                                      document_ids(kept_apart["inputs"], masked.tokenizer.eos_id))
        assert "segment_ids" not in plain


def test_data_records_documents_and_sampling(tmp_path):
    data = build_data(TextFilesConfig(paths=write_documents(tmp_path, 30), seq_len=16, val_fraction=0.4), seed=0)
    documents = int((data.val_tokens == data.tokenizer.eos_id).sum())
    keys = data.validation_windows([16, 32], 640)[32].sampling_keys()
    assert keys["sampling"] == "spread" and keys["span"] == 32 and keys["block_unit"] == "document"
    assert 1 < keys["documents"] <= documents
    assert keys == data.validation_windows([16, 32], 640)[16].sampling_keys()  # one record for all lengths
    assert keys["scored_digest"] != data.validation_windows([16, 64], 640)[16].sampling_keys()["scored_digest"]


def test_synthetic_examples_stay_their_own_units():
    task = MqarConfig(seq_len=32, task_vocab=32, num_pairs=4).build(seed=0, shard_index=0, shard_count=1)
    windows = task.validation_windows([32, 64], budget=640)
    assert windows[32].sampling_keys() == {"sampling": "examples", "examples": 10, "block_unit": "example"}
    np.testing.assert_array_equal(every_window(windows[64])["unit"][:, 0], np.arange(10))


def test_results_without_a_sampling_key_are_named_first_n():
    assert "first 65536 validation targets" in sampling_note({"eval_tokens": 65536})
    new = {"eval_tokens": 4096, "sampling": "spread", "documents": 12, "span": 512, "block_unit": "document"}
    assert sampling_note(new) == "4096 targets spread over 12 documents in spans of 512, blocks of whole documents"
