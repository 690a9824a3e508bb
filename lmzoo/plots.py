"""Plot helpers shared by evaluation, comparison, the experiments and the retrieval heat maps (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
from matplotlib import ticker  # noqa: E402


def new_axes(size=(5, 3.5)):
    return plt.subplots(figsize=size)


def save_axes(fig, ax, path: Path, *, train_len: int | None = None, xticks=None, **labels) -> Path:
    """Label, mark the training length (dotted), add the legend beside the axes, write the PNG and free the figure.

    A log axis gets plain-number labels: on x at ``xticks`` (the evaluated lengths) when given, else
    at a few powers of two; matplotlib's default labels only some minor ticks ("6x10^-1"), which collide.
    The legend sits to the right of the axes, where it hides no point, however many series there are.
    """
    ax.set(**labels)
    if ax.get_xscale() == "log":
        label_log_axis(ax, xticks)
    if ax.get_yscale() == "log":
        label_log_axis(ax, axis="y")
    if train_len is not None:
        ax.axvline(train_len, color="grey", linestyle=":", label=f"training length ({train_len})")
    ax.grid(alpha=0.3)
    legend_beside(ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def legend_beside(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))


def label_log_axis(ax, ticks=None, axis: str = "x") -> None:
    """Plain numbers on a log axis: at ``ticks`` when given, else at most ~8 powers of two (x) or a few
    values between the decades (y), none in scientific notation."""
    plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
    scale = ax.xaxis if axis == "x" else ax.yaxis
    if ticks is not None:
        scale.set_major_locator(ticker.FixedLocator(sorted(ticks)))
    elif axis == "x":
        scale.set_major_locator(ticker.LogLocator(base=2, numticks=8))  # at most ~8 labels: they stay apart
    else:
        scale.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=8))
    scale.set_major_formatter(plain)
    scale.set_minor_formatter(ticker.NullFormatter())


def error_bars(ax, x, y, lo, hi, **style) -> None:
    """Points joined by a line, with bars from ``lo`` to ``hi`` (NaN bounds draw no bar)."""
    y, lo, hi = (np.asarray(a, dtype=float) for a in (y, lo, hi))
    below, above = np.nan_to_num(y - lo), np.nan_to_num(hi - y)
    ax.errorbar(x, y, yerr=[below, above], **{"marker": "o", "capsize": 3, **style})


def interval_rows(ax, labels, y, lo, hi, points=None, **style) -> list[int]:
    """One row per label, highest estimate on top: a point at ``y`` with a bar from ``lo`` to ``hi`` (NaN bounds
    draw no bar), the labels on the y axis. For many series at one x, where lines against x would stack into one
    column of points. ``points``: per label, values drawn as small dots on its row (each seed's own score: with
    three seeds that either solve a task or do not, the dots say what a mean and its interval hide). The row order,
    top first, as indices into ``labels``."""
    y, lo, hi = (np.asarray(a, dtype=float) for a in (y, lo, hi))
    order = sorted(range(len(labels)), key=lambda i: -np.nan_to_num(y[i], nan=-np.inf))
    rows = np.arange(len(order))[::-1]  # the first of ``order`` on the top row
    below, above = np.nan_to_num(y[order] - lo[order]), np.nan_to_num(hi[order] - y[order])
    ax.errorbar(y[order], rows, xerr=[below, above], linestyle="none", **{"marker": "o", "capsize": 3, **style})
    if points is not None:
        for row, i in zip(rows, order):
            ax.plot(points[i], [row] * len(points[i]), linestyle="none", marker=".", color="black", alpha=0.6)
    ax.set_yticks(rows, [labels[i] for i in order], fontsize=8)
    ax.set_ylim(-0.7, len(order) - 0.3)
    return order


def series_style(index: int) -> dict:
    """Colour, marker and line of the index-th series: each of ten colours has its own marker, so series
    that coincide still show as several (hollow markers let one show through another); past ten, the
    colours come back with a dashed line."""
    return {"color": plt.cm.tab10(index % 10), "marker": "osD^vP<X>p"[index % 10], "markerfacecolor": "none",
            "linestyle": "-" if index < 10 else "--"}


def spread(x, index: int, count: int, width: float = 0.06) -> np.ndarray:
    """x nudged by a small factor per series (log axes), so bars of equal or close values stand side by side."""
    return np.asarray(x, float) * 2 ** (width * (index - (count - 1) / 2) / max(count - 1, 1))


def line_with_band(ax, x, y, lo, hi, **style) -> None:
    """A curve with its interval as a shaded band of the same colour."""
    (line,) = ax.plot(x, y, **style)
    lo, hi = (np.asarray(bound, dtype=float) for bound in (lo, hi))
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
