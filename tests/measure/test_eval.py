"""Evaluating a checkpoint at several lengths writes results of the documented shape."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flax import nnx

from lmzoo import eval as lmzoo_eval
from lmzoo.data import build_data
from lmzoo.measure import evaluation as evaluation
from lmzoo.scoring.lengths import sampling_note, score_length
from lmzoo.model import LM
from lmzoo.record import opening as trained
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.record.directory import RunDir
from lmzoo.record.opening import trained_config
from lmzoo.run.loop import train
from lmzoo.run.steps import init_train_state

from lmzoo.faults import EXIT_RUN_FAULT

from conftest import REPO, read_events, tiny_config

SAVED_RUN = REPO / "tests" / "fixtures" / "run_v4_gla"  # a tiny trained run committed with the tests
SAVED_RUN_EVAL = ["eval.tokens=2048", "eval.batch_tokens=512", "eval.blocks=8", "eval.resamples=50",
                  "eval.lengths=[32,64]", "eval.probe_batch=1", "eval.probe_max_len=64", "eval.progress=false"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config("softmax", "train.steps=6", "train.eval_every=6", run_dir=run_dir))
    return run_dir


def evaluate(run_dir, *args):
    return lmzoo_eval.main([f"run_dir={run_dir}", "eval.lengths=[32,64]", "eval.tokens=2048", "eval.position_buckets=4",
                            "eval.progress=false", *args])


@pytest.mark.slow
def test_eval_writes_results_csv_and_plots(trained_run):
    results = evaluate(trained_run)
    out = trained_run / "eval" / "default"
    saved = json.loads((out / "results.json").read_text())
    assert saved == results
    assert (saved["variant"], saved["train_seq_len"], saved["tag"], saved["step"]) == ("softmax", 32, "default", 6)
    assert set(saved["lengths"]) == {"32", "64"}
    for length, r in saved["lengths"].items():
        assert 0 < r["loss"] < 10 and r["bpb"] > 0
        curve = saved["per_position"][length]
        assert len(curve["positions"]) == len(curve["loss"]) == 4
        assert curve["positions"][-1] == int(length)
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("length,length_ratio,tokens,loss,bpb,bpb_lo,bpb_hi,ratio") and len(csv_lines) == 3
    for name in ("loss_vs_length", "ratio_vs_length", "per_position"):
        assert (out / f"{name}.png").stat().st_size > 0


@pytest.mark.slow
def test_every_length_scores_the_same_number_of_tokens_with_intervals(trained_run):
    results = evaluate(trained_run, "eval.lengths=[64,128]", "eval.blocks=16", "eval.tag=intervals")
    assert list(results["lengths"]) == ["32", "64", "128"]  # the training length is always evaluated
    assert results["eval_tokens"] == 2048 and results["blocks"] == 16
    assert results["bootstrap"] == {"resamples": 1000, "seed": 0, "level": 0.95}
    for length, r in results["lengths"].items():
        assert r["tokens"] == 2048
        assert r["bpb_ci"][0] < r["bpb"] < r["bpb_ci"][1]
        assert r["ratio_ci"][0] <= r["ratio"] <= r["ratio_ci"][1]
        sums = results["block_sums"][length]
        assert len(sums["count"]) == results["blocks"] and sum(sums["count"]) == 2048 and "correct" not in sums
        curve = results["per_position"][length]
        lo, hi = np.array(curve["loss_ci"])
        assert np.all(lo <= np.array(curve["loss"]) + 1e-12) and np.all(np.array(curve["loss"]) <= hi + 1e-12)
        assert [ops[0]["op"] for ops in r["kernels"]] == ["softmax_attention"] * 2  # each layer's kernel, per length
    assert results["lengths"]["32"]["ratio"] == 1.0 and results["lengths"]["32"]["ratio_ci"] == [1.0, 1.0]
    # the 2048 targets are 16 spans of 128 spread over the split; blocks are whole documents
    assert (results["sampling"], results["span"], results["block_unit"]) == ("spread", 128, "document")
    assert results["blocks"] == min(16, results["documents"]) and results["documents"] > 8


@pytest.mark.slow
def test_a_run_whose_results_predate_the_sampling_keys_still_evaluates(trained_run):
    old = {"variant": "softmax", "train_seq_len": 32, "tag": "before-sampling", "step": 6, "eval_tokens": 2048,
           "lengths": {}, "per_position": {}}
    (trained_run / "eval" / "before-sampling").mkdir(parents=True, exist_ok=True)
    (trained_run / "eval" / "before-sampling" / "results.json").write_text(json.dumps(old))
    assert sampling_note(old).startswith("the first 2048 validation targets")  # read, and named for what it is
    results = evaluate(trained_run, "eval.tag=before-sampling")
    assert results["sampling"] == "spread" and results["documents"] > 1
    assert sampling_note(results).startswith("2048 targets spread over")


@pytest.mark.slow
def test_the_scored_targets_are_the_same_set_at_every_length(trained_run):
    """A stand-in model whose "loss" of a target is the target's token id: equal sums per block at every
    length mean the very same tokens were scored in the very same blocks."""
    cfg = trained_config(RunDir(trained_run), [])
    windows = build_data(cfg.data, seed=cfg.seed).validation_windows([32, 64, 128], 1000)

    def token_ids(inputs, targets):
        return {"loss": targets.astype(float), "correct": np.zeros(targets.shape)}

    sums = {n: score_length(token_ids, w, rows=3, blocks=7, n_buckets=4) for n, w in windows.items()}
    for n in (64, 128):
        np.testing.assert_array_equal(sums[n].loss, sums[32].loss)
        np.testing.assert_array_equal(sums[n].count, sums[32].count)
    assert sums[32].count.sum() == 896  # 1000 rounded down to whole windows of 128


@pytest.mark.slow
def test_final_validation_equals_eval_at_the_training_length(trained_run):
    last = [r for r in RunDir(trained_run).read_metrics() if "val_bpb" in r][-1]
    results = evaluate(trained_run, "eval.lengths=[32]", "eval.tokens=512", "eval.tag=equal-budget")
    assert results["lengths"]["32"]["bpb"] == pytest.approx(last["val_bpb"], abs=1e-5)
    assert results["lengths"]["32"]["loss"] == pytest.approx(last["val_loss"], abs=1e-5)
    assert last["val_bpb_lo"] < last["val_bpb"] < last["val_bpb_hi"]


@pytest.mark.slow
def test_long_lengths_are_batched_within_the_budget(trained_run, monkeypatch):
    shapes = []
    length_forwards = evaluation.length_forwards

    def recording(*args):
        forwards = length_forwards(*args)
        return {n: lambda inputs, targets, f=f: shapes.append(inputs.shape) or f(inputs, targets)
                for n, f in forwards.items()}

    monkeypatch.setattr(evaluation, "length_forwards", recording)
    small = evaluate(trained_run, "eval.lengths=[32,128]", "eval.batch_tokens=64", "eval.tag=small-batches")
    assert set(shapes) == {(2, 32), (1, 128)}  # batch_tokens // L windows, at least one
    assert len(shapes) == 2048 // 64 + 2048 // 128
    large = evaluate(trained_run, "eval.lengths=[32,128]", "eval.tag=large-batches")
    for length in ("32", "128"):
        assert small["lengths"][length]["loss"] == pytest.approx(large["lengths"][length]["loss"], rel=1e-6)


@pytest.mark.slow
def test_a_data_source_s_own_evaluation_is_stored_under_extra(trained_run, monkeypatch):
    calls = []

    def grid(self, forward, lengths, out_dir, *, seed, batch_size):
        logits = forward(np.zeros((batch_size, 32), np.int32))
        calls.append((lengths, seed, logits.shape))
        return {"grid": {"cells": 1}}

    monkeypatch.setattr(type(trained_config(RunDir(trained_run), []).data), "extra_evaluation", grid, raising=False)
    results = evaluate(trained_run, "eval.tag=extra")
    assert results["extra"] == {"grid": {"cells": 1}}
    assert calls == [([32, 64], 0, (16384 // 64, 32, 259))]


@pytest.mark.slow
def test_position_override_is_tagged_and_changes_results(trained_run):
    plain = evaluate(trained_run)
    nope = evaluate(trained_run, "pos.kind=none")
    assert nope["tag"] == "pos.kind=none"
    assert (trained_run / "eval" / "pos.kind=none" / "results.json").exists()
    assert nope["lengths"]["32"]["loss"] != plain["lengths"]["32"]["loss"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["model.d_model=64"], "cannot change at evaluation"),
        (["eval.nope=1"], "unknown key 'eval.nope'"),
        (["eval.step=999"], "eval.step=999 has no checkpoint"),
        (["pos.kind=sideways"], "pos.kind='sideways'"),
        (["eval.tokens=16"], "fills no window of 64"),
        (["eval.blocks=1"], "eval.blocks=1 must be at least 2"),
    ],
)
def test_eval_bad_input_is_one_line(trained_run, capsys, args, fragment):
    with pytest.raises(SystemExit) as exit_info:
        evaluate(trained_run, *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


@pytest.mark.slow
def test_eval_reports_sparsity_and_entropy_per_layer_and_head(trained_run):
    results = evaluate(trained_run, "eval.probe_max_len=32", "eval.tag=probed")
    probed, skipped = results["lengths"]["32"], results["lengths"]["64"]
    assert len(probed["sparsity"]) == 2 and len(probed["sparsity"][0]) == 4  # layers x heads
    assert len(probed["entropy"]) == 2 and len(probed["entropy"][0]) == 4
    assert all(0 < s <= 1 for layer in probed["sparsity"] for s in layer)
    assert all(0 < share < 1 for layer in probed["first_key"] for share in layer)  # softmax rows: every key > 0
    assert "sparsity" not in skipped  # longer than eval.probe_max_len
    assert len(results["per_position"]["32"]["sparsity"][0]) == 4  # buckets per layer
    assert (trained_run / "eval" / "probed" / "sparsity_vs_length.png").exists()


def restore_with_optimizer(cfg, vocab_size, run, step, **_):
    """The whole training state restored, optimizer included: the reference for the model-only restore."""
    graphdef, like, _ = init_train_state(cfg, LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed)))
    checkpointer = Checkpointer(run.checkpoints)
    step = checkpointer.latest_step() if step is None else step
    state, _ = checkpointer.restore(step, like)
    checkpointer.close()
    return nnx.merge(graphdef, state["params"], state["extra"]), step


@pytest.mark.slow
def test_eval_restores_the_model_without_building_an_optimizer(trained_run, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(trained, "restore_model", restore_with_optimizer)
        reference = evaluate(trained_run, "eval.tag=restore")

    def no_optimizer(*args, **kwargs):
        raise AssertionError("evaluation built an optimizer")

    monkeypatch.setattr("lmzoo.run.steps.make_optimizer", no_optimizer)
    monkeypatch.setattr("lmzoo.run.optim.make_optimizer", no_optimizer)
    assert evaluate(trained_run, "eval.tag=restore") == reference


@pytest.mark.slow
def test_a_tag_evaluated_with_other_settings_is_refused_in_one_line(trained_run, capsys):
    saved = evaluate(trained_run)
    path = trained_run / "eval" / "default" / "results.json"
    with pytest.raises(SystemExit) as exit_info:
        evaluate(trained_run, "eval.lengths=[32]")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds results of other settings (eval.lengths" in err, err
    assert json.loads(path.read_text()) == saved
    replaced = evaluate(trained_run, "eval.lengths=[32]", "eval.tag=default")  # named: replaced
    assert json.loads(path.read_text()) == replaced and set(replaced["lengths"]) == {"32"}
    evaluate(trained_run, "eval.tag=default")  # back to the default settings for the other tests


@pytest.mark.slow
def test_evaluating_a_tag_again_leaves_one_event_per_length(trained_run):
    for _ in range(2):
        evaluate(trained_run, "eval.tag=twice")
    files = list((trained_run / "tb" / "eval" / "twice").glob("events.out.tfevents.*"))
    values = [(e.step, v.tag) for path in files for e in read_events(path) for v in e.summary.value]
    assert [step for step, tag in values if tag == "eval/twice/bpb_vs_length"] == [32, 64]
    assert ("eval/twice/plots/loss_vs_length" in {tag for _, tag in values}
            and "eval/twice/loss_vs_length" in {tag for _, tag in values})  # an image and a scalar, apart


@pytest.mark.slow
def test_an_unwritable_evaluation_folder_is_one_line_before_any_compute(trained_run, capsys, monkeypatch):
    (trained_run / "eval").mkdir(exist_ok=True)
    (trained_run / "eval" / "blocked").write_text("")  # a file where the folder would go

    def no_compute(*args, **kwargs):
        raise AssertionError("evaluated before checking the folder")

    monkeypatch.setattr(lmzoo_eval, "evaluate", no_compute)
    with pytest.raises(SystemExit) as exit_info:
        evaluate(trained_run, "eval.tag=blocked")
    assert exit_info.value.code == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file" in err, err


@pytest.mark.slow
def test_a_config_group_is_an_evaluation_override_as_in_training(trained_run):
    cfg = trained_config(RunDir(trained_run), ["pos=ntk", "pos.factor=4"])
    assert (cfg.pos.kind, cfg.pos.factor) == ("ntk", 4.0)
    ntk = evaluate(trained_run, "pos=ntk", "pos.factor=4")
    assert ntk["tag"] == "pos.factor=4,pos=ntk"
    assert ntk["lengths"]["64"]["loss"] != evaluate(trained_run)["lengths"]["64"]["loss"]


@pytest.mark.slow
def test_a_sweep_folder_evaluates_each_run_in_it_and_names_one_it_cannot(tmp_path, monkeypatch, capsys):
    """``run_dir=<sweep folder>``: Hydra's multirun.yaml beside the runs is no run; a run without a checkpoint is
    named and passed over, the others are evaluated, and the command ends with that run's exit code."""
    monkeypatch.chdir(REPO)  # the saved run names its corpus relative to the checkout
    sweep = tmp_path / "sweep-20261128-120000"
    for job in ("0-gla", "1-gla"):
        shutil.copytree(SAVED_RUN, sweep / job)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    shutil.copytree(SAVED_RUN, sweep / "2-gla", ignore=shutil.ignore_patterns("[0-9]*", "eval"))  # no checkpoint
    with pytest.raises(SystemExit) as stopped:
        lmzoo_eval.main([f"run_dir={sweep}", *SAVED_RUN_EVAL])
    assert stopped.value.code == EXIT_RUN_FAULT
    err = capsys.readouterr().err
    assert "1 of the 3 runs" in err and "2-gla' has no checkpoint" in err
    for job in ("0-gla", "1-gla"):
        assert json.loads((sweep / job / "eval" / "default" / "results.json").read_text())["step"] == 4
    assert not (sweep / "2-gla" / "eval" / "default").exists()
