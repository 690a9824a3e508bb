"""numpy's ``default_rng([*key, index])`` draws for a batch of indices at once, bit for bit, in array arithmetic.

A synthetic example is drawn by a Generator of its own, seeded from its index (``lmzoo.data.synthetic``); making
one per example costs far more than the few integers it draws. ``BatchDraws`` computes the same draws for every
row of a batch together: numpy's SeedSequence hash and PCG64 seeding of each row's entropy, the row's 64-bit
outputs (the 128-bit LCG jumped ahead in closed form), split into 32-bit halves as ``next_uint32`` hands them
out, and bounded integers by Lemire's method as ``Generator.integers`` and ``Generator.choice`` make them (32-bit
ranges only). Where numpy would reject a draw and draw again (probability below range / 2**32 a draw) the row
is marked in ``redo``: its later draws differ from numpy's, so the caller remakes that row with a Generator
(``RowDraws``), as it does rows whose entropy does not fit one 32-bit word per entry. ``RowDraws`` offers the
same calls on a real Generator, so one task function serves both.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

# numpy.random.bit_generator's SeedSequence constants (pool of 4 words) and PCG64's multiplier
_POOL = 4
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = (2549297995355413924 << 64) | 4865540595714422341
_M32, _M64, _M128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1
_LARGE_POPULATION = 10000  # Generator.choice shuffles a whole population above this size, not by Floyd's method


class NotVectorised(Exception):
    """A draw ``BatchDraws`` does not make as numpy would (a range above 2**32, a tail-shuffled choice)."""


def _constants(first: int, multiplier: int, n: int) -> np.ndarray:
    """uint32 [n + 1]: the hash constant before each of ``n`` uses, and after the last (it is multiplied each use)."""
    values = [first]
    for _ in range(n):
        values.append(values[-1] * multiplier & _M32)
    return np.array(values, np.uint32)


def _hashmix(values: np.ndarray, constants: np.ndarray) -> np.ndarray:
    """SeedSequence's ``hashmix`` of each column of ``values`` with its own use of the running constant:
    ``constants`` [columns + 1]... as ``_constants`` gives them, column c using entries c and c + 1."""
    values = (values ^ constants[:-1]) * constants[1:]
    return values ^ (values >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
    return result ^ (result >> np.uint32(16))


def seed_words(entropy: np.ndarray) -> np.ndarray:
    """uint64 [rows, 4]: ``SeedSequence(row).generate_state(4, np.uint64)`` of each row of uint32 ``entropy``,
    computed for all rows together (numpy mixes the pool word by word; every use of its running hash constant
    is known beforehand, so the uses that do not depend on one another are made as one array operation)."""
    entropy = np.asarray(entropy, np.uint32)
    rows, width = entropy.shape
    uses = _POOL + _POOL * (_POOL - 1) + _POOL * max(0, width - _POOL)
    constants = _constants(_INIT_A, _MULT_A, uses)
    mixer = np.zeros((rows, _POOL), np.uint32)
    mixer[:, : min(width, _POOL)] = entropy[:, :_POOL]
    mixer = _hashmix(mixer, constants[: _POOL + 1])  # the entropy up to the pool size, then zeros
    used = _POOL
    for src in range(_POOL):  # every word mixed into every other, one source word at a time
        others = [dst for dst in range(_POOL) if dst != src]
        hashed = _hashmix(mixer[:, [src] * len(others)], constants[used : used + len(others) + 1])
        mixer[:, others] = _mix(mixer[:, others], hashed)
        used += len(others)
    for src in range(_POOL, width):  # entropy beyond the pool, mixed into every word
        mixer = _mix(mixer, _hashmix(entropy[:, [src] * _POOL], constants[used : used + _POOL + 1]))
        used += _POOL
    words = _hashmix(mixer[:, np.arange(2 * _POOL) % _POOL], _constants(_INIT_B, _MULT_B, 2 * _POOL)).astype(np.uint64)
    return words[:, 0::2] | (words[:, 1::2] << np.uint64(32))


def _mulhi64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The high 64 bits of the 128-bit products of uint64 arrays."""
    a0, a1, b0, b1 = a & np.uint64(_M32), a >> np.uint64(32), b & np.uint64(_M32), b >> np.uint64(32)
    low, cross1, cross2 = a0 * b0, a0 * b1, a1 * b0
    middle = (low >> np.uint64(32)) + (cross1 & np.uint64(_M32)) + (cross2 & np.uint64(_M32))
    return a1 * b1 + (cross1 >> np.uint64(32)) + (cross2 >> np.uint64(32)) + (middle >> np.uint64(32))


def _mul128(ah, al, bh, bl):
    return ah * bl + al * bh + _mulhi64(al, bl), al * bl


def _add128(ah, al, bh, bl):
    low = al + bl
    return ah + bh + (low < al).astype(np.uint64), low


def _split(values: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([v >> 64 for v in values], np.uint64), np.array([v & _M64 for v in values], np.uint64))


@functools.cache
def _jumps(steps: int) -> tuple[np.ndarray, ...]:
    """(M^k, 1 + M + ... + M^(k-1)) mod 2**128 for k = 1 .. ``steps``, each as (high, low) uint64 halves: the LCG's
    state after k steps is M^k state + (that sum) inc."""
    powers, sums, power, total = [], [], 1, 0
    for _ in range(steps):
        total = (total + power) & _M128
        power = power * _PCG_MULT & _M128
        powers.append(power)
        sums.append(total)
    return (*_split(powers), *_split(sums))


def pcg64_outputs(seeds: np.ndarray, stop: int, start: int = 0) -> np.ndarray:
    """uint64 [rows, stop - start]: outputs ``start`` .. ``stop - 1`` of ``PCG64`` seeded with each row of
    ``seed_words``."""
    with np.errstate(over="ignore"):
        init_h, init_l, seq_h, seq_l = (seeds[:, i : i + 1] for i in range(4))
        inc_h = (seq_h << np.uint64(1)) | (seq_l >> np.uint64(63))
        inc_l = (seq_l << np.uint64(1)) | np.uint64(1)
        state = _add128(inc_h, inc_l, init_h, init_l)  # one step from state 0 gives inc, then the seed is added
        state = _add128(*_mul128(*state, np.uint64(_PCG_MULT >> 64), np.uint64(_PCG_MULT & _M64)), inc_h, inc_l)
        power_h, power_l, sum_h, sum_l = (jump[start:stop] for jump in _jumps(stop))
        high, low = _add128(*_mul128(*state, power_h, power_l), *_mul128(inc_h, inc_l, sum_h, sum_l))
        xored, rotation = high ^ low, high >> np.uint64(58)  # XSL-RR output
        return (xored >> rotation) | (xored << ((np.uint64(64) - rotation) & np.uint64(63)))


class BatchDraws:
    """The draws of ``default_rng([*key, index])`` for each of ``indices``, row by row, made together.

    Calls return int64 [rows, size]; ``redo`` [rows] marks the rows whose draws are not numpy's from some call
    on (and from the start, rows whose entropy needs more than one 32-bit word an entry)."""

    def __init__(self, key: Sequence[int], indices: np.ndarray, words: int = 0):
        indices = np.asarray(indices, np.int64)
        self.rows = len(indices)
        fits = all(0 <= k <= _M32 for k in key)
        self.redo = (indices < 0) | (indices > _M32) | (not fits)
        entropy = np.empty((self.rows, len(key) + 1), np.uint32)
        entropy[:, : len(key)] = [k & _M32 for k in key]
        entropy[:, -1] = indices & _M32
        self.seeds = seed_words(entropy)
        self.words = np.zeros((self.rows, 0), np.uint32)  # the 32-bit draws made so far, in next_uint32's order
        self.used = 0  # the draws handed out so far (each row's, when no row was redrawn)
        self._make_words(words)  # as many as the caller expects to use (more are made when asked for)

    def _make_words(self, n: int) -> None:
        have, need = self.words.shape[1] // 2, (n + 1) // 2  # 64-bit outputs, each two 32-bit draws, low half first
        if need > have:
            outputs = pcg64_outputs(self.seeds, need, have)
            halves = np.stack([outputs & np.uint64(_M32), outputs >> np.uint64(32)], axis=2)
            self.words = np.concatenate([self.words, halves.reshape(self.rows, -1).astype(np.uint32)], axis=1)

    def _next_words(self, n: int) -> np.ndarray:
        self._make_words(self.used + n)
        words = self.words[:, self.used : self.used + n]
        self.used += n
        return words

    def bounded(self, highs: Sequence[int]) -> np.ndarray:
        """Column c: a draw from [0, highs[c]) as ``random_bounded_uint64`` makes it (a range of one draws nothing)."""
        highs = np.asarray(highs, np.int64)
        if highs.min(initial=1) < 1 or highs.max(initial=1) > 1 << 32:
            raise NotVectorised("a bounded draw outside 1 .. 2**32")
        drawn = highs > 1
        out = np.zeros((self.rows, len(highs)), np.int64)
        if drawn.any():
            span = highs[drawn].astype(np.uint64)
            scaled = self._next_words(int(drawn.sum())).astype(np.uint64) * span
            threshold = (np.uint64(1 << 32) - span) % span  # numpy draws again below it
            self.redo |= ((scaled & np.uint64(_M32)) < threshold).any(axis=1)
            out[:, drawn] = (scaled >> np.uint64(32)).astype(np.int64)
        return out

    def integers(self, low: int, high: int, size: int) -> np.ndarray:
        """``Generator.integers(low, high, size)``."""
        return low + self.bounded(np.full(size, high - low))

    def choice(self, population: int, size: int) -> np.ndarray:
        """``Generator.choice(population, size, replace=False)``: Floyd's sample, then shuffled."""
        if population > _LARGE_POPULATION and size > population // 50:
            raise NotVectorised("a choice numpy makes by shuffling the whole population")
        tops = np.arange(population - size, population)
        drawn = self.bounded(tops + 1)
        chosen = np.empty((self.rows, size), np.int64)
        for t, top in enumerate(tops):  # Floyd: a value already taken is replaced by the top of the range
            taken = (chosen[:, :t] == drawn[:, t : t + 1]).any(axis=1)
            chosen[:, t] = np.where(taken, top, drawn[:, t])
        self.shuffle(chosen)
        return chosen

    def shuffle(self, values: np.ndarray) -> None:
        """Shuffles each row of ``values`` in place as numpy's ``_shuffle_int`` does (from the last position down)."""
        last = values.shape[1] - 1
        if last < 1:
            return
        swaps = self.bounded(np.arange(last, 0, -1) + 1)
        rows = np.arange(self.rows)
        for t, i in enumerate(range(last, 0, -1)):
            other = swaps[:, t]
            held = values[rows, other]
            values[rows, other] = values[:, i]
            values[:, i] = held


class RowDraws:
    """``BatchDraws``'s calls made by one real Generator, as a batch of one row."""

    rows = 1

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integers(self, low: int, high: int, size: int) -> np.ndarray:
        return self.rng.integers(low, high, size=size)[None]

    def choice(self, population: int, size: int) -> np.ndarray:
        return self.rng.choice(population, size=size, replace=False)[None]
