"""Faults a comparison meets: evaluations older than their runs, results computed on changed data, a report that
cannot be written. Each is named in one line, and no number is shown as what it is not."""

from __future__ import annotations

import json
import os

import pytest

from lmzoo import compare
from lmzoo.faults import EXIT_WRITE_FAILED
from lmzoo.measure import comparison

from test_compare import FLAT, write_run


def test_an_evaluation_older_than_its_run_is_marked(tmp_path):
    fresh = write_run(tmp_path, "fresh", variant="softmax", seed=0, growth=FLAT)
    live = write_run(tmp_path, "live", variant="softmax", seed=1, growth=FLAT)
    with open(live / "metrics.jsonl", "a") as f:  # it trained on after its evaluation at step 10
        f.write(json.dumps({"step": 40, "val_bpb": 2.6, "tokens_per_s": 100.0}) + "\n")
    report = comparison.compare([tmp_path])
    assert [n for n in report.notes if "older model" in n] == [
        f"{live}: evaluated at step 10 while its metrics reach step 40: its evaluation columns are of an older model "
        "(rerun lmzoo.eval)"]
    assert str(fresh) not in " ".join(report.notes)
    assert f"- {live}: evaluated at step 10" in report.markdown


def test_results_computed_on_changed_data_are_marked(tmp_path):
    run = write_run(tmp_path, "changed", variant="softmax", seed=0, growth=FLAT)
    results = json.loads((run / "eval" / "default" / "results.json").read_text())
    (run / "eval" / "default" / "results.json").write_text(json.dumps({**results, "data_changed": ["sha256"]}))
    notes = comparison.compare([tmp_path]).notes
    assert any("evaluated on changed data (sha256" in n and "not comparable" in n for n in notes), notes


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_report_that_cannot_be_written_is_one_line(tmp_path, capsys):
    write_run(tmp_path / "runs", "a", variant="softmax", seed=0, growth=FLAT)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o500)
    try:
        with pytest.raises(SystemExit) as stop:
            compare.main([str(tmp_path / "runs"), f"out={out}"])
    finally:
        out.chmod(0o700)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == EXIT_WRITE_FAILED and len(err.splitlines()) == 1 and str(out) in err, err


def test_a_report_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    write_run(tmp_path, "a", variant="softmax", seed=0, growth=FLAT)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("lmzoo.record.directory.tempfile.mkstemp", full)  # every whole-file write goes through it
    with pytest.raises(SystemExit) as stop:
        compare.main([str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == EXIT_WRITE_FAILED and len(err.splitlines()) == 1, err
    assert "No space left on device" in err and err.startswith("lmzoo: error: cannot write ")
