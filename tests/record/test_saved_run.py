"""A run directory an earlier lmzoo saved still evaluates, resumes and compares, to the numbers it saved.

``tests/fixtures/run_v4_gla`` was written by lmzoo before the run's record moved out of the trainer's package, by
``python -m lmzoo.train <TRAIN>``, then ``python -m lmzoo.eval <EVAL> eval.tag=v4`` and ``python -m lmzoo.compare
<it> tag=v4`` (whose table is ``run_v4_gla.comparison.md``). Its corpus is committed beside it
(``tests/fixtures/text``), so it reads the same text on every Python. Work happens on a copy: the fixture stays as
it was saved.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from lmzoo import compare
from lmzoo import eval as lmzoo_eval
from lmzoo.cli import compose_and_validate
from lmzoo.run.loop import train

from conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"
SAVED = FIXTURES / "run_v4_gla"
TRAIN = ["+attn=gla", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.steps=4",
         "train.checkpoint_every=2", "train.eval_every=2", "train.log_every=2", "train.batch_size=2",
         "train.eval_tokens=512", "data=text_files", "data.paths=tests/fixtures/text/*.txt", "data.seq_len=32"]
EVAL = ["eval.tokens=2048", "eval.batch_tokens=512", "eval.blocks=8", "eval.resamples=50", "eval.lengths=[32,64]",
        "eval.probe_batch=1", "eval.probe_max_len=64", "eval.progress=false"]


@pytest.fixture
def saved_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the saved config names its corpus relative to the checkout
    return shutil.copytree(SAVED, tmp_path / "run")


@pytest.mark.slow
def test_a_saved_run_evaluates_to_the_numbers_it_saved(saved_copy):
    again = lmzoo_eval.main([f"run_dir={saved_copy}", *EVAL, "eval.tag=again"])
    saved = json.loads((SAVED / "eval" / "v4" / "results.json").read_text())
    assert again["step"] == saved["step"] == 4
    now, before = {str(k): v for k, v in again["lengths"].items()}, saved["lengths"]
    assert now.keys() == before.keys() == {"32", "64"}
    for length in before:
        for key in ("loss", "bpb", "bpb_ci", "ratio_ci", "accuracy", "sparsity", "entropy", "first_key"):
            np.testing.assert_allclose(now[length][key], before[length][key], rtol=1e-5, err_msg=f"{key}@{length}")


@pytest.mark.slow
def test_a_saved_run_resumes_to_the_losses_it_saved(saved_copy):
    shutil.rmtree(saved_copy / "checkpoints" / "4")  # back to step 2: steps 3 and 4 are trained again
    summary = train(compose_and_validate([*TRAIN, f"run_dir={saved_copy}", "train.progress=false"]))
    assert summary["step"] == 4

    def rows(run):
        return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}

    now, before = rows(saved_copy), rows(SAVED)
    assert sorted(now) == sorted(before) == [2, 4]
    for key in ("loss", "grad_norm", "val_loss", "val_bpb"):
        np.testing.assert_allclose(now[4][key], before[4][key], rtol=1e-5, err_msg=key)


@pytest.mark.slow
def test_a_saved_run_compares_to_the_table_it_saved(saved_copy, tmp_path):
    compare.main([str(saved_copy), "tag=v4", f"out={tmp_path / 'comparison'}"])
    table = (tmp_path / "comparison" / "comparison.md").read_text()
    saved = (FIXTURES / "run_v4_gla.comparison.md").read_text()
    assert table == saved.replace("tests/fixtures/run_v4_gla", str(saved_copy))
