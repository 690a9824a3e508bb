"""Comparing trained runs: reading them, grouping seeds into arms, intervals that count seeds and text.

A run is read from its run directory (config, run info, data fingerprint, metrics, resumes and
``eval/<tag>/results.json``). Runs form one *arm* when they set the same ``label``, or, without
labels, when their configs differ only in ``seed`` (and ``run_dir``): the seeds of one experiment.

Every interval between arms counts both sources of uncertainty (``lmzoo.metrics.seeds``):
training noise, from the spread of the seeds inside each arm, and text, from resampling the
scored blocks jointly across all runs. An arm of one seed gives a text-only interval, said so in
its row and never marked significant. Runs are only compared on the same data and the same
scored tokens: a run whose data fingerprint or scored tokens differ from the reference run's is
left out, with one line saying which and why.

``compare(...)`` returns a ``Report`` (markdown tables and the ``comparison.json`` record);
``write_report`` writes them with the plots. ``python -m lmzoo.compare`` is the command around it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from lmzoo.metrics.intervals import RESAMPLES, SEED, bits_per_nat, over_seeds, ratio_of_sums, ratio_to_reference
from lmzoo.metrics.scoring import sampling_note
from lmzoo.metrics.seeds import Comparison, arm_difference, arm_estimate, seed_difference, seed_mean
from lmzoo.run.directory import CONFIG, RunDir, atomic_write_text, describe_changes
from lmzoo.schema import ConfigError, flatten

# Config keys that do not make two runs different experiments.
NOT_IDENTITY = ("seed", "run_dir", "label")


@dataclass
class Run:
    path: Path
    config: dict
    info: dict
    metrics: list[dict]
    results: dict | None = field(default=None)
    changes: list[dict] = field(default_factory=list)  # settings changed on resume (resumes.jsonl)
    fingerprint: dict | None = None  # what the data was (data_fingerprint.json)

    @property
    def name(self) -> str:
        return self.info.get("variant", self.path.name)

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def label(self) -> str | None:
        return self.config.get("label")

    @property
    def identity(self) -> str:
        """The arm a run belongs to: its label, else its config without seed and run directory, with the
        changes made on resuming."""
        if self.label is not None:
            return json.dumps(["label", self.label])
        settings = {k: v for k, v in self.config.items() if k not in NOT_IDENTITY}
        return json.dumps([settings, self.changes], sort_keys=True, default=str)

    @property
    def documents(self) -> str:
        """``data.document_boundaries`` of the run: "mask" (documents mixed alone) or "none"."""
        return self.info.get("document_boundaries", "none")

    @property
    def train_len(self) -> int | None:
        return self.results["train_seq_len"] if self.results else None

    def last(self, key: str):
        values = [r[key] for r in self.metrics if key in r]
        return values[-1] if values else None

    def mean_throughput(self):
        values = [r["tokens_per_s"] for r in self.metrics if "tokens_per_s" in r][1:]  # the first includes compilation
        return float(np.mean(values)) if values else None

    def at(self, length: int | None) -> dict:
        """Evaluation results at ``length`` ({} when not evaluated there)."""
        return (self.results or {}).get("lengths", {}).get(str(length), {})

    @property
    def at_train(self) -> dict:
        return self.at(self.train_len)

    @property
    def has_blocks(self) -> bool:
        return bool(self.results) and "block_sums" in self.results

    @property
    def sampling(self) -> str:
        """Which validation tokens the evaluation scored ("first": the first N, before spread sampling)."""
        return (self.results or {}).get("sampling", "first")

    def ratio(self, length: int) -> float | None:
        """bpb at ``length`` over bpb at the training length (computed for results that predate ``ratio``)."""
        here, train = self.at(length), self.at_train
        if "ratio" in here:
            return here["ratio"]
        return here["bpb"] / train["bpb"] if here and train else None

    def blocks(self, length: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Per-block (loss sum, token count) at ``length``, or None for results without block sums."""
        sums = (self.results or {}).get("block_sums", {}).get(str(length))
        return (np.asarray(sums["loss"], float), np.asarray(sums["count"], float)) if sums else None

    def scored_tokens(self) -> tuple | None:
        """What this run's evaluation scored: (sampling, digest of the scored tokens where recorded, training
        length, token count of every block)."""
        blocks = self.blocks(self.train_len) if self.has_blocks else None
        if blocks is None:
            return None
        return self.sampling, self.results.get("scored_digest"), self.train_len, tuple(blocks[1].tolist())

    @property
    def bits_per_nat(self) -> float:
        """The data's bits-per-byte factor per nat of loss, as the evaluation applied it."""
        return bits_per_nat(self.results)


@dataclass
class Group:
    """The runs of one arm: one label, or one config that differ only in seed."""

    label: str
    runs: list[Run]

    @property
    def variant(self) -> str:
        return self.runs[0].name

    @property
    def evaluated(self) -> list[Run]:
        """Runs with block sums, the ones intervals are made of."""
        return [r for r in self.runs if r.has_blocks]


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding config.yaml and metrics.jsonl) at or below each path. Below a path, folders whose
    name starts with a dot are skipped: they hold copies still being written (``scripts/cpu_recipe.sh KEEP=``)."""
    found = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        hidden = lambda run: any(part.startswith(".") for part in run.relative_to(path).parts)  # noqa: E731
        candidates = [path] if RunDir(path).is_run() else sorted(p.parent for p in path.rglob(CONFIG)
                                                                  if not hidden(p.parent))
        found += [p for p in candidates if RunDir(p).is_run() and p not in found]
    return found


def load_run(path: Path, tag: str) -> Run:
    run_dir = RunDir(path)
    config = OmegaConf.to_container(run_dir.read_config())
    if "tokenizer" in config.get("data", {}):  # a corpus; runs from before the setting packed without masks
        config["data"].setdefault("document_boundaries", "none")
    return Run(path, config, run_dir.read_run_info(), run_dir.read_metrics(), run_dir.read_results(tag),
               run_dir.read_resumes(), run_dir.read_fingerprint())


def load_runs(paths: list[Path], tag: str) -> tuple[list[Run], list[tuple[Path, str]]]:
    """(the runs that could be read, [(path, why not)]): one damaged run does not stop a comparison."""
    runs, unreadable = [], []
    for path in paths:
        try:
            runs.append(load_run(path, tag))
        except (ConfigError, OSError, ValueError) as e:
            unreadable.append((path, str(e).splitlines()[0]))
    return runs, unreadable


def group_runs(runs: list[Run]) -> list[Group]:
    """One group per label or distinct config (seed aside), in the order runs were found; runs sorted by seed."""
    by_identity: dict[str, list[Run]] = {}
    for run in runs:
        by_identity.setdefault(run.identity, []).append(run)
    groups = [Group(members[0].label or members[0].name, sorted(members, key=lambda r: str(r.seed)))
              for members in by_identity.values()]
    names = [g.label for g in groups]
    for group, name in zip(groups, names):
        siblings = [g for g, other in zip(groups, names) if other == name]
        if len(siblings) > 1:
            group.label = f"{name} ({distinguishing(group, siblings)})"
    return groups


def distinguishing(group: Group, siblings: list[Group]) -> str:
    """The settings in which ``group`` differs from other groups of the same variant, as key=value."""
    flat = [flatten(g.runs[0].config) for g in siblings]
    mine = flatten(group.runs[0].config)
    keys = sorted(k for k in set().union(*flat) if k not in NOT_IDENTITY and len({str(f.get(k)) for f in flat}) > 1)
    return ", ".join(f"{k}={mine.get(k)}" for k in keys)


# ----------------------------------------------------------------------------- same data or no comparison


def data_difference(run: Run, reference: Run) -> str | None:
    """Why ``run`` is not on ``reference``'s data or tokens, in a few words; None when it is."""
    if run.fingerprint is not None and reference.fingerprint is not None and run.fingerprint != reference.fingerprint:
        keys = sorted(k for k in set(run.fingerprint) | set(reference.fingerprint)
                      if run.fingerprint.get(k) != reference.fingerprint.get(k))
        shown = ", ".join(f"{k} {run.fingerprint.get(k)} vs {reference.fingerprint.get(k)}" for k in keys[:2])
        return f"other data than {reference.path} ({shown})"
    mine, theirs = run.scored_tokens(), reference.scored_tokens()
    if mine is not None and theirs is not None and mine != theirs:
        return (f"scored other validation tokens than {reference.path} (another budget, length or sampling: "
                f"{sampling_note(run.results)})")
    return None


def on_the_same_data(runs: list[Run], reference: Run) -> tuple[list[Run], list[tuple[Run, str]]]:
    """(runs on ``reference``'s data and scored tokens, [(run left out, why)])."""
    kept, left_out = [], []
    for run in runs:
        why = data_difference(run, reference)
        (left_out.append((run, why)) if why else kept.append(run))
    return kept, left_out


def reference_run(runs: list[Run], baseline: str | None) -> Run:
    """The run others must match: the baseline arm's first evaluated run, else the first evaluated run."""
    preferred = [r for r in runs if baseline in (r.label, r.name)] if baseline else []
    return next((r for r in preferred + runs if r.has_blocks), (preferred or runs)[0])


# ----------------------------------------------------------------------------- statistics


def bootstrap_settings(runs: list[Run]) -> dict:
    settings = next((r.results["bootstrap"] for r in runs if r.results and "bootstrap" in r.results), {})
    return {"resamples": settings.get("resamples", RESAMPLES), "seed": settings.get("seed", SEED)}


def ratio_blocks(run: Run, length: int) -> tuple | None:
    """(loss@L, count@L, loss@train, count@train): what the ratio to the training length is made of."""
    here, train = run.blocks(length), run.blocks(run.train_len)
    return None if here is None or train is None else (*here, *train)


def arm_bpb(group: Group, settings: dict, length: int | None = None) -> Comparison | None:
    """Bits per byte of the arm at ``length`` (the training length when None)."""
    blocks = [r.blocks(length or r.train_len) for r in group.evaluated]
    if not blocks or None in blocks:
        return None
    return arm_estimate(blocks, ratio_of_sums, scale=group.evaluated[0].bits_per_nat, **settings)


def arm_ratio(group: Group, length: int, settings: dict) -> Comparison | None:
    blocks = [ratio_blocks(r, length) for r in group.evaluated]
    if not blocks or None in blocks:
        return None
    return arm_estimate(blocks, ratio_to_reference, **settings)


def bpb_difference(group: Group, baseline: Group, settings: dict) -> Comparison | None:
    """bpb at the training length, ``group`` minus ``baseline``, each the mean over its seeds."""
    runs, bases = group.evaluated, baseline.evaluated
    if not runs or not bases or {r.train_len for r in runs + bases} != {runs[0].train_len}:
        return None
    return arm_difference([r.blocks(r.train_len) for r in runs], [b.blocks(b.train_len) for b in bases],
                          ratio_of_sums, scale=bases[0].bits_per_nat, **settings)


def ratio_difference(group: Group, baseline: Group, length: int, settings: dict) -> Comparison | None:
    """bpb@length / bpb@train, ``group`` minus ``baseline``."""
    mine, theirs = [ratio_blocks(r, length) for r in group.evaluated], [ratio_blocks(b, length) for b in baseline.evaluated]
    if not mine or not theirs or None in mine + theirs:
        return None
    return arm_difference(mine, theirs, ratio_to_reference, **settings)


# ----------------------------------------------------------------------------- tables


def _fmt(value, spec: str = ".3f") -> str:
    return "—" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def _mean(nested) -> float | None:
    return None if nested is None else float(np.nanmean(np.asarray(nested, dtype=float)))


def interval_cell(comparison: Comparison | None, spec: str = ".3f", mark: bool = False) -> str:
    """``estimate [lo, hi]``, with `` *`` for a significant difference when ``mark``."""
    if comparison is None:
        return "—"
    text = f"{comparison.estimate:{spec}} [{comparison.lo:{spec}}, {comparison.hi:{spec}}]"
    return text + (" *" if mark and comparison.significant else "")


def summary_cell(group: Group, value, spec: str = ".3f") -> str:
    """A number without block sums behind it: the one run's, or mean ± sd over the seeds."""
    summary = over_seeds([value(r) for r in group.runs])
    return _fmt(summary.mean, spec) + (f" ± {_fmt(summary.sd, spec)}" if summary.n > 1 else "")


def evaluated_lengths(runs: list[Run]) -> list[int]:
    return sorted({int(n) for r in runs if r.results for n in r.results["lengths"]})


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
    header = ["variant", "n", "params", "state size", *(["documents"] if masked else []), "val bpb", "bpb@train"]
    header += [f"bpb@{n} / bpb@train" for n in lengths]
    header += ["interval", "mean S", "entropy", "first key", "accuracy", "tokens/s", "runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    records = []
    for group in groups:
        first = group.runs[0]
        row = [group.label, str(len(group.runs))]
        row += [_fmt(first.info.get("params"), ","), _fmt(first.info.get("state_size"), ",")]
        row += [first.documents] if masked else []
        row.append(summary_cell(group, lambda r: r.last("val_bpb")))
        cells, record = row_cells(group, lengths, settings)
        row += cells
        row += [
            summary_cell(group, lambda r: _mean(r.at_train.get("sparsity")) if r.results else r.last("val_sparsity")),
            summary_cell(group, lambda r: _mean(r.at_train.get("entropy")) if r.results else r.last("val_entropy")),
            summary_cell(group, lambda r: _mean(r.at_train.get("first_key"))),
            summary_cell(group, lambda r: r.last("val_accuracy")),
            summary_cell(group, lambda r: r.mean_throughput(), spec=",.0f"),
            ", ".join(str(r.path) + (" †" if r.changes else "") for r in group.runs),
        ]
        lines.append("| " + " | ".join(row) + " |")
        records.append({"label": group.label, "variant": group.variant, "runs": [str(r.path) for r in group.runs],
                        "seeds": [r.seed for r in group.runs], **record})
    return "\n".join(lines + resumed_with_changes(runs)), records


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


def probe_difference(group: Group, baseline: Group, length: int | None, name: str = "sparsity") -> Comparison | None:
    """The arms' difference in a probe's mean (``sparsity``, ``first_key``) at ``length`` (None: the training
    length), over seeds alone."""
    def values(g: Group) -> list:
        return [_mean((r.at(length) if length else r.at_train).get(name)) for r in g.evaluated]
    return seed_difference(values(group), values(baseline))


def differences(groups: list[Group], baseline: Group, settings: dict) -> tuple[str, list[dict]]:
    """Markdown table of each arm's difference to ``baseline`` (bpb at the training length, ratios), and its records."""
    lengths = other_lengths([r for g in groups for r in g.runs])
    header = ["variant", "seeds", "Δ bpb@train"] + [f"Δ bpb@{n} / bpb@train" for n in lengths] + ["interval"]
    longest = lengths[-1:]  # S where the arms are furthest from training: the table's one other sparsity column
    header += ["Δ mean S@train (seeds)"] + [f"Δ mean S@{n} (seeds)" for n in longest] + ["Δ first key@train (seeds)"]
    lines = [
        f"Difference to {baseline.label}: the mean over each arm's seeds, minus the baseline's; 95% intervals "
        "count training noise (seeds, resampled within each arm) and the text (blocks, resampled jointly); "
        "* = significant. An arm of one seed gives a text-only interval, never significant. Mean S (the attention "
        "probe's sparsity over layers and heads, on the same windows for every run; at the training length and "
        "at the longest evaluated) and the first-key share (a row's weight on its first key, where attention "
        "sinks form) have Welch's interval over the seeds alone, and none with one seed in an arm.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    records = []
    for group in (g for g in groups if g is not baseline):
        bpb = bpb_difference(group, baseline, settings)
        ratios = {n: ratio_difference(group, baseline, n, settings) for n in lengths}
        row = [group.label, seeds_cell(bpb, group, baseline), interval_cell(bpb, "+.3f", mark=True)]
        row += [interval_cell(ratios[n], "+.3f", mark=True) for n in lengths]
        row.append(interval_note([bpb, *ratios.values()]))
        sparsity = probe_difference(group, baseline, None)
        beyond = {n: probe_difference(group, baseline, n) for n in lengths}
        first_key = probe_difference(group, baseline, None, "first_key")
        row += [interval_cell(c, "+.3f", mark=True) for c in (sparsity, *(beyond[n] for n in longest), first_key)]
        lines.append("| " + " | ".join(row) + " |")
        records.append({"label": group.label, "baseline": baseline.label, "bpb": bpb.record() if bpb else None,
                        "ratio": {str(n): c.record() for n, c in ratios.items() if c is not None},
                        "sparsity": sparsity.record() if sparsity else None,
                        "sparsity_by_length": {str(n): c.record() for n, c in beyond.items() if c is not None},
                        "first_key": first_key.record() if first_key else None})
    return "\n".join(lines), records


# ----------------------------------------------------------------------------- the report


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


def compare(paths: list[Path], *, tag: str = "default", baseline: str | None = None) -> Report:
    """Read, group and compare the runs at or below ``paths``; ValueError in one line for a bad baseline."""
    runs, unreadable = load_runs(find_runs(paths), tag)
    if not runs:
        raise FileNotFoundError(f"no readable runs (directories with config.yaml and metrics.jsonl) under "
                                f"{', '.join(map(str, paths))}" + (f": {unreadable[0][1]}" if unreadable else ""))
    reference = reference_run(runs, baseline)
    kept, left_out = on_the_same_data(runs, reference)
    notes = [f"left out {path}: {why}" for path, why in unreadable]
    notes += [f"left out {run.path}: {why}" for run, why in left_out]
    groups = group_runs(kept)
    settings = bootstrap_settings(kept)
    markdown, rows = table(groups, settings)
    record = {"tag": tag, "level": 0.95, "bootstrap": settings, "rows": rows, "differences": [], "baseline": None,
              "left_out": [{"run": str(path), "reason": why} for path, why in unreadable]
              + [{"run": str(run.path), "reason": why} for run, why in left_out]}
    if baseline:
        base = find_baseline(groups, baseline)
        text, record["differences"] = differences(groups, base, settings)
        markdown += "\n\n" + text
        record["baseline"] = base.label
    notes += missing_evaluations(groups, tag)
    if reference.results:
        markdown += f"\n\nScored text: {sampling_note(reference.results)}."
    if notes:
        markdown += "\n\n" + "\n".join(f"- {note}" for note in notes)
    return Report(markdown, record, groups, notes)


def write_report(report: Report, out: Path) -> list[Path]:
    """``comparison.md``, ``comparison.json`` and the plots in ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "comparison.md", report.markdown + "\n")
    atomic_write_text(out / "comparison.json", json.dumps(report.record, indent=2) + "\n")
    return [out / "comparison.md", out / "comparison.json", *plot(report.groups, out)]


# ----------------------------------------------------------------------------- plots


def series(group: Group, lengths: list[int], value, interval) -> tuple[list, list, list, list]:
    """(x, y, lo, hi) over ``lengths``; ``interval(group, n)`` gives the arm's Comparison (or None: no band)."""
    points = []
    for n in lengths:
        comparison = interval(group, n)
        if comparison is not None:
            points.append((n, comparison.estimate, comparison.lo, comparison.hi))
            continue
        summary = over_seeds([value(r, n) for r in group.runs])
        if summary.n:
            points.append((n, summary.mean, np.nan, np.nan))
    return tuple(map(list, zip(*points))) if points else ([], [], [], [])


def legend_label(group: Group) -> str:
    n = len(group.evaluated)
    return f"{group.label} (1 seed, 95% text only)" if n <= 1 else f"{group.label} ({n} seeds, 95% seeds+text)"


def plot_length_curves(groups: list[Group], out: Path, train_len: int, lengths: list[int], settings: dict) -> list[Path]:
    from lmzoo.plots import error_bars, new_axes, save_axes, series_style, spread

    written = []
    for name, title, ylabel, value, interval in [
        ("bpb_vs_length", "Bits per byte against evaluation length", "validation bits per byte",
         lambda r, n: r.at(n).get("bpb"), lambda g, n: arm_bpb(g, settings, n)),
        ("ratio_vs_length", "bpb@L / bpb@training length", "bpb@L / bpb@train",
         lambda r, n: r.ratio(n), lambda g, n: arm_ratio(g, n, settings)),
    ]:
        fig, ax = new_axes((6, 4))
        for index, group in enumerate(groups):  # nudged apart along x, so bars of close values stay readable
            xs, *bars = series(group, lengths, value, interval)
            error_bars(ax, spread(xs, index, len(groups)), *bars, label=legend_label(group), **series_style(index))
        written.append(save_axes(fig, ax, out / f"{name}.png", train_len=train_len, xticks=lengths, xscale="log",
                                 title=title, xlabel="evaluation length (tokens)", ylabel=ylabel))
    return written


def plot_per_position(groups: list[Group], out: Path, train_len: int) -> Path:
    from lmzoo.plots import line_with_band, new_axes, save_axes

    fig, ax = new_axes((6, 4))
    for group in groups:
        evaluated = [r for r in group.runs if r.results.get("per_position")]
        if not evaluated:
            continue
        longest = max(evaluated[0].results["per_position"], key=int)
        curves = [r.results["per_position"].get(longest) for r in evaluated]
        curves = [c for c in curves if c and c["positions"] == curves[0]["positions"]]
        losses = np.array([c["loss"] for c in curves], dtype=float)  # (runs, buckets)
        if len(curves) == 1:
            lo, hi = curves[0].get("loss_ci", [[np.nan] * losses.shape[1]] * 2)
        else:
            lo, hi = losses.mean(0) - losses.std(0, ddof=1), losses.mean(0) + losses.std(0, ddof=1)
        band = "95% text only" if len(curves) == 1 else f"{len(curves)} seeds, ± sd"
        line_with_band(ax, curves[0]["positions"], losses.mean(0), lo, hi, label=f"{group.label} (L={longest}, {band})")
    return save_axes(fig, ax, out / "per_position.png", train_len=train_len, xscale="log",
                     title="Loss by position in the window", xlabel="position", ylabel="loss (nats/token)")


def plot_sparsity(groups: list[Group], out: Path, train_len: int, lengths: list[int]) -> Path:
    from lmzoo.plots import error_bars, new_axes, save_axes, series_style, spread

    fig, ax = new_axes((6, 4))
    for index, group in enumerate(groups):
        def sparsity(r: Run, n: int) -> float | None:
            return _mean(r.at(n).get("sparsity"))
        xs, ys, los, his = series(group, lengths, sparsity, lambda g, n: seed_mean([sparsity(r, n) for r in g.evaluated]))
        n = len(group.evaluated)
        label = f"{group.label} ({n} seeds, 95% over seeds)" if n > 1 else f"{group.label} (1 run, no interval)"
        if xs:
            error_bars(ax, spread(xs, index, len(groups)), ys, los, his, label=label, **series_style(index))
    return save_axes(fig, ax, out / "sparsity_vs_length.png", train_len=train_len, xticks=lengths, xscale="log",
                     title="Attention sparsity against evaluation length",
                     xlabel="evaluation length (tokens)", ylabel="mean attention sparsity S (1 = uniform)")


def plot(groups: list[Group], out: Path) -> list[Path]:
    evaluated = [Group(g.label, [r for r in g.runs if r.results]) for g in groups]
    evaluated = [g for g in evaluated if g.runs]
    if not evaluated:
        return []
    runs = [r for g in evaluated for r in g.runs]
    train_len = runs[0].train_len
    lengths = evaluated_lengths(runs)
    return [
        *plot_length_curves(evaluated, out, train_len, lengths, bootstrap_settings(runs)),
        plot_per_position(evaluated, out, train_len),
        plot_sparsity(evaluated, out, train_len, lengths),
    ]
