"""Synthetic recall tasks: correct answers, determinism, and training/evaluation on them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from lmzoo import registry
from lmzoo.data import build_data

from conftest import tiny_config


def task_data(source, seed=0, **kw):
    return build_data(registry.SOURCES.lookup(source)(**kw), seed=seed)


def val_examples(data, n, start=0, seq_len=None):
    """Validation examples ``start .. start + n - 1`` at ``seq_len`` (default: the task's)."""
    length = seq_len or data.cfg.seq_len
    return data.validation_windows([length], (start + n) * length)[length](np.arange(start, start + n))


def test_mqar_answers_are_the_values_of_the_queried_keys():
    data = task_data("mqar", seq_len=40, task_vocab=32, num_pairs=6, num_queries=5)
    batch = val_examples(data, 4, start=4)
    for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
        seq = np.append(inputs, targets[-1])
        body = seq[seq != data.tokenizer.pad_id]
        context = dict(zip(body[0:12:2], body[1:12:2]))  # 6 pairs
        assert len(context) == 6 and all(k < 16 <= v < 32 for k, v in context.items())  # disjoint halves
        queried, answers = inputs[weights == 1], targets[weights == 1]
        assert len(answers) == 5
        assert [context[k] for k in queried] == list(answers)


def test_tasks_are_deterministic_for_a_seed_and_differ_across_seeds():
    for source in ("mqar", "induction", "selective_copy"):
        a = task_data(source, seed=1, seq_len=32).train_iterator(4)
        b = task_data(source, seed=1, seq_len=32).train_iterator(4)
        c = task_data(source, seed=2, seq_len=32).train_iterator(4)
        first_a, first_b, first_c = next(a), next(b), next(c)
        np.testing.assert_array_equal(first_a["inputs"], first_b["inputs"])
        assert not np.array_equal(first_a["inputs"], first_c["inputs"])
        state = a.get_state()
        expected = next(a)
        b.set_state(state)
        np.testing.assert_array_equal(next(b)["inputs"], expected["inputs"])


def test_induction_scores_the_repeated_half():
    data = task_data("induction", seq_len=31, task_vocab=50)
    batch = val_examples(data, 2)
    seq = np.append(batch["inputs"][0], batch["targets"][0, -1])  # 32 tokens: 16 then the same 16
    np.testing.assert_array_equal(seq[:16], seq[16:])
    assert batch["weights"][0].sum() == 15
    scored = batch["weights"][0] == 1
    np.testing.assert_array_equal(batch["targets"][0][scored], seq[17:])


def test_selective_copy_answers_are_the_marked_symbols_in_order():
    data = task_data("selective_copy", seq_len=40, task_vocab=10, num_marked=5)
    tok = data.tokenizer
    batch = val_examples(data, 3)
    for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
        sep = int(np.flatnonzero(inputs == tok.sep_id)[0])
        marked = inputs[:sep][inputs[:sep] != tok.noise_id]
        np.testing.assert_array_equal(targets[weights == 1], marked)
        assert len(marked) == 5


def test_mqar_can_ask_more_pairs_at_longer_lengths():
    data = task_data("mqar", seq_len=32, num_pairs=4)
    long = val_examples(task_data("mqar", seq_len=32, num_pairs=16), 2, seq_len=96)
    assert long["inputs"].shape == (2, 96) and long["weights"].sum() == 2 * 16
    with pytest.raises(ValueError, match="num_pairs=16"):
        task_data("mqar", seq_len=32, num_pairs=16).train_iterator(2)
    assert data.tokenizer.vocab_size == 64 + 3


def test_every_length_scores_the_same_examples():
    data = task_data("mqar", seq_len=32, num_pairs=4)
    windows = data.validation_windows([32, 64, 128], budget=1000)
    assert {len(w) for w in windows.values()} == {1000 // 128}  # examples the budget holds at the longest length
    answers = {}
    for length, w in windows.items():
        batch = w(np.arange(len(w)))
        np.testing.assert_array_equal(batch["unit"], np.repeat(np.arange(len(w))[:, None], length, axis=1))
        answers[length] = batch["targets"][batch["weights"] == 1]
    np.testing.assert_array_equal(answers[32], answers[128])  # the same queries, answered after more padding
    np.testing.assert_array_equal(answers[64], answers[128])
    with pytest.raises(ValueError, match="fewer than 2 examples of length 128"):
        data.validation_windows([32, 128], budget=200)


@pytest.mark.slow
def test_training_and_evaluation_on_mqar_report_accuracy_with_intervals(tmp_path):
    from lmzoo import eval as lmzoo_eval
    from lmzoo.run.loop import train

    cfg = tiny_config("softmax", "data=mqar", "data.seq_len=24", "data.num_pairs=4", "train.steps=4",
                      "train.eval_every=4", run_dir=tmp_path)
    summary = train(cfg)
    assert 0.0 <= summary["val_accuracy"] <= 1.0 and np.isfinite(summary["val_loss"])
    results = lmzoo_eval.main([f"run_dir={tmp_path}", "eval.lengths=[24,48]", "eval.tokens=1920", "eval.blocks=10",
                               "eval.progress=false"])
    assert results["eval_tokens"] == 1920  # 40 examples of the longest length
    for length, r in results["lengths"].items():
        assert r["tokens"] == 40 * 4  # the same examples, 4 answers each, at every length
        assert r["accuracy_ci"][0] <= r["accuracy"] <= r["accuracy_ci"][1]
        assert len(results["block_sums"][length]["correct"]) == 10


def test_task_settings_are_checked_by_their_task():
    from lmzoo.config import ConfigError

    for source, kwargs, message in [
        ("mqar", {"num_pairs": 0}, "data.num_pairs=0 must be positive"),
        ("mqar", {"num_queries": -1}, "data.num_queries=-1 must be positive"),
        ("mqar", {"task_vocab": 16, "num_pairs": 9}, "data.num_pairs=9 distinct keys need data.task_vocab >= 18"),
        ("selective_copy", {"num_marked": 0}, "data.num_marked=0 must be positive"),
        ("induction", {"task_vocab": 0}, "data.task_vocab=0 must be positive"),
        ("induction", {"seq_len": 0}, "data.seq_len=0 must be positive"),
    ]:
        with pytest.raises(ConfigError, match=f"^{message}$"):
            registry.SOURCES.lookup(source)(**kwargs).check()


def zoology_mqar(n, seed=0, **settings):
    """The first ``n`` training examples of MQAR with zoology's query placement (length 64, 4 pairs: 28 slots)."""
    settings = {"seq_len": 64, "task_vocab": 32, "num_pairs": 4, "query_placement": "power_law", **settings}
    data = task_data("mqar", seed=seed, **settings)
    return data, data._examples(0, settings["seq_len"]).rows(np.arange(n))


def zoologys_law(slots, power_a=0.01):
    """Zoology's probability of each query gap: power_a * d ** (power_a - 1) over d = 1 .. slots, normalised."""
    p = power_a * np.arange(1, slots + 1) ** (power_a - 1)
    return p / p.sum()


def test_mqar_power_law_queries_take_free_slots_after_the_pairs_and_ask_keys_shown_before():
    data, batch = zoology_mqar(300, seq_len=63)  # an odd length: no token left over
    pad = data.tokenizer.pad_id
    for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
        pairs = dict(zip(inputs[0:8:2], inputs[1:8:2]))
        assert len(pairs) == 4 and all(k < 16 <= v < 32 for k, v in pairs.items())
        asked = np.flatnonzero(weights)  # where a queried key is read; its target is the answer
        assert len(asked) == 4 and ((asked - 8) % 2 == 0).all()  # four distinct slots: no two queries collide
        assert sorted(inputs[asked]) == sorted(pairs) and [pairs[k] for k in inputs[asked]] == list(targets[asked])
        rest = np.ones(64, bool)
        rest[:8] = False
        rest[np.concatenate([asked, asked + 1])] = False
        assert (np.append(inputs, targets[-1])[rest] == pad).all()  # slots without a query hold PAD
    _, even = zoology_mqar(4, seq_len=64)
    assert (even["targets"][:, -1] == pad).all()  # 57 tokens after the pairs: 28 slots and one PAD left over


def test_mqar_power_law_slots_follow_zoologys_law():
    from scipy.stats import chisquare

    law = zoologys_law(28)
    _, one = zoology_mqar(4000, num_queries=1)  # one query: its slot is drawn from the law itself
    slot = (np.flatnonzero(one["weights"]) % 64 - 8) // 2  # weights [4000, 64]: a flat index's column
    counts = np.bincount(slot, minlength=28)
    assert chisquare(counts, 4000 * law).pvalue > 1e-3
    assert chisquare(counts, np.full(28, 4000 / 28)).pvalue < 1e-9  # the test tells the law from uniform slots
    # four queries: slots drawn without replacement, each by the law renormalised over the slots left, as
    # zoology's numpy call draws them; compared by how often each slot holds a query
    _, four = zoology_mqar(4000)
    taken = np.zeros(28)
    np.add.at(taken, (np.flatnonzero(four["weights"]) % 64 - 8) // 2, 1)
    legacy = np.random.RandomState(0)
    reference = np.zeros(28)
    for _ in range(10000):
        reference[legacy.choice(28, 4, replace=False, p=law)] += 1
    np.testing.assert_allclose(taken / 4000, reference / 10000, atol=0.04)
    assert taken[0] / 4000 > 0.35 > 4 / 28  # near slots are far likelier than uniform placement makes them


def test_mqar_packed_placement_is_the_default_and_leaves_the_data_as_before():
    from lmzoo.config import ConfigError

    default, packed = task_data("mqar", seq_len=32, num_pairs=4), task_data("mqar", seq_len=32, num_pairs=4,
                                                                          query_placement="packed")
    for key, value in next(default.train_iterator(8)).items():
        np.testing.assert_array_equal(value, next(packed.train_iterator(8))[key])
    assert default.fingerprint == packed.fingerprint and "query_placement" not in default.fingerprint  # runs resume
    assert task_data("mqar", seq_len=32, query_placement="power_law").fingerprint["query_placement"] == "power_law"
    with pytest.raises(ConfigError, match=r"^data.query_placement='spread' is not valid \(choose from: packed, "
                                          r"power_law\)$"):
        registry.SOURCES.lookup("mqar")(query_placement="spread").check()


def test_mqar_distinct_values_differ_within_every_example_and_leave_the_default_as_before():
    from lmzoo.config import ConfigError

    # 7 pairs of 8 value symbols: with replacement most examples repeat a value, so the test can fail
    settings = {"seq_len": 40, "task_vocab": 16, "num_pairs": 7}
    for placement in ("packed", "power_law"):
        distinct = task_data("mqar", query_placement=placement, distinct_values=True, **settings)
        batch = next(distinct.train_iterator(64))
        for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
            body = np.append(inputs, targets[-1])
            body = body[body != distinct.tokenizer.pad_id][:14]  # the pairs
            keys, values = body[0::2], body[1::2]
            assert len(set(values)) == 7 and all(8 <= v < 16 for v in values) and all(k < 8 for k in keys)
            pairs = dict(zip(keys, values))
            assert [pairs[k] for k in inputs[weights == 1]] == list(targets[weights == 1])  # answers still recalled
    repeated = next(task_data("mqar", **settings).train_iterator(64))["inputs"]
    assert np.mean([len(set(row[row != 16][1:14:2])) < 7 for row in repeated]) > 0.5  # the default repeats values
    assert distinct.fingerprint["distinct_values"] is True and "distinct_values" not in task_data("mqar").fingerprint
    with pytest.raises(ConfigError, match=r"^data.num_pairs=9 distinct keys and values \(data.distinct_values=true\) "
                                          r"need data.task_vocab >= 18$"):
        registry.SOURCES.lookup("mqar")(task_vocab=17, num_pairs=9, distinct_values=True).check()


def test_a_fixed_training_set_is_read_whole_each_epoch_in_a_new_order():
    data = task_data("mqar", seed=4, seq_len=16, num_pairs=2, train_examples=12)
    iterator = data.train_iterator(4)  # three batches an epoch
    epochs = [np.concatenate([next(iterator)["inputs"] for _ in range(3)]) for _ in range(3)]
    examples = data._examples(0, 16)
    whole = np.stack([examples(i)["inputs"] for i in range(12)])  # the training split's first 12 examples
    orders = []
    for epoch in epochs:
        order = [int(np.flatnonzero((whole == row).all(axis=1))[0]) for row in epoch]
        assert sorted(order) == list(range(12))  # every example once an epoch, and no other
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    fresh = task_data("mqar", seed=4, seq_len=16, num_pairs=2)
    np.testing.assert_array_equal(next(fresh.train_iterator(4))["inputs"], whole[:4])  # default: examples 0, 1 ...
    assert "train_examples" not in fresh.fingerprint and data.fingerprint["train_examples"] == 12


def test_task_fingerprint_names_the_task_settings_and_seed():
    data = task_data("mqar", seed=3, seq_len=32, num_pairs=4)
    assert data.fingerprint == {"source": "mqar", "seq_len": 32, "task_vocab": 64, "num_pairs": 4, "num_queries": None,
                                "seed": 3, "vocab_size": 67}


# Digests of examples as the tasks drew them when the experiments' verdicts were computed
# (tests/data/synthetic_pins.json): a change in how any example is drawn fails here.
PINNED_SETTINGS = [
    ("mqar", {}),
    ("mqar", {"seq_len": 64, "num_pairs": 8}),
    ("mqar", {"seq_len": 32, "task_vocab": 16, "num_pairs": 4}),
    ("mqar", {"seq_len": 64, "num_pairs": 4, "num_queries": 12}),
    ("mqar", {"seq_len": 40, "num_pairs": 6, "num_queries": 3}),
    ("induction", {"seq_len": 31, "task_vocab": 50}),
    ("induction", {"seq_len": 64}),
    ("selective_copy", {"seq_len": 40, "task_vocab": 10, "num_marked": 5}),
    ("selective_copy", {"seq_len": 64}),
    ("parity", {"seq_len": 64}),
    ("permutation", {"seq_len": 64}),
    ("permutation", {"seq_len": 48, "degree": 5, "task_vocab": 120}),
]
PINNED_INDICES = [0, 1, 2, 77, 12345, 2**33 + 5]  # the last seeds its generator with a two-word index


def batch_digest(batch):
    h = hashlib.sha256()
    for key in ("inputs", "targets", "weights"):
        h.update(np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("source, settings", PINNED_SETTINGS)
def test_examples_are_drawn_as_when_the_verdicts_were_computed(source, settings):
    pins = json.loads((Path(__file__).parent / "synthetic_pins.json").read_text())
    for seed in (0, 7):
        data = task_data(source, seed=seed, **settings)
        pinned = pins[f"{source} {json.dumps(settings, sort_keys=True)} seed={seed}"]
        iterator = data.train_iterator(8)
        assert [batch_digest(next(iterator)) for _ in range(2)] == pinned["train"]
        length = data.cfg.seq_len
        windows = data.validation_windows([length], 20 * length)[length]
        assert batch_digest(windows(np.arange(20))) == pinned["validation"]
        examples = data._examples(1, length)
        rows = [examples(i) for i in PINNED_INDICES]
        assert batch_digest({k: np.stack([r[k] for r in rows]) for k in rows[0]}) == pinned["examples"]
