"""``python -m lmzoo.experiments``: list the experiments, or run one.

    python -m lmzoo.experiments                                   # each experiment and its claim
    python -m lmzoo.experiments sparsity_closed_forms             # the full run, into experiments/
    python -m lmzoo.experiments sparsity_closed_forms quick=true out_dir=/tmp/x replicates=16
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from lmzoo.experiments import MODULES, load, run_experiment
from lmzoo.schema import ConfigError

DEFAULT_OUT = "experiments"


def fail(message: str) -> None:
    print(f"lmzoo.experiments: error: {message}", file=sys.stderr)
    sys.exit(2)


def listing() -> str:
    lines = ["experiments (python -m lmzoo.experiments <name> [quick=true] [out_dir=<dir>] [key=value ...]):"]
    for name in MODULES:
        module = load(name)
        claim = textwrap.fill(module.CLAIM, 96, initial_indent=" " * 4, subsequent_indent=" " * 4)
        lines += [f"  {name}  (seed {module.SEED})", claim]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
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
    folder = Path(options.get("out_dir", DEFAULT_OUT)) / name
    print(f"{name}: {record['verdict']} ({record['seconds']:.0f} s); {folder / 'verdict.json'}")
    for figure in record["figures"]:
        print(f"  figure: {folder / figure}")


if __name__ == "__main__":
    main(sys.argv[1:])
