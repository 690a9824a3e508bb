"""The field's published numbers, typed once from the papers, each with where it was printed.

A yardstick's numbers live in ``docs/claims/published/<yardstick>.yaml`` (the format: docs/yardsticks.md): the
yardstick's metric, its columns and, per source (one printed table), the paper, its arXiv id, the table or figure
and the setting, then the table's rows as printed. A row names the lmzoo mixer it corresponds to (``variant``),
or null where lmzoo has none, and the ``attn.*`` settings that make that mixer the row's model (``overrides``,
optional: "DeltaNet [-1, 1]" is ``deltaproduct`` with ``attn.householder_steps=1``,
``attn.negative_eigenvalues=true``, ``attn.gate=none``); each override names a field of the mixer's config with a
value of its type. Each cell is a string, exactly as printed ("94.1", "100", ">99.0"), so the rounding the paper
applied is kept: "94.1" stands for anything in [94.05, 94.15], ">99.0" for (99.0, 100].

``load(yardstick)`` reads a file into ``Published`` numbers, every one carrying its whole citation; a missing
field, an unreadable cell or a wrong override is one line naming the file, the source and the field.

Where a source states only a separation in words ("This configuration is not expected to converge."), no number is
typed: ``docs/claims/published/separations/<name>.yaml`` holds, per row and column, what the source says the row
does (``says``: ``solves`` or ``fails``) and the sentence that says it (``printed``, quoted exactly), with the same
citation fields and row overrides; ``load_separations(name)`` reads them into ``Separation`` records.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from lmzoo.registry import MIXERS
from lmzoo.schema import ConfigError, one_of

PUBLISHED_DIR = Path(__file__).resolve().parents[2] / "docs" / "claims" / "published"
SEPARATIONS_DIR = PUBLISHED_DIR / "separations"
SAYS = ("solves", "fails")  # what a source may state a row does, in words
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
    overrides: tuple[str, ...] = ()  # the attn.* settings that make ``variant`` the row's model

    @property
    def arm(self) -> str | None:
        """The lmzoo configuration the row corresponds to: its variant, with its overrides where it has any."""
        return arm_name(self.variant, self.overrides) if self.variant is not None else None

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
                "variant": self.variant, "overrides": list(self.overrides), "column": self.column,
                "printed": self.printed, "range": list(self.range)}


def arm_name(variant: str, overrides=()) -> str:
    """``deltaproduct[attn.householder_steps=1, ...]``: a variant and the settings that make it an arm."""
    return f"{variant}[{', '.join(overrides)}]" if overrides else variant


def _parse_overrides(row: dict, where: str) -> tuple[str, ...]:
    """A row's ``overrides``, each ``attn.<field>=<value>`` naming a field of its variant's config with a value of
    that field's type."""
    overrides = row.get("overrides") or []
    if overrides and row["variant"] is None:
        raise PublishedError(f"{where}: overrides {overrides} need a variant to override")
    if not overrides:
        return ()
    if row["variant"] not in MIXERS.names():
        raise PublishedError(f"{where}: variant {row['variant']!r} is not a registered mixer")
    defaults = MIXERS.lookup(row["variant"])()
    for override in overrides:
        key, _, text = str(override).partition("=")
        name = key.removeprefix("attn.")
        if not key.startswith("attn.") or not text or name not in _fields(defaults):
            raise PublishedError(f"{where}: override {override!r} is not attn.<field>=<value> for a field of "
                                 f"{row['variant']}'s config (its fields: {', '.join(_fields(defaults))})")
        value, default = yaml.safe_load(text), getattr(defaults, name)
        widened = isinstance(default, float) and type(value) is int  # 1 for a float setting
        if default is not None and type(value) is not type(default) and not widened:  # None: Optional, any type
            raise PublishedError(f"{where}: override {override!r}: {type(value).__name__}, where attn.{name} is "
                                 f"{type(default).__name__}")
    return tuple(str(o) for o in overrides)


def _fields(config) -> list[str]:
    """The settings a row may override: every field of the mixer's config but its name."""
    return [f.name for f in dataclasses.fields(config) if f.name != "name"]


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
            overrides = _parse_overrides(row, f"{where}, row {row['row']}")
            for column, cell in zip(columns, row["cells"]):
                numbers.append(Published(yardstick, source["key"], citation, str(row["row"]), row["variant"], column,
                                         str(content["metric"]), _parse_cell(cell, f"{where}, row {row['row']}"),
                                         scale, overrides))
    return numbers


def higher_is_better(yardstick: str, folder: Path = PUBLISHED_DIR) -> bool:
    return bool(yaml.safe_load((folder / f"{yardstick}.yaml").read_text())["higher_is_better"])


def column(numbers: list[Published], source: str, name: str) -> dict[str, Published]:
    """One source's column, by lmzoo arm (``Published.arm``: the variant, with the row's overrides where it has any;
    rows without a counterpart left out)."""
    chosen = {n.arm: n for n in numbers if n.source == source and n.column == name and n.variant is not None}
    if not chosen:
        sources = sorted({n.source for n in numbers})
        columns = sorted({n.column for n in numbers if n.source == source})
        raise PublishedError(f"no published numbers for source {source!r}, column {name!r} "
                             f"(sources: {', '.join(sources)}; its columns: {', '.join(columns) or 'none'})")
    return chosen


@dataclass(frozen=True)
class Separation:
    """What a source states in words that one row does on one task (``says``: solves or fails), with the
    sentence (``printed``) and everything needed to find it again; no number is attached to it."""

    name: str  # the file's name
    source: str
    citation: Citation
    row: str
    variant: str | None
    column: str
    metric: str  # what "solves" means in the source
    says: str  # solves | fails
    printed: str  # the source's sentence, exactly
    overrides: tuple[str, ...] = ()

    @property
    def arm(self) -> str | None:
        return arm_name(self.variant, self.overrides) if self.variant is not None else None

    def record(self) -> dict:
        return {"source": self.source, "arxiv": self.citation.arxiv, "where": self.citation.where, "row": self.row,
                "variant": self.variant, "overrides": list(self.overrides), "column": self.column,
                "says": self.says, "printed": self.printed}


def separation_files(folder: Path = SEPARATIONS_DIR) -> tuple[str, ...]:
    return yardsticks(folder)


def load_separations(name: str, folder: Path = SEPARATIONS_DIR) -> list[Separation]:
    """Every stated separation of ``<folder>/<name>.yaml``, with its citation: per row, one ``says`` and one
    ``printed`` sentence a column (null where the source states nothing for that column)."""
    one_of("separations", name, separation_files(folder))
    path = folder / f"{name}.yaml"
    content = yaml.safe_load(path.read_text())
    _require(content, ("metric", "columns", "sources"), path.name)
    columns, found = list(content["columns"]), []
    for source in content["sources"]:
        where = f"{path.name}, source {source.get('key', '?')}"
        _require(source, SOURCE_FIELDS, where)
        citation = Citation(**{f: str(source[f]) for f in SOURCE_FIELDS if f not in ("key", "rows")})
        for row in source["rows"]:
            at = f"{where}, row {row.get('row', '?')}"
            _require(row, ("row", "variant", "says", "printed"), at)
            if not len(row["says"]) == len(row["printed"]) == len(columns):
                raise PublishedError(f"{at}: {len(row['says'])} says and {len(row['printed'])} printed for "
                                     f"{len(columns)} columns ({', '.join(columns)})")
            overrides = _parse_overrides(row, at)
            for column_name, says, printed in zip(columns, row["says"], row["printed"]):
                if says is None:
                    continue
                if says not in SAYS or not isinstance(printed, str) or not printed.strip():
                    raise PublishedError(f"{at}: says {says!r} with printed {printed!r} (says: one of "
                                         f"{', '.join(SAYS)}, with the source's sentence)")
                found.append(Separation(name, source["key"], citation, str(row["row"]), row["variant"], column_name,
                                        str(content["metric"]), says, printed, overrides))
    return found


def stated(separations: list[Separation], source: str, name: str) -> dict[str, Separation]:
    """One source's stated separations on column ``name``, by lmzoo arm (rows without a counterpart left out)."""
    return {s.arm: s for s in separations if s.source == source and s.column == name and s.variant is not None}
