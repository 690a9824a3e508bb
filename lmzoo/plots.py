"""Plot helpers shared by ``lmzoo.eval`` and ``lmzoo.compare`` (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
from matplotlib import ticker  # noqa: E402


def new_axes(size=(5, 3.5)):
    return plt.subplots(figsize=size)


LEGEND_INSIDE = 6  # series a legend may list inside the axes


def save_axes(fig, ax, path: Path, *, train_len: int | None = None, xticks=None, **labels) -> Path:
    """Label, mark the training length (dotted), add the legend, write the PNG and free the figure.

    A log x axis gets plain-number labels: at ``xticks`` (the evaluated lengths) when given, else
    at a few powers of two; matplotlib's default labels only some minor ticks, which collide.
    """
    ax.set(**labels)
    if ax.get_xscale() == "log":
        label_log_axis(ax, xticks)
    if train_len is not None:
        ax.axvline(train_len, color="grey", linestyle=":", label=f"training length ({train_len})")
    ax.grid(alpha=0.3)
    if len(ax.get_legend_handles_labels()[0]) > LEGEND_INSIDE:  # beside the axes, where it hides no curve
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def label_log_axis(ax, ticks=None) -> None:
    plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
    if ticks is None:
        ax.xaxis.set_major_locator(ticker.LogLocator(base=2, numticks=8))  # at most ~8 labels: they stay apart
    else:
        ax.xaxis.set_major_locator(ticker.FixedLocator(sorted(ticks)))
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def error_bars(ax, x, y, lo, hi, **style) -> None:
    """Points joined by a line, with bars from ``lo`` to ``hi`` (NaN bounds draw no bar)."""
    y, lo, hi = (np.asarray(a, dtype=float) for a in (y, lo, hi))
    below, above = np.nan_to_num(y - lo), np.nan_to_num(hi - y)
    ax.errorbar(x, y, yerr=[below, above], **{"marker": "o", "capsize": 3, **style})


def series_style(index: int) -> dict:
    """Colour and marker of the index-th series: ten colours, then the same colours with another marker."""
    return {"color": plt.cm.tab10(index % 10), "marker": "os^D"[index // 10 % 4]}


def line_with_band(ax, x, y, lo, hi, **style) -> None:
    """A curve with its interval as a shaded band of the same colour."""
    (line,) = ax.plot(x, y, **style)
    lo, hi = (np.asarray(bound, dtype=float) for bound in (lo, hi))
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
