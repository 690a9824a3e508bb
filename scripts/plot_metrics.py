"""Plot training curves (train loss in bits per byte, validation bpb) of one or more runs.

    python scripts/plot_metrics.py runs/softmax-... runs/gla-... [--out curves.png]

The figure goes next to the runs: into the run directory for one run, into the directory the
runs share (e.g. their sweep) for several, unless ``--out`` names another file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from lmzoo.record.directory import RunDir


def label_of(run_dir: Path) -> str:
    return RunDir(run_dir).read_run_info().get("variant", run_dir.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with its metrics log)")
    parser.add_argument("--out", type=Path, help="the PNG to write (default: curves.png next to the runs)")
    args = parser.parse_args()
    out = args.out or Path(os.path.commonpath([run.resolve() for run in args.runs])) / "curves.png"

    fig, ax = plt.subplots(figsize=(6, 4))
    for run_dir in args.runs:
        rows = RunDir(run_dir).read_metrics()
        if not rows:
            raise SystemExit(f"plot_metrics: error: {run_dir} has no logged metrics")
        label = label_of(run_dir)
        train = [r for r in rows if "bpb" in r]
        val = [r for r in rows if "val_bpb" in r]
        line, = ax.plot([r["step"] for r in train], [r["bpb"] for r in train], alpha=0.5, label=f"{label} train")
        ax.plot([r["step"] for r in val], [r["val_bpb"] for r in val], marker="o", color=line.get_color(),
                label=f"{label} val")
    ax.set(title="Training curves", xlabel="step", ylabel="bits per byte", ylim=(None, 5.0))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
