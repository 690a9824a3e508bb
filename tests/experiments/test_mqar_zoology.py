"""Zoology's MQAR sweep: its full scale is zoology's grid, its judge fails a reversed ranking and a control that did
not learn, its ranking goes beside the printed table, and a quick run trains, scores and plots a cell."""

from __future__ import annotations

import json

import pytest

from lmzoo.config import ConfigError
from lmzoo.experiments import at_scale, load, run_experiment, settings_for

zoology = load("mqar_zoology")


def test_full_scale_is_zoologys_grid_and_the_command_line_still_wins():
    full = at_scale(settings_for(zoology, ["scale=full", "widths=[16,64]"], quick=False), zoology.SCALES)
    assert full.widths == [16, 64]  # given on the command line: kept
    assert (full.seq_lens, full.pairs, full.batch_sizes) == ([64, 128, 256, 512], [4, 8, 16, 64], [512, 512, 256, 128])
    assert full.vocab == 8192 and full.lrs == pytest.approx([1e-4, 10**-3.333333, 10**-2.666667, 1e-2], rel=1e-5)
    assert [zoology.steps_for(full, b) for b in full.batch_sizes] == [12_500, 12_500, 25_000, 50_000]  # 64 epochs
    assert at_scale(settings_for(zoology, [], quick=False), zoology.SCALES) == zoology.Settings()  # cpu: defaults
    with pytest.raises(ConfigError, match=r"^scale='gpu' is not valid \(choose from: cpu, full\)$"):
        at_scale(settings_for(zoology, ["scale=gpu"], quick=False), zoology.SCALES)
    with pytest.raises(ConfigError, match=r"^seq_lens=\[64, 128\], pairs=\[8\] and batch_sizes=\[64\] name one"):
        settings_for(zoology, ["seq_lens=[64,128]", "pairs=[8]"], quick=False)


def test_every_full_scale_variant_accepts_zoologys_model_at_the_widest_setting():
    from lmzoo.experiments.runs import run_config

    full = at_scale(settings_for(zoology, ["scale=full"], quick=False), zoology.SCALES)
    for variant in full.variants:  # the prepared GPU command fails on none of its configs
        cfg = run_config(variant, "unused", 0, zoology.steps_for(full, 128),
                         [f"optim.lr={full.lrs[0]}", *zoology.train_overrides(variant, 512, 64, 512, 128, full)])
        assert (cfg.model.d_model, cfg.model.n_heads, cfg.data.task_vocab, cfg.train.steps) == (512, 1, 8192, 50_000)
        assert (cfg.data.query_placement, cfg.data.power_a, cfg.data.distinct_values) == ("power_law", 0.01, True)


def test_overrides_give_each_variant_zoologys_depth_and_the_settings_task():
    settings = settings_for(zoology, [], quick=False)
    softmax = zoology.train_overrides("softmax", 64, 8, 32, 32, settings)
    assert {"data=mqar", "data.seq_len=64", "data.num_pairs=8", "data.task_vocab=64", "model.d_model=32",
            "model.n_layers=2", "model.n_heads=1", "train.batch_size=32", "data.query_placement=power_law",
            "data.power_a=0.01", "data.distinct_values=true"} <= set(softmax)
    assert "model.n_layers=4" in zoology.train_overrides("mamba", 64, 8, 32, 32, settings)
    nsa = settings_for(zoology, ["variants=[softmax,nsa]", "variant_overrides={nsa: [attn.n_kv_heads=1]}"], quick=False)
    assert zoology.train_overrides("nsa", 64, 8, 32, 32, nsa)[-1] == "attn.n_kv_heads=1"
    assert "attn.n_kv_heads=1" not in zoology.train_overrides("softmax", 64, 8, 32, 32, nsa)
    with pytest.raises(ConfigError, match=r"^variant_overrides='nsa' is not valid \(choose from: softmax, linear"):
        settings_for(zoology, ["variant_overrides={nsa: [attn.n_kv_heads=1]}"], quick=False)


def cell(accuracies):
    n = len(accuracies)
    mean = sum(accuracies) / n
    return {"test": list(accuracies), "accuracy": {"estimate": mean, "lo": min(accuracies) - 0.01,
                                                    "hi": max(accuracies) + 0.01, "seeds": [n],
                                                    "uncertainty": "seeds+text", "level": 0.95}}


def evidence(softmax, tau, lo, hi):
    return {"source": "metala_mqar_512_80", "grid": {"softmax": {"T64-p8": {"16": cell(softmax), "32": cell(softmax)}}},
            "agreement": {"kendall_tau": tau, "lo": lo, "hi": hi, "seeds": {"softmax": 3, "mamba": 3}}}


def test_the_judge_passes_agreement_fails_a_reversal_and_needs_its_control():
    settings = settings_for(zoology, [], quick=False)
    passed = lambda e: [c.passed for c in zoology.judge(e, settings)]  # noqa: E731
    assert passed(evidence([0.97, 0.99, 0.98], 1.0, 1.0, 1.0)) == [True, True]
    assert passed(evidence([0.97, 0.99, 0.98], -1.0, -1.0, -1.0)) == [True, False]  # the ranking reversed
    assert passed(evidence([0.97, 0.99, 0.98], None, None, None)) == [True, None]  # one seed: undecided
    assert passed(evidence([0.2, 0.3, 0.25], 1.0, 1.0, 1.0))[0] is False  # softmax did not learn: no control
    assert len(zoology.judge({**evidence([0.97], 1.0, 1.0, 1.0), "agreement": None}, settings)) == 1


def test_the_ranking_at_the_hardest_setting_goes_beside_the_printed_table():
    settings = settings_for(zoology, ["seq_lens=[32,64]", "pairs=[4,8]", "batch_sizes=[32,32]", "widths=[16,32]"],
                            quick=False)
    grid = {"softmax": {"T64-p8": {"16": {"test": [0.90, 0.91, 0.905]}}},
            "mamba": {"T64-p8": {"16": {"test": [0.30, 0.31, 0.305]}}},
            "h3": {"T64-p8": {"16": {"test": [0.5, 0.4, 0.6]}}}}  # no row in MetaLA's table: left out
    record = zoology.compared(grid, settings)
    assert record["variants"] == ["softmax", "mamba"] and record["kendall_tau"] == 1.0
    assert record["lo"] == record["hi"] == 1.0  # every redraw of the seeds keeps softmax above mamba
    assert record["published"]["mamba"]["printed"] == "0.0" and "80 key-value pairs" in record["paper_setting"]
    assert record["lmzoo_setting"] == "MQAR length 64, 8 pairs, width 16, vocabulary 64"
    assert {o["variant"] for o in record["outside"]} == {"softmax", "mamba"}  # 90.5% below ">99.0", 30.5% above "0.0"
    assert zoology.compared({"softmax": grid["softmax"], "h3": grid["h3"]}, settings) is None  # one shared variant


@pytest.mark.slow
def test_quick_run_trains_scores_and_plots_a_cell(tmp_path):
    record = run_experiment("mqar_zoology", tmp_path, quick=True)
    assert record["verdict"] == "smoke run" and len(record["runs"]) == 1
    cell = record["evidence"]["grid"]["softmax"]["T16-p2"]["16"]
    assert cell["validation_accuracy"] == {} and cell["lr"] == 1e-2  # one rate: nothing chosen on validation
    assert 0 <= cell["accuracy"]["lo"] <= cell["accuracy"]["estimate"] <= cell["accuracy"]["hi"] <= 1
    assert len(cell["test"]) == 1 and record["evidence"]["agreement"] is None  # one variant: no ranking
    assert [c["name"] for c in record["checks"]] == ["control: softmax, accuracy at its worst setting, smallest width"]
    assert (tmp_path / "mqar_zoology" / record["figures"][0]).stat().st_size > 0
    json.dumps(record)


def test_one_width_draws_a_row_per_variant_best_on_top(tmp_path):
    from lmzoo.plots import interval_rows, plt

    settings = settings_for(zoology, ["variants=[softmax,mamba,h3]", "widths=[32]", "seq_lens=[64]", "pairs=[8]",
                                      "batch_sizes=[32]"], quick=False)
    grid = {v: {"T64-p8": {"32": {**cell(a), "chance": 1 / 32}}}
            for v, a in {"softmax": [0.97, 0.99], "mamba": [0.2, 0.3], "h3": [0.5, 0.6]}.items()}
    agreement = {"published": {"softmax": {"range": [99.0, 100.0]}, "mamba": {"range": [0.0, 0.05]}}}
    path = zoology.plot({"grid": grid, "source": "metala_mqar_512_80", "agreement": agreement}, settings,
                        tmp_path / "rows.png")
    assert (tmp_path / "rows.png").stat().st_size > 0 and path == str(tmp_path / "rows.png")
    fig, ax = plt.subplots()
    order = interval_rows(ax, ["mamba", "softmax", "h3", "unscored"], [25, 98, 55, float("nan")], [20, 97, 50, 0],
                          [30, 99, 60, 0], points=[[20, 30], [97, 99], [50, 60], []])
    assert order == [1, 2, 0, 3]  # best on top, a NaN estimate last
    by_height = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())))
    assert [label for _, label in by_height] == ["unscored", "mamba", "h3", "softmax"]  # bottom to top
    dots = {tuple(line.get_xdata()): set(line.get_ydata()) for line in ax.lines if line.get_marker() == "."}
    assert dots == {(97, 99): {3}, (50, 60): {2}, (20, 30): {1}, (): set()}  # each seed on its own label's row
    plt.close(fig)


def test_one_width_cuts_intervals_at_an_accuracys_bounds(tmp_path, monkeypatch):
    """Three seeds split between solving and not give an interval past 100%: the figure draws it to 100."""
    from lmzoo import plots

    settings = settings_for(zoology, ["variants=[softmax,mamba]", "widths=[32]", "seq_lens=[64]", "pairs=[8]",
                                      "batch_sizes=[32]"], quick=False)
    grid = {v: {"T64-p8": {"32": {**cell(a), "chance": 1 / 32}}} for v, a in
            {"softmax": [1.0, 1.0, 0.5], "mamba": [0.2, 0.3, 0.25]}.items()}
    grid["softmax"]["T64-p8"]["32"]["accuracy"].update(lo=0.15, hi=1.5)
    drawn = {}
    monkeypatch.setattr(zoology, "interval_rows", lambda ax, labels, y, lo, hi, **kw: drawn.update(
        lo=list(lo), hi=list(hi), points=kw["points"]) or plots.interval_rows(ax, labels, y, lo, hi, **kw))
    zoology.plot({"grid": grid, "source": "metala_mqar_512_80", "agreement": None}, settings, tmp_path / "cut.png")
    assert drawn["hi"] == [100.0, 31.0] and drawn["lo"] == [15.0, 19.0]
    assert drawn["points"] == [[100.0, 100.0, 50.0], [20.0, 30.0, 25.0]]


def test_widths_cut_intervals_at_an_accuracys_bounds_and_mark_chance(tmp_path, monkeypatch):
    """Against width too: an interval past 0 or 100% is drawn to the bound, and chance is a line of its own."""
    from lmzoo import plots

    settings = settings_for(zoology, ["variants=[softmax,h3]", "widths=[32,64]", "seq_lens=[32]", "pairs=[4]",
                                      "batch_sizes=[64]"], quick=False)
    grid = {v: {"T32-p4": {str(w): {**cell(a), "chance": 2 / 64} for w in (32, 64)}} for v, a in
            {"softmax": [1.0, 1.0, 0.5], "h3": [0.1, 0.5, 0.1]}.items()}
    grid["softmax"]["T32-p4"]["64"]["accuracy"].update(lo=0.2, hi=1.3)
    grid["h3"]["T32-p4"]["32"]["accuracy"].update(lo=-0.35, hi=0.85)
    drawn, axes = [], set()
    monkeypatch.setattr(zoology, "error_bars", lambda ax, x, y, lo, hi, **kw: axes.add(ax) or drawn.append(
        (kw["label"], [round(v, 6) for v in lo], list(hi))) or plots.error_bars(ax, x, y, lo, hi, **kw))
    zoology.plot({"grid": grid, "source": "metala_mqar_512_80", "agreement": None}, settings, tmp_path / "w.png")
    assert drawn == [("softmax", [49.0, 20.0], [100.0, 100.0]), ("h3", [0.0, 9.0], [85.0, 51.0])]
    (ax,) = axes
    assert [line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == ":"] == [100 * 2 / 64]
