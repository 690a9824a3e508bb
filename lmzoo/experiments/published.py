"""The field's published numbers, typed once from the papers, each with where it was printed.

A yardstick's numbers live in ``docs/claims/published/<yardstick>.yaml`` (the format: docs/yardsticks.md): the
yardstick's metric, its columns and, per source (one printed table), the paper, its arXiv id, the table or figure
and the setting, then the table's rows as printed. A row names the lmzoo mixer it corresponds to (``variant``),
or null where lmzoo has none. Each cell is a string, exactly as printed ("94.1", "100", ">99.0"), so the
rounding the paper applied is kept: "94.1" stands for anything in [94.05, 94.15], ">99.0" for (99.0, 100].

``load(yardstick)`` reads a file into ``Published`` numbers, every one carrying its whole citation; a missing
field or an unreadable cell is one line naming the file, the source and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from lmzoo.schema import ConfigError, one_of

PUBLISHED_DIR = Path(__file__).resolve().parents[2] / "docs" / "claims" / "published"
SOURCE_FIELDS = ("key", "paper", "authors", "venue", "arxiv", "where", "read_from", "setting", "rows")
FILE_FIELDS = ("metric", "higher_is_better", "scale", "columns", "sources")
PRINTED = re.compile(r"^(?P<bound>[<>])?(?P<number>-?\d+(?:\.(?P<decimals>\d+))?)$")


class PublishedError(ConfigError):
    """A published-numbers file that does not follow the format (one line: file, source, field)."""


@dataclass(frozen=True)
class Citation:
    paper: str
    authors: str
    venue: str
    arxiv: str
    where: str  # table or figure, with its caption
    read_from: str  # how the number was read (the paper's text, the authors' own reprint ...)
    setting: str


@dataclass(frozen=True)
class Published:
    """One printed number and everything needed to find it again."""

    yardstick: str
    source: str  # the source's key in the file
    citation: Citation
    row: str  # the row as printed ("Transformer")
    variant: str | None  # the lmzoo mixer it corresponds to; None: none
    column: str
    metric: str
    printed: str  # the cell exactly as printed
    scale: tuple[float, float]  # the metric's possible range

    @property
    def value(self) -> float:
        """The printed number (a bound's own number for ">99.0")."""
        return float(PRINTED.match(self.printed)["number"])

    @property
    def range(self) -> tuple[float, float]:
        """Every value the printed cell stands for: half a unit of its last digit either side, or up to the end
        of the scale for a bound; clipped to the scale."""
        match = PRINTED.match(self.printed)
        value, low, high = self.value, *self.scale
        if match["bound"] == ">":
            return value, high
        if match["bound"] == "<":
            return low, value
        half = 0.5 * 10.0 ** -len(match["decimals"] or "")
        return max(low, value - half), min(high, value + half)

    def cite(self) -> str:
        c = self.citation
        return f"{c.authors}, {c.venue}, arXiv:{c.arxiv}, {c.where.split(',')[0]}, row {self.row}, column {self.column}"

    def record(self) -> dict:
        return {"source": self.source, "arxiv": self.citation.arxiv, "where": self.citation.where, "row": self.row,
                "column": self.column, "printed": self.printed, "range": list(self.range)}


def yardsticks(folder: Path = PUBLISHED_DIR) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


def _require(mapping: dict, fields: tuple[str, ...], where: str) -> None:
    missing = [f for f in fields if f not in mapping]
    if missing:
        raise PublishedError(f"{where}: missing {', '.join(missing)}")


def _parse_cell(printed, where: str) -> str:
    if not isinstance(printed, str) or not PRINTED.match(printed):
        raise PublishedError(f"{where}: cell {printed!r} is not a number as printed (a quoted string such as "
                             "\"94.1\", \"100\" or \">99.0\")")
    return printed


def load(yardstick: str, folder: Path = PUBLISHED_DIR) -> list[Published]:
    """Every number of ``<folder>/<yardstick>.yaml``, with its citation."""
    one_of("yardstick", yardstick, yardsticks(folder))
    path = folder / f"{yardstick}.yaml"
    content = yaml.safe_load(path.read_text())
    _require(content, FILE_FIELDS, path.name)
    columns, scale = list(content["columns"]), tuple(float(x) for x in content["scale"])
    numbers = []
    for source in content["sources"]:
        where = f"{path.name}, source {source.get('key', '?')}"
        _require(source, SOURCE_FIELDS, where)
        citation = Citation(**{f: str(source[f]) for f in SOURCE_FIELDS if f not in ("key", "rows")})
        for row in source["rows"]:
            _require(row, ("row", "variant", "cells"), f"{where}, a row")
            if len(row["cells"]) != len(columns):
                raise PublishedError(f"{where}, row {row['row']}: {len(row['cells'])} cells for "
                                     f"{len(columns)} columns ({', '.join(columns)})")
            for column, cell in zip(columns, row["cells"]):
                numbers.append(Published(yardstick, source["key"], citation, str(row["row"]), row["variant"], column,
                                         str(content["metric"]), _parse_cell(cell, f"{where}, row {row['row']}"),
                                         scale))
    return numbers


def higher_is_better(yardstick: str, folder: Path = PUBLISHED_DIR) -> bool:
    return bool(yaml.safe_load((folder / f"{yardstick}.yaml").read_text())["higher_is_better"])


def column(numbers: list[Published], source: str, name: str) -> dict[str, Published]:
    """One source's column, by lmzoo variant (rows without a counterpart left out)."""
    chosen = {n.variant: n for n in numbers if n.source == source and n.column == name and n.variant is not None}
    if not chosen:
        sources = sorted({n.source for n in numbers})
        columns = sorted({n.column for n in numbers if n.source == source})
        raise PublishedError(f"no published numbers for source {source!r}, column {name!r} "
                             f"(sources: {', '.join(sources)}; its columns: {', '.join(columns) or 'none'})")
    return chosen
