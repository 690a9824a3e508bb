"""The measuring scripts' JSON output, written anew after every row so a run cut off keeps what it measured.

    rows = JsonRows(args.json, {"device": ..., "jax": ...})   # None: no file, the rows are only kept in memory
    rows.add({"variant": "gla", "tokens_per_s": ...})           # the file now holds this row
    rows.close()                                                # "complete": true

The file is ``{"meta": ..., "rows": [...], "complete": false|true}``, replaced atomically (a reader never sees half
a file); ``complete`` stays false when the run was stopped before its last row. The scripts import it from their
own folder (``python scripts/<name>.py`` puts scripts/ first on ``sys.path``); it needs nothing but the standard
library, so the PyTorch benchmarks use it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class JsonRows:
    def __init__(self, path: str | os.PathLike | None, meta: dict):
        self.path = Path(path) if path else None
        self.meta, self.rows, self.complete = meta, [], False
        self.write()

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.write()
        return row

    def close(self) -> None:
        self.complete = True
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({"meta": self.meta, "rows": self.rows, "complete": self.complete}, indent=2))
        os.replace(partial, self.path)
