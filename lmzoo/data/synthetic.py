"""Synthetic recall tasks, generated on the fly and deterministically from the seed.

Each example is a token sequence of ``seq_len + 1`` ids; ``inputs``/``targets`` are its two
shifted views and ``weights`` marks the target positions that are scored (the answers), so loss
and accuracy count only what the task asks. Example ``i`` of a split is a pure function of
``(seed, split, i)``: the draws of ``numpy.random.default_rng([seed, split, i])``, so batches are reproducible
and resumable by index alone. Each task registers its spec (``data=<name>`` picks it), which draws the examples
of a batch together (``sequences``: ``lmzoo.data.draws`` makes every row's Generator draws at once, bit for bit)
or one example at a time (``example``). Training reads a fresh example at every index, or with ``train_examples=N``
a fixed set, the split's first N examples, in a new order every epoch (``EpochOrder``):

- ``mqar`` (multi-query associative recall): ``num_pairs`` key-value pairs, then ``num_queries``
  keys drawn from them, each followed by its value (scored). Keys and values use disjoint halves
  of the ``task_vocab`` symbols (values drawn with replacement, or with ``distinct_values`` distinct within an
  example, as zoology draws them); unused positions at the start are PAD. With ``query_placement=power_law``
  (zoology's layout) the pairs open the sequence and each query takes a two-token slot of the rest, the slots
  drawn without replacement with probability proportional to ``d ** (power_a - 1)`` at distance d (slot d - 1)
  from the pairs, the slots no query takes PAD.
- ``induction``: a random sequence followed by a copy of itself; every token of the copy after
  the first is scored (a model can predict it only by finding the earlier occurrence).
- ``selective_copy``: ``num_marked`` symbols scattered at random positions among NOISE tokens,
  then SEP, then the symbols again in order (scored).

State-tracking tasks (the word problem of a finite group) label every position with a state
instead of the next input: the inputs are random group elements ``x_0 .. x_{T-1}`` and the target
at position t is their running product ``s_t = x_t s_{t-1}`` (``s_0 = x_0``), every position
scored. A model must carry the state; no position can be answered from a bounded window.

- ``parity``: the group Z_2, inputs bits, targets the parity of the bits so far (``task_vocab`` 2);
- ``permutation``: the symmetric group S_n (``degree`` n: S_3, S_5 ...), permutations numbered in
  lexicographic order (``task_vocab`` n!); ``s_t`` applies ``s_{t-1}`` first, then ``x_t``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional, Sequence

import grain
import numpy as np

from lmzoo.data.base import DataDefaults
from lmzoo.data.draws import BatchDraws, NotVectorised, RowDraws
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, DataConfig, one_of, positive

TRAIN, VALIDATION = 0, 1
EPOCHS = 2  # the key of the orders a fixed training set is read in, beside the splits' keys: never an example's

# Training batches are drawn this many examples at a time (``TrainingBatches``), or as many as hold BLOCK_TOKENS
# for long sequences: drawing many examples together costs little more than drawing a few.
BLOCK_EXAMPLES, BLOCK_TOKENS = 256, 2**16
# How the training batches are read: most batches are a slice of a block already drawn, so a couple of threads
# keep up; grain's default (16 threads, 500 batches queued) cost 2-3x the CPU time (docs/benchmarks.md).
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=16)


@dataclass(frozen=True)
class TaskTokenizer:
    """Symbols 0 .. task_vocab - 1, then PAD, SEP, NOISE (EOS/BOS alias PAD: tasks have no documents)."""

    task_vocab: int
    name: str = "task"

    @property
    def pad_id(self) -> int:
        return self.task_vocab

    @property
    def sep_id(self) -> int:
        return self.task_vocab + 1

    @property
    def noise_id(self) -> int:
        return self.task_vocab + 2

    @property
    def eos_id(self) -> int:
        return self.pad_id

    @property
    def bos_id(self) -> int:
        return self.pad_id

    @property
    def vocab_size(self) -> int:
        return self.task_vocab + 3


def added_setting(default):
    """A setting added after runs were recorded without it: left out of the data's fingerprint while it holds its
    default (the data those runs trained on), so they still resume and evaluate as before."""
    return field(default=default, metadata={"fingerprint": "when changed"})


@dataclass
class TaskConfig(DataConfig):
    """Settings every synthetic task has; a task adds its own and how one example is drawn."""

    task_vocab: int = 64  # task symbols (mqar: half keys, half values)
    # None: fresh examples every step; N: a fixed training set, the split's first N examples, read in a new order
    # every epoch (``EpochOrder``), as a training set of a paper's size is (MAD's training-set sizes)
    train_examples: Optional[int] = added_setting(None)

    def check(self) -> None:
        super().check()
        positive("data.task_vocab", self.task_vocab)
        if self.train_examples is not None:
            positive("data.train_examples", self.train_examples)

    def sequences(self, draws, length: int, tok: TaskTokenizer) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """A sequence of ``length`` token ids for each row of ``draws`` (``BatchDraws``, or ``RowDraws``: one
        Generator), [rows, length], and the mask of their scored positions, [length] (the same in every row) or
        [rows, length]; None: the task draws one example at a time (``example``)."""
        return None

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        """One sequence of ``length`` token ids and the mask of its scored positions."""
        drawn = self.sequences(RowDraws(rng), length, tok)
        if drawn is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither sequences() nor example()")
        seq, scored = drawn
        return seq[0], scored if scored.ndim == 1 else scored[0]

    def labelled(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        """(inputs, targets, scored) of ``length - 1`` positions: by default a sequence from ``example``
        and its next tokens; a task whose targets are not the next inputs draws its own."""
        seq, scored = self.example(rng, length, tok)
        return seq[:-1], seq[1:], scored[1:]

    def labelled_in(self, split: int, rng: np.random.Generator, length: int,
                    tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        """``labelled`` for an example of ``split`` (TRAIN or VALIDATION): the same in both, unless a task trains
        or evaluates differently (MAD's recall tasks, ``lmzoo.data.mad``); such a task draws one example at a
        time (no ``sequences``)."""
        return self.labelled(rng, length, tok)

    def labelled_rows(self, draws, length: int, tok: TaskTokenizer) -> Optional[tuple[np.ndarray, ...]]:
        """``labelled`` for every row of ``draws`` at once: (inputs, targets) [rows, length - 1] and scored
        [length - 1] or [rows, length - 1]; None for a task that draws one example at a time."""
        drawn = self.sequences(draws, length, tok)
        if drawn is None:
            return None
        seq, scored = drawn
        return seq[:, :-1], seq[:, 1:], scored[..., 1:]

    def build(self, *, seed: int, shard_index: int, shard_count: int) -> "TaskData":
        return TaskData(self, seed, shard_index, shard_count)


QUERY_PLACEMENTS = ("packed", "power_law")  # data.query_placement of mqar


@SOURCES.register("mqar")
@dataclass
class MqarConfig(TaskConfig):
    source: str = "mqar"
    num_pairs: int = 8  # key-value pairs in the context
    num_queries: Optional[int] = None  # keys asked; None = num_pairs
    # Where the queries go after the pairs: packed at the end (lmzoo's layout), or in slots drawn by zoology's
    # power law, near slots likelier (Arora et al. 2023: the gap between repeats in text follows a power law)
    query_placement: str = added_setting("packed")
    power_a: float = added_setting(0.01)  # the power law's exponent is power_a - 1 (zoology's 0.01: nearly 1 / d)
    # The values of one example: drawn with replacement (lmzoo's), or distinct, no two keys sharing a value, as
    # zoology's generator draws them (Arora et al. 2023: values, like keys, without replacement)
    distinct_values: bool = added_setting(False)

    def check(self) -> None:
        super().check()
        positive("data.num_pairs", self.num_pairs)
        if self.num_queries is not None:
            positive("data.num_queries", self.num_queries)
        one_of("data.query_placement", self.query_placement, QUERY_PLACEMENTS)
        positive("data.power_a", self.power_a)
        if self.num_pairs > self.task_vocab // 2:  # keys are distinct symbols of the first half, values of the second
            drawn = "distinct keys and values (data.distinct_values=true)" if self.distinct_values else "distinct keys"
            raise ConfigError(f"data.num_pairs={self.num_pairs} {drawn} need data.task_vocab >= {2 * self.num_pairs}")

    def sequences(self, draws, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        half = self.task_vocab // 2
        n_pairs = self.num_pairs
        n_queries = self.num_queries or n_pairs
        need = 2 * (n_pairs + n_queries)
        if need > length:
            raise ValueError(
                f"mqar needs {need} tokens for data.num_pairs={n_pairs} and {n_queries} queries; "
                f"data.seq_len + 1 = {length}"
            )
        keys = draws.choice(half, n_pairs)
        if self.distinct_values:
            values = half + draws.choice(half, n_pairs)
        else:
            values = draws.integers(half, 2 * half, n_pairs)
        # Generator.choice with replacement draws integers(0, n_pairs)
        asked = draws.integers(0, n_pairs, n_queries) if n_queries > n_pairs else draws.choice(n_pairs, n_queries)
        pairs = np.stack([keys, values], 2)
        queries = np.take_along_axis(pairs, asked[:, :, None], 1)
        rows = draws.rows
        if self.query_placement == "power_law":
            return self.spread(draws, pairs.reshape(rows, -1), queries, length, tok)
        seq = np.concatenate([np.full((rows, length - need), tok.pad_id), pairs.reshape(rows, -1),
                              queries.reshape(rows, -1)], axis=1)
        scored = np.zeros(length, bool)
        scored[length - 2 * n_queries + 1 :: 2] = True  # the values that answer the queries
        return seq, scored

    def spread(self, draws, pairs: np.ndarray, queries: np.ndarray, length: int,
               tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        """Zoology's layout: the pairs [rows, 2 * num_pairs] first, then each (key, value) of ``queries``
        [rows, n, 2] in a two-token slot drawn by ``power_law_slots``; an odd token left over ends the sequence
        (zoology's inputs drop it too). Returns the sequences and their scored values [rows, length]."""
        rows, n_queries = queries.shape[:2]
        start = pairs.shape[1]
        slots = power_law_slots(draws, (length - start) // 2, n_queries, self.power_a)
        seq = np.full((rows, length), tok.pad_id)
        seq[:, :start] = pairs
        positions = start + 2 * slots  # [rows, n] where each query's key goes
        np.put_along_axis(seq, positions, queries[:, :, 0], axis=1)
        np.put_along_axis(seq, positions + 1, queries[:, :, 1], axis=1)
        scored = np.zeros((rows, length), bool)
        np.put_along_axis(scored, positions + 1, True, axis=1)  # the values that answer the queries
        return seq, scored


def power_law_weights(slots: int, power_a: float) -> np.ndarray:
    """Zoology's law of a query's slot: slot d - 1 (distance d from the pairs) with probability ∝ d ** (power_a - 1)."""
    weights = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1.0)
    return weights / weights.sum()


def power_law_slots(draws, slots: int, count: int, power_a: float) -> np.ndarray:
    """[rows, count] distinct slots of 0 .. slots - 1, drawn one after another as zoology draws them
    (``choice(replace=False, p=power_law_weights)``: each among the slots left, by their renormalised law). Each
    draw inverts the cumulative law at a uniform of 32 bits (one integer draw, so ``BatchDraws`` and a Generator
    draw the same slots)."""
    left = np.tile(power_law_weights(slots, power_a), (draws.rows, 1))
    uniforms = draws.integers(0, 2**32, count) / 2.0**32  # [rows, count], in [0, 1)
    chosen = np.empty((draws.rows, count), np.int64)
    rows = np.arange(draws.rows)
    for q in range(count):
        cumulative = np.cumsum(left, axis=1)
        # the first slot whose cumulative weight passes the uniform's share: a taken slot (weight 0) never does
        chosen[:, q] = (cumulative <= uniforms[:, q : q + 1] * cumulative[:, -1:]).sum(axis=1)
        left[rows, chosen[:, q]] = 0.0
    return chosen


@SOURCES.register("induction")
@dataclass
class InductionConfig(TaskConfig):
    source: str = "induction"

    def sequences(self, draws, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        half = length // 2
        prefix = draws.integers(0, self.task_vocab, half)
        seq = np.concatenate([np.full((draws.rows, length - 2 * half), tok.pad_id), prefix, prefix], axis=1)
        scored = np.zeros(length, bool)
        scored[length - half + 1 :] = True  # each repeated token after the first is predictable
        return seq, scored


@SOURCES.register("selective_copy")
@dataclass
class SelectiveCopyConfig(TaskConfig):
    source: str = "selective_copy"
    num_marked: int = 8  # symbols to copy

    def check(self) -> None:
        super().check()
        positive("data.num_marked", self.num_marked)

    def sequences(self, draws, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        n = self.num_marked
        context = length - n - 1
        if context < n:
            raise ValueError(f"selective_copy needs data.seq_len + 1 >= {2 * n + 1} for data.num_marked={n}")
        symbols = draws.integers(0, self.task_vocab, n)
        noise = np.full((draws.rows, context), tok.noise_id)
        np.put_along_axis(noise, np.sort(draws.choice(context, n), axis=1), symbols, axis=1)
        seq = np.concatenate([noise, np.full((draws.rows, 1), tok.sep_id), symbols], axis=1)
        scored = np.zeros(length, bool)
        scored[length - n :] = True
        return seq, scored


@dataclass
class StateTrackingConfig(TaskConfig):
    """The word problem of a finite group with elements 0 .. order - 1 (``task_vocab`` = the order)."""

    def products(self) -> np.ndarray:
        """[order, order]: ``products()[s, x]`` is the element ``x s`` (s applied first, then x)."""
        raise NotImplementedError(f"{type(self).__name__} does not define products()")

    def check(self) -> None:
        super().check()
        order = len(self.products())
        if self.task_vocab != order:
            raise ConfigError(f"data.task_vocab={self.task_vocab} must be {order}, the order of the {self.source} "
                              "group")

    def labelled(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        elements, states, scored = self.labelled_rows(RowDraws(rng), length, tok)
        return elements[0], states[0], scored

    def labelled_rows(self, draws, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        table = self.products()
        elements = draws.integers(0, len(table), length - 1)
        states = elements.copy()
        shift = 1
        while shift < length - 1:  # running products by doubling: the product is associative
            states[:, shift:] = table[states[:, :-shift], states[:, shift:]]  # the earlier part applied first
            shift *= 2
        return elements, states, np.ones(length - 1, bool)


@SOURCES.register("parity")
@dataclass
class ParityConfig(StateTrackingConfig):
    source: str = "parity"
    task_vocab: int = 2

    def products(self) -> np.ndarray:
        return np.array([[0, 1], [1, 0]])  # addition modulo 2


@SOURCES.register("permutation")
@dataclass
class PermutationConfig(StateTrackingConfig):
    source: str = "permutation"
    degree: int = 3  # n of S_n: 3 (6 elements, the smallest non-abelian group) or 5 (120, not solvable)
    task_vocab: int = 6

    def check(self) -> None:
        if self.degree not in DEGREES:
            raise ConfigError(f"data.degree={self.degree} is not valid (choose from: {', '.join(map(str, DEGREES))})")
        super().check()

    def products(self) -> np.ndarray:
        return permutation_products(self.degree)


DEGREES = (2, 3, 4, 5, 6)


@functools.cache
def permutation_products(degree: int) -> np.ndarray:
    """S_n's table in lexicographic numbering: entry [s, x] numbers the permutation i -> x(s(i))."""
    perms = list(itertools.permutations(range(degree)))
    number = {p: i for i, p in enumerate(perms)}
    return np.array([[number[tuple(np.asarray(x)[list(s)])] for x in perms] for s in perms])


@dataclass(frozen=True)
class TaskExamples:
    """Example ``index`` of one split as a dict of int32 inputs/targets and float32 weights."""

    cfg: TaskConfig
    seed: int
    split: int
    length: int  # tokens per window, i.e. seq_len + 1
    tokenizer: TaskTokenizer = field(repr=False)
    # 32-bit draws a row took last time (the same for every row numpy draws no more than once each): made at once
    drawn: list = field(default_factory=lambda: [0], init=False, repr=False, compare=False, hash=False)

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.split, int(index)])
        inputs, targets, scored = self.cfg.labelled_in(self.split, rng, self.length, self.tokenizer)
        return {
            "inputs": inputs.astype(np.int32),
            "targets": targets.astype(np.int32),
            "weights": scored.astype(np.float32),
        }

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Examples ``indices`` stacked, the same as one by one: drawn together where the task can
        (``labelled_rows``), and one by one for the rows whose draws only a Generator makes as numpy does."""
        indices = np.asarray(indices, np.int64)
        draws = BatchDraws([self.seed, self.split], indices, words=self.drawn[0])
        try:
            labelled = self.cfg.labelled_rows(draws, self.length, self.tokenizer)
        except NotVectorised:
            labelled = None
        if labelled is None:
            rows = [self(i) for i in indices]
            return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        self.drawn[0] = draws.used
        inputs, targets, scored = labelled
        batch = {"inputs": inputs.astype(np.int32), "targets": targets.astype(np.int32),
                 "weights": np.broadcast_to(scored, inputs.shape).astype(np.float32)}
        for row in np.flatnonzero(draws.redo):
            for key, value in self(indices[row]).items():
                batch[key][row] = value
        return batch


@dataclass(frozen=True)
class TaskWindows:
    """The first ``units`` examples of one length; every target of example ``i`` has unit ``i``, so
    the fixed blocks are blocks of examples, the same examples at every length."""

    examples: TaskExamples
    units: int

    @property
    def length(self) -> int:
        return self.examples.length - 1

    def __len__(self) -> int:
        return self.units

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        batch = self.examples.rows(indices)
        batch["unit"] = np.repeat(np.asarray(indices)[:, None], self.length, axis=1)  # (rows, L)
        return batch

    def sampling_keys(self) -> dict:
        """The ``results.json`` keys that say what was scored: independent examples, each its own unit."""
        return {"sampling": "examples", "examples": self.units, "block_unit": "example"}


class TrainingBatches:
    """This process's rows of a global batch of example indices (``batch_size`` consecutive ones), as
    ``TaskExamples.rows`` gives them; the batches are drawn a block of ``BLOCK_EXAMPLES`` examples at a time, and
    the last few blocks kept for the batches that follow (grain's reading threads ask for them in any order)."""

    def __init__(self, examples: TaskExamples, batch_size: int, shard_index: int, rows: int, keep: int = 3,
                 order: Optional["EpochOrder"] = None):
        self.examples, self.batch_size, self.rows, self.keep, self.order = examples, batch_size, rows, keep, order
        self.first_row = shard_index * rows  # this process's contiguous block of each global batch
        self.per_block = max(1, min(BLOCK_EXAMPLES, BLOCK_TOKENS // examples.length) // rows)  # batches a block holds
        self.blocks: OrderedDict[int, dict] = OrderedDict()
        self.lock = threading.Lock()

    def block(self, number: int) -> dict[str, np.ndarray]:
        with self.lock:
            if number not in self.blocks:
                batches = number * self.per_block + np.arange(self.per_block)
                indices = (batches[:, None] * self.batch_size + self.first_row + np.arange(self.rows)).ravel()
                self.blocks[number] = self.examples.rows(indices if self.order is None else self.order(indices))
                while len(self.blocks) > self.keep:
                    self.blocks.popitem(last=False)
            return self.blocks[number]

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        number, place = divmod(int(indices[0]) // self.batch_size, self.per_block)
        part = slice(place * self.rows, (place + 1) * self.rows)
        return {key: value[part].copy() for key, value in self.block(number).items()}


@dataclass(frozen=True)
class EpochOrder:
    """Where training example ``i`` comes from in a fixed set of ``size`` examples: epoch ``i // size`` reads every
    one of them once, in an order drawn from ``(seed, epoch)`` alone (so any batch is found by its index)."""

    seed: int
    size: int

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        epochs, places = np.divmod(np.asarray(indices, np.int64), self.size)
        examples = np.empty_like(places)
        for epoch in np.unique(epochs):
            at = epochs == epoch
            examples[at] = self.permutation(int(epoch))[places[at]]
        return examples

    @functools.lru_cache(maxsize=4)  # a block of batches spans an epoch or two
    def permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, EPOCHS, epoch]).permutation(self.size)


@dataclass(frozen=True, eq=False)
class TaskData(DataDefaults):
    """The ``Data`` of a synthetic task (``lmzoo.data.base``): rows are examples, not documents, and bits per
    byte read as bits per token."""

    cfg: TaskConfig
    seed: int
    shard_index: int = 0
    shard_count: int = 1
    tokenizer: TaskTokenizer = field(init=False)
    bytes_per_token: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "tokenizer", TaskTokenizer(self.cfg.task_vocab))

    @property
    def fingerprint(self) -> dict:
        # allow_changed is how to resume, not what; a setting added since runs were recorded counts once changed
        at_default = {f.name for f in dataclasses.fields(self.cfg)
                      if f.metadata.get("fingerprint") == "when changed" and getattr(self.cfg, f.name) == f.default}
        settings = {k: v for k, v in dataclasses.asdict(self.cfg).items()
                    if k != "allow_changed" and k not in at_default}
        return {**settings, "seed": self.seed, "vocab_size": self.tokenizer.vocab_size}

    @property
    def training_order(self) -> Optional[EpochOrder]:
        """Which example each training index reads: None, its own (fresh examples); a fixed set's epochs."""
        return None if self.cfg.train_examples is None else EpochOrder(self.seed, self.cfg.train_examples)

    def _examples(self, split: int, seq_len: int) -> TaskExamples:
        examples = TaskExamples(self.cfg, self.seed, split, seq_len + 1, self.tokenizer)
        examples(0)  # a task that does not fit the length fails here, in one line, not inside a data thread
        return examples

    def _batches(self, split: int, batch_size: int) -> grain.MapDataset:
        if batch_size % self.shard_count:
            raise ValueError(f"batch size {batch_size} is not divisible by the {self.shard_count} data shards")
        batches = TrainingBatches(self._examples(split, self.cfg.seq_len), batch_size, self.shard_index,
                                  batch_size // self.shard_count, order=self.training_order)
        return grain.MapDataset.range(2**62).batch(batch_size).map(batches)

    def train_iterator(self, batch_size: int) -> grain.DatasetIterator:
        return iter(self._batches(TRAIN, batch_size).to_iter_dataset(READ_OPTIONS))

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int],
                           min_doc_tokens: Optional[int] = None) -> dict[int, "TaskWindows"]:
        """The same first validation examples at each length: as many as ``budget`` tokens hold at the longest."""
        if min_doc_tokens is not None:
            raise ValueError("a minimum document length applies to text; a synthetic task's examples are not documents")
        if budget is None:
            raise ValueError("a synthetic task generates examples without end: give a token budget")
        n_examples = budget // max(lengths)
        if n_examples < 2:  # intervals resample blocks of examples: at least two
            raise ValueError(f"a budget of {budget} tokens holds fewer than 2 examples of length {max(lengths)}")
        return {length: TaskWindows(self._examples(VALIDATION, length), n_examples) for length in lengths}
