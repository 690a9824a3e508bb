"""Modular arithmetic, without and with brackets: the formal-language tasks of Deletang et al. (ICLR 2023, "Neural
Networks and the Chomsky Hierarchy") as Grazzi et al. (ICLR 2025, Table 3) score them, re-derived from the
papers' definitions.

The symbols are the residues ``0 .. modulus - 1``, then the operators ``+ - *`` and the brackets ``( )``
(``task_vocab`` = modulus + 5, the same for both tasks); ``=`` is the tokenizer's SEP. Values are taken modulo
``modulus``, with the usual precedence (``*`` before ``+`` and ``-``, left to right) and ``-d`` the negation.

- ``modular_arithmetic`` (without brackets, a regular language): residues and operators alternate, ``d op d op
  d ...``, each drawn uniformly (``operators`` names those drawn). Every prefix that ends on a residue is an
  expression of its own, so, as ``parity`` labels every prefix with its parity, the target at each residue is the
  value of the expression so far and the operators' positions are not scored: one sequence of T tokens holds an
  answer for every odd length up to T (a uniform string of the task at each length).
- ``modular_arithmetic_brackets`` (with brackets, a context-free language): one nested expression of ``n`` tokens,
  ``n`` uniform in ``min_length .. seq_len - 1``, then ``=``, whose target (the only one scored) is the
  expression's value; the positions after it are PAD. Deletang et al.'s grammar, by length: 1 ``d``, 2 ``-d``,
  3 ``(d)``, 4 ``(-d)``, and from 5 on ``(L op R)`` with L's length uniform in ``1 .. n - 4`` and R's the rest.
  The answer of an example at position p (1-based) is the answer for a string of p tokens (expression and
  ``=``), so a run's validation windows of T tokens hold strings of lengths uniform in ``min_length + 1 .. T``.

Examples are drawn from ``(seed, split, index)`` alone, as every synthetic task's (``lmzoo.data.synthetic``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmzoo.data.draws import RowDraws
from lmzoo.data.synthetic import TaskConfig, TaskTokenizer
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, positive

SIGNS = "+-*()"  # their tokens follow the residues, in this order


def symbols(modulus: int) -> str:
    """The characters of the task's tokens in id order (residues written as digits, for moduli up to 10)."""
    return "".join(str(d) for d in range(modulus)) + SIGNS


@dataclass
class ModularArithmeticBase(TaskConfig):
    """Settings both tasks share: the modulus, the operators drawn and the vocabulary they make."""

    modulus: int = 5  # Deletang et al.'s
    operators: str = "+-*"  # drawn uniformly at each operator position
    task_vocab: int = 10  # modulus + 5: residues, + - * ( )

    def check(self) -> None:
        super().check()
        if not 2 <= self.modulus <= 10:
            raise ConfigError(f"data.modulus={self.modulus} must be 2 to 10 (residues are written as single digits)")
        if not self.operators or set(self.operators) - set("+-*") or len(set(self.operators)) < len(self.operators):
            raise ConfigError(f"data.operators={self.operators!r} must name distinct operators among '+-*'")
        if self.task_vocab != self.modulus + len(SIGNS):
            raise ConfigError(f"data.task_vocab={self.task_vocab} must be {self.modulus + len(SIGNS)}: "
                              f"data.modulus={self.modulus} residues and the signs {SIGNS}")

    def token(self, sign: str) -> int:
        return self.modulus + SIGNS.index(sign)


@SOURCES.register("modular_arithmetic")
@dataclass
class ModularArithmeticConfig(ModularArithmeticBase):
    source: str = "modular_arithmetic"

    def labelled(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        inputs, targets, scored = self.labelled_rows(RowDraws(rng), length, tok)
        return inputs[0], targets[0], scored

    def labelled_rows(self, draws, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        positions = length - 1
        residues = draws.integers(0, self.modulus, (positions + 1) // 2)
        operators = np.array([self.token(s) for s in self.operators])[draws.integers(0, len(self.operators),
                                                                                     positions // 2)]
        inputs = np.empty((draws.rows, positions), np.int64)
        inputs[:, 0::2], inputs[:, 1::2] = residues, operators
        targets = np.full((draws.rows, positions), tok.pad_id, np.int64)
        targets[:, 0::2] = self.prefix_values(residues, operators)
        scored = np.zeros(positions, bool)
        scored[0::2] = True
        return inputs, targets, scored

    def prefix_values(self, residues: np.ndarray, operators: np.ndarray) -> np.ndarray:
        """[rows, residues]: the value of each expression up to and including each residue. The state is the sum of
        the finished terms and the current term (a product, carrying its sign): a finite automaton's state."""
        m = self.modulus
        finished, term = np.zeros(len(residues), np.int64), residues[:, 0] % m
        values = np.empty_like(residues)
        values[:, 0] = term
        for i in range(1, residues.shape[1]):
            op, residue = operators[:, i - 1], residues[:, i]
            times = op == self.token("*")
            finished = np.where(times, finished, (finished + term) % m)
            term = np.where(times, term * residue, np.where(op == self.token("-"), -residue, residue)) % m
            values[:, i] = (finished + term) % m
        return values


@SOURCES.register("modular_arithmetic_brackets")
@dataclass
class ModularArithmeticBracketsConfig(ModularArithmeticBase):
    source: str = "modular_arithmetic_brackets"
    min_length: int = 2  # the shortest expression drawn (Grazzi et al.'s training strings start at 3 with the =)

    def check(self) -> None:
        super().check()
        positive("data.min_length", self.min_length)
        if self.min_length >= self.seq_len:
            raise ConfigError(f"data.min_length={self.min_length} leaves no room for the = in data.seq_len="
                              f"{self.seq_len}")

    def labelled(self, rng: np.random.Generator, length: int, tok: TaskTokenizer) -> tuple[np.ndarray, ...]:
        positions = length - 1
        if positions <= self.min_length:
            raise ValueError(f"modular_arithmetic_brackets needs sequences longer than data.min_length="
                             f"{self.min_length} for the =; got {positions} tokens")
        n = int(rng.integers(self.min_length, positions))  # the expression's length: min_length .. positions - 1
        expression, value = self.expression(rng, n)
        inputs = np.full(positions, tok.pad_id, np.int64)
        inputs[:n], inputs[n] = expression, tok.sep_id
        targets = np.full(positions, tok.pad_id, np.int64)
        targets[n] = value
        scored = np.zeros(positions, bool)
        scored[n] = True
        return inputs, targets, scored

    def expression(self, rng: np.random.Generator, n: int) -> tuple[list[int], int]:
        """A random expression of exactly ``n`` tokens in Deletang et al.'s grammar, and its value."""
        m = self.modulus
        if n < 5:  # d, -d, (d), (-d)
            d = int(rng.integers(0, m))
            negated = n in (2, 4)
            core = [self.token("-"), d] if negated else [d]
            return ([self.token("("), *core, self.token(")")] if n > 2 else core), (-d if negated else d) % m
        left_n = int(rng.integers(1, n - 3))
        left, a = self.expression(rng, left_n)
        right, b = self.expression(rng, n - 3 - left_n)
        op = self.operators[int(rng.integers(0, len(self.operators)))]
        value = {"+": a + b, "-": a - b, "*": a * b}[op] % m
        return [self.token("("), *left, self.token(op), *right, self.token(")")], value
