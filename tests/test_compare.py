"""Comparing a small sweep: one table row per run, length columns, overlay plots."""

from __future__ import annotations

import pytest

from lmzoo import compare
from lmzoo import eval as lmzoo_eval
from lmzoo.train import train

from conftest import tiny_config


def test_compare_tabulates_and_plots_a_sweep(tmp_path, capsys):
    for variant in ("softmax", "mqa"):
        run_dir = tmp_path / "sweep" / variant
        train(tiny_config(variant, "train.steps=4", "train.eval_every=4", run_dir=run_dir))
        lmzoo_eval.main([f"run_dir={run_dir}", "eval.lengths=[32,64]", "eval.batches=1", "eval.progress=false"])
    markdown = compare.main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")])
    lines = markdown.splitlines()
    assert lines[0].startswith("| variant | params | state size | val bpb | bpb@32 / bpb@train | bpb@64 / bpb@train |")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines[2:]}
    assert set(rows) == {"softmax", "mqa"}
    assert rows["softmax"][4] == "1.000"  # bpb at the training length relative to itself
    assert float(rows["mqa"][5]) > 0
    assert int(rows["softmax"][2].replace(",", "")) > int(rows["mqa"][2].replace(",", ""))  # MQA's smaller cache
    for name in ("comparison.md", "bpb_vs_length.png", "per_position.png", "sparsity_vs_length.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_compare_without_runs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
