"""An experiment's runs kept as records (``keep=``: settings and measurements, no checkpoints): a run kept is not
trained again in another out_dir and gives the same evidence; a measurement the record lacks trains that run again;
a record of other settings is refused in one line."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.experiments import records_kept, run_experiment, runs


@pytest.fixture
def trained(monkeypatch) -> list[str]:
    """The run directories trained, in order."""
    done, train = [], runs.train
    monkeypatch.setattr(runs, "train", lambda cfg, *a, **k: done.append(cfg.run_dir) or train(cfg, *a, **k))
    return done


@pytest.mark.slow
def test_a_kept_run_is_read_back_not_trained_and_a_missing_measurement_trains_it_again(tmp_path, trained, caplog,
                                                                                        monkeypatch):
    caplog.set_level(logging.INFO, logger="lmzoo.experiments.progress")
    monkeypatch.setattr(runs.progress, "propagate", True)  # to caplog, even after a command in this process took it
    said = lambda: [r.getMessage().split(": ", 1)[1] for r in caplog.records]  # noqa: E731  (the run's path left out)
    keep = tmp_path / "keep"
    first = run_experiment("state_tracking", tmp_path / "a", quick=True, keep=keep)
    assert len(trained) == 2  # two arms, one seed each
    assert [line.split(" in ")[0] for line in said()] == ["training to step 8", "trained"] * 2
    kept = keep / "delta_rule_beta01-s0"  # the runs' folder left out: git ignores folders named runs
    assert sorted(p.name for p in kept.iterdir()) == ["config.yaml", "eval"]
    assert not list(keep.rglob("checkpoints"))
    second = run_experiment("state_tracking", tmp_path / "b", quick=True, keep=keep)
    assert len(trained) == 2 and second["evidence"] == first["evidence"]
    assert not (tmp_path / "b" / "state_tracking" / "runs").exists()  # nothing trained, nothing written there
    assert len(said()) == 4  # and nothing said of the runs kept

    shutil.rmtree(kept / "eval")  # as if the first experiment had stopped before evaluating this run
    third = run_experiment("state_tracking", tmp_path / "c", quick=True, keep=keep)
    assert [str(t).split("/")[-1] for t in trained[2:]] == ["delta_rule_beta01-s0"]
    assert said()[4:6] == ["its kept record lacks a measurement; training the run again", "training to step 8"]
    assert third["evidence"] == first["evidence"]  # the same seed on the same CPU trains to the same weights
    with pytest.raises(ConfigError, match=r"keeps a run trained with train.steps=8, not 9; remove that record"):
        run_experiment("state_tracking", tmp_path / "d", quick=True, keep=keep, overrides=["steps=9"])


@pytest.mark.slow
def test_a_kept_measurement_of_positions_is_read_back_as_measured(tmp_path, trained):
    keep = tmp_path / "keep"
    first = run_experiment("state_tracking_papers", tmp_path / "a", quick=True, keep=keep)
    measured = sorted(p.name for p in keep.rglob("measurements/*.json"))
    assert len(trained) == 1 and len(measured) == 2  # the test length and the control's
    second = run_experiment("state_tracking_papers", tmp_path / "b", quick=True, keep=keep)
    assert len(trained) == 1 and second["evidence"] == first["evidence"]


def test_kept_bits_come_back_as_measured_and_other_values_are_refused(tmp_path):
    folder = tmp_path / "exp"
    rng = np.random.default_rng(0)
    arrays = {"correct": (rng.random((3, 17)) < 0.5).astype(np.float64), "scored": np.ones((3, 17))}
    with records_kept(folder, tmp_path / "keep"):
        assert runs.kept_record(folder / "runs-mad" / "z") == tmp_path / "keep" / "runs-mad" / "z"
        assert runs.measured_once(folder / "runs" / "x", "m", lambda: arrays) is arrays
        back = runs.measured_once(folder / "runs" / "x", "m", lambda: pytest.fail("measured twice"))
        with pytest.raises(ValueError, match="m's half holds other values"):
            runs.measured_once(folder / "runs" / "y", "m", lambda: {"half": np.full((2,), 0.5)})
    for key, a in arrays.items():
        np.testing.assert_array_equal(back[key], a)
        assert back[key].dtype == np.float64
    assert set(json.loads((tmp_path / "keep" / "x" / "measurements" / "m.json").read_text())) == set(arrays)
    with records_kept(folder, None):
        assert runs.kept_record(folder / "runs" / "x") is None


def test_kept_counts_come_back_as_counted_and_other_values_are_refused(tmp_path):
    folder = tmp_path / "exp"
    counts = {"tp": np.array([[3, 0, 7], [1, 2, 0]]), "examples": np.array([128, 5])}
    with records_kept(folder, tmp_path / "keep"):
        assert runs.counted_once(folder / "runs" / "x", "c", lambda: counts) is counts
        back = runs.counted_once(folder / "runs" / "x", "c", lambda: pytest.fail("counted twice"))
        for bad in (np.array([-1, 2]), np.array([0.5])):
            with pytest.raises(ValueError, match="c's fn holds other values"):
                runs.counted_once(folder / "runs" / "y", "c", lambda: {"fn": bad})  # noqa: B023
    for key, a in counts.items():
        np.testing.assert_array_equal(back[key], a)
        assert back[key].shape == a.shape
    kept = json.loads((tmp_path / "keep" / "x" / "measurements" / "c.json").read_text())
    assert kept["tp"] == {"shape": [2, 3], "at": [0, 2, 3, 4], "counts": [3, 7, 1, 2]}  # the nonzero entries only


def test_a_torn_kept_record_is_named_in_one_line(tmp_path):
    folder, keep = tmp_path / "exp", tmp_path / "keep"
    (keep / "x" / "measurements").mkdir(parents=True)
    (keep / "x" / "measurements" / "m.json").write_text('{"correct": {"sha')
    (keep / "x" / "eval" / "t").mkdir(parents=True)
    (keep / "x" / "eval" / "t" / "results.json").write_text("[1]")
    with records_kept(folder, keep):
        with pytest.raises(ConfigError, match=r"^experiments: .*m.json is not a kept measurement "
                                              r"\(JSONDecodeError: Unterminated"):
            runs.measured_once(folder / "runs" / "x", "m", lambda: pytest.fail("measured"))
        with pytest.raises(ConfigError, match=r"^experiments: .*results.json is not a kept evaluation \(no settings"):
            runs.kept_evaluation(keep / "x" / "eval" / "t" / "results.json", {})
        (keep / "x" / "measurements" / "m.json").write_text('{"correct": {"shape": [2, 3]}}')
        with pytest.raises(ConfigError, match=r"^experiments: .*m.json is not a kept measurement \(KeyError"):
            runs.measured_once(folder / "runs" / "x", "m", lambda: pytest.fail("measured"))
