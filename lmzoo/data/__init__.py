"""Training and validation data: registered sources and synthetic tasks, tokenizers, deterministic batches.

``build_data(cfg, seed=...)`` is the single entry point: ``cfg`` is the spec of a registered data
source or synthetic task (``lmzoo.registry.SOURCES``; ``data=<name>`` picks one), which builds its
data. Text corpora (see ``corpus``, and a module per source: ``stdlib``, ``text_files``, ``hf``) are
tokenised (see ``tokenizers``) into a ``Data`` whose methods hand out batches (see ``pipeline``);
synthetic tasks (see ``synthetic``) generate theirs. A mix (``mix``, ``data=mix``) draws its rows from several
named corpora and tasks in given proportions, all in one tokenizer.
Batch sizes passed to ``Data`` are global; each process gets its own rows of every batch.

Every module in this package is imported here, so a module holding a new source or task registers
it just by existing: adding one is its registered spec (``data=<name>`` is made from it; a
``configs/data/<name>.yaml`` only where a file sets something, ``lmzoo.config.options_made``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from lmzoo.data.pipeline import Batch, Data
from lmzoo.data.corpus import CorpusConfig, Documents
from lmzoo.data.synthetic import TaskConfig, TaskData
from lmzoo.data.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, build_tokenizer
from lmzoo.schema import DataConfig

__all__ = [
    "Batch",
    "ByteTokenizer",
    "CorpusConfig",
    "Data",
    "DataConfig",
    "Documents",
    "FLAT_DEFAULTS",
    "HFTokenizer",
    "TaskConfig",
    "TaskData",
    "Tokenizer",
    "build_data",
    "build_tokenizer",
    "drop_flat_leftovers",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

# Run directories written before each source had its own spec saved one flat data config holding every
# source's settings, these defaults included; a source ignores those it does not have.
FLAT_DEFAULTS = {
    "tokenizer": "byte",
    "val_fraction": 0.05,
    "paths": None,
    "text_field": "text",
    "hf_name": None,
    "hf_config": None,
    "hf_data_files": None,
    "hf_train_split": "train",
    "hf_val_split": None,
    "task_vocab": 64,
    "num_pairs": 8,
    "num_queries": None,
    "num_marked": 8,
}


def _check_shard(shard_index: int, shard_count: int) -> None:
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got shard_index={shard_index}, "
                         f"shard_count={shard_count}")


def build_data(cfg: DataConfig, *, seed: int, shard_index: int = 0, shard_count: int = 1) -> Data | TaskData:
    """The data ``cfg`` describes, this process's share of it when ``shard_count`` processes share batches."""
    _check_shard(shard_index, shard_count)
    return cfg.build(seed=seed, shard_index=shard_index, shard_count=shard_count)


def drop_flat_leftovers(raw: dict, spec: type) -> dict:
    """``raw`` (a data config for ``spec``) without the settings of other sources that an older run
    directory's flat data config holds at their defaults."""
    own = {f.name for f in dataclasses.fields(spec)}
    return {k: v for k, v in raw.items() if k in own or k not in FLAT_DEFAULTS or v != FLAT_DEFAULTS[k]}
