"""``lmzoo.load``: docs/api.md's examples run as doctests, and the scoring's windows and errors."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import lmzoo
from lmzoo.config import ConfigError

from conftest import REPO

SAVED = "tests/fixtures/run_v4_gla"  # relative: the saved config names its corpus relative to the checkout


@pytest.fixture(scope="module")
def run():
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        yield lmzoo.load(SAVED)


def test_the_api_page_examples_run(monkeypatch):
    monkeypatch.chdir(REPO)
    failed, attempted = doctest.testfile(str(REPO / "docs" / "api.md"), module_relative=False, report=True,
                                         optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert attempted > 20 and failed == 0


def test_a_score_in_windows_is_the_sum_of_each_window_read_afresh(run):
    text = "import os\nprint(os.getcwd())\n"  # 29 bytes: windows of 8, 8, 8 and 5
    ids = run.encode(text)
    before = np.concatenate([[run.tokenizer.eos_id], ids[:-1]])
    by_hand = -sum(run.log_probs(before[s:s + 8])[np.arange(len(ids[s:s + 8])), ids[s:s + 8]].sum()
                   for s in range(0, len(ids), 8))
    score = run.score(text, length=8)
    np.testing.assert_allclose(score.nats, by_hand, rtol=1e-5)
    assert (score.tokens, score.bytes) == (29, 29)
    assert not np.isclose(score.nats, run.score(text).nats, rtol=1e-6)  # the windows' context matters


def test_bits_per_byte_count_bytes_not_characters(run):
    score = run.score("é")  # one character, two UTF-8 bytes and tokens
    assert (score.tokens, score.bytes) == (2, 2)
    np.testing.assert_allclose(score.bits_per_byte, score.nats / (np.log(2) * 2))


@pytest.mark.parametrize("text, length, message", [("", None, "text is empty"), ("ab", 0, "length=0")])
def test_a_score_of_nothing_is_refused_in_one_line(run, text, length, message):
    with pytest.raises(ValueError, match=message):
        run.score(text, length=length)


def test_ids_of_another_shape_are_refused(run):
    with pytest.raises(ValueError, match=r"shape \(1, 1, 2\)"):
        run.logits(np.zeros((1, 1, 2), np.int32))


def test_a_missing_run_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="holds no trained run"):
        lmzoo.load(tmp_path)
