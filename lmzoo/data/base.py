"""What every data object is: the protocol the trainer, the evaluation and the experiments rely on.

A data source is a registered spec (``lmzoo.schema.DataConfig``: ``check``, ``build`` and, where the source
evaluates something of its own such as a retrieval grid, ``extra_evaluation``) and the data its ``build``
returns, which ``lmzoo.data.build_data`` hands to every caller. The data (``Data``) offer
- ``tokenizer`` (``vocab_size``, ``eos_id``, ``encode``: the model's vocabulary and how text becomes ids),
  ``fingerprint`` (a JSON-ready dict naming exactly what the data are: a resume or an evaluation checks it),
  ``bytes_per_token`` (validation text bytes per token: bits per byte = nats per token / (ln 2 * it); 1.0
  where no bytes lie behind the tokens, so "bits per byte" read as bits per token);
- ``train_iterator(batch_size)``: endless global batches of ``batch_size`` rows, this process's
  ``batch_size // shard_count`` of them, each ``{"inputs", "targets"}: int32 [rows, seq_len]`` and, as the
  source has them, ``weights`` (the scored targets), ``segment_ids`` (``document_boundaries="mask"``) and its
  own keys; the iterator's ``get_state()`` / ``set_state()`` resume exactly;
- ``streams`` and ``stream_iterator(batch_size)``: with ``streams`` True, batches whose row ``r`` continues row
  ``r`` of the batch before, plus ``continues [rows]`` (``train.state_passing``); a source without one stream
  of text has ``streams`` False and its ``stream_iterator`` raises;
- ``validation_windows(lengths, budget, min_doc_tokens=None) -> {length: windows}``: the windows of every
  length over the same ``budget`` scored targets (``Windows``; ValueError in one line for a budget or a
  length the data cannot give). ``has_documents`` says whether the data are documents of text, the only
  data a minimum document length (``min_doc_tokens``, ``eval.min_doc_tokens``) applies to;
- ``document_boundaries``: "mask" when batches carry ``segment_ids`` and each document is mixed alone, else
  "none" (a synthetic task's row is one sequence);
- ``source_metrics(length, budget) -> SourceMetrics``: what the trainer logs of the source beyond the loss,
  at training length ``length`` with ``budget`` validation targets (nothing, unless the source says more).

``DataDefaults`` holds the defaults of a source without documents or metrics of its own; every data class
inherits it and writes the rest. ``tests/data/test_base.py`` checks every source ``build_data`` can make.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

Batch = dict[str, np.ndarray]


@runtime_checkable
class Windows(Protocol):
    """Validation windows of one length: ``windows(indices)`` is the batch of those windows (``inputs``,
    ``targets``, ``unit`` [rows, length]: each target's unit, the block the bootstrap resamples; as the source
    has them, ``weights`` and ``segment_ids``), ``len(windows)`` how many there are."""

    length: int  # tokens per window
    units: int  # units the scored targets belong to (documents, spans or examples)

    def __len__(self) -> int: ...

    def __call__(self, window_indices: np.ndarray) -> Batch: ...

    def sampling_keys(self) -> dict:
        """The ``results.json`` keys that say which targets were scored and what the blocks are made of."""


class SourceMetrics:
    """What a data source logs beyond the loss, through hooks the trainer calls without naming the source.

    ``step_terms(token_loss, batch)``, traced inside the jitted step, returns arrays added to the step's
    metrics (None: nothing); ``add`` keeps a call's metrics on the device until ``pop`` averages them into a
    log row; ``validation`` scores the source's own validation windows. This default logs nothing; a source
    that logs more has ``source_metrics(length, budget)`` return its own (a mix: loss per component).
    """

    step_terms = None

    def add(self, metrics: dict, steps_per_call: int) -> None:
        """One call's metrics (stacked [k, ...] when a call runs k > 1 steps)."""

    def pop(self) -> dict[str, float]:
        """The log row's terms over the calls added since the last ``pop``."""
        return {}

    def held(self) -> Any:
        """The calls added since the last ``pop`` as JSON values (exactly), for a checkpoint between two log rows."""
        return None

    def hold(self, held: Any) -> None:
        """Take back what ``held`` gave, on resuming from such a checkpoint."""

    def validation(self, score_windows, *, scored: Optional[tuple] = None) -> dict[str, float]:
        """Terms scored on the source's own validation windows by ``score_windows`` (windows -> their
        ``LengthScores``, the trainer's scorer); ``scored`` = (windows, their scores) already scored by the trainer,
        not scored again."""
        return {}


@runtime_checkable
class Data(Protocol):
    """The data a source builds (see the module docstring for each member)."""

    tokenizer: Any  # lmzoo.data.tokenizers.Tokenizer; a synthetic task's TaskTokenizer
    fingerprint: dict
    bytes_per_token: float
    document_boundaries: str  # "none" | "mask"
    streams: bool  # whether stream_iterator gives batches for train.state_passing
    has_documents: bool  # whether validation_windows takes a min_doc_tokens

    def train_iterator(self, batch_size: int) -> Iterator[Batch]: ...

    def stream_iterator(self, batch_size: int) -> Iterator[Batch]: ...

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int],
                           min_doc_tokens: Optional[int] = None) -> dict[int, Windows]: ...

    def source_metrics(self, length: int, budget: int) -> SourceMetrics: ...


class DataDefaults:
    """``Data``'s defaults for a source without documents or metrics of its own: rows are single sequences
    (no segment ids, no stream to pass state along, no minimum document length) and nothing is logged beyond
    the loss. A data class inherits this and writes the rest (or overrides a default)."""

    document_boundaries = "none"
    streams = False
    has_documents = False

    def stream_iterator(self, batch_size: int) -> Iterator[Batch]:
        raise ValueError(f"{type(self).__name__} has no stream of text whose windows run on from batch to batch")

    def source_metrics(self, length: int, budget: int) -> SourceMetrics:
        return SourceMetrics()
