"""``python -m lmzoo.experiments``: list the experiments, or run one.

    python -m lmzoo.experiments                                   # each experiment and its claim
    python -m lmzoo.experiments sparsity_closed_forms             # the full run, into experiments/
    python -m lmzoo.experiments sparsity_closed_forms quick=true out_dir=/tmp/x replicates=16   # a smoke run
    python -m lmzoo.experiments rejudge docs/claims/*/verdict.json   # the current rules on committed evidence
    python -m lmzoo.experiments report [--check]                     # docs/claims.md's tables from the JSON
    python -m lmzoo.experiments sparsity_closed_forms --help      # its settings, their defaults and exit codes
"""

from __future__ import annotations

import logging
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Optional

from lmzoo.cli import (
    errors_in_one_line, exit_codes, fail, parse_settings, run_command, schema_options, show_help, wants_help,
)
from lmzoo.experiments import ARTICLES, MODULES, SEED_GROUPS, load, rejudge, run_experiment
from lmzoo.faults import EXIT_INTERRUPTED, probe_writable
from lmzoo.schema import one_of


@dataclass
class RunSettings:
    """How ``python -m lmzoo.experiments <name>`` runs an experiment (its own settings are the module's Settings)."""

    quick: bool = False  # true: small settings that test the pipeline in about a minute, not the claim (no verdict)
    out_dir: str = "experiments"  # the experiment writes <out_dir>/<name>/ (verdict.json, figures, runs); a rerun
                                  # resumes
    seed_groups: str = "auto"  # an arm's seeds trained as one vmapped group: auto (on an accelerator), true, false
                               # (one run per seed)
    keep: Optional[str] = None  # a folder keeping each run's record (settings and measurements, no checkpoints): a
                                # run kept there is not trained again, whatever out_dir, so a long experiment can be
                                # carried to another machine as its records and go on; null: none kept

    def check(self) -> None:
        probe_writable(Path(self.out_dir), "out_dir")  # a file or a read-only folder: one line now, not after runs
        if self.keep is not None:
            probe_writable(Path(self.keep), "keep")
        self.seed_groups = self.seed_groups.lower()
        one_of("seed_groups", self.seed_groups, SEED_GROUPS)


def show_usage(name: str) -> NoReturn:
    module = load(name)
    quick = ", ".join(f"{k}={v}" for k, v in module.QUICK.items())
    show_help(f"python -m lmzoo.experiments {name} [key=value ...]", module.CLAIM,
              [("run settings", schema_options(RunSettings)),
               (f"settings of {name} (quick=true sets {quick})", schema_options(module.Settings)),
               ("exit codes", exit_codes())])


def source_of(module) -> str:
    if module.SOURCE is None:
        return "beyond the source articles: a frontier they point to (docs/claims.md)"
    return f"from source article {module.SOURCE}: {ARTICLES[module.SOURCE]}"


def listing() -> str:
    lines = ["experiments (python -m lmzoo.experiments <name> [quick=true] [out_dir=<dir>] [key=value ...]):"]
    for name in MODULES:
        module = load(name)
        claim = textwrap.fill(module.CLAIM, 96, initial_indent=" " * 4, subsequent_indent=" " * 4)
        lines += [f"  {name}  ({source_of(module)})", claim]
    return "\n".join(lines)


def report(argv: list[str]) -> None:
    from lmzoo.experiments import report as tables

    if wants_help(argv):
        print(__doc__.split("\n\n")[1])
        return
    if argv not in ([], ["--check"]):
        fail(f"report takes only --check, not {' '.join(argv)}")
    with errors_in_one_line():  # a committed record that cannot be read is named, not a JSON traceback
        regenerate(tables, check=bool(argv))


def regenerate(tables, check: bool) -> None:
    if check:
        stale = tables.stale()
        for path in stale:
            print(f"{path}: its tables differ from docs/claims/*/verdict.json; run python -m lmzoo.experiments report",
                  file=sys.stderr)
        sys.exit(1 if stale else 0)
    for path in tables.write():
        print(f"rewrote the tables of {path}")


def rejudge_all(paths: list[str]) -> None:
    if wants_help(paths):
        print(__doc__.split("\n\n")[1])
        return
    if not paths:
        fail("rejudge needs the verdict.json files to re-judge")
    for path in paths:
        if not Path(path).is_file():
            fail(f"rejudge: {path} is not a verdict.json file")
        with errors_in_one_line():  # a file that is not a verdict (binary, other JSON), a write that fails
            record = rejudge(Path(path))
        print(f"{record['name']}: {record['verdict']} ({record['reason']}); was {record['rejudged']['verdict']}")


class ToStdout(logging.Handler):
    """Each line to ``sys.stdout`` as it is when the line is written (a redirection or a test's capture made after
    the first experiment ran), flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(record.getMessage(), file=sys.stdout, flush=True)
        except Exception:  # a closed stdout: logging's own handling (silent under run_command)
            self.handleError(record)


def show_progress() -> None:
    """The experiment's line before and after each run it trains (``runs.progress``) on stdout, each as it comes:
    stderr is kept for the one line of an error."""
    progress = logging.getLogger("lmzoo.experiments.progress")
    if not any(isinstance(h, ToStdout) for h in progress.handlers):
        progress.addHandler(ToStdout())
    progress.setLevel(logging.INFO)
    progress.propagate = False


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return
    if argv[0] in ("report", "rejudge"):
        (report if argv[0] == "report" else rejudge_all)(argv[1:])
        return
    name, rest = argv[0], argv[1:]
    with errors_in_one_line():  # a run stopped early (interrupted, diverged ...) writes no verdict
        if wants_help(rest):
            show_usage(name)
        run, overrides, _ = parse_settings(RunSettings, rest, "experiments", others=True)
        show_progress()
        try:
            record = run_experiment(name, Path(run.out_dir), quick=run.quick, overrides=overrides,
                                    seed_groups=run.seed_groups, keep=None if run.keep is None else Path(run.keep))
        except KeyboardInterrupt:  # outside training, which saves and stops on its own
            fail("interrupted; no verdict was written: run the same command again to resume", EXIT_INTERRUPTED)
    folder = Path(run.out_dir) / name
    if record["quick"]:
        print(f"{name}: smoke run (quick=true: tests the pipeline, not the claim; no verdict) "
              f"({record['seconds']:.0f} s); {folder / 'verdict.json'}")
    else:
        print(f"{name}: {record['verdict']}: {record['reason']} ({record['seconds']:.0f} s); {folder / 'verdict.json'}")
    for figure in record["figures"]:
        print(f"  figure: {folder / figure}")


if __name__ == "__main__":
    run_command(lambda: main(sys.argv[1:]), "no verdict was written: run the same command again to resume")
