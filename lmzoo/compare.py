"""``python -m lmzoo.compare <run or sweep dir> ... [--tag default] [--out DIR]``: runs side by side.

Reads each run's ``run_info.json``, ``metrics.jsonl`` and ``eval/<tag>/results.json`` and writes
a markdown table (printed, and saved as ``comparison.md``) plus overlay plots of all runs: bits
per byte against evaluation length, per-position loss at the longest evaluated length, and mean
attention sparsity against length. Run ``python -m lmzoo.eval`` on each run first for the
length columns; runs without evaluation results still get their training columns.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmzoo.logger import read_metrics


@dataclass
class Run:
    path: Path
    info: dict
    metrics: list[dict]
    results: dict | None = field(default=None)

    @property
    def name(self) -> str:
        return self.info.get("variant", self.path.name)

    def last(self, key: str):
        values = [r[key] for r in self.metrics if key in r]
        return values[-1] if values else None

    def mean_throughput(self):
        values = [r["tokens_per_s"] for r in self.metrics if "tokens_per_s" in r][1:]  # first window includes compilation
        return float(np.mean(values)) if values else None


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
    return Run(path, info, read_metrics(path), results)


def _fmt(value, spec: str = ".3f") -> str:
    return "—" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def _mean(nested) -> float | None:
    return None if nested is None else float(np.nanmean(np.asarray(nested, dtype=float)))


def table(runs: list[Run]) -> str:
    lengths = sorted({int(n) for r in runs if r.results for n in r.results["lengths"]})
    header = ["variant", "params", "state size", "val bpb"]
    header += [f"bpb@{n} / bpb@train" for n in lengths]
    header += ["mean S", "entropy", "accuracy", "tokens/s", "run"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        res = run.results or {"lengths": {}, "train_seq_len": None}
        at_train = res["lengths"].get(str(res["train_seq_len"]), {})
        row = [run.name, _fmt(run.info.get("params"), ","), _fmt(run.info.get("state_size"), ","), _fmt(run.last("val_bpb"))]
        for n in lengths:
            r = res["lengths"].get(str(n))
            row.append(_fmt(r["bpb"] / at_train["bpb"] if r and at_train else None))
        row += [
            _fmt(_mean(at_train.get("sparsity")) if at_train else run.last("val_sparsity")),
            _fmt(_mean(at_train.get("entropy")) if at_train else run.last("val_entropy")),
            _fmt(run.last("val_accuracy")),
            _fmt(run.mean_throughput(), ",.0f"),
            str(run.path),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(runs: list[Run], out: Path) -> list[Path]:
    from lmzoo.plots import new_axes, save_axes

    evaluated = [r for r in runs if r.results]
    if not evaluated:
        return []
    train_len = evaluated[0].results["train_seq_len"]
    written = []

    fig, ax = new_axes((6, 4))
    for run in evaluated:
        lengths = sorted(int(n) for n in run.results["lengths"])
        ax.plot(lengths, [run.results["lengths"][str(n)]["bpb"] for n in lengths], marker="o", label=run.name)
    written.append(save_axes(fig, ax, out / "bpb_vs_length.png", train_len=train_len, xscale="log",
                             xlabel="evaluation length (tokens)", ylabel="validation bits per byte"))

    fig, ax = new_axes((6, 4))
    for run in evaluated:
        longest = max(run.results["per_position"], key=int)
        curve = run.results["per_position"][longest]
        ax.plot(curve["positions"], curve["loss"], label=f"{run.name} (L={longest})")
    written.append(save_axes(fig, ax, out / "per_position.png", train_len=train_len, xscale="log",
                             xlabel="position", ylabel="loss (nats/token)"))

    fig, ax = new_axes((6, 4))
    for run in evaluated:
        probed = sorted((int(n), _mean(r["sparsity"])) for n, r in run.results["lengths"].items() if "sparsity" in r)
        if probed:
            ax.plot(*zip(*probed), marker="o", label=run.name)
    written.append(save_axes(fig, ax, out / "sparsity_vs_length.png", train_len=train_len, xscale="log",
                             xlabel="evaluation length (tokens)", ylabel="mean attention sparsity S (1 = uniform)"))
    return written


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m lmzoo.compare", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or sweep directories holding runs")
    parser.add_argument("--tag", default="default", help="which evaluation of each run to read (eval/<tag>)")
    parser.add_argument("--out", type=Path, help="where comparison.md and the plots go (default: the first path)")
    args = parser.parse_args(argv)
    try:
        paths = find_runs(args.paths)
    except FileNotFoundError as e:
        print(f"lmzoo: error: {e}", file=sys.stderr)
        sys.exit(2)
    if not paths:
        print(f"lmzoo: error: no runs (directories with config.yaml and metrics.jsonl) under {', '.join(map(str, args.paths))}", file=sys.stderr)
        sys.exit(2)
    runs = [load_run(p, args.tag) for p in paths]
    out = args.out or (args.paths[0] if args.paths[0].is_dir() else Path("."))
    out.mkdir(parents=True, exist_ok=True)
    markdown = table(runs)
    (out / "comparison.md").write_text(markdown + "\n")
    print(markdown)
    for png in plot(runs, out):
        print(f"wrote {png}")
    return markdown


if __name__ == "__main__":
    main()
