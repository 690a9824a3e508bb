"""Batched draws equal numpy's Generator draws row by row, and batches equal their examples made one by one."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo import registry
from lmzoo.data import build_data
from lmzoo.data.draws import BatchDraws, NotVectorised, pcg64_outputs, seed_words
from lmzoo.data.synthetic import TaskExamples

INDICES = np.array([0, 1, 2, 5, 77, 4096, 123456, 2**31 + 3, 2**32 - 1])


def one_by_one(examples, indices):
    rows = [examples(i) for i in indices]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


@pytest.mark.parametrize("key", [[0, 0], [7, 1], [3], [1, 2, 3, 4, 5], [2**32 - 1, 0]])
def test_seeding_and_outputs_are_numpys(key):
    entropy = np.array([[*key, i] for i in INDICES], np.uint32)
    seeds = seed_words(entropy)
    sequences = [np.random.SeedSequence([*key, int(i)]) for i in INDICES]
    np.testing.assert_array_equal(seeds, [s.generate_state(4, np.uint64) for s in sequences])
    np.testing.assert_array_equal(pcg64_outputs(seeds, 40), [np.random.PCG64(s).random_raw(40) for s in sequences])
    np.testing.assert_array_equal(pcg64_outputs(seeds, 40, 13), pcg64_outputs(seeds, 40)[:, 13:])


def test_bounded_draws_are_numpys_and_rows_numpy_redraws_are_marked():
    draws = BatchDraws([4, 0], np.arange(200), words=5)
    got = [draws.choice(32, 8), draws.integers(32, 64, 8), draws.choice(8, 8), draws.integers(0, 5, 12),
           draws.choice(55, 5), draws.integers(0, 1, 3), draws.integers(-3, 2**32 - 3, 2),
           draws.integers(0, 2**31 + 1, 6)]  # the last range is redrawn by numpy about half the time
    assert 0 < draws.redo.sum() < 200
    for row in np.flatnonzero(~draws.redo):
        rng = np.random.default_rng([4, 0, row])
        expected = [rng.choice(32, 8, replace=False), rng.integers(32, 64, 8), rng.choice(8, 8, replace=False),
                    rng.integers(0, 5, 12), rng.choice(55, 5, replace=False), rng.integers(0, 1, 3),
                    rng.integers(-3, 2**32 - 3, 2), rng.integers(0, 2**31 + 1, 6)]
        for values, wanted in zip(got, expected):
            np.testing.assert_array_equal(values[row], wanted)
    with pytest.raises(NotVectorised):
        draws.integers(0, 2**32 + 1, 1)
    with pytest.raises(NotVectorised):
        draws.choice(20000, 500)


def test_entropy_wider_than_a_word_is_left_to_a_generator():
    draws = BatchDraws([0, 1], np.array([3, 2**32, 2**40]))
    np.testing.assert_array_equal(draws.redo, [False, True, True])
    assert BatchDraws([2**32, 1], np.array([3])).redo.all()


@pytest.mark.parametrize("source, settings", [
    ("induction", {"seq_len": 5, "task_vocab": 2**30 + 1}),  # numpy redraws about a quarter of these draws
    ("selective_copy", {"seq_len": 10_300, "num_marked": 250}),  # a choice numpy makes by a whole shuffle
    ("mqar", {"seq_len": 48, "num_pairs": 5, "num_queries": 7}),
    ("mqar", {"seq_len": 48, "num_pairs": 5, "num_queries": 7, "query_placement": "power_law"}),
    ("mqar", {"seq_len": 48, "num_pairs": 5, "query_placement": "power_law", "distinct_values": True}),
    ("permutation", {"seq_len": 33, "degree": 4, "task_vocab": 24}),
])
def test_a_batch_is_its_examples_made_one_by_one(source, settings):
    data = build_data(registry.SOURCES.lookup(source)(**settings), seed=5)
    examples = TaskExamples(data.cfg, 5, 0, data.cfg.seq_len + 1, data.tokenizer)
    indices = INDICES[:4] if settings.get("seq_len", 0) > 1000 else np.concatenate([INDICES, [2**33, 9]])
    batch, expected = examples.rows(indices), one_by_one(examples, indices)
    if source == "induction":  # the rows a Generator remakes are among those compared
        draws = BatchDraws([5, 0], indices)
        data.cfg.labelled_rows(draws, examples.length, data.tokenizer)
        assert 0 < draws.redo.sum() < len(indices) - 1
    assert batch.keys() == expected.keys()
    for key in batch:
        assert batch[key].dtype == expected[key].dtype
        np.testing.assert_array_equal(batch[key], expected[key])


def test_training_batches_in_any_order_and_for_each_process():
    whole = build_data(registry.SOURCES.lookup("mqar")(seq_len=32, num_pairs=4), seed=2)
    second = build_data(registry.SOURCES.lookup("mqar")(seq_len=32, num_pairs=4), seed=2, shard_index=1, shard_count=2)
    batches, halves = whole._batches(0, 8), second._batches(0, 8)
    examples = whole._examples(0, 32)
    for b in (40, 3, 0, 41, 1000, 2):  # blocks of 32 batches, asked for out of order
        expected = one_by_one(examples, b * 8 + np.arange(8))
        for key, value in batches[b].items():
            np.testing.assert_array_equal(value, expected[key])
            np.testing.assert_array_equal(halves[b][key], expected[key][4:])
