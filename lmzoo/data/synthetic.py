"""Synthetic recall tasks, generated on the fly and deterministically from the seed.

Each example is a token sequence of ``seq_len + 1`` ids; ``inputs``/``targets`` are its two
shifted views and ``weights`` marks the target positions that are scored (the answers), so loss
and accuracy count only what the task asks. Example ``i`` of a split is a pure function of
``(seed, split, i)``: batches are reproducible and resumable by index alone. Each task registers
its spec (``data=<name>`` picks it), which draws one example (``example``):

- ``mqar`` (multi-query associative recall): ``num_pairs`` key-value pairs, then ``num_queries``
  keys drawn from them, each followed by its value (scored). Keys and values use disjoint halves
  of the ``task_vocab`` symbols; unused positions at the start are PAD.
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
from dataclasses import dataclass, field
from typing import Optional, Sequence

import grain
import numpy as np

from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, DataConfig, positive

TRAIN, VALIDATION = 0, 1


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


@dataclass
class TaskConfig(DataConfig):
    """Settings every synthetic task has; a task adds its own and how one example is drawn."""

    task_vocab: int = 64  # task symbols (mqar: half keys, half values)

    def check(self) -> None:
        super().check()
        positive("data.task_vocab", self.task_vocab)

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        """One sequence of ``length`` token ids and the mask of its scored positions."""
        raise NotImplementedError(f"{type(self).__name__} does not define example()")

    def labelled(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        """(inputs, targets, scored) of ``length - 1`` positions: by default a sequence from ``example``
        and its next tokens; a task whose targets are not the next inputs draws its own."""
        seq, scored = self.example(rng, length, tok)
        return seq[:-1], seq[1:], scored[1:]

    def build(self, *, seed: int, shard_index: int, shard_count: int) -> "TaskData":
        return TaskData(self, seed, shard_index, shard_count)


@SOURCES.register("mqar")
@dataclass
class MqarConfig(TaskConfig):
    source: str = "mqar"
    num_pairs: int = 8  # key-value pairs in the context
    num_queries: Optional[int] = None  # keys asked; None = num_pairs

    def check(self) -> None:
        super().check()
        positive("data.num_pairs", self.num_pairs)
        if self.num_queries is not None:
            positive("data.num_queries", self.num_queries)
        if self.num_pairs > self.task_vocab // 2:  # keys are distinct symbols from the first half
            raise ConfigError(f"data.num_pairs={self.num_pairs} distinct keys need data.task_vocab >= {2 * self.num_pairs}")

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        half = self.task_vocab // 2
        n_pairs = self.num_pairs
        n_queries = self.num_queries or n_pairs
        need = 2 * (n_pairs + n_queries)
        if need > length:
            raise ValueError(
                f"mqar needs {need} tokens for data.num_pairs={n_pairs} and {n_queries} queries; "
                f"data.seq_len + 1 = {length}"
            )
        keys = rng.choice(half, size=n_pairs, replace=False)
        values = rng.integers(half, 2 * half, size=n_pairs)
        asked = rng.choice(n_pairs, size=n_queries, replace=n_queries > n_pairs)
        body = np.concatenate([np.stack([keys, values], 1).ravel(), np.stack([keys[asked], values[asked]], 1).ravel()])
        seq = np.concatenate([np.full(length - need, tok.pad_id), body])
        scored = np.zeros(length, bool)
        scored[length - 2 * n_queries + 1 :: 2] = True  # the values that answer the queries
        return seq, scored


@SOURCES.register("induction")
@dataclass
class InductionConfig(TaskConfig):
    source: str = "induction"

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        half = length // 2
        prefix = rng.integers(0, self.task_vocab, size=half)
        seq = np.concatenate([np.full(length - 2 * half, tok.pad_id), prefix, prefix])
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

    def example(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, np.ndarray]:
        n = self.num_marked
        context = length - n - 1
        if context < n:
            raise ValueError(f"selective_copy needs data.seq_len + 1 >= {2 * n + 1} for data.num_marked={n}")
        symbols = rng.integers(0, self.task_vocab, size=n)
        noise = np.full(context, tok.noise_id)
        noise[np.sort(rng.choice(context, size=n, replace=False))] = symbols
        seq = np.concatenate([noise, [tok.sep_id], symbols])
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
            raise ConfigError(f"data.task_vocab={self.task_vocab} must be {order}, the order of the {self.source} group")

    def labelled(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        table = self.products()
        elements = rng.integers(0, len(table), size=length - 1)
        states = np.empty_like(elements)
        state = elements[0]
        for t, element in enumerate(elements):
            state = element if t == 0 else table[state, element]
            states[t] = state
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

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.split, int(index)])
        inputs, targets, scored = self.cfg.labelled(rng, self.length, self.tokenizer)
        return {
            "inputs": inputs.astype(np.int32),
            "targets": targets.astype(np.int32),
            "weights": scored.astype(np.float32),
        }


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
        rows = [self.examples(i) for i in indices]
        batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        batch["unit"] = np.repeat(np.asarray(indices)[:, None], self.length, axis=1)  # (rows, L)
        return batch

    def sampling_keys(self) -> dict:
        """The ``results.json`` keys that say what was scored: independent examples, each its own unit."""
        return {"sampling": "examples", "examples": self.units, "block_unit": "example"}


@dataclass(frozen=True, eq=False)
class TaskData:
    """The ``Data`` interface for synthetic tasks (bits per byte reads as bits per token here)."""

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
        settings = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "allow_changed"}  # how to resume, not what
        return {**settings, "seed": self.seed, "vocab_size": self.tokenizer.vocab_size}

    def _examples(self, split: int, seq_len: int) -> TaskExamples:
        examples = TaskExamples(self.cfg, self.seed, split, seq_len + 1, self.tokenizer)
        examples(0)  # a task that does not fit the length fails here, in one line, not inside a data thread
        return examples

    def _batches(self, split: int, batch_size: int) -> grain.MapDataset:
        if batch_size % self.shard_count:
            raise ValueError(f"batch size {batch_size} is not divisible by the {self.shard_count} data shards")
        rows = batch_size // self.shard_count
        examples = self._examples(split, self.cfg.seq_len)
        mine = slice(self.shard_index * rows, (self.shard_index + 1) * rows)  # this process's rows of each global batch

        def make_batch(indices: np.ndarray) -> dict[str, np.ndarray]:
            rows_ = [examples(i) for i in indices[mine]]
            return {k: np.stack([r[k] for r in rows_]) for k in rows_[0]}

        return grain.MapDataset.range(2**62).batch(batch_size).map(make_batch)

    def train_iterator(self, batch_size: int) -> grain.DatasetIterator:
        return iter(self._batches(TRAIN, batch_size).to_iter_dataset())

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int]) -> dict[int, "TaskWindows"]:
        """The same first validation examples at each length: as many as ``budget`` tokens hold at the longest."""
        if budget is None:
            raise ValueError("a synthetic task generates examples without end: give a token budget")
        n_examples = budget // max(lengths)
        if n_examples < 2:  # intervals resample blocks of examples: at least two
            raise ValueError(f"a budget of {budget} tokens holds fewer than 2 examples of length {max(lengths)}")
        return {length: TaskWindows(self._examples(VALIDATION, length), n_examples) for length in lengths}
