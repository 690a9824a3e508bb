"""The MAD experiment: its judge on evidence where lmzoo's ranking disagrees with the paper's, and a quick run."""

from __future__ import annotations

import json

import pytest

from lmzoo.experiments import load, run_experiment, settings_for

mad = load("mad")


def evidence(tau, lo, hi, recall=(0.95, 0.97, 0.96)):
    record = {"kendall_tau": tau, "lo": lo, "hi": hi, "seeds": {"softmax": 3, "gla": 3}}
    return {"source": "deltanet_mad", "scores": {"in_context_recall": {"softmax": {"test": list(recall)}}},
            "agreement": {"in_context_recall": record, "memorization": record}}


def test_the_judge_passes_agreement_fails_reversal_and_needs_its_control():
    settings = settings_for(mad, [], quick=False)
    passed = lambda checks: [c.passed for c in checks]  # noqa: E731
    assert passed(mad.judge(evidence(1.0, 0.6, 1.0), settings)) == [True, True, True]
    assert passed(mad.judge(evidence(-1.0, -1.0, -0.6), settings)) == [True, False, False]  # the ranking reversed
    assert passed(mad.judge(evidence(None, None, None), settings))[1:] == [None, None]  # one seed: undecided
    assert passed(mad.judge(evidence(1.0, 0.6, 1.0, recall=(0.3, 0.35, 0.32)), settings))[0] is False


def test_task_overrides_use_mads_baseline_vocabulary():
    settings = settings_for(mad, [], quick=False)
    overrides = mad.task_overrides("noisy_recall", settings)
    assert {"data=mad", "data.task=noisy_recall", "data.task_vocab=32", "data.noise_vocab_size=16",
            "data.frac_noise=0.2"} <= set(overrides)


def test_recall_tasks_train_on_every_next_token_and_fuzzy_recall_evaluates_on_mads_test_split():
    from lmzoo.experiments.runs import run_config

    settings = settings_for(mad, [], quick=False)
    for task in mad.TASKS:
        data = run_config("softmax", "unused", 0, 10, mad.task_overrides(task, settings)).data  # a valid config
        recall = task in ("in_context_recall", "noisy_recall", "fuzzy_recall")
        assert data.train_targets == ("next_tokens" if recall else "scored")
        assert data.eval_keys == ("largest" if task == "fuzzy_recall" else "any_size")


@pytest.mark.slow
def test_mad_quick_run_compares_its_scores_with_the_published_table(tmp_path):
    record = run_experiment("mad", tmp_path, quick=True)
    assert record["verdict"] == "smoke run" and len(record["runs"]) == 4
    agreement = record["evidence"]["agreement"]["in_context_recall"]
    assert agreement["variants"] == ["softmax", "gla"]  # the paper's order: Transformer 94.1 above GLA 80.8
    assert record["evidence"]["published"]["memorization"]["gla"]["printed"] == "63.3"
    assert (tmp_path / "mad" / record["figures"][0]).stat().st_size > 0
    json.dumps(record)
