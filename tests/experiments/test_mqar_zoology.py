"""Zoology's MQAR sweep: its full scale is zoology's grid, its judge fails a reversed ranking and a control that did
not learn, and a quick run compares its ranking with the printed table."""

from __future__ import annotations

import json

import pytest

from lmzoo.config import ConfigError
from lmzoo.experiments import at_scale, load, run_experiment, settings_for

zoology = load("mqar_zoology")


def test_full_scale_is_zoologys_grid_and_the_command_line_still_wins():
    full = at_scale(settings_for(zoology, ["scale=full", "widths=[16,64]"], quick=False), zoology.SCALES)
    assert full.widths == [16, 64]  # given on the command line: kept
    assert (full.seq_lens, full.pairs, full.batch_sizes) == ([64, 128, 256, 512], [4, 8, 16, 64], [512, 512, 256, 128])
    assert full.vocab == 8192 and full.lrs == pytest.approx([1e-4, 10**-3.333333, 10**-2.666667, 1e-2], rel=1e-5)
    assert [zoology.steps_for(full, b) for b in full.batch_sizes] == [12_500, 12_500, 25_000, 50_000]  # 64 epochs
    assert at_scale(settings_for(zoology, [], quick=False), zoology.SCALES) == zoology.Settings()  # cpu: defaults
    with pytest.raises(ConfigError, match=r"^scale='gpu' is not valid \(choose from: cpu, full\)$"):
        at_scale(settings_for(zoology, ["scale=gpu"], quick=False), zoology.SCALES)
    with pytest.raises(ConfigError, match=r"^seq_lens=\[64, 128\], pairs=\[8\] and batch_sizes=\[32\] name one"):
        settings_for(zoology, ["seq_lens=[64,128]"], quick=False)


def test_overrides_give_each_variant_zoologys_depth_and_the_settings_task():
    settings = settings_for(zoology, [], quick=False)
    softmax = zoology.train_overrides("softmax", 64, 8, 32, 32, settings)
    assert {"data=mqar", "data.seq_len=64", "data.num_pairs=8", "data.task_vocab=128", "model.d_model=32",
            "model.n_layers=2", "model.n_heads=1", "train.batch_size=32"} <= set(softmax)
    assert "model.n_layers=4" in zoology.train_overrides("mamba", 64, 8, 32, 32, settings)


def cell(accuracies):
    n = len(accuracies)
    mean = sum(accuracies) / n
    return {"test": list(accuracies), "accuracy": {"estimate": mean, "lo": min(accuracies) - 0.01,
                                                    "hi": max(accuracies) + 0.01, "seeds": [n],
                                                    "uncertainty": "seeds+text", "level": 0.95}}


def evidence(softmax, tau, lo, hi):
    return {"source": "metala_mqar_512_80", "grid": {"softmax": {"T64-p8": {"16": cell(softmax), "32": cell(softmax)}}},
            "agreement": {"kendall_tau": tau, "lo": lo, "hi": hi, "seeds": {"softmax": 3, "mamba": 3}}}


def test_the_judge_passes_agreement_fails_a_reversal_and_needs_its_control():
    settings = settings_for(zoology, [], quick=False)
    passed = lambda e: [c.passed for c in zoology.judge(e, settings)]  # noqa: E731
    assert passed(evidence([0.97, 0.99, 0.98], 1.0, 1.0, 1.0)) == [True, True]
    assert passed(evidence([0.97, 0.99, 0.98], -1.0, -1.0, -1.0)) == [True, False]  # the ranking reversed
    assert passed(evidence([0.97, 0.99, 0.98], None, None, None)) == [True, None]  # one seed: undecided
    assert passed(evidence([0.2, 0.3, 0.25], 1.0, 1.0, 1.0))[0] is False  # softmax did not learn: no control
    assert len(zoology.judge({**evidence([0.97], 1.0, 1.0, 1.0), "agreement": None}, settings)) == 1


@pytest.mark.slow
def test_quick_run_ranks_softmax_and_mamba_beside_metalas_table(tmp_path):
    record = run_experiment("mqar_zoology", tmp_path, quick=True)
    assert record["verdict"] == "smoke run" and len(record["runs"]) == 2
    cell = record["evidence"]["grid"]["mamba"]["T16-p2"]["16"]
    assert cell["validation_accuracy"] == {} and cell["lr"] == 1e-2  # one rate: nothing chosen on validation
    assert 0 <= cell["accuracy"]["lo"] <= cell["accuracy"]["estimate"] <= cell["accuracy"]["hi"] <= 1
    agreement = record["evidence"]["agreement"]
    assert agreement["variants"] == ["softmax", "mamba"] and agreement["undecided"] == ["softmax", "mamba"]
    assert agreement["published"]["softmax"]["printed"] == ">99.0" and "length 16" in agreement["lmzoo_setting"]
    assert (tmp_path / "mqar_zoology" / record["figures"][0]).stat().st_size > 0
    json.dumps(record)
