"""Evaluating a checkpoint at several lengths writes results of the documented shape."""

from __future__ import annotations

import json

import pytest
from flax import nnx

from lmzoo import eval as lmzoo_eval
from lmzoo.checkpoint import Checkpointer
from lmzoo.model import LM
from lmzoo.train import init_train_state, train

from conftest import tiny_config


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config("softmax", "train.steps=6", "train.eval_every=6", run_dir=run_dir))
    return run_dir


def evaluate(run_dir, *args):
    return lmzoo_eval.main([f"run_dir={run_dir}", "eval.lengths=[32,64]", "eval.batches=2", "eval.position_buckets=4",
                            "eval.progress=false", *args])


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
    assert csv_lines[0] == "length,length_ratio,loss,bpb,accuracy,mean_sparsity,mean_entropy" and len(csv_lines) == 3
    assert (out / "loss_vs_length.png").stat().st_size > 0 and (out / "per_position.png").stat().st_size > 0


def test_position_override_is_tagged_and_changes_results(trained_run):
    plain = evaluate(trained_run)
    nope = evaluate(trained_run, "pos.kind=none")
    assert nope["tag"] == "pos.kind=none"
    assert (trained_run / "eval" / "pos.kind=none" / "results.json").exists()
    assert nope["lengths"]["32"]["loss"] != plain["lengths"]["32"]["loss"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["model.d_model=64"], "cannot change at evaluation"),
        (["eval.nope=1"], "unknown key 'eval.nope'"),
        (["eval.step=999"], "eval.step=999 has no checkpoint"),
        (["pos.kind=sideways"], "pos.kind='sideways'"),
    ],
)
def test_eval_bad_input_is_one_line(trained_run, capsys, args, fragment):
    with pytest.raises(SystemExit) as exit_info:
        evaluate(trained_run, *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


def test_eval_reports_sparsity_and_entropy_per_layer_and_head(trained_run):
    results = evaluate(trained_run, "eval.probe_max_len=32", "eval.tag=probed")
    probed, skipped = results["lengths"]["32"], results["lengths"]["64"]
    assert len(probed["sparsity"]) == 2 and len(probed["sparsity"][0]) == 4  # layers x heads
    assert len(probed["entropy"]) == 2 and len(probed["entropy"][0]) == 4
    assert all(0 < s <= 1 for layer in probed["sparsity"] for s in layer)
    assert "sparsity" not in skipped  # longer than eval.probe_max_len
    assert len(results["per_position"]["32"]["sparsity"][0]) == 4  # buckets per layer
    assert (trained_run / "eval" / "probed" / "sparsity_vs_length.png").exists()


def restore_with_optimizer(cfg, vocab_size, run_dir, step):
    """The whole training state restored, optimizer included: the reference for the model-only restore."""
    graphdef, like, _ = init_train_state(cfg, LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed)))
    checkpointer = Checkpointer(run_dir / "checkpoints")
    step = checkpointer.latest_step() if step is None else step
    state, _ = checkpointer.restore(step, like)
    checkpointer.close()
    return nnx.merge(graphdef, state["params"], state["extra"]), step


def test_eval_restores_the_model_without_building_an_optimizer(trained_run, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(lmzoo_eval, "restore_model", restore_with_optimizer)
        reference = evaluate(trained_run, "eval.tag=restore")

    def no_optimizer(*args, **kwargs):
        raise AssertionError("evaluation built an optimizer")

    monkeypatch.setattr("lmzoo.train.make_optimizer", no_optimizer)
    monkeypatch.setattr("lmzoo.optim.make_optimizer", no_optimizer)
    assert evaluate(trained_run, "eval.tag=restore") == reference
