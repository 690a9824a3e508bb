"""lmzoo: small decoder-only language models in which one config switch picks the sequence mixer.

``lmzoo.load(run_dir)`` opens a trained run in Python (``lmzoo.measure.loaded``; docs/api.md).
"""

import sys as _sys

__version__ = "0.1.0"

if _sys.argv[:1] == ["-m"]:  # python -m lmzoo.<command>: Python loads the package before it finds the command
    from lmzoo.faults import stop_in_one_line_while_starting

    stop_in_one_line_while_starting()  # Ctrl-C while JAX and the command load: one line, not a traceback or a crash


def __getattr__(name: str):
    # Imported on first use: ``import lmzoo.<command>`` stays free of the measuring side, and JAX is configured
    # (its compilation cache, by the commands) before anything imports it.
    if name in ("load", "LoadedRun", "TextScore"):
        from lmzoo.measure import loaded

        return getattr(loaded, name)
    raise AttributeError(f"module 'lmzoo' has no attribute {name!r}")
