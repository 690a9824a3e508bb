"""Comparing runs: seeds grouped into one row, paired differences to a baseline, plots with intervals."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from omegaconf import OmegaConf

from lmzoo import compare

from lmzoo.measure import comparison
from lmzoo.stats.bootstrap import length_intervals

from conftest import tiny_config

TRAIN_LEN, LENGTHS, BLOCKS = 32, (32, 64, 128), 40
BITS = 1 / (math.log(2) * 1.5)  # bits per byte per nat, at 1.5 bytes per token
RNG = np.random.default_rng(0)
TEXT = RNG.normal(2.0, 0.3, BLOCKS)  # mean loss of each block's text: the same blocks in every run
COUNT = RNG.integers(80, 120, BLOCKS).astype(float)  # scored tokens per block, the same at every length


def write_run(root, name, *, variant, seed, growth, shift=0, lr=1e-3, new_keys=True, label=None, level=1.0,
              corpus="abc", sparsity=None, first_key=None, train=None):
    """A fake run whose per-block loss at length L is the text's, shifted ``shift`` blocks, times growth[L] and
    ``level``, on the corpus named ``corpus``; with ``sparsity`` and ``first_key``, its probes' values per layer and
    head (``[[...]]``)."""
    run_dir = root / name
    (run_dir / "eval" / "default").mkdir(parents=True)
    config = {"seed": seed, "label": label, "run_dir": str(run_dir), "attn": {"name": variant}, "optim": {"lr": lr},
              "data": {"source": "stdlib", "seq_len": TRAIN_LEN},
              "train": {"steps": 10, "batch_size": 4, "progress": True, "log_every": 10, **(train or {})}}
    OmegaConf.save(OmegaConf.create(config), run_dir / "config.yaml")
    (run_dir / "run_info.json").write_text(json.dumps({"variant": variant, "params": 1000, "state_size": 64}))
    (run_dir / "data_fingerprint.json").write_text(json.dumps({"source": "stdlib", "sha256": corpus}))
    row = {"step": 10, "val_bpb": 2.9 + 0.01 * seed, "tokens_per_s": 100.0}
    (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    # each model's own effects of its seed and context: two runs (two folders) never score every block alike
    noise = {n: np.random.default_rng([seed, n, zlib.crc32(name.encode())]).normal(1.0, 0.01, BLOCKS) for n in LENGTHS}
    loss = {n: np.roll(TEXT, shift) * COUNT * noise[n] * growth[n] * level for n in LENGTHS}  # (blocks,) per length
    results = {"variant": variant, "tag": "default", "train_seq_len": TRAIN_LEN, "step": 10}
    results.update(lengths={}, per_position={})
    for n in LENGTHS:
        mean = loss[n].sum() / COUNT.sum()
        results["lengths"][str(n)] = {"loss": mean, "bpb": mean * BITS, "ppl": math.exp(mean), "accuracy": 0.5}
        results["per_position"][str(n)] = {"positions": [n // 2, n], "loss": [mean + 0.1, mean - 0.1]}
        for name, value in (("sparsity", sparsity), ("first_key", first_key)):
            if value is not None:
                results["lengths"][str(n)][name] = value
        if new_keys:
            sums = {"loss": loss[n], "count": COUNT}
            train_sums = {"loss": loss[TRAIN_LEN], "count": COUNT}
            results["lengths"][str(n)].update(length_intervals(sums, train_sums, bits_per_nat=BITS, resamples=500))
            results["per_position"][str(n)]["loss_ci"] = [[mean, mean - 0.2], [mean + 0.2, mean]]
    if new_keys:
        results.update(eval_tokens=int(COUNT.sum()), blocks=BLOCKS, bootstrap={"resamples": 500, "seed": 0},
                       block_sums={str(n): {"loss": loss[n].tolist(), "count": COUNT.tolist()} for n in LENGTHS})
    (run_dir / "eval" / "default" / "results.json").write_text(json.dumps(results))
    return run_dir


DEGRADES = {32: 1.0, 64: 1.1, 128: 1.2}  # loss grows beyond the training length
FLAT = {32: 1.0, 64: 1.0, 128: 1.0}


@pytest.fixture
def sweep(tmp_path):
    """softmax degrades with length; gla is as good at the training length (on other blocks) and flat beyond."""
    for seed in (0, 1):
        write_run(tmp_path / "sweep", f"softmax-{seed}", variant="softmax", seed=seed, growth=DEGRADES)
        write_run(tmp_path / "sweep", f"gla-{seed}", variant="gla", seed=seed, growth=FLAT, shift=1)
    return tmp_path / "sweep"


def rows_of(markdown: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header = cells[0]
    return header, {row[0]: dict(zip(header, row)) for row in cells[1:] if row[0] != header[0]}


def test_seeds_are_grouped_and_other_settings_stay_apart(sweep, tmp_path):
    write_run(sweep, "softmax-lr", variant="softmax", seed=0, growth=DEGRADES, lr=3e-3)
    header, rows = rows_of(compare.main([str(sweep), "--out", str(tmp_path / "out")]))
    assert header[:8] == ["variant", "n", "params", "state size", "steps", "tokens", "val bpb", "bpb@train"]
    assert header[10] == "interval"
    assert set(rows) == {"softmax (optim.lr=0.001)", "softmax (optim.lr=0.003)", "gla"}
    assert rows["gla"]["n"] == "2" and rows["softmax (optim.lr=0.001)"]["n"] == "2"
    assert (rows["gla"]["steps"], rows["gla"]["tokens"]) == ("10", "1,280")  # 10 steps of 4 rows of 32 tokens
    assert rows["softmax (optim.lr=0.003)"]["n"] == "1"
    assert rows["gla"]["val bpb"] == "2.905 ± 0.007"  # mean ± sd of 2.90 and 2.91
    single = rows["softmax (optim.lr=0.003)"]["bpb@64 / bpb@train"]
    estimate, bounds = single.split(" ", 1)  # one run: its paired bootstrap interval
    lo, hi = map(float, bounds.strip("[]").split(", "))
    assert lo < float(estimate) < hi and float(estimate) == pytest.approx(1.1, abs=0.01)
    assert rows["softmax (optim.lr=0.003)"]["interval"] == "1 seed: text only"
    assert rows["gla"]["interval"] == "seeds+text"


def test_baseline_marks_only_differences_the_interval_supports(sweep, tmp_path):
    markdown = compare.main([str(sweep), "baseline=softmax", "--out", str(tmp_path / "out")])
    differences = markdown.split("Difference to softmax")[1]
    _, rows = rows_of(differences)
    gla = rows["gla"]
    assert gla["seeds"] == "2 vs 2" and gla["interval"] == "seeds+text"
    assert not gla["Δ bpb@train"].endswith("*")  # same text on shifted blocks: equal on average, not significant
    for n, rise in ((64, "-0.1"), (128, "-0.2")):
        cell = gla[f"Δ bpb@{n} / bpb@train"]
        assert cell.startswith(rise) and cell.endswith("*")  # flat against a 10% and 20% rise: clear
    assert "softmax" not in rows


def test_pairing_needs_the_same_scored_tokens(sweep, tmp_path):
    results_path = sweep / "gla-0" / "eval" / "default" / "results.json"
    results = json.loads(results_path.read_text())
    for sums in results["block_sums"].values():
        sums["count"][0] += 1  # another budget: the blocks hold other tokens
    results_path.write_text(json.dumps(results))
    markdown = compare.main([str(sweep), "--baseline", "softmax", "--out", str(tmp_path / "out")])
    _, rows = rows_of(markdown.split("Difference")[1])
    assert rows["gla"]["seeds"] == "1 vs 2"  # gla-0 is left out, named in one line
    assert f"left out {sweep / 'gla-0'}: scored other validation tokens" in markdown


def test_runs_on_other_data_are_left_out_in_one_line(sweep, tmp_path):
    write_run(sweep, "softmax-9", variant="softmax", seed=9, growth=DEGRADES, corpus="another python")
    report = comparison.compare([sweep], baseline="softmax")
    _, rows = rows_of(report.markdown)
    assert rows["softmax"]["n"] == "2"
    assert report.notes == [f"left out {sweep / 'softmax-9'}: other data than {sweep / 'softmax-0'} "
                            "(sha256 another python vs abc)"]
    reason = report.notes[0][len(f"left out {sweep / 'softmax-9'}: "):]
    assert report.record["left_out"] == [{"run": str(sweep / "softmax-9"), "reason": reason}]


def test_labels_make_arms_and_comparison_json_records_every_interval(tmp_path):
    """The acceptance test on synthetic evaluations: three seeds labelled A against three others labelled B of the
    same config are not told apart; against a clearly worse arm (a 5% higher loss) the difference is significant;
    one seed per arm is never significant, however large the difference."""
    root = tmp_path / "runs"
    for seed in (0, 1, 2):
        write_run(root, f"A-{seed}", variant="softmax", seed=seed, growth=DEGRADES, label="A")
        write_run(root, f"B-{seed + 3}", variant="softmax", seed=seed + 3, growth=DEGRADES, label="B")
        write_run(root, f"short-{seed}", variant="softmax", seed=seed, growth=DEGRADES, label="short", level=1.05)
    write_run(root, "lone", variant="gla", seed=0, growth=FLAT, label="lone", level=1.5)
    compare.main([str(root), "baseline=A", "out=" + str(tmp_path / "out")])
    record = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert [row["label"] for row in record["rows"]] == ["A", "B", "lone", "short"]
    assert record["rows"][0]["bpb"]["uncertainty"] == "seeds+text" and record["rows"][0]["seeds"] == [0, 1, 2]
    assert record["rows"][0]["params"] == 1000 and record["rows"][0]["state_size"] == 64
    assert record["rows"][0]["measurements"]["sparsity"] == {"mean": None, "sd": None, "n": 0}  # no probe in these runs
    by_label = {d["label"]: d for d in record["differences"]}
    assert set(by_label["B"]["bpb"]) == {"estimate", "lo", "hi", "seeds", "uncertainty", "significant", "level", "df",
                                         "p", "p_adjusted", "significant_adjusted"}
    assert by_label["B"]["bpb"]["uncertainty"] == "seeds+text" and not by_label["B"]["bpb"]["significant"]
    assert by_label["short"]["bpb"]["significant"] and by_label["short"]["bpb"]["lo"] > 0
    assert by_label["short"]["bpb"]["significant_adjusted"] and record["adjust"] == "holm"
    lone = by_label["lone"]["bpb"]
    assert lone["uncertainty"] == "text" and lone["seeds"] == [1, 3] and lone["lo"] > 0 and not lone["significant"]


def test_results_without_intervals_still_compare(tmp_path):
    run_dir = write_run(tmp_path, "old", variant="softmax", seed=0, growth=DEGRADES, new_keys=False)
    _, rows = rows_of(compare.main([str(tmp_path), "--baseline", "softmax", "--out", str(tmp_path / "out")]))
    assert float(rows["softmax"]["bpb@128 / bpb@train"]) == pytest.approx(1.2, abs=0.01)  # from bpb, no interval
    bpb = json.loads((run_dir / "eval" / "default" / "results.json").read_text())["lengths"]["32"]["bpb"]
    assert rows["softmax"]["bpb@train"] == f"{bpb:.3f}"


def test_plots_are_written_with_intervals(sweep, tmp_path):
    out = tmp_path / "out"
    compare.main([str(sweep), "--out", str(out)])
    assert (out / "comparison.md").stat().st_size > 0
    for name in ("bpb_vs_length", "ratio_vs_length", "per_position", "sparsity_vs_length"):
        assert (out / f"{name}.png").stat().st_size > 0


def test_an_ambiguous_baseline_is_one_line(sweep, tmp_path, capsys):
    write_run(sweep, "softmax-lr", variant="softmax", seed=0, growth=DEGRADES, lr=3e-3)
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(sweep), "--baseline", "softmax", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "several rows" in error and "softmax (optim.lr=0.003)" in error


@pytest.mark.slow
def test_compare_tabulates_and_plots_a_sweep(tmp_path, capsys):
    from lmzoo import eval as lmzoo_eval
    from lmzoo.run.loop import train

    for variant, documents in (("softmax", "none"), ("mqa", "mask")):  # mqa keeps packed documents apart
        run_dir = tmp_path / "sweep" / variant
        train(tiny_config(variant, "model.n_layers=1", "train.steps=4", "train.eval_every=4",
                          f"data.document_boundaries={documents}", run_dir=run_dir))
        assert json.loads((run_dir / "run_info.json").read_text())["document_boundaries"] == documents
        lmzoo_eval.main([f"run_dir={run_dir}", "eval.lengths=[32,64]", "eval.tokens=1024", "eval.progress=false"])
    header, rows = rows_of(compare.main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]))
    assert header[:10] == ["variant", "n", "params", "state size", "steps", "tokens", "documents", "val bpb",
                           "bpb@train", "bpb@64 / bpb@train"]
    assert rows["softmax"]["steps"] == "4"
    assert set(rows) == {"softmax", "mqa"}
    assert (rows["softmax"]["documents"], rows["mqa"]["documents"]) == ("none", "mask")
    results = json.loads((tmp_path / "sweep" / "softmax" / "eval" / "default" / "results.json").read_text())
    assert float(rows["softmax"]["bpb@train"].split()[0]) == pytest.approx(results["lengths"]["32"]["bpb"], abs=5e-4)
    assert float(rows["mqa"]["bpb@64 / bpb@train"].split()[0]) > 0
    state_sizes = {name: int(row["state size"].replace(",", "")) for name, row in rows.items()}
    assert state_sizes["softmax"] > state_sizes["mqa"]  # MQA's smaller cache
    for name in ("comparison.md", "bpb_vs_length.png", "per_position.png", "sparsity_vs_length.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_compare_without_runs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1



def test_a_run_that_cannot_be_read_is_left_out_in_one_line(sweep, tmp_path):
    (sweep / "gla-1" / "config.yaml").write_text("")  # a write cut short
    report = comparison.compare([sweep], baseline="softmax")
    assert len(report.notes) == 1 and report.notes[0].startswith(f"left out {sweep / 'gla-1'}: ")
    _, rows = rows_of(report.markdown.split("Difference")[0])
    assert rows["gla"]["n"] == "1" and rows["softmax"]["n"] == "2"


def test_a_damaged_results_file_leaves_out_that_file_not_the_run(sweep, caplog):
    for folder in ("eval", "lm_eval"):  # lmzoo's evaluation and lm-eval's are read alike
        damaged = sweep / "gla-1" / folder / "default" / "results.json"
        damaged.parent.mkdir(parents=True, exist_ok=True)
        kept = damaged.read_text() if damaged.exists() else None
        damaged.write_text('{"lengths": ')  # a write cut short
        report = comparison.compare([sweep], baseline="softmax")
        assert not [note for note in report.notes if note.startswith("left out")], report.notes
        _, rows = rows_of(report.markdown.split("Difference")[0])
        assert rows["gla"]["n"] == "2"
        assert f"{damaged} cannot be read" in caplog.text
        damaged.write_text(kept) if kept is not None else damaged.unlink()


def test_a_hidden_folder_below_a_sweep_is_not_a_run(sweep, tmp_path):
    write_run(sweep, ".gla-2.partial", variant="gla", seed=2, growth=FLAT, shift=1)  # a copy not yet moved in place
    _, rows = rows_of(compare.main([str(sweep), "--out", str(tmp_path / "out")]))
    assert rows["gla"]["n"] == "2"
    assert comparison.find_runs([sweep / ".gla-2.partial"]) == [sweep / ".gla-2.partial"]  # named: still read


def test_sparsity_differences_count_the_seeds_and_need_two_of_them(tmp_path):
    for seed, (s_soft, s_gla) in enumerate([(0.30, 0.52), (0.32, 0.50), (0.31, 0.51)]):
        write_run(tmp_path, f"softmax-{seed}", variant="softmax", seed=seed, growth=FLAT, sparsity=[[s_soft, s_soft]])
        write_run(tmp_path, f"gla-{seed}", variant="gla", seed=seed, growth=FLAT, sparsity=[[s_gla - 0.1, s_gla + 0.1]],
                  first_key=[[0.1 + 0.01 * seed, 0.1]])
    write_run(tmp_path, "retnet-0", variant="retnet", seed=0, growth=FLAT, sparsity=[[0.9, 0.9]])
    report = comparison.compare([tmp_path], baseline="softmax")
    header, rows = rows_of(report.markdown.split("Difference to softmax")[1])
    column = "Δ mean S@train (seeds)"
    estimate, rest = rows["gla"][column].split(" ", 1)
    assert float(estimate) == pytest.approx(0.20, abs=1e-9) and rest.endswith("*")
    lo, hi = map(float, rest.removesuffix(" *").strip("[]").split(", "))
    half = stats.t.ppf(0.975, 4) * math.sqrt(0.01**2 / 3 + 0.01**2 / 3)  # equal spreads: Welch's df is 4
    assert (lo, hi) == pytest.approx((0.2 - half, 0.2 + half), abs=2e-3)  # the table rounds to 3 decimals
    assert rows["retnet"][column] == "—"  # one seed: its training noise is unknown
    record = {d["label"]: d for d in report.record["differences"]}
    assert record["gla"]["sparsity"]["uncertainty"] == "seeds" and record["retnet"]["sparsity"] is None
    assert rows["gla"]["Δ mean S@128 (seeds)"] == rows["gla"][column]  # the fake runs' S is the same at every length
    assert set(record["gla"]["sparsity_by_length"]) == {"64", "128"} and record["retnet"]["sparsity_by_length"] == {}
    _, summary = rows_of(report.markdown.split("Difference to softmax")[0])
    assert summary["gla"]["first key"] == "0.105 ± 0.005" and summary["softmax"]["first key"] == "—"
    assert rows["gla"]["Δ first key@train (seeds)"] == "—" and record["gla"]["first_key"] is None  # softmax has none


def test_arms_on_different_kernels_are_named(tmp_path):
    """Runs record the kernels their mixers ran; a comparison says when arms (or one arm's seeds) differ."""
    ran = {"gla-0": "jla.mosaic_gpu:gla", "gla-1": "lmzoo:chunk", "softmax-0": "lmzoo:xla", "retnet-0": None}
    for name, implementation in ran.items():
        run_dir = write_run(tmp_path, name, variant=name.split("-")[0], seed=int(name[-1]), growth=FLAT)
        info = json.loads((run_dir / "run_info.json").read_text())
        # retnet's layers as a mixer calling no op with a choice of kernels records them: nothing to name
        info["kernels"] = [[{"op": "any", "implementation": implementation}] if implementation else []] * 2
        (run_dir / "run_info.json").write_text(json.dumps(info))
    report = comparison.compare([tmp_path])
    [note] = [n for n in report.notes if "kernels" in n]
    assert "jla.mosaic_gpu:gla | lmzoo:chunk" in note and "lmzoo:xla" in note and "retnet" not in note
    assert sorted(map(tuple, sum(report.record["kernels"].values(), []))) == [
        ("jla.mosaic_gpu:gla",), ("lmzoo:chunk",), ("lmzoo:xla",)]
    assert report.record["kernels"]["retnet"] == []


def test_arms_on_the_same_kernels_say_nothing(sweep):
    # runs from before kernels were recorded, too
    assert not [n for n in comparison.compare([sweep]).notes if "kernels" in n]


# ----------------------------------------------------------------------------- each run once, arms by what trains


def test_a_run_and_its_copy_or_link_count_once_and_are_named(sweep, tmp_path):
    alone = comparison.compare([sweep], baseline="softmax")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # as experiments link twins
    (elsewhere / "softmax-0-link").symlink_to(sweep / "softmax-0", target_is_directory=True)
    shutil.copytree(sweep / "gla-1", elsewhere / "gla-1-copy")  # as cpu_recipe.sh KEEP= copies
    report = comparison.compare([sweep, elsewhere], baseline="softmax")
    _, rows = rows_of(report.markdown.split("Difference")[0])
    assert rows["softmax"]["n"] == "2" and rows["gla"]["n"] == "2"
    assert report.notes[:2] == [f"counted once: {elsewhere / 'gla-1-copy'} is a copy of {sweep / 'gla-1'}",
                                f"counted once: {elsewhere / 'softmax-0-link'} is a link to {sweep / 'softmax-0'}"]
    assert report.record["counted_once"] == report.notes[:2]
    assert tables_of(report) == tables_of(alone)


def tables_of(report) -> list[str]:
    return [line for line in report.markdown.splitlines() if line.startswith("|")]


def test_two_runs_of_one_seed_in_an_arm_are_refused_unless_said_distinct(sweep, tmp_path, capsys):
    write_run(sweep, "softmax-0-again", variant="softmax", seed=0, growth=DEGRADES)  # another run_dir, same seed
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(sweep), f"out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "arm softmax has 2 runs of seed 0" in line and "same_seed=distinct" in line
    _, rows = rows_of(compare.main([str(sweep), f"out={tmp_path / 'out'}", "same_seed=distinct"]))
    assert rows["softmax"]["n"] == "3"


def test_identical_content_counts_once_whatever_the_config_says(sweep, tmp_path):
    """A copy whose run_dir was edited records another config, and same_seed=distinct lets two runs of one seed
    through: its block sums, the same to the bit, still make it one model, named in a note."""
    copy = tmp_path / "edited"
    shutil.copytree(sweep / "softmax-1", copy)
    config = OmegaConf.load(copy / "config.yaml")
    config.run_dir = str(copy)
    OmegaConf.save(config, copy / "config.yaml")
    report = comparison.compare([sweep, copy], baseline="gla", same_seed="distinct")
    _, rows = rows_of(report.markdown.split("Difference")[0])
    assert rows["softmax"]["n"] == "2"
    assert report.notes[0] == (f"counted once: {copy} scored the same block sums as (one model's evaluation, whatever "
                               f"its config says: a copy with an edited config, or one evaluation twice) "
                               f"{sweep / 'softmax-1'}")
    assert tables_of(report) == tables_of(comparison.compare([sweep], baseline="gla"))


def test_an_arm_pooling_validation_budgets_says_so(sweep):
    write_run(sweep, "softmax-2", variant="softmax", seed=2, growth=DEGRADES, train={"eval_tokens": 65536})
    notes = comparison.compare([sweep]).notes
    assert [n for n in notes if "train.eval_tokens" in n] == [
        "arm softmax pools runs validated on different budgets (train.eval_tokens 65536, None): its val bpb column "
        "mixes texts, its evaluation columns do not"]


def test_arms_split_by_a_change_on_resuming_are_labelled_by_it(sweep):
    write_run(sweep, "softmax-lr", variant="softmax", seed=2, growth=DEGRADES)
    (sweep / "softmax-lr" / "resumes.jsonl").write_text(
        json.dumps({"step": 5, "key": "optim.lr", "old": 0.001, "new": 0.0005}) + "\n")
    _, rows = rows_of(comparison.compare([sweep]).markdown)
    assert set(rows) == {"softmax (not changed on resuming)", "softmax (resumed at step 5: optim.lr 0.001 -> 0.0005)",
                         "gla"}


def test_pair_seed_pairs_the_runs_of_one_seed_number_and_says_where_it_cannot(sweep, tmp_path, capsys):
    paired = comparison.compare([sweep], baseline="softmax", pair="seed")
    unpaired = comparison.compare([sweep], baseline="softmax")
    [gla] = paired.record["differences"]
    assert gla["paired_by_seed"] and paired.record["pair"] == "seed" and unpaired.record["pair"] == "none"
    assert gla["bpb"]["estimate"] == pytest.approx(unpaired.record["differences"][0]["bpb"]["estimate"])
    assert gla["bpb"]["lo"] != pytest.approx(unpaired.record["differences"][0]["bpb"]["lo"])  # another interval
    assert rows_of(paired.markdown.split("Difference to softmax")[1])[1]["gla"]["seeds"] == "2 vs 2 paired"
    write_run(sweep, "gla-5", variant="gla", seed=5, growth=FLAT, shift=1)
    notes = comparison.compare([sweep], baseline="softmax", pair="seed").notes
    assert [n for n in notes if "not paired" in n] == [
        "arm gla is not paired by seed (its seeds 0, 1, 5, softmax's 0, 1: pairing needs the same two or more seed "
        "numbers in both arms); its differences are unpaired"]
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(sweep), "baseline=softmax", "pair=seeds", f"out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "pair='seeds' is not valid (choose from: none, seed)" in line


def test_settings_that_cannot_change_the_model_do_not_split_arms(sweep, tmp_path):
    write_run(sweep, "softmax-2", variant="softmax", seed=2, growth=DEGRADES,
              train={"progress": False, "log_every": 1, "checkpoint_every": 7})
    write_run(sweep, "softmax-long", variant="softmax", seed=0, growth=DEGRADES, train={"steps": 40})
    _, rows = rows_of(comparison.compare([sweep]).markdown)
    assert rows["softmax (train.steps=10)"]["n"] == "3"  # progress and intervals pooled, the budget kept apart
    assert (rows["softmax (train.steps=40)"]["steps"], rows["softmax (train.steps=40)"]["tokens"]) == ("40", "5,120")


def every_setting() -> set[str]:
    """Every dotted key of the config: the top-level schema and every registered mixer's and data source's spec."""
    from lmzoo import registry
    from lmzoo.config import Config

    def keys(spec, prefix=""):
        found = set()
        for f in dataclasses.fields(spec):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            found |= (keys(type(default), f"{prefix}{f.name}.") if dataclasses.is_dataclass(default)
                      else {prefix + f.name})
        return found

    found = keys(Config) - {"attn", "data"}
    for group, specs in (("attn", registry.MIXERS), ("data", registry.SOURCES)):
        for name in specs.names():
            found |= keys(specs.lookup(name), f"{group}.")
    return found


def test_every_setting_is_classified_as_changing_the_trained_model_or_not():
    from lmzoo.schema import CAN_CHANGE_TRAINED_MODEL, changes_trained_model, is_classified

    settings = every_setting()
    assert len(settings) > 150 and {"train.progress", "train.steps", "attn.window", "data.hf_name"} <= settings
    unclassified = sorted(k for k in settings if not is_classified(k))
    assert not unclassified, f"add these to lmzoo.schema's lists: {unclassified}"
    train_keys = {k for k in settings if k.startswith("train.")}
    assert "train" not in CAN_CHANGE_TRAINED_MODEL and all(is_classified(k) for k in train_keys)  # one by one
    assert not changes_trained_model("train.progress") and not changes_trained_model("train.mesh.fsdp")
    assert changes_trained_model("optim.lr") and changes_trained_model("train.steps") and changes_trained_model("seed")
    assert changes_trained_model("something.new")  # unknown: kept apart


def test_the_default_output_does_not_replace_another_comparison(sweep, tmp_path, capsys):
    compare.main([str(sweep)])  # into the sweep folder
    compare.main([str(sweep)])  # the same comparison again: replaced
    with pytest.raises(SystemExit):
        compare.main([str(sweep), "baseline=softmax"])  # another comparison
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "holds a comparison of other runs" in line and "out=" in line
    compare.main([str(sweep), "baseline=softmax", f"out={sweep}"])  # said so: replaced
    assert json.loads((sweep / "comparison.json").read_text())["baseline"] == "softmax"


def test_the_frontier_records_with_a_copy_of_themselves_give_the_same_tables(tmp_path):
    records = Path(__file__).resolve().parents[2] / "docs" / "frontier" / "records"
    subset = tmp_path / "records"
    for run in sorted(records.glob("softmax-s*")) + sorted(records.glob("kda-s*")):
        shutil.copytree(run, subset / run.name)
    shutil.copytree(subset, tmp_path / "copy")
    alone = comparison.compare([subset], baseline="softmax")
    doubled = comparison.compare([subset, tmp_path / "copy"], baseline="softmax")
    assert tables_of(doubled) == tables_of(alone)
    assert "3 vs 3" in "\n".join(tables_of(doubled)) and len(doubled.record["counted_once"]) == 6


# ----------------------------------------------------------------------------- stars adjusted for the arms


def test_holm_adjusts_p_values_step_down():
    from lmzoo.stats.uncertainty import adjusted_p_values

    assert adjusted_p_values([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjusted_p_values([0.01, 0.04], "none") == [0.01, 0.04]
    assert adjusted_p_values([0.5, 0.6, 0.9]) == pytest.approx([1.0, 1.0, 1.0])  # capped, never decreasing
    with pytest.raises(ValueError, match="adjust='bonf' is not valid"):
        adjusted_p_values([0.1], "bonf")


def test_the_frontier_stars_are_adjusted_for_all_31_arms_and_both_are_recorded():
    """Against softmax at the training length, seven arms significant at 95% each lose their stars once the 31 arms
    are one family (Holm); the p-values agree with the intervals they come from."""
    records = Path(__file__).resolve().parents[2] / "docs" / "frontier" / "records"
    report = comparison.compare([records], baseline="softmax")
    plain = comparison.compare([records], baseline="softmax", adjust="none")
    _, rows = rows_of(report.markdown.split("Difference to softmax")[1])
    _, unadjusted = rows_of(plain.markdown.split("Difference to softmax")[1])
    assert len(rows) == 31 and "Holm's adjustment for the 31 arms" in report.markdown
    starred = lambda table, arm: table[arm]["Δ bpb@train"].endswith("*")  # noqa: E731
    lost = {arm for arm in rows if starred(unadjusted, arm) and not starred(rows, arm)}
    assert lost == {"gated_softmax", "stickbreaking", "kda", "rwkv7", "mamba3", "ttt_linear", "minimax_like"}
    for difference in report.record["differences"]:
        for key in ("bpb", "sparsity"):
            c = difference[key]
            assert c["significant"] == (c["p"] < 0.05) and c["p_adjusted"] >= c["p"]
            assert unadjusted[difference["label"]]["Δ bpb@train"].endswith("*") == difference["bpb"]["significant"]


@pytest.mark.slow
def test_all_the_frontier_records_with_a_copy_of_themselves_give_the_same_tables(tmp_path):
    records = Path(__file__).resolve().parents[2] / "docs" / "frontier" / "records"
    shutil.copytree(records, tmp_path / "copy")
    alone = comparison.compare([records], baseline="softmax")
    doubled = comparison.compare([records, tmp_path / "copy"], baseline="softmax")
    assert tables_of(doubled) == tables_of(alone) and len(doubled.record["counted_once"]) == 96
    assert "kda | 3 vs 3 | -0.082 [-0.144, -0.021] |" in "\n".join(tables_of(doubled))  # not "6 vs 6"


def test_the_table_explains_its_spread_cells_and_an_unevaluated_arm(sweep):
    """Arms of two seeds give ``mean ± sd`` cells, which the table's legend explains; an arm whose runs have no
    results at the tag counts 0 seeds, and the differences' note says to evaluate them first."""
    for seed in (0, 1):
        shutil.rmtree(sweep / f"gla-{seed}" / "eval")
    markdown = comparison.compare([sweep], baseline="softmax").markdown
    assert " ± " in markdown and "the mean ± the standard deviation over the arm's runs" in markdown
    _, rows = rows_of(markdown.split("Difference to softmax")[1])
    assert rows["gla"]["seeds"] == "0 vs 2" and "0 (and — for its differences): none has" in markdown


def test_a_table_of_single_runs_and_evaluated_arms_has_no_legend(sweep):
    for seed in (1,):
        for variant in ("softmax", "gla"):
            shutil.rmtree(sweep / f"{variant}-{seed}")
    markdown = comparison.compare([sweep], baseline="softmax").markdown
    assert "standard deviation" not in markdown and "none has" not in markdown


# ----------------------------------------------------------------------------- files that are not what they should be


@pytest.mark.parametrize("out, code, fragment", [("afile", 2, "is a file, not a folder"),
                                                 ("afile/below", 5, "cannot make the folder")])
def test_compare_into_a_file_is_one_line(sweep, tmp_path, capsys, out, code, fragment):
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(sweep), f"out={tmp_path / out}"])
    assert exit_info.value.code == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


def test_results_of_another_layout_are_named_and_left_out_of_a_comparison(sweep, caplog):
    odd = sweep / "gla-1" / "eval" / "default" / "results.json"
    odd.write_text(json.dumps({"lengths": [32, 64], "train_seq_len": 32}))  # valid JSON of another layout
    (sweep / "gla-0" / "lm_eval" / "default").mkdir(parents=True)
    (sweep / "gla-0" / "lm_eval" / "default" / "results.json").write_text(json.dumps({"results": [1]}))
    compare.main([str(sweep), f"out={sweep}"])  # exits 0: the two files are left out, the rest compared
    err = caplog.text
    assert f"{odd} is not laid out as lmzoo writes it" in err and "lm_eval/default/results.json" in err, err
