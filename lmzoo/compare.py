"""``python -m lmzoo.compare <run or sweep dir> ... [baseline=ARM] [tag=default] [out=DIR]``.

Reads each run (``config.yaml``, ``run_info.json``, ``metrics.jsonl`` and ``eval/<tag>/results.json``)
and writes a markdown table (printed, and saved as ``comparison.md``), the same numbers as
``comparison.json``, and plots: bits per byte and its ratio to the training length against evaluation
length, per-position loss at the longest length, attention sparsity against length.

Runs that set the same ``label``, or whose configs differ only in ``seed``, form one row (an arm):
the mean over its seeds with a 95% interval that counts training noise and text (``seeds+text``);
an arm of one seed shows its text-only interval and says so. With a baseline, a second table gives
each arm's difference to it in bpb at the training length and in the extrapolation ratio at every
other length; ``*`` marks a significant difference (never for a one-seed arm). Runs on other data
or other scored tokens than the reference run are left out, each named in one line. Run
``python -m lmzoo.eval`` on each run first. ``--baseline ARM`` is accepted for ``baseline=ARM``.
The comparison itself is ``lmzoo.comparison``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmzoo.cli import fail
from lmzoo.comparison import compare, write_report


def as_flags(argv: list[str]) -> list[str]:
    """``baseline=softmax`` (the key=value style of the other entry points) as ``--baseline softmax``."""
    flags = []
    for arg in argv:
        key, _, value = arg.partition("=")
        flags += [f"--{key}", value] if key in ("baseline", "tag", "out") and value else [arg]
    return flags


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lmzoo.compare", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or sweep directories holding runs")
    parser.add_argument("--baseline", help="the arm (label or variant) every other row is compared with")
    parser.add_argument("--tag", default="default", help="which evaluation of each run to read (eval/<tag>)")
    parser.add_argument("--out", type=Path, help="where comparison.md/.json and the plots go (default: the folder "
                                                 "the paths share)")
    return parser.parse_args(as_flags(argv))


def main(argv: list[str] | None = None) -> str:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        report = compare(args.paths, tag=args.tag, baseline=args.baseline)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e), 2)
    out = args.out or Path(os.path.commonpath([p.resolve() for p in args.paths]))  # not inside one run of several
    print(report.markdown)
    for path in write_report(report, out):
        print(f"wrote {path}")
    return report.markdown


if __name__ == "__main__":
    main()
