"""Modular arithmetic without and with brackets: every scored answer is the value Python's own evaluator gives the
expression modulo 5, the expressions are the grammar's at the lengths asked, the answers' classes are as the docs
say, and the examples depend on the seed alone (batch drawn rows equal one-by-one examples)."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.data import build_data
from lmzoo.data.modular_arithmetic import (
    ModularArithmeticBracketsConfig, ModularArithmeticConfig, symbols,
)

TEXT = symbols(5)


def text(ids) -> str:
    return "".join(TEXT[i] for i in ids)


def validation(cfg, examples: int) -> dict:
    data = build_data(cfg, seed=0)
    return data.validation_windows([cfg.seq_len], cfg.seq_len * examples)[cfg.seq_len](np.arange(examples))


def test_without_brackets_every_prefix_ending_on_a_residue_is_answered_with_its_value():
    cfg = ModularArithmeticConfig(seq_len=33)
    batch = validation(cfg, 1000)
    assert (batch["weights"][:, 0::2] == 1).all() and (batch["weights"][:, 1::2] == 0).all()
    for inputs, targets in zip(batch["inputs"][:100], batch["targets"][:100]):
        expression = text(inputs)
        assert all(c.isdigit() for c in expression[0::2]) and set(expression[1::2]) <= set("+-*")
        assert [eval(expression[: p + 1]) % 5 for p in range(0, 33, 2)] == list(targets[0::2])  # precedence: * first
    operators = "".join(text(batch["inputs"][:, 1::2].ravel()))
    assert {op: operators.count(op) / len(operators) for op in "+-*"} == pytest.approx(
        {op: 1 / 3 for op in "+-*"}, abs=0.02)
    answers = np.bincount(batch["targets"][:, 0::2].ravel(), minlength=5)
    assert answers / answers.sum() == pytest.approx([0.2] * 5, abs=0.02)  # chance is 1/5


def test_with_brackets_one_answer_after_the_expression_is_its_value():
    cfg = ModularArithmeticBracketsConfig(seq_len=40)
    batch = validation(cfg, 300)
    assert (batch["weights"].sum(axis=1) == 1).all()
    ends = batch["weights"].argmax(axis=1)  # the = and the answer: the expression's length
    assert ends.min() == cfg.min_length and ends.max() == cfg.seq_len - 1  # lengths 2 .. 39, both ends drawn
    assert abs(ends.mean() - (cfg.min_length + cfg.seq_len - 1) / 2) < 2  # uniform lengths
    sep = build_data(cfg, seed=0).tokenizer.sep_id
    for inputs, targets, n in zip(batch["inputs"], batch["targets"], ends):
        expression = text(inputs[:n])
        assert inputs[n] == sep and targets[n] == eval(expression) % 5
        depth = np.cumsum([{"(": 1, ")": -1}.get(c, 0) for c in expression])
        assert depth.min() >= 0 and depth[-1] == 0  # balanced
    answers = np.bincount(batch["targets"][np.arange(300), ends], minlength=5) / 300
    assert answers[0] > 0.2 and min(answers) > 0.1  # products with a 0 make 0 the most frequent answer


def test_examples_depend_on_the_seed_alone_and_rows_drawn_together_equal_examples_drawn_alone():
    for cfg in (ModularArithmeticConfig(seq_len=17), ModularArithmeticBracketsConfig(seq_len=17)):
        first, again, other = (build_data(cfg, seed=s) for s in (3, 3, 4))
        batches = [next(d.train_iterator(8)) for d in (first, again, other)]
        assert all((batches[0][k] == batches[1][k]).all() for k in batches[0])
        assert not (batches[0]["inputs"] == batches[2]["inputs"]).all()
        examples = first._examples(0, cfg.seq_len)
        rows = examples.rows(np.arange(8))
        alone = [examples(i) for i in range(8)]
        assert all((rows[k] == np.stack([a[k] for a in alone])).all() for k in rows)


def test_a_wrong_setting_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"^data.task_vocab=64 must be 10: data.modulus=5 residues"):
        ModularArithmeticConfig(task_vocab=64).check()
    with pytest.raises(ConfigError, match=r"^data.operators='\+/' must name distinct operators among"):
        ModularArithmeticConfig(operators="+/").check()
    with pytest.raises(ConfigError, match=r"^data.min_length=40 leaves no room for the = in data.seq_len=40$"):
        ModularArithmeticBracketsConfig(seq_len=40, min_length=40).check()
