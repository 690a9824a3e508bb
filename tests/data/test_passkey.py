"""Passkey retrieval: the examples hide the number where asked (as they always did), and the grid scores retrieval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmzoo import registry
from lmzoo.config import ConfigError
from lmzoo.data import build_data
from lmzoo.data.passkey import PasskeyConfig
from lmzoo.data.retrieval import retrieval_grid, wilson_interval
from lmzoo.data.synthetic import TaskTokenizer
from lmzoo.schema import DataConfig

from conftest import tiny_config

CFG = PasskeyConfig(seq_len=32, digits=4, task_vocab=14, base=10)
SEP = CFG.task_vocab + 1
VOCAB = CFG.task_vocab + 3


def needle_at(inputs: np.ndarray) -> int:
    """Index of the first SEP: where the needle starts."""
    return int(np.flatnonzero(inputs == SEP)[0])


def test_data_passkey_selects_the_task_and_its_settings(capsys):
    cfg = tiny_config("softmax", "data=passkey", "data.digits=3", "data.grid_depths=[0,1]").data
    assert isinstance(cfg, PasskeyConfig) and (cfg.seq_len, cfg.digits, cfg.grid_depths) == (32, 3, [0.0, 1.0])
    with pytest.raises(SystemExit):
        tiny_config("softmax", "data=passkey", "data.seq_len=4")
    message = "data.seq_len=4 is too short for passkey: data.digits=5 needs at least 12"
    assert capsys.readouterr().err == f"lmzoo: error: {message}\n"


def validation_examples(seed: int, first: int, count: int) -> dict:
    """Validation examples ``first .. first + count - 1`` at the training length, as one batch."""
    windows = build_data(CFG, seed=seed).validation_windows([CFG.seq_len], (first + count) * CFG.seq_len)
    return windows[CFG.seq_len](np.arange(first, first + count))


def test_examples_are_deterministic_and_the_answer_is_the_hidden_number():
    a, b = (validation_examples(1, 8, 8) for _ in range(2))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["inputs"], validation_examples(2, 8, 8)["inputs"])
    for inputs, targets, weights in zip(a["inputs"], a["targets"], a["weights"]):
        at = needle_at(inputs)
        number = inputs[at + 1 : at + 1 + CFG.digits]
        assert (number < CFG.base).all()
        np.testing.assert_array_equal(targets[weights == 1], number)
        np.testing.assert_array_equal(np.flatnonzero(weights), np.arange(32 - CFG.digits, 32))  # exactly the answer
        assert inputs[32 - CFG.digits] == SEP  # the question
        filler = np.delete(inputs, np.arange(at, at + CFG.digits + 1))[: -CFG.digits]  # less the question
        assert (filler >= CFG.base).all() and (filler < CFG.task_vocab).all()


def recorded_passkey(rng: np.random.Generator, length: int, depth) -> np.ndarray:
    """The passkey example as the task first drew it, written out: its number, then its depth, then the sentence."""
    number = rng.integers(0, CFG.base, size=CFG.digits)
    n_filler = length - 2 * (CFG.digits + 1)
    at = rng.integers(0, n_filler + 1) if depth is None else round(depth * n_filler)
    filler = np.resize(np.arange(CFG.base, CFG.task_vocab), n_filler)
    needle = [SEP, *number]
    return np.concatenate([filler[:at], needle, filler[at:], needle])


def test_passkey_draws_the_examples_and_fingerprint_it_always_drew():
    tok = TaskTokenizer(CFG.task_vocab)
    for index in range(12):
        for length, depth in [(33, None), (33, 0.0), (50, 0.4), (71, 1.0), (200, None)]:
            seq, scored = CFG.example_at(np.random.default_rng([5, 1, index]), length, tok, depth)
            np.testing.assert_array_equal(seq, recorded_passkey(np.random.default_rng([5, 1, index]), length, depth))
            np.testing.assert_array_equal(np.flatnonzero(scored), np.arange(length - CFG.digits, length))
    assert build_data(PasskeyConfig(), seed=3).fingerprint == {  # resuming a passkey run still finds its data
        "source": "passkey", "seq_len": 32, "task_vocab": 16, "digits": 5, "base": 10,
        "grid_depths": [0.0, 0.25, 0.5, 0.75, 1.0], "grid_examples": 32, "seed": 3, "vocab_size": 19,
    }


def test_training_draws_the_depth_uniformly():
    batch = validation_examples(0, 0, 256)
    depths = np.array([needle_at(inputs) for inputs in batch["inputs"]]) / (33 - 2 * (CFG.digits + 1))
    assert depths.min() == 0 and depths.max() == 1
    assert abs(depths.mean() - 0.5) < 0.05


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_the_needle_sits_at_the_requested_depth(depth):
    batch = CFG.examples_at(40, depth, 4, seed=3)
    n_filler = 41 - 2 * (CFG.digits + 1)
    assert batch["inputs"].shape == (4, 40) and batch["inputs"].dtype == np.int32
    assert all(needle_at(inputs) == round(depth * n_filler) for inputs in batch["inputs"])
    same_numbers = CFG.examples_at(64, 1 - depth, 4, seed=3)  # example i hides the same number in every cell
    np.testing.assert_array_equal(batch["targets"][:, -CFG.digits :], same_numbers["targets"][:, -CFG.digits :])


def test_too_short_lengths_and_depths_outside_0_1_are_refused():
    message = r"^data.seq_len=9 is too short for passkey: data.digits=4 needs at least 10$"
    with pytest.raises(ConfigError, match=message):
        PasskeyConfig(seq_len=9, digits=4).check()
    PasskeyConfig(seq_len=10, digits=4).check()
    with pytest.raises(ConfigError, match="length=9 is too short"):
        CFG.examples_at(9, 0.5, 2)
    with pytest.raises(ValueError, match=r"lies in \[0, 1\], got 1.5"):
        CFG.examples_at(32, 1.5, 2)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"digits": 0}, "data.digits=0 must be positive"),
        ({"base": 1}, "data.base=1 must be at least 2"),
        ({"task_vocab": 10}, "data.task_vocab=10 leaves no filler symbols"),
        ({"grid_examples": 1}, "data.grid_examples=1 must be at least 2"),
        ({"grid_depths": [0.5, 1.5]}, r"data.grid_depths=\[0.5, 1.5\] must lie in \[0, 1\]"),
    ],
)
def test_settings_are_checked(settings, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        PasskeyConfig(**settings).check()


def oracle(tokens: np.ndarray) -> np.ndarray:
    """Logits that copy the needle: all mass on the right digit at every answer position."""
    logits = np.zeros((*tokens.shape, VOCAB))  # (B, T, V)
    for row, inputs in zip(logits, tokens):
        at = needle_at(inputs)
        number = inputs[at + 1 : at + 1 + CFG.digits]
        row[np.arange(len(inputs) - CFG.digits, len(inputs)), number] = 1.0  # logits at t predict token t + 1
    return logits


def constant(tokens: np.ndarray) -> np.ndarray:
    return np.zeros((*tokens.shape, VOCAB))  # always predicts symbol 0


def test_an_oracle_retrieves_every_answer(tmp_path):
    grid = retrieval_grid(oracle, CFG, [32, 64], [0.0, 0.5, 1.0], 6, 4, plot_path=tmp_path / "passkey.png")
    assert grid["lengths"] == [32, 64] and grid["depths"] == [0.0, 0.5, 1.0]
    assert json.loads(json.dumps(grid)) == grid
    assert np.array(grid["accuracy"]).shape == (3, 2)
    assert np.all(np.array(grid["accuracy"]) == 1) and np.all(np.array(grid["answer_accuracy"]) == 1)
    for key in ("accuracy_ci", "answer_accuracy_ci"):
        lo, hi = np.moveaxis(np.array(grid[key]), -1, 0)
        assert np.all(lo <= 1) and np.all(hi == 1)
    assert (tmp_path / "passkey.png").stat().st_size > 0 and grid["plot"] == str(tmp_path / "passkey.png")


def test_a_constant_guess_is_at_chance():
    grid = retrieval_grid(constant, CFG, [32, 48], [0.0, 1.0], 64, 32)
    accuracy = np.array(grid["accuracy"])
    assert grid["chance"] == 0.1 and np.all(abs(accuracy - 0.1) < 0.05)
    lo, hi = np.moveaxis(np.array(grid["accuracy_ci"]), -1, 0)
    assert np.all(lo <= 0.1) and np.all(0.1 <= hi)
    assert np.all(np.array(grid["answer_accuracy"]) == 0)  # four zeros in a row: 1 in 10,000


def test_wilson_interval_stays_informative_at_the_extremes():
    assert wilson_interval(20, 20).hi == 1 and 0.8 < wilson_interval(20, 20).lo < 0.9
    assert wilson_interval(0, 20).lo == 0 and 0.1 < wilson_interval(0, 20).hi < 0.2
    half = wilson_interval(50, 100)
    assert half.estimate == 0.5 and half.lo == pytest.approx(1 - half.hi) and 0.39 < half.lo < 0.41


def test_the_task_offers_its_grid_to_the_evaluator_and_other_sources_offer_none(tmp_path):
    cfg = PasskeyConfig(seq_len=32, digits=4, task_vocab=14, grid_depths=[0.0, 1.0], grid_examples=4)
    extra = cfg.extra_evaluation(oracle, [32, 64], tmp_path, batch_size=4)
    assert extra["passkey"]["answer_accuracy"] == [[1.0, 1.0], [1.0, 1.0]]
    assert (tmp_path / "passkey.png").exists()
    assert cfg.extra_evaluation(oracle, None, tmp_path, batch_size=4)["passkey"]["lengths"] == [32, 64, 128, 256, 512]
    assert DataConfig(source="stdlib").extra_evaluation(oracle, [32], tmp_path) is None
    assert registry.SOURCES.lookup("mqar")().extra_evaluation(oracle, [32], tmp_path) is None


@pytest.mark.slow
def test_training_on_passkey_scores_the_answer(tmp_path):
    from lmzoo.run.loop import train

    cfg = tiny_config("softmax", "data=passkey", "train.steps=2", "train.eval_every=2", run_dir=tmp_path)
    summary = train(cfg)
    assert 0.0 <= summary["val_accuracy"] <= 1.0 and np.isfinite(summary["val_loss"])
