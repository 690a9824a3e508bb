"""The ``stdlib`` corpus (``data=stdlib``): the running Python's standard-library ``*.py`` files (~12 MB),
a corpus every machine has, split by file (``lmzoo.data.corpus``).
"""

from __future__ import annotations

import os
import platform
import sysconfig
from dataclasses import dataclass
from typing import Optional

from lmzoo.data.corpus import CorpusConfig, Documents, Unit, split_documents
from lmzoo.registry import SOURCES

# Folders skipped in the stdlib corpus: third-party packages, and the test
# suites, which are large, repetitive and would dominate the corpus.
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def _stdlib_relpaths(root: str) -> list[str]:
    relpaths = []
    for directory, subdirs, filenames in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages and test suites.
        subdirs[:] = [name for name in subdirs if name not in STDLIB_EXCLUDED_DIRS]
        for filename in filenames:
            if filename.endswith(".py"):
                relpath = os.path.relpath(os.path.join(directory, filename), root)
                relpaths.append(relpath.replace(os.sep, "/"))
    return sorted(relpaths)


def stdlib_documents(val_fraction: float = 0.05, root: Optional[str] = None) -> Documents:
    """The standard-library sources of the running Python, split by file.

    ``root`` defaults to ``sysconfig.get_paths()["stdlib"]``; tests point it
    at a small tree.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    units = []
    for relpath in _stdlib_relpaths(root):
        with open(os.path.join(root, relpath), "rb") as file:
            units.append(Unit(relpath, [file.read()]))
    documents = split_documents(units, val_fraction, f"the standard library at {root}", source="stdlib",
                                python=platform.python_version())
    documents.fingerprint.update(
        train_files=documents.fingerprint["train_documents"],
        val_files=documents.fingerprint["val_documents"],
    )
    return documents


@SOURCES.register("stdlib")
@dataclass
class StdlibConfig(CorpusConfig):
    source: str = "stdlib"

    def documents(self) -> Documents:
        return stdlib_documents(self.val_fraction)
