"""The RULER tasks beyond one needle (``data=niah_multikey`` etc.); the family is described in ``lmzoo.data.retrieval``.

- ``niah_multikey``: ``num_keys`` needles ``SEP key d1..dk`` under distinct keys; one key is asked
  (``SEP key`` -> its number). The other needles are distractors: retrieval has to match the key.
- ``niah_multivalue``: one key files ``num_values`` numbers; the question (``SEP``: a lone key is not
  named) is answered by all of them, in the order they appear.
- ``niah_multiquery``: ``num_queries`` of the ``num_keys`` keys asked one after another
  (``SEP key d1..dk SEP key' d1'..dk' ...``).
- ``variable_tracking``: ``num_chains`` chains of assignments ``X1 = value, X2 = X1, ..., Xn = Xn-1``
  (``n = hops + 1``), each written ``SEP X1 d1..dk``, ``SEP X2 X1``, ... in chain order among the
  filler, every chain holding a different value. The question ``SEP d1..dk`` names the first
  chain's value and is answered by its variables ``X1 X2 .. Xn``. Of RULER's two forms (which
  variables hold the value, or the value of the last one) this one scores per answer token: each
  answer token is one hop, the assignment whose right side is the token before it (the value, then
  each variable in turn), where asking for the value of ``Xn`` would put all ``n`` hops before the
  first scored token.

The three ``niah_*`` tasks are one spec with other defaults, so settings combine (several keys,
values and queries at once); each takes ``data.filler=noise`` for a filler of fresh symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import ClassVar

import numpy as np

from lmzoo.data.retrieval import NeedleTask, RetrievalTask, answer_positions, lay_out, uniform_positions, with_questions
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, positive


@dataclass
class NiahConfig(NeedleTask):
    """Needles filed under keys, every count a setting (see ``NeedleTask``)."""

    seq_len: int = 64
    task_vocab: int = 24  # digits, then key_vocab key symbols (with several keys), the rest make the filler
    digits: int = 3
    num_keys: int = 1  # keys filing numbers; the needles of keys not asked are distractors
    num_values: int = 1  # numbers filed under each key: all are asked, in the order they appear
    num_queries: int = 1  # keys asked, one after another
    key_vocab: int = 8  # symbols keys are drawn from (used only with several keys)
    filler: str = "sentence"  # sentence: the filler symbols in order, repeated; noise: drawn uniformly

    depth_label: ClassVar[str] = "depth of the first needle asked for"


def niah_task(class_name: str, source: str, **counts: int) -> type[NiahConfig]:
    """``NiahConfig`` registered as ``source`` with other default ``counts``: the ``niah_*`` tasks differ
    in nothing else."""
    fields = [("source", str, field(default=source)), *((key, int, field(default=n)) for key, n in counts.items())]
    spec = make_dataclass(class_name, fields, bases=(NiahConfig,))
    spec.__module__ = __name__  # importable (and picklable) under its name here
    return SOURCES.register(source)(spec)


MultiKeyConfig = niah_task("MultiKeyConfig", "niah_multikey", num_keys=4)
MultiValueConfig = niah_task("MultiValueConfig", "niah_multivalue", num_values=4)
MultiQueryConfig = niah_task("MultiQueryConfig", "niah_multiquery", num_keys=4, num_queries=4)


@SOURCES.register("variable_tracking")
@dataclass
class VariableTrackingConfig(RetrievalTask):
    source: str = "variable_tracking"
    seq_len: int = 64
    task_vocab: int = 32  # digits, then var_vocab variable names, the rest make the filler
    digits: int = 3
    hops: int = 4  # assignments after the first: a chain names hops + 1 variables
    num_chains: int = 1  # chains in the haystack, each holding its own value; the first is asked for
    var_vocab: int = 16  # symbols variable names are drawn from
    filler: str = "sentence"  # sentence: the filler symbols in order, repeated; noise: drawn uniformly

    depth_label: ClassVar[str] = "depth of the chain's first assignment"

    def check(self) -> None:
        positive("data.hops", self.hops, allow_zero=True)
        positive("data.num_chains", self.num_chains)
        if self.var_vocab < self.num_chains * self.chain_length:
            raise ConfigError(f"data.var_vocab={self.var_vocab} is too small for data.num_chains={self.num_chains} "
                              f"chains of data.hops + 1 = {self.chain_length} distinct variables")
        if self.base >= 2 and self.digits > 0:  # otherwise super().check() refuses them
            self.check_values(self.base**self.digits)
        super().check()

    def check_values(self, count: int) -> None:
        """The ``count`` = base**digits numbers the digits write: enough for a different one per chain,
        and few enough to draw as int64."""
        if count >= 2**62:
            raise ConfigError(f"data.digits={self.digits} is too many for variable_tracking: values are drawn as "
                              f"integers below 2**62 (data.base**data.digits = {count})")
        if count < self.num_chains:
            raise ConfigError(f"data.base={self.base} and data.digits={self.digits} write fewer values than "
                              f"data.num_chains={self.num_chains}: each chain holds a different value")

    @property
    def chain_length(self) -> int:
        return self.hops + 1

    def reserved_symbols(self) -> dict[str, int]:
        return {"data.base": self.base, "data.var_vocab": self.var_vocab}

    def length_settings(self) -> dict[str, int]:
        return {"data.digits": self.digits, "data.hops": self.hops, "data.num_chains": self.num_chains}

    @property
    def min_length(self) -> int:
        chain = (2 + self.digits) + 3 * self.hops  # SEP X1 d1..dk, then SEP Xi Xi-1 per hop
        return self.num_chains * chain + (1 + self.digits) + self.answer_tokens

    @property
    def answer_tokens(self) -> int:
        return self.chain_length

    @property
    def chance(self) -> float:
        return 1 / self.var_vocab

    def draw(self, rng, length, tok, depth):
        values = rng.choice(self.base**self.digits, size=self.num_chains, replace=False)
        numbers = values[:, None] // self.base ** np.arange(self.digits - 1, -1, -1) % self.base  # (chains, digits)
        names = self.base + rng.choice(self.var_vocab, size=(self.num_chains, self.chain_length), replace=False)
        needles = []
        for number, chain in zip(numbers, names):
            needles.append(np.concatenate([[tok.sep_id, chain[0]], number]))
            needles += [np.array([tok.sep_id, later, earlier]) for earlier, later in zip(chain, chain[1:])]
        n_filler = length - self.min_length
        asked = np.sort(answer_positions(rng, n_filler, self.chain_length, depth))  # in order: a chain reads forward
        others = [np.sort(uniform_positions(rng, n_filler, self.chain_length)) for _ in range(self.num_chains - 1)]
        haystack, _ = lay_out(self.draw_filler(rng, n_filler), needles, np.concatenate([asked, *others]))
        return with_questions(haystack, [([tok.sep_id, *numbers[0]], names[0])])
