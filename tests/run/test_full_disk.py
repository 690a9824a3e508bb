"""A full disk, at the start of a run and in the middle of one: one ``lmzoo: error`` line, exit 5, no log spam,
and what was on disk before intact. On a real small tmpfs where this process may mount one, injected otherwise."""

from __future__ import annotations

import errno
import logging
import os
import subprocess

import jax.numpy as jnp
import pytest

from lmzoo import train as lmzoo_train
from lmzoo.faults import EXIT_WRITE_FAILED
from lmzoo.record.checkpoints import Checkpointer, UnretrievedWriteErrors, silence_unretrieved_write_errors

from conftest import TINY, run_lmzoo

SMALL_RUN = [*TINY, "model.n_layers=1", "train.steps=200", "train.checkpoint_every=5", "train.log_every=5",
             "train.eval_every=50", "train.probe_batch=0"]


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_run_started_on_a_full_disk_is_one_line_before_hydra_writes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "fsync", no_space)  # the write probe's bytes do not fit
    with pytest.raises(SystemExit) as stop:
        lmzoo_train.main(["+attn=softmax", *TINY, f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == EXIT_WRITE_FAILED and len(err.splitlines()) == 1, err
    assert err == f"lmzoo: error: run_dir '{tmp_path / 'run'}' is not writable (No space left on device)"
    assert not (tmp_path / "run" / ".hydra").exists()


def test_a_checkpoint_on_a_full_disk_says_so_in_one_line_and_keeps_the_earlier_one(tmp_path, monkeypatch):
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    state = {"params": {"w": jnp.ones(4)}}
    checkpointer.save(1, state, {"position": 1})

    def full(*args, **kwargs):  # what TensorStore raises when a write does not fit
        raise ValueError('RESOURCE_EXHAUSTED: Error writing "params.w" in OCDBT database: Failed to write 30218 '
                         "bytes to file 19: No space left on device [os_error_code='28']")

    monkeypatch.setattr(checkpointer.manager, "save", full)
    with pytest.raises(Exception) as fault:
        checkpointer.save(2, state, {"position": 2})
    assert fault.value.exit_code == EXIT_WRITE_FAILED
    assert str(fault.value) == (f"checkpoint 2 could not be written in {tmp_path / 'checkpoints'} (the disk is full: "
                                "no space left on device); the earlier checkpoints are intact")
    assert checkpointer.all_steps() == [1]
    checkpointer.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs, 2 MB of it taken: a tiny run fills the rest within a few checkpoints."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("this process cannot mount a tmpfs (the injected tests above cover the code paths)")
    try:
        (disk / "filler").write_bytes(bytes(2_000_000))
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_stops_it_in_one_line_with_its_checkpoints_intact(small_disk):
    run_dir = small_disk / "run"
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", *SMALL_RUN, f"run_dir={run_dir}")
    err = proc.stderr.strip()
    assert proc.returncode == EXIT_WRITE_FAILED and len(err.splitlines()) == 1, (proc.returncode, err[-3000:])
    assert err.startswith("lmzoo: error: ") and "no space left on device" in err
    assert "Traceback" not in proc.stdout and "Logging error" not in proc.stdout, proc.stdout[-3000:]
    saved = Checkpointer(run_dir / "checkpoints")
    assert saved.all_steps() and saved.all_steps()[-1] < 200  # what it saved before the disk filled
    saved.close()
    (small_disk / "filler").unlink()  # room again: the same command resumes from the newest checkpoint
    resumed = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", *SMALL_RUN[:-5], "train.steps=20",
                        "train.checkpoint_every=5", "train.log_every=5", "train.eval_every=20", "train.probe_batch=0",
                        f"run_dir={run_dir}")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr[-2000:]



def test_after_a_failed_write_unretrieved_write_tasks_are_not_logged(caplog):
    """The other writes of a failed checkpoint, never awaited, would be logged by asyncio as tracebacks."""
    asyncio_log = logging.getLogger("asyncio")
    try:
        silence_unretrieved_write_errors()
        silence_unretrieved_write_errors()  # once only
        assert sum(isinstance(f, UnretrievedWriteErrors) for f in asyncio_log.filters) == 1
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished ...>")
            asyncio_log.error("Exception in callback something else")
        assert [r.getMessage() for r in caplog.records] == ["Exception in callback something else"]
    finally:
        for f in [f for f in asyncio_log.filters if isinstance(f, UnretrievedWriteErrors)]:
            asyncio_log.removeFilter(f)
