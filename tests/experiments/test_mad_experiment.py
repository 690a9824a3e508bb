"""The MAD experiment: its judge on evidence where lmzoo's ranking disagrees with the paper's, and a quick run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.data.mad import PROTOCOL
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
        overrides = set(mad.task_overrides(task, settings))
        recall = task in ("in_context_recall", "noisy_recall", "fuzzy_recall")
        assert ("data.train_targets=next_tokens" in overrides) == recall
        assert ("data.eval_keys=largest" in overrides) == (task == "fuzzy_recall")
    data = run_config("softmax", "unused", 0, 10, mad.task_overrides("fuzzy_recall", settings)).data  # valid
    assert (data.train_targets, data.eval_keys) == ("next_tokens", "largest")


@pytest.mark.slow
def test_mad_quick_run_compares_its_scores_with_the_published_table(tmp_path):
    record = run_experiment("mad", tmp_path, quick=True)
    assert record["verdict"] == "smoke run" and len(record["runs"]) == 4
    agreement = record["evidence"]["agreement"]["in_context_recall"]
    assert agreement["variants"] == ["softmax", "gla"]  # the paper's order: Transformer 94.1 above GLA 80.8
    assert record["evidence"]["published"]["memorization"]["gla"]["printed"] == "63.3"
    baseline = record["evidence"]["scores"]["in_context_recall"]["softmax"]["settings"]["baseline"]
    assert all(0 <= a <= 1 for a in baseline["test"] + baseline["test_token_accuracy"])  # MAD's and the plain one
    assert len(list((tmp_path / "mad").rglob("class_counts-*.json"))) == 0  # no records kept: counts not written
    assert (tmp_path / "mad" / record["figures"][0]).stat().st_size > 0
    json.dumps(record)


def test_difficulties_all_are_mads_settings_at_their_lengths_and_training_set_sizes():
    from lmzoo.data import build_data
    from lmzoo.data.mad import MadConfig

    settings = settings_for(mad, ["difficulties=all"], quick=False)
    named = {task: mad.difficulty_settings(task, settings) for task in mad.TASKS}
    assert {task: len(n) for task, n in named.items()} == {"compression": 11, "in_context_recall": 11,
                                                           "fuzzy_recall": 11,
                                                           "noisy_recall": 14, "selective_copying": 13,
                                                           "memorization": 6}
    assert list(named["noisy_recall"])[:2] == ["baseline", "vocab_size48"] and "frac_noise0.8" in named["noisy_recall"]
    lengths = {name: mad.data_length("in_context_recall", s, settings)
               for name, s in named["in_context_recall"].items()}
    assert (lengths["baseline"], lengths["seq_len256"], lengths["vocab_size32"]) == (127, 255, 127)
    assert mad.data_length("selective_copying", named["selective_copying"]["seq_len512"], settings) == 512
    copy = mad.task_overrides("selective_copying", settings, named["selective_copying"]["num_tokens_to_copy96"])
    assert {"data.task_vocab=16", "data.seq_len=256", "data.num_tokens_to_copy=96"} <= set(copy)
    assert not any(o.startswith("data.train_examples") for o in copy)  # fresh examples at MAD's training-set size
    small = mad.task_overrides("fuzzy_recall", settings, named["fuzzy_recall"]["num_train_examples800"])
    assert "data.train_examples=800" in small  # a setting of the training-set size: a fixed set of that size
    from lmzoo.experiments.runs import run_config
    assert run_config("gla", "unused", 0, 10, small).data.train_examples == 800  # a config the trainer accepts
    assert list(mad.difficulty_settings("memorization", settings_for(mad, [], quick=False))) == ["baseline"]
    for task, by_name in named.items():  # every setting is data the trainer can draw
        for setting in by_name.values():
            cfg = MadConfig(task=task, task_vocab=setting["vocab_size"],
                            seq_len=mad.data_length(task, setting, settings),
                            train_examples=setting["num_train_examples"],
                            **{k: setting[k] for k in mad.TASK_KEYS if k in setting})
            cfg.check()
            build_data(cfg, seed=0)._examples(0, cfg.seq_len)(0)
    with pytest.raises(ConfigError, match=r"^difficulties='some' is not valid \(choose from: baseline, all\)$"):
        settings_for(mad, ["difficulties=some"], quick=False)


def test_a_tasks_score_is_the_mean_over_its_settings_of_each_settings_best_grid_point(monkeypatch, tmp_path):
    settings = settings_for(mad, ["difficulties=all", "tasks=[memorization]", "lrs=[0.0001,0.001]",
                                  "weight_decays=[0.0]", "seeds=[0,1]"], quick=False)
    vocab = {name: s["vocab_size"] for name, s in mad.difficulty_settings("memorization", settings).items()}
    trained = []
    monkeypatch.setattr(mad, "train_grid", lambda variant, grid, **kw: trained.append(kw["overrides"]))

    def scored(run_dir, length, examples, seed):  # validation: the larger rate is better; test: vocabulary, seed
        name = run_dir.name
        if seed == int(name[-1]):  # the run's own data seed: validation
            return counts_of(0.5 if "lr0.001" in name else 0.2)
        assert "lr0.001" in name and seed == int(name[-1]) + 1000  # the best rate's runs, on the test seeds
        setting = next((n for n in vocab if f"-{n}-" in name), "baseline")
        return counts_of(1000 / vocab[setting] + int(name[-1]) / 100)

    monkeypatch.setattr(mad, "scored_counts", scored)
    result = mad.score("softmax", "memorization", settings, tmp_path, runs := [])
    assert len(trained) == 6 and len(runs) == 6 * 2 * 2  # six settings, each two rates x two seeds
    assert all(s["best"] == "wd0-lr0.001" for s in result["settings"].values())
    expected = [np.mean([1000 / v + seed / 100 for v in vocab.values()]) for seed in (0, 1)]
    np.testing.assert_allclose(result["test"], expected)
    assert "softmax-memorization-wd0-lr0.001-s0" in {r.name for r in runs}  # the baseline keeps its run names


def test_protocol_mad_trains_every_setting_on_mads_training_set_for_its_epochs_at_its_batch():
    from lmzoo.experiments.runs import run_config

    settings = mad.with_protocol(settings_for(mad, ["protocol=mad", "difficulties=all"], quick=False))
    assert (settings.batch_size, settings.eval_examples, settings.epochs) == (128, 1280, 200)  # MAD's
    assert mad.runs_folder(settings) == "runs-mad"
    expected = {("in_context_recall", "baseline"): (12800, 20000), ("noisy_recall", "frac_noise0.8"): (12800, 20000),
                ("fuzzy_recall", "num_train_examples800"): (800, 1250),  # 200 x 800 / 128: full batches across epochs
                ("selective_copying", "num_train_examples1600"): (1600, 2500),
                ("memorization", "baseline"): (256, 400), ("memorization", "vocab_size8192"): (256, 400)}
    for (task, name), (examples, steps) in expected.items():
        setting = mad.difficulty_settings(task, settings)[name]
        assert mad.training_steps(setting, settings) == steps
        cfg = run_config("gla", "unused", 0, steps, mad.run_overrides(task, setting, 0.1, settings))
        assert (cfg.data.train_examples, cfg.train.batch_size, cfg.train.steps) == (examples, 128, steps)
    for task in mad.TASKS:  # every setting of every task on a fixed set of its MAD size
        for setting in mad.difficulty_settings(task, settings).values():
            assert f"data.train_examples={setting['num_train_examples']}" in mad.task_overrides(task, settings, setting)
    chosen = mad.with_protocol(settings_for(mad, ["protocol=mad", "batch_size=64", "epochs=2"], quick=False))
    assert (chosen.batch_size, chosen.eval_examples) == (64, 1280)  # key=value wins over the protocol's value
    assert mad.training_steps(PROTOCOL["memorization"].baseline, chosen) == 8  # 2 x 256 / 64


def test_protocol_steps_is_the_default_and_trains_as_before():
    settings = mad.with_protocol(settings_for(mad, [], quick=False))
    assert (settings.protocol, settings.batch_size, settings.eval_examples, mad.runs_folder(settings)) == (
        "steps", 32, 128, "runs")
    baseline = PROTOCOL["in_context_recall"].baseline
    assert mad.training_steps(baseline, settings) == 2000
    assert not any(o.startswith("data.train_examples") for o in mad.run_overrides("in_context_recall", baseline,
                                                                                  0.0, settings))
    assert "train.batch_size=32" in mad.run_overrides("in_context_recall", baseline, 0.0, settings)


@pytest.mark.parametrize("override, message", [
    ("protocol=epochs", r"^protocol='epochs' is not valid \(choose from: steps, mad\)$"),
    ("epochs=0", r"^epochs=0 must be positive$"),
    ("batch_size=-8", r"^batch_size=-8 must be positive$"),
])
def test_bad_protocol_settings_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        settings_for(mad, [override], quick=False)


def test_a_run_under_protocol_mad_trains_mads_steps_in_its_own_folder(monkeypatch, tmp_path):
    settings = settings_for(mad, ["protocol=mad", "tasks=[memorization]", "variants=[softmax,gla]", "lrs=[0.001]",
                                  "weight_decays=[0.0]", "seeds=[0,1]"], quick=False)
    trained = []
    monkeypatch.setattr(mad, "train_grid", lambda variant, grid, **kw: trained.append((grid, kw)))
    monkeypatch.setattr(mad, "scored_counts", lambda run_dir, length, examples, seed: counts_of(
        0.5 + 0.1 * ("gla" in str(run_dir)) + 0.01 * ((length, examples) == (32, 1280))))  # MAD's 1,280 examples
    outcome = mad.run(settings, tmp_path)
    assert [kw["steps"] for _, kw in trained] == [400, 400]  # 200 epochs of 256 examples at 128
    assert all({"train.batch_size=128", "data.train_examples=256"} <= set(kw["overrides"]) for _, kw in trained)
    assert {p.parent.name for grid, _ in trained for p in grid.values()} == {"runs-mad"}
    scores = outcome.evidence["scores"]["memorization"]
    assert scores["gla"]["test"] == pytest.approx([0.61, 0.61])
    assert scores["softmax"]["settings"]["baseline"]["steps"] == 400
    assert outcome.evidence["protocol"] == "mad"


def test_one_variant_has_no_ranking_to_compare_and_is_judged_on_its_control(monkeypatch, tmp_path):
    """A run of softmax alone (sizing a scale, say) writes its scores with no ranking, rather than stopping."""
    settings = settings_for(mad, ["tasks=[in_context_recall]", "variants=[softmax]", "lrs=[0.001]",
                                  "weight_decays=[0.0]", "seeds=[0,1,2]"], quick=False)
    monkeypatch.setattr(mad, "train_grid", lambda variant, grid, **kw: None)
    monkeypatch.setattr(mad, "scored_counts", lambda run_dir, length, examples, seed: counts_of(0.95 + 0.01 * (
        str(run_dir)[-1] == "1")))
    outcome = mad.run(settings, tmp_path)
    assert outcome.evidence["agreement"] == {"in_context_recall": None}
    checks = mad.judge(json.loads(json.dumps(outcome.evidence)), settings)
    assert [(c.name, c.passed) for c in checks] == [("control: softmax, in-context recall accuracy", True)]


def counts_of(accuracy: float) -> dict:
    """Class counts whose MAD accuracy and token accuracy are both ``accuracy``: one class, one batch."""
    return {"tp": np.array([[accuracy]]), "fp": np.array([[0.0]]), "fn": np.array([[1 - accuracy]])}


def test_mads_accuracy_is_torchmetrics_macro_average_over_the_classes_present_per_batch():
    # torchmetrics' own example: targets [2, 1, 0, 0], predictions [2, 1, 0, 1] -> recalls 0.5, 1, 1: 0.8333
    counts = mad.class_counts(np.array([2, 1, 0, 1]), np.array([2, 1, 0, 0]), vocab=5)
    assert counts["tp"].tolist() == [1, 1, 1, 0, 0] and counts["fn"].tolist() == [1, 0, 0, 0, 0]
    assert mad.mads_accuracy(counts) == pytest.approx(2.5 / 3) and mad.token_accuracy(counts) == 0.75
    only_predicted = mad.class_counts(np.array([3, 0]), np.array([0, 0]), vocab=5)  # class 3 is never a target
    assert mad.mads_accuracy(only_predicted) == pytest.approx(0.25)  # recalls: class 0 1/2, class 3 0 -> 0.25
    assert mad.token_accuracy(only_predicted) == 0.5
    batches = {k: np.stack([counts[k], only_predicted[k]]) for k in ("tp", "fp", "fn")}
    assert mad.mads_accuracy({**batches, "examples": np.array([3, 1])}) == pytest.approx(
        (3 * 2.5 / 3 + 1 * 0.25) / 4)  # the batches' mean weighted by their examples, as Lightning's epoch value
    assert mad.token_accuracy(batches) == pytest.approx(4 / 6)
