"""Passkey retrieval (``data=passkey``): a number hidden in filler text, asked for at the end.

The single-needle case of the retrieval family (``lmzoo.data.retrieval``: one key, one value, one
query, sentence filler). One example of ``L`` tokens (``H = L - 2 * (digits + 1)`` of them filler)::

    filler[:p]  SEP d1 .. dk  filler[p:H]  SEP d1 .. dk
                `- needle --'              `- question, then the answer (scored)

SEP plays the phrase "the pass key is" of the literature (Mohtashami & Jaggi, 2023): it
introduces the number in the needle and asks for it at the end. The number is ``digits`` symbols
drawn from the first ``base`` task symbols; the filler is the other symbols in order,
``base, base + 1, ..., task_vocab - 1``, repeated: a fixed sentence, as the repeated "The grass is
green. The sky is blue." of the literature.

Why a fixed sentence rather than random noise: the filler then carries no information, so the
number is the only thing in the context to remember, and answering needs exactly one skill,
fetching it back over the distance to the question. Noise would add a second one (holding the
number against a stream of fresh symbols, a capacity test that ``selective_copy`` already is) and
would make a longer context differ from a training one in more than distance (the ``niah_*``
tasks offer ``data.filler=noise`` for that). Digits never occur in the filler, so the needle is
unambiguous, and the task is an induction task: at the second SEP, copy what followed the first
(a tiny model learns the first digit long before the others).

The default training length is short on purpose: retrieval is learnt much faster when the needle
competes with fewer filler tokens (per-digit validation accuracy of the default model after 600
steps: 0.90 at length 32, 0.71 at length 64), and the evaluation grid reaches 16 times further.

Depth is ``p / H``: 0 puts the needle first, 1 right before the question. Training draws ``p``
uniformly. The number of example ``i`` is drawn before its depth, so ``examples_at`` gives example
``i`` the same number at every length and depth: the cells of a depth x length grid differ only in
where the needle sits and how far it is from the question.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmzoo.data.retrieval import NeedleTask
from lmzoo.registry import SOURCES


@SOURCES.register("passkey")
@dataclass
class PasskeyConfig(NeedleTask):
    source: str = "passkey"
    seq_len: int = 32  # a short haystack: the default model learns the task on a CPU in minutes
    task_vocab: int = 16  # symbols 0 .. base - 1 are digits, the rest make the filler sentence
