"""Check lmzoo's frontier ops against flash-linear-attention's pure-PyTorch reference files.

Needs torch and fla-core 0.6.0 (``pip install torch; pip install --no-deps fla-core==0.6.0``); without
them it says what to install and exits 0, so it can run anywhere. fla's ``naive.py`` files are loaded
by file path because importing ``fla.ops.<op>`` imports Triton.

Each module in ``scripts/fla_checks/`` defines ``CHECKS``: a dict from a name to a function that
compares one op at a few shapes and returns the largest absolute difference it saw (raising
``AssertionError`` past its tolerance).

    python scripts/fla_check.py            # every check
    python scripts/fla_check.py dplr kda   # the checks whose names contain these words
"""

from __future__ import annotations

import importlib.util
import pkgutil
import sys
import traceback
from pathlib import Path

CHECKS_DIR = Path(__file__).with_name("fla_checks")


def missing() -> str | None:
    """What to install, or None when torch and fla-core are both importable."""
    for module, command in (("torch", "pip install torch"), ("fla", "pip install --no-deps fla-core==0.6.0")):
        if importlib.util.find_spec(module) is None:
            return command
    return None


def all_checks() -> dict:
    checks = {}
    for info in sorted(pkgutil.iter_modules([str(CHECKS_DIR)]), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"fla_checks.{info.name}", CHECKS_DIR / f"{info.name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        checks.update(module.CHECKS)
    return checks


def main(words: list[str]) -> int:
    need = missing()
    if need:
        print(f"fla_check: skipped, torch and fla-core are needed ({need})")
        return 0
    sys.path.insert(0, str(CHECKS_DIR))
    checks = {name: fn for name, fn in all_checks().items() if not words or any(w in name for w in words)}
    failed = 0
    for name, check in checks.items():
        try:
            print(f"{name:40s} ok   max |diff| {check():.2e}")
        except Exception as error:  # report every check, then fail once
            failed += 1
            print(f"{name:40s} FAIL {type(error).__name__}: {error}")
            traceback.print_exc(limit=2)
    print(f"{len(checks) - failed}/{len(checks)} checks agree with fla")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
