"""The MAD tasks' generators against the paper's definitions: vocabulary splits, noise shares, which positions
are scored and what their answers are, and MAD's difficulty settings."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.data import mad
from lmzoo.schema import ConfigError


def examples(task, count=200, seed=0, **settings):
    return [mad.draw(task, np.random.default_rng([seed, i]), **settings) for i in range(count)]


def pairs_of(example):
    """The (key, value) slots of a recall instance: the inputs plus its last target, two tokens a slot."""
    tokens = np.append(example.inputs, example.targets[-1])
    return tokens.reshape(-1, 2)


def test_in_context_recall_splits_keys_and_values_keeps_one_mapping_and_scores_repeated_keys():
    for ex in examples("in_context_recall", vocab_size=16, seq_len=128):
        assert len(ex.inputs) == len(ex.targets) == len(ex.scored) == 127
        slots = pairs_of(ex)
        assert (slots[:, 0] < 8).all() and ((slots[:, 1] >= 8) & (slots[:, 1] < 16)).all()
        mapping, seen = {}, set()
        for position, (key, value) in enumerate(slots):
            assert mapping.setdefault(key, value) == value  # one value per key within a sequence
            # the value's target position (2 * slot) is scored exactly when its key came before
            assert ex.scored[2 * position] == (key in seen)
            seen.add(key)
        assert ex.scored[-1] and not ex.scored[1::2].any()  # the probe is answered; keys are never scored
        np.testing.assert_array_equal(ex.targets[:-1], ex.inputs[1:])  # trained on every next token


def test_noisy_recall_noise_share_and_vocabulary():
    for frac in (0.2, 0.6):
        drawn = examples("noisy_recall", count=300, vocab_size=32, noise_vocab_size=16, seq_len=128, frac_noise=frac)
        tokens = np.concatenate([pairs_of(ex).reshape(-1) for ex in drawn])
        noise = tokens >= 16
        # 63 slots, of which the probe and one guaranteed pair are never noise: expected share frac * 62 / 64
        assert noise.mean() == pytest.approx(frac * 62 / 64, abs=0.02)
        for ex in drawn:
            slots = pairs_of(ex)
            noisy = slots[:, 0] >= 16
            assert (noisy == (slots[:, 1] >= 16)).all()  # a slot is all noise or a pair
            assert not ex.scored[2 * np.flatnonzero(noisy)].any()  # noise is never scored
            assert not noisy[-1] and (slots[~noisy, 0] < 8).all() and (slots[~noisy, 1] // 8 == 1).all()


def test_fuzzy_recall_motifs_and_scored_values():
    for ex in examples("fuzzy_recall", count=100, vocab_size=16, seq_len=128, k_motif_size=3, v_motif_size=3):
        tokens = np.append(ex.inputs, ex.targets[-1])
        assert len(tokens) == 128
        body = tokens[np.argmax(tokens != 15):]  # left-padded with the last id
        assert (body != 15).all()
        keys = body < 7  # symbols 0..13: keys 0..6, values 7..13
        runs = np.split(body, np.flatnonzero(np.diff(keys.astype(int))) + 1)
        assert all(1 <= len(r) <= 3 and len(set(r)) == len(r) for r in runs)  # motifs of distinct tokens
        pairs = list(zip(runs[0::2], runs[1::2]))
        assert len(runs) % 2 == 0 and all(k[0] < 7 <= v[0] for k, v in pairs)
        mapping = {}
        for key, value in pairs:
            assert tuple(mapping.setdefault(tuple(key), tuple(value))) == tuple(value)
        assert ex.scored[-len(pairs[-1][1]):].all()  # the probe's value is answered
        assert (ex.targets[ex.scored] >= 7).all()  # only value tokens are scored
    for ex in examples("fuzzy_recall", count=30, vocab_size=16, seq_len=128, test=True):
        body = np.append(ex.inputs, ex.targets[-1])
        body = body[np.argmax(body != 15):]
        runs = np.split(body, np.flatnonzero(np.diff((body < 7).astype(int))) + 1)
        assert all(len(k) == 3 for k in runs[0::2])  # evaluation keys: the largest motif


def test_selective_copying_answers_the_scattered_symbols_in_order():
    for ex in examples("selective_copying", count=100, vocab_size=16, seq_len=256, num_tokens_to_copy=16):
        assert len(ex.inputs) == 256 and ex.scored.sum() == 16 and ex.scored[-16:].all()
        copy = np.flatnonzero(ex.inputs == 15)
        assert copy.tolist() == [256 - 17]
        context = ex.inputs[: copy[0]]
        np.testing.assert_array_equal(context[context != 14], ex.targets[-16:])  # in their order of occurrence
        assert (ex.inputs[-16:] == 14).all() and (ex.targets[-16:] < 14).all()  # answers never shown after copy


def test_compression_targets_the_whole_input_and_memorization_one_fixed_bijection():
    for ex in examples("compression", count=50, vocab_size=16, seq_len=32):
        assert ex.inputs[-1] == 15 and (ex.inputs[:-1] < 15).all()
        np.testing.assert_array_equal(ex.targets[ex.scored], ex.inputs[:-1])
    facts = mad.memorization_map(256)
    assert sorted(facts) == list(range(127)) and sorted(facts.values()) == list(range(127, 254))  # a bijection
    for ex in examples("memorization", count=50, vocab_size=256, seq_len=32, facts=facts):
        assert (ex.inputs[1::2] == 255).all() and ex.scored.tolist() == [False, True] * 16
        assert [facts[k] for k in ex.inputs[0::2]] == ex.targets[1::2].tolist()


def test_an_example_is_a_function_of_its_seed_and_the_protocol_is_mads():
    a, b = (mad.dataset("noisy_recall", 4, seed=3, **mad.PROTOCOL["noisy_recall"].baseline) for _ in range(2))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert a.inputs.shape == (4, 127)
    counts = {task: len(p.settings()) for task, p in mad.PROTOCOL.items()}
    assert counts == {"in_context_recall": 11, "fuzzy_recall": 11, "noisy_recall": 14, "selective_copying": 13,
                      "compression": 11, "memorization": 6}
    for task, protocol in mad.PROTOCOL.items():
        for setting in protocol.settings()[:4]:  # every setting draws (the long ones cost seconds: a few here)
            mad.draw(task, np.random.default_rng(0), **setting)
    with pytest.raises(ValueError, match="is not one of"):
        mad.draw("recall", np.random.default_rng(0))


def test_data_mad_feeds_the_trainer_the_scored_positions_of_each_task():
    from lmzoo.data import build_data
    from lmzoo.registry import SOURCES
    from lmzoo.schema import ConfigError

    for task, seq_len, vocab in [("in_context_recall", 31, 16), ("in_context_recall", 32, 16),
                                 ("noisy_recall", 31, 32), ("fuzzy_recall", 31, 16), ("selective_copying", 40, 16),
                                 ("memorization", 17, 256)]:
        cfg = SOURCES.lookup("mad")(task=task, seq_len=seq_len, task_vocab=vocab, num_tokens_to_copy=8)
        cfg.check()
        batch = next(build_data(cfg, seed=0).train_iterator(4))
        assert batch["inputs"].shape == batch["targets"].shape == batch["weights"].shape == (4, seq_len)
        scored = batch["weights"] > 0
        assert scored.any(axis=1).all() and (batch["targets"][scored] < vocab).all()  # answers are task symbols
        if task in ("in_context_recall", "noisy_recall", "memorization") and seq_len % 2 == 0:
            assert (batch["inputs"][:, 0] == vocab).all() and not scored[:, 0].any()  # one PAD in front, unscored
    compression = SOURCES.lookup("mad")(task="compression", seq_len=12, task_vocab=16)
    compression.check()
    batch = next(build_data(compression, seed=0).train_iterator(4))
    scored = batch["weights"] > 0
    assert (batch["inputs"][:, -1] == 15).all() and not scored[:, -1].any()  # the compression token, unscored
    assert scored[:, :-1].all() and (batch["targets"][:, :-1] == batch["inputs"][:, :-1]).all()  # its own input
    assert compression.readout() == "last_state" and cfg.readout() == "per_position"
    with pytest.raises(ConfigError, match=r"^data.task='compress' is not valid \(choose from: in_context_recall, "):
        SOURCES.lookup("mad")(task="compress").check()


def mad_data(**settings):
    from lmzoo.data import build_data
    from lmzoo.registry import SOURCES

    cfg = SOURCES.lookup("mad")(**settings)
    cfg.check()
    return build_data(cfg, seed=0)


def validation(data, n=8):
    length = data.cfg.seq_len
    return data.validation_windows([length], n * length)[length](np.arange(n))


def test_recall_tasks_train_on_every_next_token_where_asked_and_evaluate_mads_scored_positions():
    for task, seq_len, vocab in [("in_context_recall", 32, 16), ("noisy_recall", 31, 32), ("fuzzy_recall", 31, 16)]:
        scored, every = (mad_data(task=task, seq_len=seq_len, task_vocab=vocab, train_targets=targets)
                         for targets in ("scored", "next_tokens"))
        a, b = next(scored.train_iterator(4)), next(every.train_iterator(4))
        np.testing.assert_array_equal(a["inputs"], b["inputs"])  # the same examples, only the loss's weights differ
        np.testing.assert_array_equal(a["targets"], b["targets"])
        front = 1 if seq_len % 2 == 0 else 0  # an even length of two-token slots: lmzoo's PAD in front, never trained
        assert (b["weights"][:, front:] == 1).all() and (b["weights"][:, :front] == 0).all()
        np.testing.assert_array_equal(b["targets"][:, front:-1], b["inputs"][:, front + 1 :])  # the next tokens
        assert 0 < a["weights"].mean() < 0.5  # by default the loss counts the recalled values only
        for key, value in validation(scored).items():  # evaluation scores MAD's positions either way
            np.testing.assert_array_equal(value, validation(every)[key])
    with pytest.raises(ConfigError, match=r"^data.train_targets='next_tokens' is for MAD's recall tasks \("
                                          r"in_context_recall, noisy_recall, fuzzy_recall\); MAD trains memorization"):
        mad_data(task="memorization", seq_len=16, task_vocab=256, train_targets="next_tokens")
    with pytest.raises(ConfigError, match=r"^data.train_targets='all' is not valid \(choose from: scored, next_tokens"):
        mad_data(train_targets="all")


def motif_sizes(batch, vocab=16):
    """The (key, value) motif sizes of each fuzzy recall example in ``batch`` (keys are the symbols below
    (vocab - 2) // 2, values the rest; vocab - 1 pads the front)."""
    sizes = []
    for inputs, targets in zip(batch["inputs"], batch["targets"]):
        tokens = np.append(inputs, targets[-1])
        body = tokens[np.argmax(tokens != vocab - 1):]
        runs = np.split(body, np.flatnonzero(np.diff((body < (vocab - 2) // 2).astype(int))) + 1)
        sizes.append(np.array([(len(k), len(v)) for k, v in zip(runs[0::2], runs[1::2])]))
    return np.concatenate(sizes)


def test_fuzzy_recall_evaluates_on_mads_test_split_its_keys_all_of_the_largest_motif():
    data = mad_data(task="fuzzy_recall", seq_len=127, task_vocab=16, eval_keys="largest")
    evaluated = motif_sizes(validation(data, 60))
    trained = motif_sizes(data._examples(0, 127).rows(np.arange(60)))
    assert (evaluated[:, 0] == 3).all()  # MAD prompts at the largest key motif
    key_share = np.bincount(trained[:, 0], minlength=4)[1:] / len(trained)
    np.testing.assert_allclose(key_share, 1 / 3, atol=0.05)  # training keys stay of any size, uniformly
    for sizes in (evaluated, trained):  # values of any size in both splits
        np.testing.assert_allclose(np.bincount(sizes[:, 1], minlength=4)[1:] / len(sizes), 1 / 3, atol=0.06)
    default = motif_sizes(validation(mad_data(task="fuzzy_recall", seq_len=127, task_vocab=16), 60))
    assert (np.bincount(default[:, 0], minlength=4)[1:] > len(default) / 5).all()  # by default: as in training
    with pytest.raises(ConfigError, match=r"^data.eval_keys='largest' is for fuzzy_recall"):
        mad_data(task="in_context_recall", seq_len=31, eval_keys="largest")
