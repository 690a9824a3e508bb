"""Every measurement's names appear where its definition says: results.csv, the comparison's tables and figures,
TensorBoard and the training log (checked on the run saved in tests/fixtures/run_v4_gla, evaluated with probes)."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest
from omegaconf import OmegaConf

from lmzoo.measure import outputs
from lmzoo.measure.comparison import compare, write_report
from lmzoo.scoring.catalog import MEASUREMENTS, PROBES, SCORES, measurement
from lmzoo.record.directory import RunDir

from conftest import REPO

SAVED = REPO / "tests" / "fixtures" / "run_v4_gla"
RESULTS = json.loads((SAVED / "eval" / "v4" / "results.json").read_text())


def test_names_are_distinct_and_probes_have_their_statistic():
    for field in ("name", "csv", "logged", "table"):
        names = [getattr(m, field) for m in MEASUREMENTS if getattr(m, field)]
        assert len(names) == len(set(names)), field
    assert all(p.is_probe for p in PROBES) and not any(m.is_probe for m in SCORES)
    assert measurement("bpb").logged == "val_bpb"


def test_every_csv_column_is_written_with_its_values():
    rows = list(csv.DictReader(io.StringIO(outputs.results_csv(RESULTS))))
    for m in (m for m in MEASUREMENTS if m.csv):
        for column in outputs.csv_columns(m):
            assert all(row[column] != "" for row in rows), column  # every length of the fixture is probed
    assert list(rows[0]) == outputs.CSV_COLUMNS
    assert outputs.CSV_COLUMNS == (SAVED / "eval" / "v4" / "results.csv").read_text().splitlines()[0].split(",")


def test_every_logged_name_is_in_the_saved_training_log():
    logged = json.loads((SAVED / "metrics.jsonl").read_text().splitlines()[-1])
    for m in (m for m in MEASUREMENTS if m.logged):
        assert m.logged in logged, m.logged
    for probe in (p for p in PROBES if p.per_layer):
        assert f"probe/{probe.name}/layer0" in logged
    unlisted = {k.removeprefix("val_") for k in logged if k.startswith("val_") and not k.endswith(("_lo", "_hi"))}
    assert unlisted == {m.name for m in MEASUREMENTS if m.logged}  # nothing logged that has no definition


def test_every_tensorboard_name_is_written(tmp_path, monkeypatch):
    import tensorboardX

    written = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *args):
            pass

        def add_scalar(self, tag, value, step):
            written.append(tag)

    monkeypatch.setattr(tensorboardX, "SummaryWriter", Recorder)
    outputs.write_tensorboard(RunDir(tmp_path), RESULTS, [])
    assert {f"eval/v4/{m.name}_vs_length" for m in MEASUREMENTS if m.tensorboard} == set(written)


@pytest.fixture
def two_arms(tmp_path, monkeypatch):
    """The saved run, and a copy of it labelled ``other`` whose scored losses differ a little (a byte-identical
    copy is the same run, counted once): a comparison with a baseline."""
    monkeypatch.chdir(REPO)
    for name, label in (("a", None), ("b", "other")):
        run = shutil.copytree(SAVED, tmp_path / name)
        config = OmegaConf.load(run / "config.yaml")
        config.run_dir, config.label = str(run), label
        OmegaConf.save(config, run / "config.yaml")
    results = tmp_path / "b" / "eval" / "v4" / "results.json"
    saved = json.loads(results.read_text())
    for sums in saved["block_sums"].values():
        sums["loss"] = [loss * 1.001 for loss in sums["loss"]]
    results.write_text(json.dumps(saved))
    return [tmp_path / "a", tmp_path / "b"]


def table_header(markdown: str, first: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {first} |"))
    return line.strip("| ").split(" | ")


def test_every_table_column_difference_and_figure_is_in_the_comparison(two_arms, tmp_path):
    report = compare(two_arms, tag="v4", baseline="gla")
    arms, differences = report.markdown.split("Difference to gla")
    header = table_header(arms, "variant")
    assert [h for h in header if h in {m.table for m in MEASUREMENTS}] == [
        *(p.table for p in PROBES if p.table), *(s.table for s in SCORES if s.table)]
    assert all(cell != "—" for cell in table_header(arms, "gla")[header.index("mean S"):])  # every column read
    shown = table_header(differences, "variant")
    for probe in (p for p in PROBES if p.difference):
        assert f"Δ {probe.difference}@train (seeds)" in shown
        assert (f"Δ {probe.difference}@64 (seeds)" in shown) == probe.difference_by_length
        assert probe.name in report.record["differences"][0]
    written = {p.name for p in write_report(report, tmp_path / "comparison")}
    assert {f"{p.figure.stem}.png" for p in PROBES if p.figure} <= written


def test_every_probe_figure_of_an_evaluation_is_drawn(tmp_path):
    outputs.plot_results(RESULTS, tmp_path)
    assert {f"{p.figure.stem}.png" for p in PROBES if p.figure} <= {p.name for p in tmp_path.iterdir()}
