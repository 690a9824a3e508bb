"""The comparison's markdown tables (every arm; each arm's difference to a baseline) and their
``comparison.json`` rows."""

from __future__ import annotations

import numpy as np

from lmzoo.measure.comparison.estimates import arm_bpb, arm_ratio, bpb_difference, ratio_difference, seed_pairs
from lmzoo.measure.comparison.reading import Group, Run, evaluated_lengths, probe_mean
from lmzoo.scoring.catalog import PROBES, SCORES, Measurement, measurement
from lmzoo.record.directory import describe_changes
from lmzoo.stats.trained_models import Comparison, over_seeds, seed_difference
from lmzoo.stats.uncertainty import adjusted_p_values


def _fmt(value, spec: str = ".3f") -> str:
    return "—" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def interval_cell(comparison: Comparison | None, spec: str = ".3f", mark: bool = False) -> str:
    """``estimate [lo, hi]``, with `` *`` for a significant difference when ``mark``."""
    if comparison is None:
        return "—"
    text = f"{comparison.estimate:{spec}} [{comparison.lo:{spec}}, {comparison.hi:{spec}}]"
    return text + (" *" if mark and comparison.significant else "")


def summary_cell(group: Group, value, spec: str = ".3f") -> str:
    """A number without block sums behind it: the one run's, or mean ± sd over the seeds."""
    return spread_text(over_seeds([value(r) for r in group.runs]), spec)


def spread_text(summary, spec: str = ".3f") -> str:
    return _fmt(summary.mean, spec) + (f" ± {_fmt(summary.sd, spec)}" if summary.n > 1 else "")


def budget_cells(group: Group) -> list[str]:
    """The arm's training budget: optimizer steps and training tokens (both ranges where its runs differ)."""
    def cell(values: set) -> str:
        known = sorted(v for v in values if v is not None)
        return "—" if not known else f"{known[0]:,}" if len(known) == 1 else f"{known[0]:,}–{known[-1]:,}"
    budgets = [r.budget for r in group.runs]
    return [cell({steps for steps, _ in budgets}), cell({tokens for _, tokens in budgets})]


# The measurements with a column in the table of every arm: the probes, then the scores the training log keeps.
TABLE_MEASUREMENTS = tuple(m for m in (*PROBES, *SCORES) if m.table)
# The probes with a column in the differences to a baseline.
DIFFERENCE_PROBES = tuple(p for p in PROBES if p.difference)


def measurement_value(m: Measurement, run: Run):
    """A run's value in ``m``'s column: a probe's mean at the training length (a run without evaluation: its last
    logged value, if logged), a score's last value in the training log."""
    if not m.is_probe:
        return run.last(m.logged)
    if run.results or m.logged is None:
        return probe_mean(run.at_train.get(m.name))
    return run.last(m.logged)


def other_lengths(runs: list[Run]) -> list[int]:
    train_lengths = {r.train_len for r in runs if r.results}
    return [n for n in evaluated_lengths(runs) if n not in train_lengths]


def interval_note(comparisons: list[Comparison | None]) -> str:
    """What a row's intervals cover (the first one present speaks for the row: all come from the same runs)."""
    return next((c.note for c in comparisons if c is not None), "—")


def row_cells(group: Group, lengths: list[int], settings: dict) -> tuple[list[str], dict]:
    """The interval cells of one arm and their record for comparison.json."""
    bpb = arm_bpb(group, settings)
    ratios = {n: arm_ratio(group, n, settings) for n in lengths}
    if bpb is None:  # results without block sums: the plain values
        cells = [summary_cell(group, lambda r: r.at_train.get("bpb"))]
        cells += [summary_cell(group, lambda r, n=n: r.ratio(n)) for n in lengths]
    else:
        cells = [interval_cell(bpb)] + [interval_cell(ratios[n]) for n in lengths]
    record = {"bpb": bpb.record() if bpb else None,
              "ratio": {str(n): c.record() for n, c in ratios.items() if c is not None}}
    return cells + [interval_note([bpb, *ratios.values()])], record


def table(groups: list[Group], settings: dict) -> tuple[str, list[dict]]:
    """The markdown table of every arm, and its rows for comparison.json."""
    runs = [r for g in groups for r in g.runs]
    lengths = other_lengths(runs)
    masked = any(r.documents == "mask" for r in runs)
    header = ["variant", "n", "params", "state size", "steps", "tokens", *(["documents"] if masked else []),
              "val bpb", "bpb@train"]
    header += [f"bpb@{n} / bpb@train" for n in lengths]
    header += ["interval", *(m.table for m in TABLE_MEASUREMENTS), "tokens/s", "runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    records = []
    for group in groups:
        first = group.runs[0]
        row = [group.label, str(len(group.runs))]
        row += [_fmt(first.info.get("params"), ","), _fmt(first.info.get("state_size"), ",")]
        row += budget_cells(group)
        row += [first.documents] if masked else []
        row.append(summary_cell(group, lambda r: r.last(measurement("bpb").logged)))
        cells, record = row_cells(group, lengths, settings)
        row += cells
        measured = {m: over_seeds([measurement_value(m, r) for r in group.runs]) for m in TABLE_MEASUREMENTS}
        row += [spread_text(summary, m.spec) for m, summary in measured.items()]
        row += [
            summary_cell(group, lambda r: r.mean_throughput(), spec=",.0f"),
            ", ".join(str(r.path) + (" †" if r.changes else "") for r in group.runs),
        ]
        lines.append("| " + " | ".join(row) + " |")
        records.append({"label": group.label, "variant": group.variant, "runs": [str(r.path) for r in group.runs],
                        "seeds": [r.seed for r in group.runs],
                        "budget": [dict(zip(("steps", "tokens"), r.budget)) for r in group.runs],
                        "params": first.info.get("params"), "state_size": first.info.get("state_size"),
                        "measurements": {m.name: summary_record(summary) for m, summary in measured.items()},
                        "measurements_by_length": probes_by_length(group, lengths), **record})
    return "\n".join(lines + spread_note(groups) + resumed_with_changes(runs)), records


def probes_by_length(group: Group, lengths: list[int]) -> dict:
    """comparison.json's ``measurements_by_length``: each probe compared by length, its mean, sd and count over the
    arm's runs at every evaluated length past the training length."""
    return {p.name: {str(n): summary_record(over_seeds([probe_mean(r.at(n).get(p.name)) for r in group.runs]))
                     for n in lengths} for p in DIFFERENCE_PROBES if p.difference_by_length}


def finite_or_none(x: float) -> float | None:
    return x if np.isfinite(x) else None  # JSON has no NaN


def summary_record(summary) -> dict:
    """A measurement's mean, sd and count over an arm's runs for comparison.json (null where undefined)."""
    return {"mean": finite_or_none(summary.mean), "sd": finite_or_none(summary.sd), "n": summary.n}


def spread_note(groups: list[Group]) -> list[str]:
    """The legend of ``mean ± sd`` cells, where an arm of several runs makes them."""
    if all(len(g.runs) == 1 for g in groups):
        return []
    return ["", "n: an arm's runs (its seeds). A cell without an interval is one run's value, or for several the mean "
                "± the standard deviation over the arm's runs (no interval: these numbers have no scored blocks "
                "behind them)."]


def resumed_with_changes(runs: list[Run]) -> list[str]:
    """Footnotes for the runs (marked †) resumed with changed settings: the config they started with no
    longer says how they were trained."""
    notes = []
    for run in (r for r in runs if r.changes):
        by_step: dict[int, list[dict]] = {}
        for change in run.changes:
            by_step.setdefault(change["step"], []).append(change)
        steps = "; ".join(f"at step {step}: {describe_changes(changes)}" for step, changes in by_step.items())
        notes.append(f"† {run.path} resumed with changed settings {steps}")
    return [""] + notes if notes else []


def find_baseline(groups: list[Group], name: str) -> Group:
    matches = [g for g in groups if g.label == name] or [g for g in groups if g.variant == name]
    if len(matches) != 1:
        found = "no row" if not matches else "several rows"
        raise ValueError(f"baseline={name} matches {found} (choose one of: {', '.join(g.label for g in groups)})")
    return matches[0]


def seeds_cell(comparison: Comparison | None, group: Group, baseline: Group) -> str:
    n = comparison.seeds if comparison else (len(group.evaluated), len(baseline.evaluated))
    return f"{n[0]} vs {n[1]}"


def probe_difference(group: Group, baseline: Group, length: int | None, name: str) -> Comparison | None:
    """The arms' difference in a probe's mean (``sparsity``, ``first_key``) at ``length`` (None: the training
    length), over seeds alone."""
    def values(g: Group) -> list:
        return [probe_mean((r.at(length) if length else r.at_train).get(name)) for r in g.evaluated]
    return seed_difference(values(group), values(baseline))


def difference_columns(group: Group, baseline: Group, lengths: list[int], settings: dict, pair: str = "none") -> dict:
    """One arm's differences to ``baseline``, by column: ``bpb``, ``ratio@<n>``, then per difference probe
    ``<probe>`` (and ``<probe>@<n>`` where it is compared by length), e.g. ``sparsity``, ``sparsity@<n>``,
    ``first_key`` (None where they cannot be had)."""
    columns = {"bpb": bpb_difference(group, baseline, settings, pair)}
    columns.update({f"ratio@{n}": ratio_difference(group, baseline, n, settings, pair) for n in lengths})
    for probe in DIFFERENCE_PROBES:
        columns[probe.name] = probe_difference(group, baseline, None, probe.name)
        if probe.difference_by_length:
            columns.update({f"{probe.name}@{n}": probe_difference(group, baseline, n, probe.name) for n in lengths})
    return columns


def probe_difference_keys(longest: list[int]) -> list[str]:
    """The differences table's probe columns, by ``difference_columns`` key: each probe at the training length,
    then at ``longest`` where it is compared by length."""
    return [key for p in DIFFERENCE_PROBES
            for key in [p.name, *(f"{p.name}@{n}" for n in longest if p.difference_by_length)]]


def probe_difference_header(key: str) -> str:
    """``Δ mean S@train (seeds)`` for the key ``sparsity``, ``Δ mean S@<n> (seeds)`` for ``sparsity@<n>``."""
    name, _, length = key.partition("@")
    return f"Δ {next(p for p in PROBES if p.name == name).difference}@{length or 'train'} (seeds)"


def probe_difference_records(recorded: dict, lengths: list[int]) -> dict:
    """comparison.json's probe differences: ``<probe>``, and ``<probe>_by_length`` where compared by length."""
    records = {}
    for probe in DIFFERENCE_PROBES:
        records[probe.name] = recorded[probe.name]
        if probe.difference_by_length:
            records[f"{probe.name}_by_length"] = {str(n): recorded[f"{probe.name}@{n}"] for n in lengths
                                                  if recorded[f"{probe.name}@{n}"]}
    return records


def adjusted_columns(rows: list[dict], adjust: str) -> list[dict]:
    """Each estimate's p-value adjusted over the arms of its column (one family per column), by key like ``rows``."""
    adjusted = [{} for _ in rows]
    for key in rows[0] if rows else []:
        present = [(i, row[key]) for i, row in enumerate(rows) if row[key] is not None]
        for (i, _), p in zip(present, adjusted_p_values([c.p_value for _, c in present], adjust)):
            adjusted[i][key] = p
    return adjusted


def adjusted_record(comparison: Comparison | None, p_adjusted: float | None) -> dict | None:
    """``comparison.record()`` with its p-value, and the p-value and significance adjusted for the arms."""
    if comparison is None:
        return None
    return {**comparison.record(), "p": comparison.p_value, "p_adjusted": p_adjusted,
            "significant_adjusted": comparison.counts_training_noise and p_adjusted < 1 - comparison.level}


PAIRED_CAPTION = (". Paired by seed (pair=seed): where an arm holds the baseline's seed numbers, each run is paired "
                  "with the baseline's run of the same seed (the same data order) and the interval is over the pairs' "
                  "differences, n - 1 degrees of freedom for n pairs (seeds marked paired)")


def stars_caption(adjust: str, arms: int) -> str:
    if adjust == "none" or arms < 2:
        return f"* = significant at 95% for each arm on its own (not adjusted for the {arms} arms compared)"
    return (f"* = significant after Holm's adjustment for the {arms} arms compared with the baseline (each column "
            "one family; comparison.json records the unadjusted p-values too)")


def differences(groups: list[Group], baseline: Group, settings: dict, adjust: str = "holm",
                pair: str = "none") -> tuple[str, list[dict]]:
    """Markdown table of each arm's difference to ``baseline`` (bpb at the training length, ratios, probes), stars
    adjusted for the number of arms (``adjust``: holm or none), each arm's runs paired with the baseline's by seed
    number where ``pair="seed"`` and their seeds allow, and its records."""
    lengths = other_lengths([r for g in groups for r in g.runs])
    header = ["variant", "seeds", "Δ bpb@train"] + [f"Δ bpb@{n} / bpb@train" for n in lengths] + ["interval"]
    longest = lengths[-1:]  # where the arms are furthest from training: the one other length of a probe by length
    header += [probe_difference_header(key) for key in probe_difference_keys(longest)]
    others = [g for g in groups if g is not baseline]
    rows = [difference_columns(group, baseline, lengths, settings, pair) for group in others]
    adjusted = adjusted_columns(rows, adjust)
    lines = [
        f"Difference to {baseline.label}: the mean over each arm's seeds, minus the baseline's; 95% intervals "
        "count training noise (a t interval on the spread of each arm's seeds) and the text (each block left out "
        f"in turn, for every run alike){PAIRED_CAPTION if pair == 'seed' else ''}; "
        f"{stars_caption(adjust, len(others))}. An arm of one seed gives a text-only interval, never "
        "significant. Mean S (the attention probe's sparsity over layers and heads, on the same windows for every "
        "run) and the first-key share (a row's weight on its first key, where attention sinks form), each at the "
        "training length and at the longest evaluated, have Welch's interval over the seeds alone, and none with one "
        "seed in an arm.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    records, unevaluated = [], not baseline.evaluated
    for group, columns, p_adjusted in zip(others, rows, adjusted):
        recorded = {key: adjusted_record(c, p_adjusted.get(key)) for key, c in columns.items()}
        cells = {key: interval_cell(c, "+.3f") + (" *" if c and recorded[key]["significant_adjusted"] else "")
                 for key, c in columns.items()}
        paired = pair == "seed" and seed_pairs(group, baseline) is not None
        row = [group.label, seeds_cell(columns["bpb"], group, baseline) + (" paired" if paired else ""), cells["bpb"]]
        row += [cells[f"ratio@{n}"] for n in lengths]
        row.append(interval_note([columns["bpb"], *(columns[f"ratio@{n}"] for n in lengths)]))
        row += [cells[key] for key in probe_difference_keys(longest)]
        lines.append("| " + " | ".join(row) + " |")
        unevaluated |= not group.evaluated
        records.append({"label": group.label, "baseline": baseline.label, "paired_by_seed": paired,
                        "bpb": recorded["bpb"],
                        "ratio": {str(n): recorded[f"ratio@{n}"] for n in lengths if recorded[f"ratio@{n}"]},
                        **probe_difference_records(recorded, lengths)})
    if unevaluated:
        lines += ["", "seeds: the runs of the arm and of the baseline that have evaluation results at this tag; 0 (and "
                      "— for its differences): none has, so evaluate them first (python -m lmzoo.eval run_dir=<run or "
                      "sweep folder>)."]
    return "\n".join(lines), records
