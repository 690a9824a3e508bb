"""The training loop never waits on the device between steps (``Trainer.advance``): each step's finiteness flag
is read after the next step is dispatched, the next batch is on its way to the device while a step runs, and
neither shows: divergence stops at the same step with the same message and kept checkpoint, and a checkpoint
taken with a batch prefetched resumes on that batch.

(tests/test_faults.py stops a diverging run that logs every step; tests/test_train.py, test_state_passing.py and
test_tfds.py resume interrupted runs bit for bit.)
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo import training
from lmzoo.faults import Diverged
from lmzoo.steps import train_step
from lmzoo.training import Trainer, train

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


def test_flags_are_read_a_step_late_and_a_resume_reads_the_batch_that_was_prefetched(tmp_path):
    cfg = tiny_config("softmax", *ONE_LAYER, "train.steps=4", "train.log_every=100", "train.checkpoint_every=100",
                      run_dir=tmp_path)
    trainer = Trainer(cfg)
    try:
        events, step_fn, check_finite = [], trainer.step_fn, trainer.check_finite

        def dispatch(state, batch):
            events.append(("step", trainer.step + 1))
            return step_fn(state, batch)

        def read(finite, step=None):
            events.append(("read", step))
            check_finite(finite, step)

        trainer.step_fn, trainer.check_finite = dispatch, read
        for _ in range(3):
            trainer.advance()
        assert events == [("step", 1), ("step", 2), ("read", 1), ("step", 3), ("read", 2)]
        position, batch = trainer.prefetched
        assert position != trainer.train_iter.get_state()  # step 4's batch is pulled and on the device
        prefetched = np.asarray(batch["inputs"])
        trainer.save()  # reads step 3's flag first, and records the data position from before step 4's batch
        assert events[-1] == ("read", 3)
        trainer.advance()
        assert trainer.prefetched is None  # nothing is pulled after the last step
    finally:
        trainer.close()

    resumed = Trainer(cfg)
    try:
        assert resumed.step == 3
        np.testing.assert_array_equal(next(resumed.train_iter)["inputs"], prefetched)
    finally:
        resumed.close()
