"""What a model that did not learn context scores: n-gram bits per byte, counted on the training text and scored
on the validation targets an evaluation scores, the bound below which a "learned the text" control passes.

A control that only asks for bpb below 4 passes every model that has not diverged: byte frequencies alone
(a unigram) score about 4.4 bits per byte on the stdlib text. The bound that rules out "learned nothing of
context" is the bpb of a bigram: the next byte from the previous one. Both are counted here, with a trigram for
scale, on the training split of the run's data, and scored on exactly the targets ``lmzoo.eval`` scores for the
same lengths and budget (``Data.validation_windows``; ``scored_digest`` says which, as an evaluation's
``results.json`` does). Higher orders back off to lower ones by Witten-Bell interpolation (no setting to tune on
the validation text); the unigram is add-one.

    python -m lmzoo.experiments.ngram docs/claims/decode_cache/verdict.json ...   # add them to committed evidence
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

ORDERS = ("unigram", "bigram", "trigram")


def interpolated(counts: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Witten-Bell: ``P(x | h) = (c(h, x) + t(h) P_lower(x)) / (c(h) + t(h))``, ``t(h)`` the distinct followers of
    ``h``; ``counts`` [H, V] over contexts ``h``, ``lower`` [H, V] (or [V]) the lower order's probabilities."""
    seen = counts.sum(-1, keepdims=True)
    followers = (counts > 0).sum(-1, keepdims=True)
    weight = np.where(seen > 0, followers, 1.0)  # an unseen context: the lower order alone
    return (counts + weight * lower) / (seen + weight)


def probabilities(train: np.ndarray, vocab: int) -> list[np.ndarray]:
    """The unigram [V], bigram [V, V] and trigram [V, V, V] tables of ``train`` (token ids below ``vocab``)."""
    train = train.astype(np.int64)
    unigram = (np.bincount(train, minlength=vocab) + 1.0) / (len(train) + vocab)
    pairs = np.bincount(train[:-1] * vocab + train[1:], minlength=vocab**2).reshape(vocab, vocab).astype(float)
    bigram = interpolated(pairs, unigram)
    triples = np.bincount((train[:-2] * vocab + train[1:-1]) * vocab + train[2:], minlength=vocab**3)
    trigram = interpolated(triples.reshape(vocab * vocab, vocab).astype(float), bigram[np.arange(vocab**2) % vocab])
    return [unigram, bigram, trigram.reshape(vocab, vocab, vocab)]


def scored_targets(data, lengths: list[int], budget: int, min_doc_tokens: int | None) -> tuple[np.ndarray, str]:
    """The stream positions of the targets an evaluation at ``lengths`` with ``budget`` targets (and
    ``eval.min_doc_tokens``) scores, and their digest (``lmzoo.data.validation_spans.spread_spans``; target ``t``
    is stream token ``t + 1``)."""
    spans = data.validation_windows(lengths, budget, min_doc_tokens)[lengths[0]].spans
    return (spans.starts[:, None] + np.arange(spans.length)).ravel() + 1, spans.digest


def context_free_bpb(data, lengths: list[int], budget: int, min_doc_tokens: int | None = None) -> dict:
    """``{"unigram", "bigram", "trigram"}`` bits per byte of ``data``'s n-grams on the scored validation targets,
    with what they were scored on; ``data`` a ``lmzoo.data.TextData``, the rest as the evaluation's settings."""
    vocab = data.tokenizer.vocab_size
    if vocab > 512:  # a trigram table of V^3 floats: byte-level vocabularies only
        raise ValueError(f"n-gram baselines count dense tables: a vocabulary of {vocab} tokens is too large "
                         "(up to 512)")
    positions, digest = scored_targets(data, lengths, budget, min_doc_tokens)
    tokens = data.val_tokens.astype(np.int64)
    target, previous, before = tokens[positions], tokens[positions - 1], tokens[np.maximum(positions - 2, 0)]
    unigram, bigram, trigram = probabilities(data.train_tokens, vocab)
    nats = [-np.log(p).mean() for p in (unigram[target], bigram[previous, target], trigram[before, previous, target])]
    to_bpb = 1 / (math.log(2) * data.bytes_per_token)
    return {**{order: round(float(n * to_bpb), 4) for order, n in zip(ORDERS, nats)},
            "targets": len(positions), "scored_digest": digest, "smoothing": "Witten-Bell interpolation",
            "counted_on": f"{len(data.train_tokens)} training tokens", "data_sha256": data.fingerprint.get("sha256")}


def measure(overrides: list[str], lengths: list[int], budget: int, min_doc_tokens: int | None = None) -> dict:
    """``context_free_bpb`` on the data that training with ``overrides`` reads, scored where an evaluation at
    ``lengths`` with ``budget`` targets scores (``lengths`` of None: the training length alone)."""
    from lmzoo.cli import compose_and_validate
    from lmzoo.data import build_data

    cfg = compose_and_validate(["+attn=softmax", "train.progress=false", *overrides])  # the data, whatever the mixer
    return context_free_bpb(build_data(cfg.data, seed=cfg.seed), lengths or [cfg.data.seq_len], budget, min_doc_tokens)


def learned_bound(evidence: dict) -> float | None:
    """The bpb a control's model must score below to have learned context: the bigram's, or None where the
    evidence predates its measurement (then the control is undecided; ``add_to`` measures it)."""
    return evidence.get("ngram_bpb", {}).get("bigram")


def add_to(path: Path) -> dict:
    """Measure the n-gram baselines of a committed verdict.json into its evidence, on the data and scored targets
    its settings name (the experiment's ``ngram_request``)."""
    from lmzoo.experiments import load, settings_of, write

    record = json.loads(Path(path).read_text())
    settings = settings_of(module := load(record["name"]), record)
    record["evidence"]["ngram_bpb"] = {**measure(*module.ngram_request(settings)),
                                       "measured": "after the run, on the data and targets its settings name"}
    write(Path(path), record)
    return record["evidence"]["ngram_bpb"]


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(name, add_to(Path(name)))
