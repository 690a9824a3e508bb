"""logger=wandb: a Weights & Biases run, offline, gets the scalars metrics.jsonl holds, the config and an evaluation.

Nothing contacts a server (WANDB_MODE=offline). The offline run file is read back record by record: it is a
LevelDB-format log (32 KiB blocks of chunks, each a 7-byte header: crc32, length, type) after a 7-byte
``:W&B`` header, each record one of wandb's protobuf ``Record`` messages.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from lmzoo import eval as lmzoo_eval
from lmzoo.config import ConfigError
from lmzoo.record import tracking
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train
from tests.conftest import tiny_config

BLOCK, CHUNK_HEADER = 32768, 7
FULL, FIRST, LAST = 1, 2, 4


@pytest.fixture
def offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-files"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "wandb-files").mkdir()
    return tmp_path / "wandb-files"


def wandb_records(path: Path):
    """The protobuf records of an offline ``.wandb`` run file, in the order written."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, chunks = CHUNK_HEADER, []
    while position + CHUNK_HEADER <= len(data):
        if BLOCK - position % BLOCK < CHUNK_HEADER:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + CHUNK_HEADER])
        if kind == 0 and length == 0:
            break
        chunks.append(data[position + CHUNK_HEADER:position + CHUNK_HEADER + length])
        position += CHUNK_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def logged(files: Path):
    """(history rows by step, config, summary) of every offline run under ``files``."""
    import wandb

    wandb.teardown()  # a finished run's records may still sit in the service's buffers: it writes them as it stops
    history, config, summary = {}, {}, {}
    for path in sorted(files.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                row = {item_key(i): json.loads(i.value_json) for i in record.history.item}
                history[row["_step"]] = {k: v for k, v in row.items() if not k.startswith("_")}
            elif kind in ("config", "run"):
                updates = record.config.update if kind == "config" else record.run.config.update
                config.update({item_key(i): json.loads(i.value_json) for i in updates})
            elif kind == "summary":
                summary.update({item_key(i): i.value_json for i in record.summary.update})
    return history, config, summary


@pytest.mark.slow
def test_wandb_logs_the_scalars_and_config_metrics_jsonl_and_tensorboard_get(tmp_path, offline):
    run_dir = tmp_path / "run"
    cfg = tiny_config("softmax", "logger=wandb", "train.steps=4", "train.log_every=1", "train.eval_every=2",
                      "train.checkpoint_every=4", run_dir=run_dir)
    train(cfg)
    rows = RunDir(run_dir).read_metrics()
    history, config, _ = logged(offline)
    assert sorted(history) == [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        expected = {("train/" + k if "/" not in k and not k.startswith("val_") else k.replace("val_", "val/", 1)): v
                    for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        assert history[row["step"]] == pytest.approx(expected, rel=1e-12)
    assert "val/loss" in history[2] and "val/loss" not in history[1]
    assert config["model.d_model"] == 32 and config["logger"] == "wandb" and config["params"] > 0
    run_id = (run_dir / tracking.WANDB_ID).read_text().strip()
    assert {p.name.rsplit("-", 1)[1] for p in offline.glob("wandb/offline-run-*")} == {run_id}

    results = lmzoo_eval.main([f"run_dir={run_dir}", "eval.lengths=[32]", "eval.tokens=512", "eval.probe_batch=0",
                               "eval.progress=false", "eval.tag=short"])
    _, _, summary = logged(offline)  # the evaluation went to the same Weights & Biases run
    assert json.loads(summary["eval/short/bpb@32"]) == pytest.approx(results["lengths"]["32"]["bpb"])
    assert {p.name.rsplit("-", 1)[1] for p in offline.glob("wandb/offline-run-*")} == {run_id}


def test_an_evaluation_of_a_wandb_run_goes_to_the_same_run(tmp_path, offline):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    with tracking.open_tracker("wandb", run) as tracker:
        tracker.log(1, {"train/loss": 2.5})
    rows = [{"length": "32", "bpb": "1.25", "bpb_lo": ""},  # text, as results.csv holds
            {"length": "64", "bpb": "1.5", "bpb_lo": "1.25"}]
    tracking.log_evaluation(run, "tiny", rows)
    history, _, summary = logged(offline)
    assert history[1] == {"train/loss": 2.5}
    assert {k: json.loads(v) for k, v in summary.items() if k.endswith(("@32", "@64"))} == {
        "eval/tiny/bpb@32": 1.25, "eval/tiny/bpb@64": 1.5, "eval/tiny/bpb_lo@64": 1.25}
    assert json.loads(summary["eval/tiny/results/_type"]) == "table-file"
    table_file = next(offline.glob("wandb/offline-run-*/files/" + json.loads(summary["eval/tiny/results/path"])))
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["length", "bpb", "bpb_lo"] and table["data"] == [[32, 1.25, None], [64, 1.5, 1.25]]
    # offline-run-<time>-<id>[-<n>]: W&B adds -<n> where a run of the same second already has the folder
    ids = {p.name.split("-")[3] for p in offline.glob("wandb/offline-run-*")}
    assert ids == {(run.path / tracking.WANDB_ID).read_text().strip()}


def test_without_wandb_logger_wandb_fails_in_one_line_naming_the_extra(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError(name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"logger=wandb needs the wandb package: pip install -e \"\.\[track\]\""):
        tracking.open_tracker("wandb", RunDir(tmp_path))
    assert not (tmp_path / tracking.WANDB_ID).exists()


def test_logger_names_its_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        tiny_config("softmax", "logger=mlflow", run_dir=tmp_path)
    assert "logger='mlflow' is not valid (choose from: tensorboard, wandb)" in capsys.readouterr().err


def test_a_tracker_that_cannot_start_says_so_in_one_line(tmp_path, offline, monkeypatch):
    import wandb

    def not_logged_in(**_):
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")

    monkeypatch.setattr(wandb, "init", not_logged_in)
    with pytest.raises(ConfigError, match=r"^logger=wandb could not start a Weights & Biases run \(api_key not "
                                          r"configured \(no-tty\)\..*\): run `wandb login`, or set WANDB_MODE=offline"):
        tracking.open_tracker("wandb", RunDir(tmp_path))
    (tmp_path / "eval").mkdir()
    tracking.log_evaluation(RunDir(tmp_path), "x", [{"length": "32", "bpb": "1.0"}])  # an evaluation warns, goes on


def test_a_seed_of_a_group_is_named_with_its_group():
    assert tracking.display_name(RunDir("/runs/gla-sweep/seed3")) == "gla-sweep/seed3"
    assert tracking.display_name(RunDir("/runs/seedling")) == "seedling"


def test_seeds_trained_together_log_to_runs_of_their_own_at_once(tmp_path, offline):
    """A seed group's members each hold a tracker open in one process (``train.seeds``)."""
    runs = [RunDir(tmp_path / "group" / f"seed{s}") for s in (0, 1)]
    trackers = []
    for run in runs:
        run.path.mkdir(parents=True)
        trackers.append(tracking.open_tracker("wandb", run, label="arm"))
    for step in (1, 2):
        for seed, tracker in enumerate(trackers):
            tracker.log(step, {"train/loss": 10.0 * seed + step})
    for tracker in trackers:
        tracker.close()
    for seed, run in enumerate(runs):
        run_id = (run.path / tracking.WANDB_ID).read_text().strip()
        [files] = offline.glob(f"wandb/offline-run-*-{run_id}")
        logged(offline)  # lets the service write what it holds
        by_run = {}
        for record in wandb_records(next(files.glob("run-*.wandb"))):
            if record.WhichOneof("record_type") == "history":
                row = {item_key(i): json.loads(i.value_json) for i in record.history.item}
                by_run[row["_step"]] = row["train/loss"]
        assert by_run == {1: 10.0 * seed + 1, 2: 10.0 * seed + 2}
