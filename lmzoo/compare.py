"""``python -m lmzoo.compare <run or sweep dir> ... [baseline=ARM] [tag=default] [out=DIR]``: compare runs.

Reads each run (``config.yaml``, ``run_info.json``, ``metrics.jsonl`` and ``eval/<tag>/results.json``)
and writes a markdown table (printed, and saved as ``comparison.md``), the same numbers as
``comparison.json``, and plots: bits per byte and its ratio to the training length against evaluation
length, per-position loss at the longest length, attention sparsity against length.

Each run counts once (a link to a run, or a copy of its folder, is named and left out; two runs of one seed in
an arm are refused unless ``same_seed=distinct``). Runs that set the same ``label``, or whose configs differ
only in ``seed`` and in settings that cannot change the trained model (``lmzoo.schema``), form one row (an arm):
the mean over its seeds with a 95% interval that counts training noise and text (``seeds+text``);
an arm of one seed shows its text-only interval and says so. With a baseline, a second table gives
each arm's difference to it in bpb at the training length and in the extrapolation ratio at every
other length; ``*`` marks a significant difference (never for a one-seed arm), adjusted for the number of arms
compared with the baseline (Holm's method, each column one family; ``adjust=none`` for each arm on its own at 95%;
``comparison.json`` records both; ``pair=seed`` pairs each arm's runs with the baseline's of the same seed
number). Runs on other data
or other scored tokens than the reference run are left out, each named in one line. Run
``python -m lmzoo.eval`` on each run first. ``--baseline ARM`` is accepted for ``baseline=ARM``;
``--help`` lists the settings.
The comparison itself is ``lmzoo.measure.comparison``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Optional

from lmzoo.cli import (
    HelpLine, errors_in_one_line, exit_codes, parse_settings, run_command, schema_options, show_help, shown_as,
    wants_help,
)
from lmzoo.config import ConfigError
from lmzoo.faults import (
    EXIT_ABORTED, EXIT_CONFIG, EXIT_FINISHED, EXIT_UNPARSABLE, EXIT_WRITE_FAILED, WriteFault, first_line,
)
from lmzoo.measure.comparison import another_comparison, compare, write_report


@dataclass
class CompareSettings:
    """The settings of ``python -m lmzoo.compare`` besides the run paths."""

    baseline: Optional[str] = None  # the arm (label or variant) every other row is compared with; null: no second
                                    # table
    tag: str = "default"  # which evaluation of each run to read (eval/<tag>)
    out: Optional[str] = shown_as("<the folder the paths share>")  # where comparison.md/.json and the plots go;
                                                                   # without out=, a comparison of other runs (or
                                                                   # another baseline or tag) already there is not
                                                                   # replaced
    adjust: str = "holm"  # how the stars of the differences to the baseline are adjusted for the number of arms
                          # compared: holm, or none (each arm on its own at 95%)
    same_seed: str = "refuse"  # two runs of one arm with the same seed: refuse, or distinct (they are different
                               # runs, e.g. a nondeterministic rerun: each counts)
    pair: str = "none"  # differences to the baseline: none (arms independent), or seed (each run paired with the
                        # baseline's run of the same seed number, which shares its data order, where both arms hold
                        # the same seeds)


def show_usage() -> NoReturn:
    show_help("python -m lmzoo.compare <run or sweep dir> ... [key=value ...]",
              "Tabulate and plot evaluated runs side by side: a row per arm (its seeds pooled), with 95% intervals.",
              [("arguments", [HelpLine("<run or sweep dir>", None, "run directories, or folders holding runs")]),
               ("settings (--key value is accepted too)", schema_options(CompareSettings)),
               ("exit codes",
                exit_codes(EXIT_FINISHED, EXIT_CONFIG, EXIT_WRITE_FAILED, EXIT_UNPARSABLE, EXIT_ABORTED))])


def parse_args(argv: list[str]) -> tuple[list[Path], CompareSettings]:
    """The run paths and settings; a path is any argument without ``=`` (or one that exists as a path)."""
    settings, _, paths = parse_settings(CompareSettings, argv, "compare", paths=True, dashes=True)
    if not paths:
        raise ConfigError("no run given: python -m lmzoo.compare <run or sweep dir> ... "
                          "(run python -m lmzoo.eval on each first)")
    return [Path(p) for p in paths], settings


def main(argv: list[str] | None = None) -> str:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        paths, s = parse_args(argv)
        out = Path(s.out) if s.out else Path(os.path.commonpath([p.resolve() for p in paths]))  # not in one run
        if out.exists() and not out.is_dir():
            raise ConfigError(f"out={str(out)!r} is a file, not a folder: give out=<folder> for the report's files")
        try:
            report = compare(paths, tag=s.tag, baseline=s.baseline, same_seed=s.same_seed, adjust=s.adjust,
                             pair=s.pair)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(str(e)) from None
        if not s.out and another_comparison(report, out):
            raise ConfigError(f"{out / 'comparison.md'} holds a comparison of other runs (or another baseline or tag): "
                              f"give out=<folder> for this one, or out={out} to replace it")
        print(report.markdown)
        make_folder(out)
        for path in write_report(report, out):  # a WriteFault (full disk, read-only folder): one line, exit 5
            print(f"wrote {path}")
    return report.markdown


def make_folder(out: Path) -> None:
    """The report's folder, made where it is missing; a WriteFault (one line, exit 5) where it cannot be."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on its path, a read-only parent
        raise WriteFault(f"cannot make the folder out={str(out)!r} ({e.strerror or first_line(e)})") from None


if __name__ == "__main__":
    run_command(main, "nothing was written (the report's files are replaced whole)")
