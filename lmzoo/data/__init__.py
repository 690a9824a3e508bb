"""Training and validation data: registered sources and synthetic tasks, tokenizers, deterministic batches.

``build_data(cfg, seed=...)`` is the single entry point: ``cfg`` is the spec of a registered data
source or synthetic task (``lmzoo.registry.SOURCES``; ``data=<name>`` picks one), which builds its
data: every one is a ``Data`` (``base``: the protocol the trainer and the evaluation rely on). Text corpora
(see ``corpus``, and a module per source: ``stdlib``, ``text_files``, ``hf``, ``tfds``) are tokenised (see
``tokenizers``) into a ``TextData`` (``text``) whose methods hand out batches: cut into windows
(``token_windows``), read in training order (``train_iterators``) and scored in validation over spans spread
across the split (``validation_spans``); synthetic tasks (see ``synthetic``) generate theirs (``TaskData``).
A mix (``mix``, ``data=mix``) draws its rows from several named corpora and tasks in given proportions, all in
one tokenizer. Batch sizes passed to ``Data`` are global; each process gets its own rows of every batch.

Every module in this package is imported here, so a module holding a new source or task registers
it just by existing: adding one is its registered spec (``data=<name>`` is made from it; a
``configs/data/<name>.yaml`` only where a file sets something, ``lmzoo.config.options_made``).
"""

from __future__ import annotations

import importlib
import pkgutil

from lmzoo.data.base import Batch, Data, DataDefaults, SourceMetrics, Windows
from lmzoo.data.corpus import CorpusConfig, Documents
from lmzoo.data.synthetic import TaskConfig, TaskData
from lmzoo.data.text import TextData
from lmzoo.data.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, build_tokenizer
from lmzoo.schema import DataConfig

__all__ = [
    "Batch",
    "ByteTokenizer",
    "CorpusConfig",
    "Data",
    "DataConfig",
    "DataDefaults",
    "Documents",
    "HFTokenizer",
    "SourceMetrics",
    "TaskConfig",
    "TaskData",
    "TextData",
    "Tokenizer",
    "Windows",
    "build_data",
    "build_tokenizer",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

def _check_shard(shard_index: int, shard_count: int) -> None:
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got shard_index={shard_index}, "
                         f"shard_count={shard_count}")


def build_data(cfg: DataConfig, *, seed: int, shard_index: int = 0, shard_count: int = 1) -> Data:
    """The data ``cfg`` describes, this process's share of it when ``shard_count`` processes share batches."""
    _check_shard(shard_index, shard_count)
    return cfg.build(seed=seed, shard_index=shard_index, shard_count=shard_count)
