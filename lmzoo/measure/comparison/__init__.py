"""Comparing trained runs: reading them, grouping seeds into arms, intervals that count seeds and text.

A run is read from its run directory (config, run info, data fingerprint, metrics, resumes,
``eval/<tag>/results.json`` and ``lm_eval/<tag>/results.json``, whose tasks get a table of their own:
``comparison.harness``). Runs form one *arm* when they set the same ``label``, or, without
labels, when their configs differ only in ``seed`` (and ``run_dir``): the seeds of one experiment.

Every interval between arms counts both sources of uncertainty (``lmzoo.stats.trained_models``): training noise,
from the spread of the seeds inside each arm, and text, from leaving out each scored block in turn, the same block
for every run (the jackknife). An arm of one seed gives a text-only interval, said so in its row and never marked
significant. Runs are only compared on the same data and the same scored tokens: a run whose data fingerprint or
scored tokens differ from the reference run's is left out, with one line saying which and why.

``compare(...)`` returns a ``Report`` (markdown tables and the ``comparison.json`` record);
``write_report`` writes them with the plots. ``python -m lmzoo.compare`` is the command around it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lmzoo.measure.comparison.estimates import PAIRINGS, bootstrap_settings, unpaired_notes
from lmzoo.measure.comparison.figures import plot
from lmzoo.measure.comparison.harness import harness_difference_table, harness_table
from lmzoo.measure.comparison.reading import (
    Group,
    check_distinct_seeds,
    distinct_runs,
    find_runs,
    group_runs,
    load_runs,
    on_the_same_data,
    reference_run,
    stale_evaluations,
    validation_budgets,
)
from lmzoo.measure.comparison.tables import differences, find_baseline, table
from lmzoo.scoring.lengths import sampling_note
from lmzoo.record.directory import atomic_write_text
from lmzoo.stats.uncertainty import adjusted_p_values


@dataclass
class Report:
    markdown: str
    record: dict  # comparison.json
    groups: list[Group]
    notes: list[str]  # one line each: runs left out, columns left empty


def missing_evaluations(groups: list[Group], tag: str) -> list[str]:
    """A line naming the runs whose evaluation columns are empty, and the command that fills them."""
    unevaluated = [r for g in groups for r in g.runs if not r.results]
    if not unevaluated:
        return []
    return [f"{len(unevaluated)} run(s) have no eval/{tag}/results.json, so their evaluation columns are empty: "
            f"run `python -m lmzoo.eval run_dir={unevaluated[0].path}` (and the others) first"]


def kernel_differences(groups: list[Group]) -> list[str]:
    """A line where arms (or the seeds of one arm) ran different kernels: their speed and rounding differ, so a
    reader should know before comparing them."""
    sets = {g.label: g.kernels for g in groups if g.kernels}
    if len({tuple(s) for s in sets.values()}) <= 1 and all(len(s) == 1 for s in sets.values()):
        return []
    ran = "; ".join(f"{label}: {' | '.join(', '.join(s) for s in kinds)}" for label, kinds in sets.items())
    return [f"the runs did not all run the same kernels ({ran}); run_info.json says which ran where and why"]


def compare(paths: list[Path], *, tag: str = "default", baseline: str | None = None,
            same_seed: str = "refuse", adjust: str = "holm", pair: str = "none") -> Report:
    """Read, group and compare the runs at or below ``paths``, each run once; ValueError in one line for a bad
    baseline, for two runs of one seed in an arm (unless ``same_seed="distinct"``) or a bad ``adjust``. The stars of
    the differences to the baseline are adjusted for the number of arms (``adjust``: holm, or none); ``pair="seed"``
    pairs each arm's runs with the baseline's of the same seed number where both arms hold the same seeds."""
    adjusted_p_values([], adjust)  # a bad setting is refused before any run is read
    if pair not in PAIRINGS:
        raise ValueError(f"pair={pair!r} is not valid (choose from: {', '.join(PAIRINGS)})")
    runs, unreadable = load_runs(find_runs(paths), tag)
    runs, duplicates = distinct_runs(runs)
    if not runs:
        raise FileNotFoundError(f"no readable runs (directories with config.yaml and metrics.jsonl) under "
                                f"{', '.join(map(str, paths))}" + (f": {unreadable[0][1]}" if unreadable else ""))
    reference = reference_run(runs, baseline)
    kept, left_out = on_the_same_data(runs, reference)
    notes = duplicates + [f"left out {path}: {why}" for path, why in unreadable]
    notes += [f"left out {run.path}: {why}" for run, why in left_out]
    groups = group_runs(kept)
    check_distinct_seeds(groups, same_seed)
    settings = bootstrap_settings(kept)
    markdown, rows = table(groups, settings)
    record = {"tag": tag, "level": 0.95, "adjust": adjust, "pair": pair, "bootstrap": settings, "rows": rows,
              "differences": [], "baseline": None,
              "left_out": [{"run": str(path), "reason": why} for path, why in unreadable]
              + [{"run": str(run.path), "reason": why} for run, why in left_out],
              "counted_once": duplicates}
    harness, record["lm_eval"], harness_notes = harness_table(groups, settings)
    record["lm_eval_differences"] = []
    if baseline:
        base = find_baseline(groups, baseline)
        text, record["differences"] = differences(groups, base, settings, adjust, pair)
        notes += unpaired_notes(groups, base, pair)
        markdown += "\n\n" + text
        record["baseline"] = base.label
        harness_diffs, record["lm_eval_differences"] = harness_difference_table(groups, base, settings, adjust)
        harness += "\n\n" + harness_diffs if harness_diffs else ""
    if harness:
        markdown += "\n\n" + harness
    notes += harness_notes
    notes += missing_evaluations(groups, tag) + kernel_differences(groups) + stale_evaluations(kept)
    notes += validation_budgets(groups)
    record["kernels"] = {g.label: [list(s) for s in g.kernels] for g in groups}
    if reference.results:
        markdown += f"\n\nScored text: {sampling_note(reference.results)}."
    if notes:
        markdown += "\n\n" + "\n".join(f"- {note}" for note in notes)
    return Report(markdown, record, groups, notes)


def what_was_compared(record: dict) -> dict:
    """The runs (real paths), evaluation tag and baseline of a comparison.json, old records included."""
    runs = [run for row in record.get("rows", []) for run in row.get("runs", [])]
    return {"runs": sorted(str(Path(run).resolve()) for run in runs), "tag": record.get("tag"),
            "baseline": record.get("baseline")}


def another_comparison(report: Report, out: Path) -> bool:
    """Whether ``out`` holds the comparison.json of other runs, another tag or another baseline than ``report``'s:
    writing there would silently replace it."""
    try:
        earlier = json.loads((out / "comparison.json").read_text())
    except (OSError, ValueError):
        return (out / "comparison.md").exists()
    return what_was_compared(earlier) != what_was_compared(report.record)


def write_report(report: Report, out: Path) -> list[Path]:
    """``comparison.md``, ``comparison.json`` and the plots in ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "comparison.md", report.markdown + "\n")
    atomic_write_text(out / "comparison.json", json.dumps(report.record, indent=2) + "\n")
    return [out / "comparison.md", out / "comparison.json", *plot(report.groups, out)]
