"""The six MAD tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures", section 3 and
appendix), each drawn from its definition, with MAD's sizes and difficulty settings (docs/yardsticks.md).

An example is a pure function of a NumPy Generator and the task's settings. MAD's ``seq_len`` counts the tokens
of an instance; a model sees ``seq_len - 1`` positions of the recall and memorization tasks (the instance and its
next tokens) and ``seq_len`` of copying and compression (targets beside the inputs). Every generator returns
``Example(inputs, targets, scored)``, three arrays of one length: ``scored`` marks the positions MAD's accuracy
counts; elsewhere ``targets`` is the next input (MAD trains its recall tasks on every next token;
``data.train_targets=next_tokens`` does so) or ``IGNORED``. Token ids follow MAD's layout: the special tokens are
the last ids of ``vocab_size``.

- ``in_context_recall``: ``seq_len // 2`` slots of (key, value); keys from the first half of the symbols, values
  from the second, one mapping per sequence; a value is scored whenever its key appeared before (multi-query);
  the last slot repeats a key already seen. With ``frac_noise`` > 0 (``noisy_recall``) each slot but one and the
  last is, with that probability, two tokens of a separate noise vocabulary (the last ``noise_vocab_size``
  symbols), never scored.
- ``fuzzy_recall``: keys and values are motifs of 1 .. ``k_motif_size`` / ``v_motif_size`` distinct adjacent
  tokens, paired per sequence; a value's tokens are scored when its key appeared before; left-padded (the last
  id); in MAD's test split (``test=True``; ``data.eval_keys=largest`` evaluates on it) every key has the largest
  motif size (MAD's choice: the hardest grouping), values any size.
- ``selective_copying``: ``num_tokens_to_copy`` symbols scattered in order among blanks, then a copy token and
  as many blanks; the answer at each of those blanks is the next symbol, in order (the inputs never show it).
- ``compression``: ``seq_len - 1`` random symbols and a compression token; the target is the whole input,
  to be recovered from the compression token's representation alone (MAD's encoder-decoder backbone).
- ``memorization``: ``seq_len // 2`` slots of (key, insert token); the answer at the insert token is the key's
  value under one mapping fixed for the whole task (a bijection from keys to values drawn from ``map_seed``).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from lmzoo.data.synthetic import TRAIN, VALIDATION, TaskConfig, added_setting
from lmzoo.registry import SOURCES
from lmzoo.schema import LAST_STATE, PER_POSITION, ConfigError, one_of

IGNORED = -1  # a target no accuracy or loss counts


class Example(NamedTuple):
    inputs: np.ndarray  # int [n]
    targets: np.ndarray  # int [n]
    scored: np.ndarray  # bool [n]


def _next_tokens(tokens: list[int], scored: list[bool]) -> Example:
    """An instance as a model sees it: every token but the last, each position's target its next token."""
    tokens = np.asarray(tokens, np.int64)
    return Example(tokens[:-1], tokens[1:], np.asarray(scored[1:], bool))


def recall_vocab(vocab_size: int, noise_vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, values, noise): the symbols split in halves, the noise vocabulary after them."""
    symbols = vocab_size - noise_vocab_size
    if symbols < 2:
        raise ValueError(f"vocab_size={vocab_size} leaves no key and value symbols beside "
                         f"noise_vocab_size={noise_vocab_size}")
    return np.arange(symbols // 2), np.arange(symbols // 2, 2 * (symbols // 2)), np.arange(symbols, vocab_size)


def in_context_recall(rng: np.random.Generator, *, vocab_size: int = 16, seq_len: int = 128,
                      noise_vocab_size: int = 0, frac_noise: float = 0.0) -> Example:
    if seq_len % 2 or not 0 <= frac_noise < 1 or (frac_noise > 0) != (noise_vocab_size > 0):
        raise ValueError(f"in-context recall needs an even seq_len (got {seq_len}), 0 <= frac_noise < 1 "
                         f"(got {frac_noise}) and a noise vocabulary exactly when there is noise")
    keys, values, noise = recall_vocab(vocab_size, noise_vocab_size)
    mapping = dict(zip(keys.tolist(), rng.choice(values, size=len(keys)).tolist()))
    slots = seq_len // 2
    always_pair = rng.integers(slots - 1)  # at least one pair before the probe, whatever the noise
    tokens, scored, seen = [], [], set()
    for slot in range(slots - 1):
        if slot != always_pair and rng.random() < frac_noise:
            tokens += rng.choice(noise, size=2).tolist()
            scored += [False, False]
            continue
        key = int(rng.choice(keys))
        tokens += [key, mapping[key]]
        scored += [False, key in seen]
        seen.add(key)
    probe = int(rng.choice(sorted(seen)))
    tokens += [probe, mapping[probe]]
    scored += [False, True]
    return _next_tokens(tokens, scored)


def noisy_recall(rng: np.random.Generator, *, vocab_size: int = 32, seq_len: int = 128, noise_vocab_size: int = 16,
                 frac_noise: float = 0.2) -> Example:
    return in_context_recall(rng, vocab_size=vocab_size, seq_len=seq_len, noise_vocab_size=noise_vocab_size,
                             frac_noise=frac_noise)


def motif(rng: np.random.Generator, vocab: np.ndarray, size: int) -> tuple[int, ...]:
    return tuple(rng.choice(vocab, size=size, replace=False).tolist())


def fuzzy_recall(rng: np.random.Generator, *, vocab_size: int = 16, seq_len: int = 128, k_motif_size: int = 3,
                 v_motif_size: int = 3, test: bool = False) -> Example:
    pad = vocab_size - 1
    keys, values, _ = recall_vocab(vocab_size - 1, 0)
    if min(len(keys), len(values)) < max(k_motif_size, v_motif_size):
        raise ValueError(f"vocab_size={vocab_size} has too few symbols for motifs of {k_motif_size} and "
                         f"{v_motif_size} distinct tokens")
    key_size = lambda: k_motif_size if test else int(rng.integers(1, k_motif_size + 1))  # noqa: E731
    longest_pair = k_motif_size + v_motif_size
    mapping, tokens, scored = {}, [], []
    while len(tokens) + 2 * longest_pair <= seq_len:  # room left for this pair and the final probe
        key = motif(rng, keys, key_size())
        seen = key in mapping
        value = mapping.setdefault(key, motif(rng, values, int(rng.integers(1, v_motif_size + 1))))
        tokens += [*key, *value]
        scored += [False] * len(key) + [seen] * len(value)
    probe = list(mapping)[int(rng.integers(len(mapping)))]
    tokens += [*probe, *mapping[probe]]
    scored += [False] * len(probe) + [True] * len(mapping[probe])
    fill = seq_len - len(tokens)
    return _next_tokens([pad] * fill + tokens, [False] * fill + scored)


def selective_copying(rng: np.random.Generator, *, vocab_size: int = 16, seq_len: int = 256,
                      num_tokens_to_copy: int = 16) -> Example:
    n = num_tokens_to_copy
    blank, copy = vocab_size - 2, vocab_size - 1
    blanks = seq_len - 2 * n - 1
    if blanks < 1:
        raise ValueError(f"selective copying needs seq_len > 2 * num_tokens_to_copy + 1 (got {seq_len}, {n})")
    symbols = rng.integers(0, vocab_size - 2, size=n)
    context = np.full(blanks + n, blank)
    context[np.sort(rng.choice(blanks + n, size=n, replace=False))] = symbols  # in their order of occurrence
    inputs = np.concatenate([context, [copy], np.full(n, blank)])
    targets = np.concatenate([np.full(blanks + n + 1, IGNORED), symbols])
    return Example(inputs, targets, targets != IGNORED)


def compression(rng: np.random.Generator, *, vocab_size: int = 16, seq_len: int = 32) -> Example:
    compress = vocab_size - 1
    inputs = np.concatenate([rng.integers(0, vocab_size - 1, size=seq_len - 1), [compress]])
    scored = np.ones(seq_len, bool)
    scored[-1] = False
    return Example(inputs, np.where(scored, inputs, IGNORED), scored)


def memorization_map(vocab_size: int, map_seed: int = 0) -> dict[int, int]:
    """The task's fixed facts: a bijection from the keys (first half of the symbols) to the values."""
    keys, values, _ = recall_vocab(vocab_size - 1, 0)
    return dict(zip(keys.tolist(), np.random.default_rng(map_seed).permutation(values).tolist()))


def memorization(rng: np.random.Generator, *, vocab_size: int = 256, seq_len: int = 32,
                 facts: dict[int, int] | None = None, map_seed: int = 0) -> Example:
    insert = vocab_size - 1
    facts = facts if facts is not None else memorization_map(vocab_size, map_seed)
    keys = rng.choice(np.fromiter(facts, int), size=seq_len // 2)
    inputs = np.stack([keys, np.full_like(keys, insert)], 1).reshape(-1)
    targets = np.stack([np.full_like(keys, IGNORED), [facts[int(k)] for k in keys]], 1).reshape(-1)
    return Example(inputs, targets, targets != IGNORED)


GENERATORS: dict[str, Callable[..., Example]] = {
    "in_context_recall": in_context_recall, "fuzzy_recall": fuzzy_recall, "noisy_recall": noisy_recall,
    "selective_copying": selective_copying, "compression": compression, "memorization": memorization,
}


@dataclass(frozen=True)
class Protocol:
    """One task's MAD settings: the baseline, and the changes that each vary one setting from it."""

    baseline: dict
    changes: dict

    def settings(self) -> list[dict]:
        """The difficulty settings MAD averages over: the baseline, then each change alone."""
        return [dict(self.baseline)] + [{**self.baseline, key: value}
                                        for key, values in self.changes.items() for value in values]


TRAIN_SIZES = [6400, 3200, 1600, 800]
PROTOCOL = {  # MAD's task settings (the released task configuration of Poli et al. 2024; docs/yardsticks.md)
    "in_context_recall": Protocol({"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800},
                                  {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024],
                                   "num_train_examples": TRAIN_SIZES}),
    "fuzzy_recall": Protocol({"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "k_motif_size": 3,
                              "v_motif_size": 3},
                             {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024],
                              "num_train_examples": TRAIN_SIZES}),
    "noisy_recall": Protocol({"vocab_size": 32, "noise_vocab_size": 16, "seq_len": 128, "num_train_examples": 12800,
                              "frac_noise": 0.2},
                             {"vocab_size": [48, 80, 144], "seq_len": [256, 512, 1024],
                              "num_train_examples": TRAIN_SIZES, "frac_noise": [0.4, 0.6, 0.8]}),
    "selective_copying": Protocol({"vocab_size": 16, "seq_len": 256, "num_tokens_to_copy": 16,
                                   "num_train_examples": 12800},
                                  {"vocab_size": [32, 64, 128], "seq_len": [512, 1024],
                                   "num_train_examples": TRAIN_SIZES, "num_tokens_to_copy": [32, 64, 96]}),
    "compression": Protocol({"vocab_size": 16, "seq_len": 32, "num_train_examples": 12800},
                            {"vocab_size": [32, 64, 128], "seq_len": [64, 128, 256],
                             "num_train_examples": TRAIN_SIZES}),
    "memorization": Protocol({"vocab_size": 256, "seq_len": 32, "num_train_examples": 256},
                             {"vocab_size": [512, 1024, 2048, 4096, 8192]}),
}
TEST_EXAMPLES = 1280  # per setting, drawn apart from the training set
TRAINING = {"batch_size": 128, "epochs": 200, "optimizer": "adamw", "schedule": "cosine to 1e-6", "width": 128,
            "lrs": [1e-4, 5e-4, 1e-3], "weight_decays": [0.0, 0.1]}  # a setting's score: its best (lr, wd)


def draw(task: str, rng: np.random.Generator, **settings) -> Example:
    """One example of ``task`` at ``settings`` (``num_train_examples``, a size of the training set, is ignored)."""
    if task not in GENERATORS:
        raise ValueError(f"MAD task {task!r} is not one of {', '.join(GENERATORS)}")
    settings = {k: v for k, v in settings.items() if k != "num_train_examples"}
    return GENERATORS[task](rng, **settings)


def dataset(task: str, count: int, *, seed: int, **settings) -> Example:
    """``count`` examples stacked (every example of a task's setting has one length); example ``i`` is drawn
    from ``default_rng([seed, i])``, so a training set of N examples is the first N of its seed."""
    rows = [draw(task, np.random.default_rng([seed, i]), **settings) for i in range(count)]
    return Example(*(np.stack([getattr(r, f) for r in rows]) for f in Example._fields))


# ----------------------------------------------------------------------------- as a data source of the trainer

NEXT_TOKEN_TASKS = ("in_context_recall", "noisy_recall", "fuzzy_recall")  # a model sees an instance's next tokens
EVEN_TASKS = ("in_context_recall", "noisy_recall", "memorization")  # instances of two-token slots
LAST_STATE_TASKS = ("compression",)  # decoded from the last position's state alone (MAD's encoder-decoder backbone)


@functools.lru_cache(maxsize=8)
def _facts(vocab_size: int, map_seed: int) -> tuple[tuple[int, int], ...]:
    return tuple(memorization_map(vocab_size, map_seed).items())


TRAIN_TARGETS = ("scored", "next_tokens")  # data.train_targets: what the training loss counts
EVAL_KEYS = ("any_size", "largest")  # data.eval_keys: fuzzy recall's evaluation keys


@SOURCES.register("mad")
@dataclass
class MadConfig(TaskConfig):
    """``data=mad data.task=<task>``: one MAD task as a stream of examples (``task_vocab`` is MAD's
    ``vocab_size``, special tokens included). The accuracy counts the positions MAD scores, and so does the loss
    unless ``train_targets=next_tokens``. Odd lengths of the two-token-slot tasks get one unscored PAD in front.
    Compression is read out from the last position's state (``readout``), as MAD decodes it from the compression
    token alone."""

    source: str = "mad"
    task: str = "in_context_recall"
    task_vocab: int = 16
    noise_vocab_size: int = 16  # noisy_recall only
    frac_noise: float = 0.2  # noisy_recall only
    k_motif_size: int = 3  # fuzzy_recall only
    v_motif_size: int = 3
    num_tokens_to_copy: int = 16  # selective_copying only
    map_seed: int = 0  # memorization: the fixed facts
    # What the training loss counts: the scored positions, or every next token of the instance (MAD trains its
    # recall tasks so: the model also learns to predict keys, values seen once and noise); the evaluation scores
    # the scored positions either way
    train_targets: str = added_setting("scored")
    # fuzzy_recall's evaluation keys: motifs of any size, as in training, or all of the largest size (MAD's test
    # split prompts at the hardest grouping)
    eval_keys: str = added_setting("any_size")

    def check(self) -> None:
        super().check()
        one_of("data.task", self.task, tuple(GENERATORS))
        one_of("data.train_targets", self.train_targets, TRAIN_TARGETS)
        one_of("data.eval_keys", self.eval_keys, EVAL_KEYS)
        if self.train_targets == "next_tokens" and self.task not in NEXT_TOKEN_TASKS:
            raise ConfigError(f"data.train_targets='next_tokens' is for MAD's recall tasks "
                              f"({', '.join(NEXT_TOKEN_TASKS)}); MAD trains {self.task} on its scored positions "
                              "(data.train_targets=scored)")
        if self.eval_keys == "largest" and self.task != "fuzzy_recall":
            raise ConfigError(f"data.eval_keys='largest' is for fuzzy_recall (motif keys); data.task={self.task!r} "
                              "has single-token keys (data.eval_keys=any_size)")

    def readout(self) -> str:
        """Compression's targets are its own inputs: each is read off the last position's state, as MAD's
        encoder-decoder backbone reads them, not off its own position (which would copy it)."""
        return LAST_STATE if self.task in LAST_STATE_TASKS else PER_POSITION

    def task_settings(self) -> dict:
        wanted = inspect.signature(GENERATORS[self.task]).parameters
        settings = {"vocab_size": self.task_vocab, "noise_vocab_size": self.noise_vocab_size,
                    "frac_noise": self.frac_noise, "k_motif_size": self.k_motif_size,
                    "v_motif_size": self.v_motif_size, "num_tokens_to_copy": self.num_tokens_to_copy}
        if self.task != "noisy_recall":  # in-context recall is noisy recall without noise
            settings = {k: v for k, v in settings.items() if k not in ("noise_vocab_size", "frac_noise")}
        if self.task == "memorization":
            settings["facts"] = dict(_facts(self.task_vocab, self.map_seed))
        return {k: v for k, v in settings.items() if k in wanted}

    def split_settings(self, split: int) -> dict:
        """The generator's settings for an example of ``split``: fuzzy recall's evaluation examples are MAD's test
        split where ``eval_keys=largest``."""
        test = split == VALIDATION and self.eval_keys == "largest"
        return {**self.task_settings(), **({"test": True} if test else {})}

    def labelled_in(self, split: int, rng: np.random.Generator, length: int, tok) -> tuple[np.ndarray, ...]:
        size = length if self.task in NEXT_TOKEN_TASKS else length - 1  # MAD's seq_len: the instance's tokens
        pad = size % 2 if self.task in EVEN_TASKS else 0
        ex = draw(self.task, rng, seq_len=size - pad, **self.split_settings(split))
        # a recall instance's targets are its next tokens: trained on all of them where train_targets says so
        trained = np.ones_like(ex.scored) if split == TRAIN and self.train_targets == "next_tokens" else ex.scored
        front = lambda array, value: np.concatenate([np.full(pad, value, array.dtype), array])  # noqa: E731
        targets = front(ex.targets, IGNORED)
        return front(ex.inputs, tok.pad_id), np.where(targets == IGNORED, tok.pad_id, targets), front(trained, False)
