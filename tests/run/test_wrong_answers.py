"""Faults that used to give a wrong answer or wrong advice without a word: each injected, and the one line,
the exit code and the numbers that come out (or do not) asserted.

A live run evaluated while it trains, data changed under an evaluation, two evaluations of one tag at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmzoo import eval as lmzoo_eval
from lmzoo.config import ConfigError
from lmzoo.faults import EXIT_CONFIG, EXIT_RUN_FAULT, EXIT_UNPARSABLE, RunFault, RunLock, UnparsableConfig
from lmzoo.mixers.hybrid import check_layers_used
from lmzoo.record.checkpoints import Checkpointer, CorruptCheckpoint
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train
from lmzoo.train import note_short_schedule

from conftest import REPO, TINY, run_lmzoo, tiny_config

ONE_LAYER = ["model.n_layers=1"]
SCHEDULE = [*ONE_LAYER, "train.steps=6", "train.checkpoint_every=2", "train.eval_every=6", "train.probe_batch=0"]
EVAL_ARGS = ["eval.lengths=[32]", "eval.tokens=512", "eval.probe_batch=0", "eval.progress=false"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A finished tiny run with checkpoints at steps 2, 4 and 6."""
    run_dir = tmp_path_factory.mktemp("trained")
    train(tiny_config("softmax", *SCHEDULE, run_dir=run_dir))
    return run_dir


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    to = tmp_path / "run"
    shutil.copytree(trained_run, to)
    (to / "lock").unlink(missing_ok=True)
    return to


def evaluate(run_dir: Path, *args: str) -> dict:
    return lmzoo_eval.main([f"run_dir={run_dir}", *EVAL_ARGS, *args])


def refused(capsys, run_dir: Path, *args: str, code: int) -> str:
    """The one stderr line of an evaluation that must stop with ``code``."""
    with pytest.raises(SystemExit) as stop:
        evaluate(run_dir, *args)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == code, err
    assert len(err.splitlines()) == 1 and err.startswith("lmzoo: error: "), err
    return err


# ----------------------------------------------------------------------------- a live run


def test_a_run_still_training_is_evaluated_at_its_newest_finished_checkpoint_and_says_so(run_copy, caplog):
    with RunLock(RunDir(run_copy).lock_path), caplog.at_level(logging.WARNING):
        results = evaluate(run_copy)
    assert results["step"] == 6
    notes = [r.getMessage() for r in caplog.records]
    assert any("still training" in n and "step 6" in n for n in notes), notes
    assert not any("move the checkpoints" in n or "damaged" in n for n in notes), notes


def rotating(monkeypatch, run_dir: Path, rotations: int):
    """The trainer's rotation, injected: the first ``rotations`` checkpoints read vanish while they are read
    (the trainer saved newer ones and deleted them), as with a fast run keeping its newest three."""
    original, seen = Checkpointer.restore_model, []

    def restore_while_rotated(self, step, model):
        if len(seen) < rotations:
            seen.append(step)
            shutil.rmtree(run_dir / "checkpoints" / str(step))
            raise CorruptCheckpoint(f"checkpoint {step} cannot be restored (FileNotFoundError: gone)")
        return original(self, step, model)

    monkeypatch.setattr(Checkpointer, "restore_model", restore_while_rotated)
    return seen


def test_a_checkpoint_rotated_away_while_read_is_not_called_damaged(run_copy, monkeypatch, caplog):
    seen = rotating(monkeypatch, run_copy, rotations=1)
    with RunLock(RunDir(run_copy).lock_path), caplog.at_level(logging.WARNING):
        results = evaluate(run_copy)
    assert seen == [6] and results["step"] == 4  # the newest still on disk, listed afresh
    assert not any("damaged" in r.getMessage() or "older checkpoint" in r.getMessage() for r in caplog.records)


def test_a_checkpoint_rotated_away_while_the_steps_are_listed_is_listed_again(run_copy, monkeypatch):
    """Orbax lists the step folders, then reads each one's time: a step deleted in between fails the listing."""
    from lmzoo.record import checkpoints

    real, calls = checkpoints.ocp.CheckpointManager, []

    def listing_raced(directory, **kwargs):
        calls.append(directory)
        if len(calls) == 1:  # the trainer deletes its oldest while this lists them
            shutil.rmtree(run_copy / "checkpoints" / "2")
            raise FileNotFoundError(2, "No such file or directory", str(run_copy / "checkpoints" / "2"))
        return real(directory, **kwargs)

    monkeypatch.setattr(checkpoints.ocp, "CheckpointManager", listing_raced)
    with RunLock(RunDir(run_copy).lock_path):
        results = evaluate(run_copy)
    assert len(calls) == 2 and results["step"] == 6


def unreadable(self, step, model):
    raise CorruptCheckpoint(f"checkpoint {step} cannot be restored (ValueError: half there)")


def test_a_live_run_never_gets_the_advice_to_move_its_checkpoints(run_copy, monkeypatch, capsys):
    monkeypatch.setattr(Checkpointer, "restore_model", unreadable)  # as if each were caught mid-write
    with RunLock(RunDir(run_copy).lock_path):
        err = refused(capsys, run_copy, code=EXIT_RUN_FAULT)
    assert "trains the run" in err and "try again" in err and "move" not in err
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == ["2", "4", "6"]  # nothing moved
    assert "move the checkpoints away" in refused(capsys, run_copy, code=EXIT_RUN_FAULT)  # no trainer: they are bad

    rotating(monkeypatch, run_copy, rotations=3)  # every one rotated away before it could be read
    with RunLock(RunDir(run_copy).lock_path):
        err = refused(capsys, run_copy, code=EXIT_RUN_FAULT)
    assert "no finished checkpoint yet" in err and "is training it" in err


# ----------------------------------------------------------------------------- data changed under an evaluation


def test_an_evaluation_refuses_data_other_than_the_run_trained_on(run_copy, capsys):
    fingerprint = json.loads((run_copy / "data_fingerprint.json").read_text())
    fingerprint["sha256"] = "0" * 64  # the corpus the run trained on, as if a file had changed since
    (run_copy / "data_fingerprint.json").write_text(json.dumps(fingerprint))
    err = refused(capsys, run_copy, code=EXIT_RUN_FAULT)
    assert "data differ" in err and "sha256" in err and "data.allow_changed=true" in err
    assert not list((run_copy / "eval").glob("*/results.json")) if (run_copy / "eval").exists() else True
    assert "bpb" not in capsys.readouterr().out  # no number scored on the other data

    results = evaluate(run_copy, "data.allow_changed=true")
    assert results["data_changed"] == ["sha256"]  # the results say what they were computed on
    saved = json.loads((run_copy / "eval" / "data.allow_changed=true" / "results.json").read_text())
    assert saved["data_changed"] == ["sha256"]


# ----------------------------------------------------------------------------- one tag, two evaluations


def test_a_second_evaluation_of_a_tag_being_evaluated_is_refused(run_copy, capsys):
    tag_dir = run_copy / "eval" / "mine"
    tag_dir.mkdir(parents=True)
    with RunLock(tag_dir / lmzoo_eval.EVAL_LOCK):  # another evaluation of eval.tag=mine, computing
        err = refused(capsys, run_copy, "eval.tag=mine", code=EXIT_RUN_FAULT)
    assert "being evaluated by another process" in err and "eval.tag=<name>" in err
    assert not (tag_dir / "results.json").exists()
    assert evaluate(run_copy, "eval.tag=mine")["tag"] == "mine"  # once it is done, the tag is free


# ----------------------------------------------------------------------------- settings that silently did less


def test_a_hybrid_too_shallow_for_its_pattern_is_refused_where_a_run_starts():
    with pytest.raises(ConfigError, match=r"model.n_layers=2 leaves out the 'softmax' layers .* model.n_layers>=4"):
        check_layers_used(tiny_config("gla_softmax").attn, 2)  # pattern [gla, gla, gla, softmax]
    check_layers_used(tiny_config("gla_softmax", "model.n_layers=4").attn, 4)
    check_layers_used(tiny_config("hwfa").attn, 2)  # [window] below, [full] on top: both used
    check_layers_used(tiny_config("softmax").attn, 1)  # not a hybrid: nothing to check


@pytest.mark.slow
def test_training_a_hybrid_without_its_softmax_layer_is_one_line_before_anything_is_written(tmp_path):
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=gla_softmax", *TINY, f"run_dir={tmp_path / 'run'}")
    err = proc.stderr.strip()
    assert proc.returncode == EXIT_CONFIG and len(err.splitlines()) == 1 and "'softmax' layers" in err, err
    assert not (tmp_path / "run").exists()


def test_a_warmup_the_run_cannot_finish_is_named_in_a_note(caplog):
    with caplog.at_level(logging.WARNING, logger="lmzoo.train"):
        note_short_schedule(tiny_config("softmax", "optim.warmup_steps=1000", "train.steps=4"))
    assert [r.getMessage() for r in caplog.records] == [
        "note: optim.warmup_steps=1000 is not below train.steps=4: the warmup is cut to end by step 3, "
        "so the learning rate peaks at the end"]
    caplog.clear()
    note_short_schedule(tiny_config("softmax", "optim.warmup_steps=3", "train.steps=4"))
    assert not caplog.records


# ----------------------------------------------------------------------------- a run directory changed by hand


def test_a_run_whose_config_was_deleted_is_refused_in_one_line_not_resumed(run_copy):
    (run_copy / "config.yaml").unlink()
    with pytest.raises(ConfigError) as refusal:
        train(tiny_config("softmax", *SCHEDULE, run_dir=run_copy))
    assert str(refusal.value) == (f"run_dir '{run_copy}' has checkpoints (steps 2, 4, 6) but no config.yaml: the "
                                  "settings they were trained with are gone, so it cannot resume; put config.yaml "
                                  "back, or pick another run_dir")
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == ["2", "4", "6"]


def test_a_model_changed_under_a_run_is_named_and_its_checkpoints_called_intact(run_copy):
    config = run_copy / "config.yaml"
    config.write_text(config.read_text().replace("d_model: 32", "d_model: 64"))  # an edit by hand
    with pytest.raises(RunFault) as refusal:
        train(tiny_config("softmax", *SCHEDULE, "model.d_model=64", run_dir=run_copy))
    message = str(refusal.value)
    assert "holds arrays of other shapes than these settings build" in message and "intact" in message
    assert "move the checkpoints" not in message and "\n" not in message
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == ["2", "4", "6"]


def test_half_a_config_is_the_parse_fault_with_its_line_and_column(run_copy):
    (run_copy / "config.yaml").write_text("model:\n  d_model: [32\n")
    with pytest.raises(UnparsableConfig) as fault:
        RunDir(run_copy).read_config()
    assert fault.value.exit_code == EXIT_UNPARSABLE
    assert str(fault.value).startswith(f"{run_copy / 'config.yaml'}, line 3, column 1 does not parse as YAML (")


def test_a_torn_resumes_line_is_named_once_however_often_it_is_read(run_copy, caplog):
    with open(run_copy / "resumes.jsonl", "a") as f:
        f.write('{"step": 6, "key": "optim.lr", "old": 0.003, "new"')  # a write cut short
    run = RunDir(run_copy)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):  # as the checks of one resume read it
            run.settings_in_effect()
    assert len([r for r in caplog.records if "resumes.jsonl" in r.getMessage()]) == 1


@pytest.mark.slow
def test_a_run_evaluated_while_it_trains_and_rotates_its_checkpoints(tmp_path):
    """The real thing: a trainer saving every 2 steps and keeping 3 in one process, an evaluation in another."""
    run_dir = tmp_path / "live"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    trainer = subprocess.Popen([sys.executable, "-m", "lmzoo.train", "+attn=softmax", *TINY, *ONE_LAYER,
                                "train.steps=100000", "train.checkpoint_every=2", "train.eval_every=100000",
                                "train.log_every=1000", "train.probe_batch=0", f"run_dir={run_dir}"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not RunDir(run_dir).is_trained() or not saved(run_dir):
            assert trainer.poll() is None and time.time() < deadline, trainer.communicate()
            time.sleep(0.5)
        proc = run_lmzoo("-m", "lmzoo.eval", f"run_dir={run_dir}", *EVAL_ARGS)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "is still training" in proc.stderr and "newest finished checkpoint" in proc.stderr, proc.stderr
        assert "move the checkpoints" not in proc.stderr and "damaged" not in proc.stderr
        assert "WARNING:" not in proc.stderr  # plain lines, not logging's default prefix
        step = json.loads((run_dir / "eval" / "default" / "results.json").read_text())["step"]
        assert step >= 2 and step % 2 == 0
    finally:
        trainer.send_signal(signal.SIGTERM)
        out, err = trainer.communicate(timeout=120)
    assert trainer.returncode == 75, err[-3000:]
    assert f"run_dir={run_dir}" in out  # the line that resumes it
    assert max(saved(run_dir)) > step  # it trained on while it was evaluated


def saved(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []


def test_data_asked_for_by_an_override_are_not_refused_but_recorded(run_copy):
    results = evaluate(run_copy, "data.val_fraction=0.2")  # another split, asked for: the results say so
    assert "val_documents" in results["data_changed"] and results["step"] == 6


def test_overrides_that_ask_for_other_data_by_name():
    from lmzoo.record.opening import changes_data

    assert changes_data(["data.num_pairs=64"]) and changes_data(["seed=1000"])  # a task's examples of another seed
    assert not changes_data(["data.allow_changed=true", "pos=pi", "eval.step=4"])
