"""lm-evaluation-harness results in a comparison: each task's metrics per arm, with seeds+text intervals over examples.

``python -m lmzoo.lm_eval`` writes every example's score beside a task's metric (``per_example``). The examples play
the part the scored text's blocks play for bits per byte (``lmzoo.stats.trained_models``): every run scored the same
examples, so each is left out in turn for every run alike (the jackknife), and the spread of the seeds inside an arm
gives the training noise. A metric lm-eval takes as a mean over examples (accuracy, exact match) is a ratio of sums
of (score, 1); one it aggregates as a ratio (bits per byte, word and byte perplexity) is made of each example's
(log-likelihood, bytes or words), as lm-eval makes it. A task whose runs scored different examples (another
``limit`` or task version) is left out of the table, with a line saying so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lmzoo.measure.comparison.tables import (
    adjusted_columns,
    adjusted_record,
    interval_cell,
    interval_note,
    stars_caption,
)
from lmzoo.stats.bootstrap import ratio_of_sums
from lmzoo.stats.trained_models import Comparison, arm_difference, arm_estimate

# lm-eval's metrics aggregated as a ratio of sums: the metric of minus the summed log-likelihood over the summed count
RATIO_METRICS: dict[str, Callable] = {
    "bits_per_byte": lambda nats_per_unit: nats_per_unit / np.log(2),
    "byte_perplexity": np.exp,
    "word_perplexity": np.exp,
}


def metric_function(metric: str, paired: bool) -> Callable | None:
    """The metric of summed example arrays: (score, 1) -> mean, or (log-likelihood, count) -> lm-eval's ratio."""
    if not paired:
        return ratio_of_sums
    to_metric = RATIO_METRICS.get(metric)
    return None if to_metric is None else (lambda ll, count: to_metric(-ll / count))


def example_arrays(results: dict | None, task: str, metric: str) -> tuple[tuple, tuple[np.ndarray, ...]] | None:
    """(the examples' ids, the arrays the metric takes, one entry per example), or None where the run has none."""
    examples = (results or {}).get("per_example", {}).get(task, {})
    if metric not in examples:
        return None
    values = np.asarray(examples[metric], np.float64)
    ids = tuple(examples.get("doc_id", range(len(values))))
    arrays = (values, np.ones_like(values)) if values.ndim == 1 else (values[:, 0], values[:, 1])
    return ids, arrays


def columns_of(runs) -> list[tuple[str, str]]:
    """Every (task, metric) with per-example scores an interval can be made of, in name order."""
    found = set()
    for run in runs:
        for task, examples in ((run.harness or {}).get("per_example") or {}).items():
            for metric, values in examples.items():
                paired = bool(values) and isinstance(values[0], list)
                if metric != "doc_id" and len(values) >= 2 and metric_function(metric, paired) is not None:
                    found.add((task, metric))
    return sorted(found)


def aligned_columns(runs) -> tuple[list[tuple[str, str, Callable]], list[str]]:
    """(the columns every run that has them scored on the same examples, with their metric; a note per column
    left out because its runs scored different examples)."""
    kept, notes = [], []
    for task, metric in columns_of(runs):
        found = [example_arrays(r.harness, task, metric) for r in runs]
        if len({ids for ids, _ in filter(None, found)}) > 1:
            notes.append(f"lm-eval {task} {metric} left out: its runs scored different examples (another limit= or "
                         "task version); rerun python -m lmzoo.lm_eval with the same settings on each")
            continue
        paired = any(np.ndim(r.harness["per_example"][task][metric]) == 2 for a, r in zip(found, runs) if a)
        kept.append((task, metric, metric_function(metric, paired)))
    return kept, notes


def arm_arrays(group, task: str, metric: str) -> list[tuple[np.ndarray, ...]]:
    """The example arrays of the arm's runs that ran the task."""
    return [found[1] for found in (example_arrays(r.harness, task, metric) for r in group.runs) if found]


def harness_estimates(groups, settings: dict) -> tuple[list[tuple[str, str, Callable]], list[dict], list[str]]:
    """(the columns, per arm {"<task>/<metric>": Comparison or None}, notes)."""
    columns, notes = aligned_columns([r for g in groups for r in g.runs])
    rows = []
    for group in groups:
        row = {}
        for task, metric, function in columns:
            arrays = arm_arrays(group, task, metric)
            row[f"{task}/{metric}"] = arm_estimate(arrays, function, **settings) if arrays else None
        rows.append(row)
    return columns, rows, notes


def harness_differences(group, baseline, columns, settings: dict) -> dict[str, Comparison | None]:
    """Per column, the arm's mean over seeds minus the baseline's, with its seeds+text interval."""
    found = {}
    for task, metric, function in columns:
        mine, theirs = arm_arrays(group, task, metric), arm_arrays(baseline, task, metric)
        found[f"{task}/{metric}"] = arm_difference(mine, theirs, function, **settings) if mine and theirs else None
    return found


def harness_table(groups, settings: dict) -> tuple[str, list[dict], list[str]]:
    """The markdown table of each arm's lm-eval metrics with their intervals ("" when no run has lm-eval results
    with per-example scores), its records for comparison.json, and notes."""
    columns, rows, notes = harness_estimates(groups, settings)
    if not columns:
        return "", [], notes
    header = ["variant", "n", *(f"{task} {metric}" for task, metric, _ in columns), "interval"]
    lines = ["lm-evaluation-harness (python -m lmzoo.lm_eval): each arm's mean over its seeds; 95% intervals count "
             "training noise (the spread of the seeds) and the examples (each left out in turn, for every run "
             "alike).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    records = []
    for group, row in zip(groups, rows):
        cells = [interval_cell(c, ".4f") for c in row.values()]
        lines.append("| " + " | ".join([group.label, str(len(group.runs)), *cells, interval_note(list(row.values()))])
                     + " |")
        records.append({"label": group.label, **{key: c.record() if c else None for key, c in row.items()}})
    return "\n".join(lines), records, notes


def harness_difference_table(groups, baseline, settings: dict, adjust: str) -> tuple[str, list[dict]]:
    """Each arm's lm-eval metrics minus the baseline's, stars adjusted over the arms as the bpb table's are."""
    columns, _ = aligned_columns([r for g in groups for r in g.runs])
    others = [g for g in groups if g is not baseline]
    if not columns or not others:
        return "", []
    rows = [harness_differences(group, baseline, columns, settings) for group in others]
    adjusted = adjusted_columns(rows, adjust)
    header = ["variant", *(f"Δ {task} {metric}" for task, metric, _ in columns)]
    lines = [f"lm-evaluation-harness, difference to {baseline.label} (seeds+text intervals over examples); "
             f"{stars_caption(adjust, len(others))}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    records = []
    for group, row, p_adjusted in zip(others, rows, adjusted):
        recorded = {key: adjusted_record(c, p_adjusted.get(key)) for key, c in row.items()}
        cells = [interval_cell(c, "+.4f") + (" *" if c and recorded[key]["significant_adjusted"] else "")
                 for key, c in row.items()]
        lines.append("| " + " | ".join([group.label, *cells]) + " |")
        records.append({"label": group.label, "baseline": baseline.label, **recorded})
    return "\n".join(lines), records
