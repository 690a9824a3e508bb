"""The ``text_files`` corpus (``data=text_files data.paths=<glob>``): local files matched by globs.
``.jsonl`` files give one document per line (the ``text_field`` of each JSON object); any other file
is one plain-text document. Split by file, or by line for a single ``.jsonl`` (``lmzoo.data.corpus``).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence, Union

from lmzoo.data.corpus import CorpusConfig, Documents, Unit, as_list, check_globs, split_documents
from lmzoo.faults import first_line
from lmzoo.registry import SOURCES


def _expand_pattern(pattern: str) -> list[str]:
    pattern = os.path.expanduser(pattern)
    if glob.has_magic(pattern):
        matches = [path for path in glob.glob(pattern, recursive=True) if os.path.isfile(path)]
        if not matches:
            raise FileNotFoundError(f"no files match data.paths pattern {pattern!r}")
        return matches
    if not os.path.isfile(pattern):
        raise FileNotFoundError(f"data.paths file not found: {pattern!r}")
    return [pattern]


def _jsonl_documents(path: str, text_field: str) -> list[bytes]:
    documents = []
    with open(path, "rb") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:  # JSON, or UTF-8, that does not decode: name the place, not just the column
                raise ValueError(f"{path}:{line_number}: not a JSON line ({first_line(e)}); "
                                 "fix or remove that line") from None
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{line_number}: no string field {text_field!r} (set data.text_field)")
            documents.append(text.encode("utf-8"))
    return documents


def _file_documents(path: str, text_field: str) -> list[bytes]:
    if path.endswith(".jsonl"):
        return _jsonl_documents(path, text_field)
    with open(path, "rb") as file:
        return [file.read()]


def _relative_keys(paths: Sequence[str]) -> list[str]:
    """Keys relative to the files' common folder, so the split does not depend on the cwd."""
    absolute = [os.path.abspath(path) for path in paths]
    root = os.path.commonpath([os.path.dirname(path) for path in absolute])
    return [os.path.relpath(path, root).replace(os.sep, "/") for path in absolute]


def text_file_documents(
    paths: Union[str, Sequence[str]], text_field: str = "text", val_fraction: float = 0.05
) -> Documents:
    """Documents from local ``.txt``/``.jsonl`` (or other plain-text) files."""
    patterns = as_list(paths)
    if not patterns:
        raise ValueError("data.paths is required for data.source='text_files'")
    files = sorted({os.path.abspath(path) for pattern in patterns for path in _expand_pattern(pattern)})
    units = [Unit(key, _file_documents(path, text_field)) for key, path in zip(_relative_keys(files), files)]
    return split_documents(units, val_fraction, f"data.paths {patterns}", source="text_files", patterns=patterns)


@SOURCES.register("text_files")
@dataclass
class TextFilesConfig(CorpusConfig):
    source: str = "text_files"
    # Any (not str | list) so OmegaConf accepts both: a glob or a list of globs ("**" allowed)
    paths: Any = None
    text_field: str = "text"  # the text field of .jsonl lines

    def check(self) -> None:
        super().check()
        check_globs("data.paths", self.paths, required=True)

    def documents(self) -> Documents:
        return text_file_documents(self.paths, self.text_field, self.val_fraction)
