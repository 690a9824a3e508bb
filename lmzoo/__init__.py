"""lmzoo: small decoder-only language models in which one config switch picks the sequence mixer."""

import sys as _sys

__version__ = "0.1.0"

if _sys.argv[:1] == ["-m"]:  # python -m lmzoo.<command>: Python loads the package before it finds the command
    from lmzoo.faults import stop_in_one_line_while_starting

    stop_in_one_line_while_starting()  # Ctrl-C while JAX and the command load: one line, not a traceback or a crash
