"""The training loop never waits on the device between steps (``Trainer.advance``): each step's finiteness flag
is read after the next step is dispatched, the next batch is on its way to the device while a step runs, and
neither shows: divergence stops at the same step with the same message and kept checkpoint, and a checkpoint
taken with batches read ahead resumes on the first of them.

(run/test_faults.py stops a diverging run that logs every step; run/test_train.py, run/test_state_passing.py and
data/test_tfds.py resume interrupted runs bit for bit.)
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.faults import Diverged
from lmzoo.run import loop as training
from lmzoo.run.loop import Trainer, train
from lmzoo.run.steps import train_step

from conftest import tiny_config

ONE_LAYER = ["model.n_layers=1", "train.probe_batch=0", "train.eval_every=100"]


def skipping_steps(*bad: int):
    """``train_step`` as the jitted step runs it, but the steps numbered ``bad`` are skipped as non-finite."""

    def step(graphdef, tx, state, batch, **options):
        new, metrics = train_step(graphdef, tx, state, batch, **options)
        skip = jnp.isin(new["step"], jnp.array(bad))
        kept = {k: jax.tree.map(lambda n, o: jnp.where(skip, o, n), new[k], state[k])
                for k in ("params", "extra", "opt")}
        return {**new, **kept}, {**metrics, "finite": metrics["finite"] & ~skip}

    return step


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every, kept", [(100, "none saved yet"), (3, "step 3 in ")],
                         ids=["read_by_the_next_step", "read_by_its_checkpoint"])
def test_divergence_read_one_step_late_names_its_step_and_saves_nothing_for_it(tmp_path, monkeypatch, caplog,
                                                                               checkpoint_every, kept):
    """Steps 4, 5, 6 skipped with train.max_nonfinite=3 stop the run at step 6, whether its flag is read by
    step 7's ``advance`` or by step 6's checkpoint; step 2 alone is counted and forgotten."""
    monkeypatch.setattr(training, "train_step", skipping_steps(2, 4, 5, 6))
    caplog.set_level(logging.WARNING, logger="lmzoo.train")
    cfg = tiny_config("softmax", *ONE_LAYER, "train.steps=8", "train.log_every=100", "train.max_nonfinite=3",
                      f"train.checkpoint_every={checkpoint_every}", run_dir=tmp_path)
    with pytest.raises(Diverged, match=f"diverged at step 6: 3 steps in a row .* last finite checkpoint: {kept}"):
        train(cfg)
    skipped = [(r.args[0], r.args[1]) for r in caplog.records if "its update was skipped" in r.msg]
    assert skipped == [(2, 1), (4, 1), (5, 2), (6, 3)]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == (
        ["3"] if checkpoint_every == 3 else [])


@pytest.mark.slow
def test_flags_are_read_a_step_late_and_a_resume_reads_the_batch_that_was_read_ahead(tmp_path):
    cfg = tiny_config("softmax", *ONE_LAYER, "train.steps=4", "train.log_every=100", "train.checkpoint_every=100",
                      run_dir=tmp_path)
    trainer = Trainer(cfg)
    try:
        events, inputs, step_fn, check_finite = [], {}, trainer.step_fn, trainer.check_finite

        def dispatch(state, batch):
            events.append(("step", trainer.step + 1))
            inputs[trainer.step + 1] = np.asarray(batch["inputs"])
            return step_fn(state, batch)

        def read(finite, step=None):
            events.append(("read", step))
            check_finite(finite, step)

        trainer.step_fn, trainer.check_finite = dispatch, read
        for _ in range(3):
            trainer.advance()
        assert events == [("step", 1), ("step", 2), ("read", 1), ("step", 3), ("read", 2)]
        trainer.save()  # reads step 3's flag first, and records the data position from before step 4's batch
        assert events[-1] == ("read", 3)
        trainer.advance()  # on the batch the feed read ahead while step 3 ran
    finally:
        trainer.close()

    resumed = Trainer(cfg)
    try:
        assert resumed.step == 3
        np.testing.assert_array_equal(next(resumed.train_iter)["inputs"], inputs[4])
    finally:
        resumed.close()


# ----------------------------------------------------------------------------- train.steps_per_call


class Killed(Exception):
    pass


ADVANCE = Trainer.advance  # as the trainer defines it, whatever a test wraps it in


def recording(monkeypatch, kill_at: int | None = None) -> tuple[list, dict]:
    """Each step's loss (in order) and the state's leaves after the last step, of the runs trained from now on;
    ``kill_at``: the run dies when its next call would start after that step (its work since the last
    checkpoint lost)."""
    losses, final = [], {}

    def advance_and_record(self):
        if self.step == kill_at:
            raise Killed
        metrics = ADVANCE(self)
        losses.extend(np.asarray(metrics["loss"]).ravel().tolist())
        if self.step == self.cfg.train.steps:
            final["leaves"] = [np.asarray(x) for x in jax.device_get(self.leaves)]
        return metrics

    monkeypatch.setattr(Trainer, "advance", advance_and_record)
    return losses, final


@pytest.mark.slow
def test_two_steps_a_call_take_the_steps_and_log_the_rows_of_one_step_a_call(tmp_path, monkeypatch):
    """On a mix (whose rows hold each component's loss too): the same losses step by step, parameters and
    logged rows, to float32 rounding (a scan may fuse the step's arithmetic differently)."""
    runs = {}
    for k in (1, 2):
        losses, final = recording(monkeypatch)
        train(tiny_config("softmax", *ONE_LAYER, "data=mix", "train.steps=6", "train.log_every=2",
                          "train.checkpoint_every=6", f"train.steps_per_call={k}", run_dir=tmp_path / str(k)))
        runs[k] = losses, final["leaves"], training.RunDir(tmp_path / str(k)).read_metrics()
    (losses_1, leaves_1, rows_1), (losses_2, leaves_2, rows_2) = runs[1], runs[2]
    assert len(losses_1) == 6
    np.testing.assert_allclose(losses_2, losses_1, rtol=1e-5)
    for a, b in zip(leaves_2, leaves_1, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert [r["step"] for r in rows_2] == [r["step"] for r in rows_1] == [2, 4, 6]
    for a, b in zip(rows_2, rows_1):
        assert a.keys() == b.keys() and "loss/text" in a
        for key in ("loss", "grad_norm", "accuracy", "lr", "loss/text", "nonfinite_steps"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
        assert a["loss"] == pytest.approx(np.mean(losses_1[a["step"] - 2:a["step"]]), rel=1e-5)  # both steps


@pytest.mark.slow
def test_divergence_inside_a_call_names_its_step(tmp_path, monkeypatch, caplog):
    """Two steps a call: steps 5, 6 (a call) and 7 (the first of the last call) skipped stop the run at step 7,
    read by the checkpoint of step 8, which is not saved; step 4's is kept."""
    monkeypatch.setattr(training, "train_step", skipping_steps(2, 5, 6, 7))
    caplog.set_level(logging.WARNING, logger="lmzoo.train")
    cfg = tiny_config("softmax", *ONE_LAYER, "train.steps=8", "train.log_every=100", "train.max_nonfinite=3",
                      "train.checkpoint_every=4", "train.steps_per_call=2", run_dir=tmp_path)
    with pytest.raises(Diverged, match="diverged at step 7: 3 steps in a row .* last finite checkpoint: step 4 in "):
        train(cfg)
    skipped = [(r.args[0], r.args[1]) for r in caplog.records if "its update was skipped" in r.msg]
    assert skipped == [(2, 1), (5, 1), (6, 2), (7, 3)]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["4"]


PASSING = ["model.n_layers=1", "train.state_passing=true", "data.document_boundaries=mask", "train.grad_accum=2",
           "train.steps=8", "train.checkpoint_every=4", "train.eval_every=8", "train.log_every=2",
           "train.probe_batch=0", "train.steps_per_call=2"]


@pytest.mark.slow
def test_a_killed_run_of_two_steps_a_call_resumes_bit_identically_and_other_calls_are_refused(tmp_path, monkeypatch,
                                                                                             capsys):
    """State passing and micro-batches inside the scan; the run killed after step 6 (its checkpoint: step 4)."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    losses, final = recording(monkeypatch)
    train(tiny_config("gla", *PASSING, run_dir=whole))
    whole_losses, whole_leaves = list(losses), final.pop("leaves")
    losses.clear()
    recording(monkeypatch, kill_at=6)
    with pytest.raises(Killed):
        train(tiny_config("gla", *PASSING, run_dir=broken))
    losses, final = recording(monkeypatch)
    train(tiny_config("gla", *PASSING, run_dir=broken))
    assert losses == whole_losses[4:]  # steps 5 to 8 again, bit for bit
    for a, b in zip(final["leaves"], whole_leaves, strict=True):
        np.testing.assert_array_equal(a, b)
    rows = [[(r["step"], r["loss"]) for r in training.RunDir(run).read_metrics()] for run in (whole, broken)]
    assert [step for step, _ in rows[0]] == [2, 4, 6, 8] and rows[1] == rows[0]  # no row lost or doubled

    with pytest.raises(training.ConfigError) as refused:  # step 8 is not a multiple of 3
        Trainer(tiny_config("gla", *PASSING, "train.steps_per_call=3", "train.steps=12", "train.checkpoint_every=3",
                            "train.eval_every=12", "train.log_every=3", run_dir=whole))
    assert str(refused.value) == (f"train.steps_per_call=3: run_dir {str(whole)!r} resumes at step 8, not a multiple "
                                  f"of 3; resume with a steps_per_call that divides 8 (e.g. train.steps_per_call=1)")
    for overrides, message in [
        (["train.log_every=5"], "train.log_every=5 is not a multiple of train.steps_per_call=2"),
        (["train.steps=7"], "train.steps=7 is not a multiple of train.steps_per_call=2"),
        (["train.steps_per_call=0"], "train.steps_per_call=0 must be positive"),
    ]:
        with pytest.raises(SystemExit):
            tiny_config("gla", *PASSING, *overrides)
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
