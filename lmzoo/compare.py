"""``python -m lmzoo.compare <run or sweep dir> ... [--baseline VARIANT] [--tag default] [--out DIR]``.

Reads each run's ``config.yaml``, ``run_info.json``, ``metrics.jsonl`` and
``eval/<tag>/results.json`` and writes a markdown table (printed, and saved as ``comparison.md``)
plus plots: bits per byte and its ratio to the training length against evaluation length,
per-position loss at the longest length, and attention sparsity against length. When some run
kept packed documents apart (``data.document_boundaries=mask``) a "documents" column says which.

Runs whose configs differ only in ``seed`` (and ``run_dir``) form one row: mean ± sd over the
seeds, with ``n``. A row of one run shows its bootstrap 95% interval instead. With a baseline,
a second table gives each variant's difference to it in bpb at the training length and in the
extrapolation ratio at every other length, paired on the same blocks of scored tokens (and run by
run on the same seeds); ``*`` marks a difference whose paired interval excludes zero. Run
``python -m lmzoo.eval`` on each run first; runs without evaluation results keep their training
columns. ``baseline=VARIANT`` is accepted for ``--baseline VARIANT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from lmzoo.logger import read_metrics
from lmzoo.rundir import describe_changes, read_resumes
from lmzoo.metrics.intervals import (
    RESAMPLES,
    SEED,
    Interval,
    over_seeds,
    paired_difference_interval,
    ratio_of_sums,
    ratio_to_reference,
)

# Config keys that do not make two runs different experiments.
NOT_IDENTITY = ("seed", "run_dir")


@dataclass
class Run:
    path: Path
    config: dict
    info: dict
    metrics: list[dict]
    results: dict | None = field(default=None)
    changes: list[dict] = field(default_factory=list)  # settings changed on resume (resumes.jsonl)

    @property
    def name(self) -> str:
        return self.info.get("variant", self.path.name)

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def identity(self) -> str:
        """The config without seed and run directory, and the changes made on resuming: runs with equal identity
        are seeds of one experiment."""
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


@dataclass
class Group:
    """Runs of one experiment that differ only in seed."""

    label: str
    runs: list[Run]

    @property
    def variant(self) -> str:
        return self.runs[0].name


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding config.yaml and metrics.jsonl) at or below each path."""
    found = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        candidates = [path] if (path / "config.yaml").exists() else sorted(p.parent for p in path.rglob("config.yaml"))
        found += [p for p in candidates if (p / "metrics.jsonl").exists() and p not in found]
    return found


def load_run(path: Path, tag: str) -> Run:
    info_path, results_path = path / "run_info.json", path / "eval" / tag / "results.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    results = json.loads(results_path.read_text()) if results_path.exists() else None
    config = OmegaConf.to_container(OmegaConf.load(path / "config.yaml"))
    if "tokenizer" in config.get("data", {}):  # a corpus; runs from before the setting packed without masks
        config["data"].setdefault("document_boundaries", "none")
    return Run(path, config, info, read_metrics(path), results, read_resumes(path))


def group_runs(runs: list[Run]) -> list[Group]:
    """One group per distinct config (seed aside), in the order runs were found; runs sorted by seed."""
    by_identity: dict[str, list[Run]] = {}
    for run in runs:
        by_identity.setdefault(run.identity, []).append(run)
    groups = [Group(members[0].name, sorted(members, key=lambda r: str(r.seed))) for members in by_identity.values()]
    for group in groups:
        siblings = [g for g in groups if g.variant == group.variant]
        if len(siblings) > 1:
            group.label = f"{group.variant} ({distinguishing(group, siblings)})"
    return groups


def distinguishing(group: Group, siblings: list[Group]) -> str:
    """The settings in which ``group`` differs from other groups of the same variant, as key=value."""
    flat = [flatten(g.runs[0].config) for g in siblings]
    mine = flatten(group.runs[0].config)
    keys = sorted(k for k in set().union(*flat) if k not in NOT_IDENTITY and len({str(f.get(k)) for f in flat}) > 1)
    return ", ".join(f"{k}={mine.get(k)}" for k in keys)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


# ----------------------------------------------------------------------------- tables


def _fmt(value, spec: str = ".3f") -> str:
    return "—" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def _mean(nested) -> float | None:
    return None if nested is None else float(np.nanmean(np.asarray(nested, dtype=float)))


def summary_cell(group: Group, value, interval=None, spec: str = ".3f") -> str:
    """One run: the value and its bootstrap interval ``[lo, hi]``; several seeds: mean ± sd."""
    if len(group.runs) == 1:
        run = group.runs[0]
        bounds = interval(run) if interval else None
        text = _fmt(value(run), spec)
        return text + (f" [{_fmt(bounds[0], spec)}, {_fmt(bounds[1], spec)}]" if bounds and text != "—" else "")
    summary = over_seeds([value(r) for r in group.runs])
    return _fmt(summary.mean, spec) + (f" ± {_fmt(summary.sd, spec)}" if summary.n > 1 else "")


def evaluated_lengths(runs: list[Run]) -> list[int]:
    return sorted({int(n) for r in runs if r.results for n in r.results["lengths"]})


def table(groups: list[Group]) -> str:
    runs = [r for g in groups for r in g.runs]
    train_lengths = {r.train_len for r in runs if r.results}
    lengths = [n for n in evaluated_lengths(runs) if n not in train_lengths]
    masked = any(r.documents == "mask" for r in runs)
    header = ["variant", "n", "params", "state size", *(["documents"] if masked else []), "val bpb", "bpb@train"]
    header += [f"bpb@{n} / bpb@train" for n in lengths]
    header += ["mean S", "entropy", "accuracy", "tokens/s", "runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in groups:
        first = group.runs[0]
        row = [group.label, str(len(group.runs))]
        row += [_fmt(first.info.get("params"), ","), _fmt(first.info.get("state_size"), ",")]
        row += [first.documents] if masked else []
        row.append(summary_cell(group, lambda r: r.last("val_bpb")))
        row.append(summary_cell(group, lambda r: r.at_train.get("bpb"), lambda r: r.at_train.get("bpb_ci")))
        for n in lengths:
            row.append(summary_cell(group, lambda r, n=n: r.ratio(n), lambda r, n=n: r.at(n).get("ratio_ci")))
        row += [
            summary_cell(group, lambda r: _mean(r.at_train.get("sparsity")) if r.results else r.last("val_sparsity")),
            summary_cell(group, lambda r: _mean(r.at_train.get("entropy")) if r.results else r.last("val_entropy")),
            summary_cell(group, lambda r: r.last("val_accuracy")),
            summary_cell(group, lambda r: r.mean_throughput(), spec=",.0f"),
            ", ".join(str(r.path) + (" †" if r.changes else "") for r in group.runs),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines + resumed_with_changes(runs))


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


# ----------------------------------------------------------------------------- differences to a baseline


def find_baseline(groups: list[Group], name: str) -> Group:
    matches = [g for g in groups if g.label == name] or [g for g in groups if g.variant == name]
    if len(matches) != 1:
        found = "no row" if not matches else "several rows"
        raise ValueError(f"baseline={name} matches {found} (choose one of: {', '.join(g.label for g in groups)})")
    return matches[0]


def seed_pairs(group: Group, baseline: Group) -> list[tuple[Run, Run]]:
    """Runs of ``group`` and ``baseline`` with the same seed, both evaluated with block sums."""
    base_by_seed = {r.seed: r for r in baseline.runs if r.has_blocks}
    return [(r, base_by_seed[r.seed]) for r in group.runs if r.has_blocks and r.seed in base_by_seed]


def paired_blocks(pairs, lengths: list[int]) -> tuple[list, list] | None:
    """Block arrays (loss, count at each length) of every run and its baseline; None if they do not share the blocks."""
    runs, baselines = [], []
    for run, base in pairs:
        mine, theirs = [run.blocks(n) for n in lengths], [base.blocks(n) for n in lengths]
        if None in mine or None in theirs or any(not np.array_equal(a[1], b[1]) for a, b in zip(mine, theirs)):
            return None  # a length missing, or different scored tokens (other data or budget): nothing to pair
        runs.append([x for loss_count in mine for x in loss_count])
        baselines.append([x for loss_count in theirs for x in loss_count])
    return runs, baselines


def bits_per_nat(run: Run) -> float:
    """The data's bits-per-byte factor per nat of loss, as the evaluation applied it."""
    return run.at_train["bpb"] / run.at_train["loss"]


def difference_cell(interval: Interval | None) -> str:
    if interval is None:
        return "—"
    mark = " *" if interval.excludes(0.0) else ""
    return f"{interval.estimate:+.3f} [{interval.lo:+.3f}, {interval.hi:+.3f}]{mark}"


def difference_row(group: Group, baseline: Group, lengths: list[int], bootstrap_args: dict) -> list[str]:
    pairs = seed_pairs(group, baseline)
    row = [group.label, str(len(pairs))]
    train_len = pairs[0][0].train_len if pairs else None
    if not pairs or any(run.train_len != train_len or base.train_len != train_len for run, base in pairs):
        return row + ["—"] * (1 + len(lengths))
    at_train = paired_blocks(pairs, [train_len])
    bpb = None if at_train is None else paired_difference_interval(*at_train, ratio_of_sums, **bootstrap_args)
    row.append(difference_cell(bpb.scaled(bits_per_nat(pairs[0][0])) if bpb else None))
    for n in lengths:
        both = paired_blocks(pairs, [n, train_len])
        ratio = paired_difference_interval(*both, ratio_to_reference, **bootstrap_args) if both else None
        row.append(difference_cell(ratio))
    return row


def differences(groups: list[Group], baseline: Group) -> str:
    """Markdown table of each group's paired difference to ``baseline`` (bpb at training length, ratios)."""
    runs = [r for g in groups for r in g.runs]
    lengths = [n for n in evaluated_lengths(runs) if n not in {r.train_len for r in runs if r.results}]
    settings = next((r.results["bootstrap"] for r in baseline.runs if r.results and "bootstrap" in r.results), {})
    bootstrap_args = {"resamples": settings.get("resamples", RESAMPLES), "seed": settings.get("seed", SEED)}
    header = ["variant", "seeds paired", "Δ bpb@train"] + [f"Δ bpb@{n} / bpb@train" for n in lengths]
    lines = [
        f"Difference to {baseline.label}, paired on the same blocks of scored tokens and the same seeds "
        f"(mean over seeds, 95% interval; * = the interval excludes zero):",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for group in groups:
        if group is not baseline:
            lines.append("| " + " | ".join(difference_row(group, baseline, lengths, bootstrap_args)) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots


def series(group: Group, lengths: list[int], value, interval) -> tuple[list, list, list, list]:
    """(x, y, lo, hi) over ``lengths``: one run with its interval, several seeds as mean ± sd."""
    points = []
    for n in lengths:
        values = [value(r, n) for r in group.runs]
        if all(v is None for v in values):
            continue
        if len(group.runs) == 1:
            bounds = interval(group.runs[0], n) or [np.nan, np.nan]
            y, lo, hi = values[0], *bounds
        else:
            summary = over_seeds(values)
            y, lo, hi = summary.mean, summary.mean - summary.sd, summary.mean + summary.sd
        points.append((n, y, lo, hi))
    return tuple(map(list, zip(*points))) if points else ([], [], [], [])


def legend_label(group: Group) -> str:
    return f"{group.label} (95% CI)" if len(group.runs) == 1 else f"{group.label} (n={len(group.runs)}, ± sd)"


def plot_length_curves(groups: list[Group], out: Path, train_len: int, lengths: list[int]) -> list[Path]:
    from lmzoo.plots import error_bars, new_axes, save_axes

    written = []
    for name, title, ylabel, value, interval in [
        ("bpb_vs_length", "Bits per byte against evaluation length", "validation bits per byte",
         lambda r, n: r.at(n).get("bpb"), lambda r, n: r.at(n).get("bpb_ci")),
        ("ratio_vs_length", "Extrapolation: bpb@L / bpb@training length (paired)", "bpb@L / bpb@train",
         lambda r, n: r.ratio(n), lambda r, n: r.at(n).get("ratio_ci")),
    ]:
        fig, ax = new_axes((6, 4))
        for group in groups:
            error_bars(ax, *series(group, lengths, value, interval), label=legend_label(group))
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
        label = f"{group.label} (L={longest}, " + ("95% CI)" if len(curves) == 1 else f"n={len(curves)}, ± sd)")
        line_with_band(ax, curves[0]["positions"], losses.mean(0), lo, hi, label=label)
    return save_axes(fig, ax, out / "per_position.png", train_len=train_len, xscale="log",
                     title="Loss by position in the window", xlabel="position", ylabel="loss (nats/token)")


def plot_sparsity(groups: list[Group], out: Path, train_len: int, lengths: list[int]) -> Path:
    from lmzoo.plots import error_bars, new_axes, save_axes

    fig, ax = new_axes((6, 4))
    for group in groups:
        xs, ys, los, his = series(group, lengths, lambda r, n: _mean(r.at(n).get("sparsity")), lambda r, n: None)
        if xs:
            error_bars(ax, xs, ys, los, his, label=group.label if len(group.runs) == 1 else legend_label(group))
    return save_axes(fig, ax, out / "sparsity_vs_length.png", train_len=train_len, xticks=lengths, xscale="log",
                     title="Attention sparsity against evaluation length",
                     xlabel="evaluation length (tokens)", ylabel="mean attention sparsity S (1 = uniform)")


def plot(groups: list[Group], out: Path) -> list[Path]:
    evaluated = [Group(g.label, [r for r in g.runs if r.results]) for g in groups]
    evaluated = [g for g in evaluated if g.runs]
    if not evaluated:
        return []
    train_len = evaluated[0].runs[0].train_len
    lengths = evaluated_lengths([r for g in evaluated for r in g.runs])
    return [
        *plot_length_curves(evaluated, out, train_len, lengths),
        plot_per_position(evaluated, out, train_len),
        plot_sparsity(evaluated, out, train_len, lengths),
    ]


# ----------------------------------------------------------------------------- command line


def as_flags(argv: list[str]) -> list[str]:
    """``baseline=softmax`` (the key=value style of the other entry points) as ``--baseline softmax``."""
    flags = []
    for arg in argv:
        key, _, value = arg.partition("=")
        flags += [f"--{key}", value] if key in ("baseline", "tag", "out") and value else [arg]
    return flags


def fail(message: str):
    print(f"lmzoo: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m lmzoo.compare", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or sweep directories holding runs")
    parser.add_argument("--baseline", help="variant (or row label) every other row is compared with, paired")
    parser.add_argument("--tag", default="default", help="which evaluation of each run to read (eval/<tag>)")
    parser.add_argument("--out", type=Path, help="where comparison.md and the plots go (default: the folder the paths share)")
    args = parser.parse_args(as_flags(list(sys.argv[1:] if argv is None else argv)))
    try:
        paths = find_runs(args.paths)
    except FileNotFoundError as e:
        fail(str(e))
    if not paths:
        fail(f"no runs (directories with config.yaml and metrics.jsonl) under {', '.join(map(str, args.paths))}")
    groups = group_runs([load_run(p, args.tag) for p in paths])
    markdown = table(groups)
    if args.baseline:
        try:
            markdown += "\n\n" + differences(groups, find_baseline(groups, args.baseline))
        except ValueError as e:
            fail(str(e))
    out = args.out or Path(os.path.commonpath([p.resolve() for p in args.paths]))  # not inside one run of several
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(markdown + "\n")
    print(markdown)
    for png in plot(groups, out):
        print(f"wrote {png}")
    return markdown


if __name__ == "__main__":
    main()
