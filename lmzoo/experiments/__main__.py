"""``python -m lmzoo.experiments``: list the experiments, or run one.

    python -m lmzoo.experiments                                   # each experiment and its claim
    python -m lmzoo.experiments sparsity_closed_forms             # the full run, into experiments/
    python -m lmzoo.experiments sparsity_closed_forms quick=true out_dir=/tmp/x replicates=16   # a smoke run
    python -m lmzoo.experiments rejudge docs/claims/*/verdict.json   # the current rules on committed evidence
    python -m lmzoo.experiments report [--check]                     # docs/claims.md's tables from the JSON
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from lmzoo.experiments import MODULES, load, rejudge, run_experiment
from lmzoo.faults import EXIT_CONFIG, EXIT_INTERRUPTED, RunFault, debugging
from lmzoo.schema import ConfigError

DEFAULT_OUT = "experiments"


def fail(message: str, code: int = EXIT_CONFIG) -> None:
    print(f"lmzoo.experiments: error: {message}", file=sys.stderr)
    sys.exit(code)


def listing() -> str:
    lines = ["experiments (python -m lmzoo.experiments <name> [quick=true] [out_dir=<dir>] [key=value ...]):"]
    for name in MODULES:
        module = load(name)
        claim = textwrap.fill(module.CLAIM, 96, initial_indent=" " * 4, subsequent_indent=" " * 4)
        lines += [f"  {name}  (seed {module.SEED})", claim]
    return "\n".join(lines)


def report(argv: list[str]) -> None:
    from lmzoo.experiments import report as tables

    if argv not in ([], ["--check"]):
        fail(f"report takes only --check, not {' '.join(argv)}")
    if argv:
        stale = tables.stale()
        for path in stale:
            print(f"{path}: its tables differ from docs/claims/*/verdict.json; run python -m lmzoo.experiments report",
                  file=sys.stderr)
        sys.exit(1 if stale else 0)
    for path in tables.write():
        print(f"rewrote the tables of {path}")


def rejudge_all(paths: list[str]) -> None:
    if not paths:
        fail("rejudge needs the verdict.json files to re-judge")
    for path in paths:
        record = rejudge(Path(path))
        print(f"{record['name']}: {record['verdict']} ({record['reason']}); was {record['rejudged']['verdict']}")


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return
    if argv[0] in ("report", "rejudge"):
        (report if argv[0] == "report" else rejudge_all)(argv[1:])
        return
    name, rest = argv[0], argv[1:]
    options = dict(item.split("=", 1) for item in rest if item.split("=", 1)[0] in ("out_dir", "quick") and "=" in item)
    overrides = [item for item in rest if item.split("=", 1)[0] not in options]
    quick = options.get("quick", "false").lower()
    if quick not in ("true", "false"):
        fail(f"quick={quick!r} is not valid (choose from: true, false)")
    try:
        record = run_experiment(name, Path(options.get("out_dir", DEFAULT_OUT)), quick=quick == "true", overrides=overrides)
    except ConfigError as error:
        fail(str(error))
    except RunFault as fault:  # a run stopped early (interrupted, diverged ...): no verdict was written
        if debugging():
            raise
        fail(str(fault), fault.exit_code)
    except KeyboardInterrupt:  # outside training, which saves and stops on its own
        fail("interrupted; no verdict was written: run the same command again to resume", EXIT_INTERRUPTED)
    folder = Path(options.get("out_dir", DEFAULT_OUT)) / name
    if record["quick"]:
        print(f"{name}: smoke run (quick=true: tests the pipeline, not the claim; no verdict) ({record['seconds']:.0f} s); "
              f"{folder / 'verdict.json'}")
    else:
        print(f"{name}: {record['verdict']}: {record['reason']} ({record['seconds']:.0f} s); {folder / 'verdict.json'}")
    for figure in record["figures"]:
        print(f"  figure: {folder / figure}")


if __name__ == "__main__":
    main(sys.argv[1:])
