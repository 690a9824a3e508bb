"""Plot helpers shared by ``lmzoo.eval`` and ``lmzoo.compare`` (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)


def new_axes(size=(5, 3.5)):
    return plt.subplots(figsize=size)


def save_axes(fig, ax, path: Path, *, train_len: int | None = None, **labels) -> Path:
    """Label, mark the training length (dotted), add the legend, write the PNG and free the figure."""
    ax.set(**labels)
    if train_len is not None:
        ax.axvline(train_len, color="grey", linestyle=":", label="training length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
