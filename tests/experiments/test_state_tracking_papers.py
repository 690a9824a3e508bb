"""State tracking at Grazzi et al.'s protocol: its settings validate, each arm is a config the trainer accepts and
the arms that are Table 3's rows find their printed cells, the scores are scaled accuracy over the paper's lengths,
the judge gives the published separation a verdict on given accuracies, both ways, and a quick run trains, scores
and plots one arm."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.experiments import at_scale, judged, load, run_experiment, settings_for

papers = load("state_tracking_papers")


def test_the_paper_scale_runs_every_arm_at_the_papers_lengths_and_a_wrong_setting_is_one_line():
    paper = at_scale(settings_for(papers, ["scale=paper", "seeds=[0]"], quick=False), papers.SCALES)
    assert paper.arms == list(papers.ARMS) and paper.seeds == [0]  # the command line still wins
    assert (paper.train_min, paper.train_len, paper.test_min, paper.test_max) == (3, 40, 40, 256)
    with pytest.raises(ConfigError, match=r"^arms='lstm' is not valid \(choose from: softmax, mamba, deltanet"):
        settings_for(papers, ["arms=[softmax,lstm]"], quick=False)
    with pytest.raises(ConfigError, match=r"^train_min=3, train_len=64, test_min=40, test_max=256 must rise"):
        settings_for(papers, ["train_len=64"], quick=False)
    with pytest.raises(ConfigError, match=r"^task='modular_arithmetic' is not valid \(choose from: parity\)$"):
        settings_for(papers, ["task=modular_arithmetic"], quick=False)


def test_every_arm_is_a_config_the_trainer_accepts():
    from lmzoo.experiments.runs import run_config

    paper = at_scale(settings_for(papers, ["scale=paper"], quick=False), papers.SCALES)
    for arm in paper.arms:
        cfg = run_config(papers.ARMS[arm][0], "unused", 0, 10, papers.train_overrides(arm, paper))
        assert (cfg.attn.name, cfg.data.seq_len, cfg.model.d_model) == (papers.ARMS[arm][0], 40, 128)
    cfg = run_config("deltaproduct", "unused", 0, 10, papers.train_overrides("deltanet_neg", paper))
    assert (cfg.attn.householder_steps, cfg.attn.negative_eigenvalues, cfg.attn.gate) == (1, True, "none")


def test_the_arms_that_are_rows_of_table_3_find_their_cells():
    rows = papers.published_rows(settings_for(papers, ["arms=[softmax,deltanet,deltanet_neg,rwkv7]"], quick=False))
    assert {arm: n.row for arm, n in rows.items()} == {"softmax": "Transformer", "deltanet": "DeltaNet [0, 1]",
                                                        "deltanet_neg": "DeltaNet [-1, 1]"}  # rwkv7: no row
    assert rows["deltanet_neg"].printed == "1.000"


def test_scores_are_scaled_accuracy_over_the_papers_ranges():
    settings = settings_for(papers, ["train_len=4", "test_min=4", "test_max=6", "train_min=2"], quick=False)
    correct = np.array([[1, 1, 0, 1, 0, 0]] * 4, float)  # control: 1 of 1 and 1; train 2..4: 2 of 3; test 4..6: 1 of 3
    scores = papers.score_arm([correct, correct], settings, 0.5)
    assert scores["control_seeds"] == [1.0, 1.0] and scores["train"]["estimate"] == pytest.approx(1 / 3)
    assert scores["test_seeds"] == pytest.approx([-1 / 3, -1 / 3])  # below chance: negative


def evidence(test_accuracy: dict[str, list[float]], control: float = 1.0) -> dict:
    """What ``run`` records, from each arm's test accuracy per seed (every other position at ``control``)."""
    settings = settings_for(papers, [f"arms=[{','.join(test_accuracy)}]"], quick=False)
    rng = np.random.default_rng(0)
    scores = {}
    for arm, seeds in test_accuracy.items():
        correct = []
        for accuracy in seeds:
            rows = np.full((64, settings.test_max), control)
            rows[:, settings.test_min - 1 :] = rng.random((64, settings.test_max - settings.test_min + 1)) < accuracy
            correct.append(rows)
        scores[arm] = papers.score_arm(correct, settings, 0.5)
    rows = papers.published_rows(settings)
    published = {arm: n.record() for arm, n in rows.items()}
    return {"scaled_accuracy": scores, "published": published, "agreement": papers.compared(scores, rows)}, settings


def test_the_judge_gives_the_published_separation_its_verdict_both_ways():
    as_printed = {"softmax": [0.52, 0.5, 0.51], "mamba": [0.5, 0.49, 0.5], "deltanet": [0.55, 0.53, 0.54],
                  "deltanet_neg": [1.0, 1.0, 1.0]}
    record, settings = evidence(as_printed)
    verdict = judged(papers, record, settings, quick=False)
    assert verdict["verdict"] == "reproduced", verdict["reason"]
    assert record["agreement"]["variants"][0] == "deltanet_neg" and record["agreement"]["kendall_tau"] > 0
    reversed_ = {"softmax": [1.0, 1.0, 1.0], "mamba": [1.0, 1.0, 1.0], "deltanet": [0.99, 1.0, 1.0],
                 "deltanet_neg": [0.5, 0.52, 0.5]}
    record, settings = evidence(reversed_)
    assert judged(papers, record, settings, quick=False)["verdict"] == "not reproduced"
    record, settings = evidence(as_printed, control=0.5)  # nothing learned even in the conv window
    assert judged(papers, record, settings, quick=False)["verdict"] == "inconclusive"
    record, settings = evidence({"deltanet_neg": [1.0, 1.0, 1.0]})  # one row: its separation, no ranking
    verdict = judged(papers, record, settings, quick=False)
    assert record["agreement"] is None
    assert [c["name"].split(" (")[0] for c in verdict["checks"]] == ["control: deltanet_neg, scaled accuracy on "
                                                                     "strings of 1 to 3 bits", "deltanet_neg"]
    assert verdict["verdict"] == "reproduced"


@pytest.mark.slow
def test_quick_run_trains_scores_and_plots_one_arm(tmp_path):
    record = run_experiment("state_tracking_papers", tmp_path, quick=True)
    assert record["verdict"] == "smoke run" and list(record["evidence"]["scaled_accuracy"]) == ["deltanet_neg"]
    scores = record["evidence"]["scaled_accuracy"]["deltanet_neg"]
    assert all(-1.0 <= scores[f"{name}_seeds"][0] <= 1.0 for name in ("control", "train", "test"))
    assert record["evidence"]["agreement"] is None  # one row: no ranking
    assert record["evidence"]["published"]["deltanet_neg"]["row"] == "DeltaNet [-1, 1]"
    assert (tmp_path / "state_tracking_papers" / record["figures"][0]).stat().st_size > 0
