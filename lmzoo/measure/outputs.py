"""Writing an evaluation's results: results.json, results.csv and plots in ``eval/<tag>/``, and TensorBoard.

The files go to ``eval/<tag>/`` of the run and the scalars to ``tb/eval/<tag>/`` (and to the run's Weights &
Biases run, if it trained with ``logger=wandb``). Each evaluation
replaces its tag's files whole, so a rerun never leaves duplicate TensorBoard steps or a torn results
file behind.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from lmzoo.faults import probe_writable
from lmzoo.scoring.catalog import MEASUREMENTS, PROBES, SCORES, Measurement
from lmzoo.record.directory import RunDir, atomic_write_text, json_text
from lmzoo.record.tracking import log_evaluation



def csv_columns(m: Measurement) -> list[str]:
    """A measurement's results.csv columns: none, its value, or its value and its interval's bounds."""
    if not m.csv:
        return []
    return [m.csv, f"{m.csv}_lo", f"{m.csv}_hi"] if m.interval else [m.csv]


# Each evaluated length, then the measurements' columns (scores, then probes: the order of ``MEASUREMENTS``).
CSV_COLUMNS = ["length", "length_ratio", "tokens"] + [column for m in MEASUREMENTS for column in csv_columns(m)]


def check_writable(run: RunDir, tag: str) -> None:
    """RunFault in one line unless the evaluation's folders take files: checked before any compute."""
    probe_writable(run.eval_dir(tag), "evaluation folder")
    probe_writable(run.eval_tensorboard(tag), "TensorBoard folder")


def write_outputs(run: RunDir, results: dict, *, plots: bool = True) -> Path:
    """results.json, results.csv, the plots and TensorBoard scalars of ``results``; the results.json path."""
    tag = results["tag"]
    out_dir = run.eval_dir(tag)
    table = results_csv(results)
    atomic_write_text(run.results_csv_path(tag), table)
    if plots:
        plot_results(results, out_dir)
    write_tensorboard(run, results, sorted(out_dir.glob("*.png")) if plots else [])
    atomic_write_text(run.results_path(tag), json_text(results))  # last on disk: its presence says the rest is written
    log_evaluation(run, tag, list(csv.DictReader(io.StringIO(table))))  # after: a tracker's failure loses no file
    return run.results_path(tag)


def results_csv(results: dict) -> str:
    train_len = results["train_seq_len"]
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(CSV_COLUMNS)
    for length, r in results["lengths"].items():
        writer.writerow([length, int(length) / train_len, r["tokens"], *measurement_cells(r)])
    return text.getvalue()


def measurement_cells(entry: dict) -> list:
    """The measurements' cells of one length's ``results.json`` entry: scores (with their intervals), then each
    probe's mean over layers and heads (empty where the length was not probed)."""
    cells = []
    for m in (m for m in SCORES if m.csv):
        cells += [entry[m.name], *entry[f"{m.name}_ci"]] if m.interval else [entry[m.name]]
    return cells + [float(np.nanmean(entry[p.name])) if p.name in entry else "" for p in PROBES if p.csv]


def write_tensorboard(run: RunDir, results: dict, pngs: list[Path]) -> None:
    """The tag's scalars against length, and its plots, in a fresh event file; the tag's older event files
    go once it is written, so TensorBoard shows each length once however often the tag is evaluated."""
    from tensorboardX import SummaryWriter

    folder, tag = run.eval_tensorboard(results["tag"]), results["tag"]
    older = set(folder.glob("events.out.tfevents.*"))
    with SummaryWriter(str(folder)) as tb:  # its own folder: a resumed training run purges steps in tb/
        for length, r in results["lengths"].items():
            for m in (m for m in SCORES if m.tensorboard):
                tb.add_scalar(f"eval/{tag}/{m.name}_vs_length", r[m.name], int(length))
            for probe in (p for p in PROBES if p.tensorboard and p.name in r):
                tb.add_scalar(f"eval/{tag}/{probe.name}_vs_length", float(np.nanmean(r[probe.name])), int(length))
        for png in pngs:  # under plots/: an image never shares a scalar's tag
            tb.add_image(f"eval/{tag}/plots/{png.stem}", png_pixels(png), 0, dataformats="HWC")
    for path in older:
        path.unlink(missing_ok=True)


def png_pixels(path: Path) -> np.ndarray:
    import matplotlib.image

    return (matplotlib.image.imread(path)[..., :3] * 255).astype(np.uint8)  # (H, W, 3)


def plot_results(results: dict, out_dir: Path) -> None:
    """bpb and its paired ratio to the training length against length, and loss by position, each with its
    95% band; the probes that have a figure (attention sparsity) against length where probed."""
    from lmzoo.plots import line_with_band, new_axes, save_axes

    train_len = results["train_seq_len"]
    lengths = [int(n) for n in results["lengths"]]
    run = f"{results['variant']} (trained at {train_len}), eval {results['tag']}, {results['eval_tokens']:,} tokens"
    axis = {"train_len": train_len, "xscale": "log"}
    fig, ax = new_axes()
    bpb = [r["bpb"] for r in results["lengths"].values()]
    lo, hi = zip(*(r["bpb_ci"] for r in results["lengths"].values()))
    line_with_band(ax, lengths, bpb, lo, hi, marker="o", label="bpb, 95% interval")
    save_axes(fig, ax, out_dir / "loss_vs_length.png", xticks=lengths, xlabel="evaluation length (tokens)",
              ylabel="validation bits per byte",
              title=f"Bits per byte against length (95% text interval)\n{run}", **axis)

    fig, ax = new_axes()  # paired on the same blocks: the band shows the change with length, not the text's noise
    ratio = [r["ratio"] for r in results["lengths"].values()]
    lo, hi = zip(*(r["ratio_ci"] for r in results["lengths"].values()))
    line_with_band(ax, lengths, ratio, lo, hi, marker="o", label="paired ratio, 95% interval")
    save_axes(fig, ax, out_dir / "ratio_vs_length.png", xticks=lengths, xlabel="evaluation length (tokens)",
              ylabel=f"bpb@L / bpb@{train_len}", title=f"Ratio to the training length (paired 95% interval)\n{run}",
              **axis)

    for probe in (p for p in PROBES if p.figure):
        plot_probe_layers(results, probe, out_dir, run, axis)

    fig, ax = new_axes()
    for length, curve in results["per_position"].items():
        line_with_band(ax, curve["positions"], curve["loss"], *curve["loss_ci"], label=f"L={length}")
    save_axes(fig, ax, out_dir / "per_position.png", xlabel="position", ylabel="loss (nats/token)",
              title=f"Loss by position in the window (95% text band)\n{run}", **axis)


def plot_probe_layers(results: dict, probe: Measurement, out_dir: Path, run: str, axis: dict) -> None:
    """``probe``'s mean per layer against length, at the lengths it was probed (no figure where none was)."""
    from lmzoo.plots import new_axes, save_axes

    probed = {int(n): r[probe.name] for n, r in results["lengths"].items() if probe.name in r}
    if not probed:
        return
    fig, ax = new_axes()
    for layer in range(len(next(iter(probed.values())))):
        layer_means = [float(np.nanmean(values[layer])) for values in probed.values()]
        ax.plot(list(probed), layer_means, marker="o", label=f"layer {layer}")
    save_axes(fig, ax, out_dir / f"{probe.figure.stem}.png", xticks=list(probed), xlabel="evaluation length (tokens)",
              ylabel=probe.figure.run_ylabel, title=f"{probe.figure.subject} per layer (no interval)\n{run}", **axis)
