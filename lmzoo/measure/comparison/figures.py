"""The comparison's figures: bpb and its ratio against evaluation length, loss by position, the probes that have a
figure (sparsity) against length (matplotlib only once a figure is drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmzoo.measure.comparison.estimates import arm_bpb, arm_ratio, bootstrap_settings
from lmzoo.measure.comparison.reading import Group, Run, evaluated_lengths, probe_mean
from lmzoo.scoring.catalog import PROBES, Measurement
from lmzoo.stats.trained_models import over_seeds, seed_mean


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


def plot_length_curves(groups: list[Group], out: Path, train_len: int, lengths: list[int],
                       settings: dict) -> list[Path]:
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


def plot_probe(probe: Measurement, groups: list[Group], out: Path, train_len: int, lengths: list[int]) -> Path:
    """``probe``'s mean over layers and heads against length, per arm (an interval over its seeds)."""
    from lmzoo.plots import error_bars, new_axes, save_axes, series_style, spread

    fig, ax = new_axes((6, 4))
    for index, group in enumerate(groups):
        def mean(r: Run, n: int) -> float | None:
            return probe_mean(r.at(n).get(probe.name))
        xs, ys, los, his = series(group, lengths, mean, lambda g, n: seed_mean([mean(r, n) for r in g.evaluated]))
        n = len(group.evaluated)
        label = f"{group.label} ({n} seeds, 95% over seeds)" if n > 1 else f"{group.label} (1 run, no interval)"
        if xs:
            error_bars(ax, spread(xs, index, len(groups)), ys, los, his, label=label, **series_style(index))
    return save_axes(fig, ax, out / f"{probe.figure.stem}.png", train_len=train_len, xticks=lengths, xscale="log",
                     title=f"{probe.figure.subject} against evaluation length",
                     xlabel="evaluation length (tokens)", ylabel=probe.figure.arms_ylabel)


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
        *(plot_probe(p, evaluated, out, train_len, lengths) for p in PROBES if p.figure),
    ]
