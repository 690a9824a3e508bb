"""A trained run in Python (``lmzoo.load``): its model, tokenizer and settings, its logits and log-probabilities,
the bits per byte it scores on a text, and text it generates.

``load(run_dir)`` opens the run as ``lmzoo.eval`` and ``lmzoo.generate`` do (``lmzoo.record.opening.open_trained``:
the newest intact checkpoint, the run's own tokenizer, evaluation-time overrides of its settings). The calls take
token ids or text and hand back NumPy arrays and floats; each is compiled once per input shape. Examples that run in
the test suite: docs/api.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lmzoo.config import Config
from lmzoo.measure.decoding import Sampling, generate, until_eos
from lmzoo.record.checkpoints import split_model
from lmzoo.record.opening import open_trained
from lmzoo.scoring.lengths import logit_scores


@dataclass(frozen=True)
class TextScore:
    """What a run scores on one text: every byte of it predicted, each window of ``length`` tokens starting afresh."""

    bits_per_byte: float  # nats / (ln 2 * bytes): comparable across tokenizers
    nats: float  # the summed cross-entropy of the text's tokens
    tokens: int  # tokens scored (the text's own, each predicted from those before it in its window)
    bytes: int  # the text's UTF-8 bytes
    length: int  # the window length it was scored in (tokens of context at most)


class LoadedRun:
    """One trained run, opened: ``model`` (an ``lmzoo.model.LM``, Flax NNX), ``tokenizer``, ``config`` (the run's
    settings with the overrides applied), ``step`` (of the checkpoint read) and ``path``."""

    def __init__(self, path: Path, config: Config, tokenizer, model, step: int):
        self.path, self.config, self.tokenizer, self.model, self.step = path, config, tokenizer, model, step
        graphdef, self._weights = split_model(model)
        self._forward = jax.jit(lambda w, ids: nnx.merge(graphdef, w["params"], w["extra"])(ids))

    def __repr__(self) -> str:
        return (f"LoadedRun({str(self.path)!r}, attn={self.config.attn.name}, step={self.step}, "
                f"vocab={self.tokenizer.vocab_size}, trained at {self.config.data.seq_len} tokens)")

    @property
    def train_length(self) -> int:
        """The context length the run trained at (``data.seq_len``)."""
        return self.config.data.seq_len

    def encode(self, text: str | bytes) -> np.ndarray:
        """The text's token ids, int32 [T] (no special token added)."""
        return np.asarray(self.tokenizer.encode(text), np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode(np.asarray(ids))

    def logits(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 next-token logits [T, vocab] for ids [T] ([B, T, vocab] for [B, T]): row t predicts token t + 1."""
        ids = np.asarray(ids, np.int32)
        if ids.ndim not in (1, 2) or ids.shape[-1] == 0:
            raise ValueError(f"ids must be a non-empty [T] or [B, T] array of token ids, not shape {ids.shape}")
        out = self._forward(self._weights, jnp.asarray(ids[None] if ids.ndim == 1 else ids))
        return np.asarray(out[0] if ids.ndim == 1 else out)

    def log_probs(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Next-token log-probabilities (natural log), shaped as ``logits``; each row's exponentials sum to 1."""
        return np.asarray(jax.nn.log_softmax(jnp.asarray(self.logits(ids)), axis=-1))

    def score(self, text: str | bytes, length: Optional[int] = None) -> TextScore:
        """The bits per byte of ``text``, read in consecutive windows of ``length`` tokens (the training length
        if None), as ``lmzoo.eval`` reads validation text at one length. Its first token is predicted after the
        end-of-text token that precedes every document in training; each later window starts afresh."""
        ids = self.encode(text)
        n_bytes = len(text.encode("utf-8") if isinstance(text, str) else bytes(text))
        if len(ids) == 0:
            raise ValueError("text is empty: there is nothing to score")
        length = self.train_length if length is None else length
        if length < 1:
            raise ValueError(f"length={length} must be at least 1 token")
        nats = sum(self._window_nats(inputs, targets) for inputs, targets in self._windows(ids, length))
        return TextScore(nats / (math.log(2) * n_bytes), nats, len(ids), n_bytes, length)

    def _windows(self, ids: np.ndarray, length: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(inputs, targets) of each window: the targets are ids cut into pieces of ``length``, the inputs the
        same pieces shifted right by one (the first after the document separator)."""
        before = self.tokenizer.eos_id if self.tokenizer.eos_id is not None else self.tokenizer.bos_id
        if before is None:
            raise ValueError(f"the tokenizer {self.tokenizer.name} has no end-of-text or beginning token to predict "
                             "a text's first token after")
        shifted = np.concatenate([[before], ids[:-1]]).astype(np.int32)
        for start in range(0, len(ids), length):
            yield shifted[start:start + length], ids[start:start + length]

    def _window_nats(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        scores = logit_scores(jnp.asarray(self.logits(inputs)), jnp.asarray(targets))
        return float(jnp.sum(scores["loss"], dtype=jnp.float32))

    def generate(self, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.8, top_k: int | None = None,
                 top_p: float | None = None, seed: int = 0) -> str:
        """The prompt's continuation (without the prompt), as ``python -m lmzoo.generate`` samples it: the same
        seed gives the same text; ``temperature=0`` is greedy."""
        sampling = Sampling(prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed)
        sampling.check()
        eos = self.tokenizer.eos_id
        tokens = generate(self.model, self.encode(prompt), sampling, eos_id=eos)
        return self.decode(until_eos(tokens[0], eos))


def load(run_dir: str | Path, overrides: Sequence[str] = (), step: Optional[int] = None) -> LoadedRun:
    """The trained run in ``run_dir`` at ``step`` (its newest intact checkpoint if None).

    ``overrides`` change evaluation-time settings in the training command's grammar (``["pos=ntk",
    "pos.factor=4"]``, ``["attn.window=64"]``); settings that shape the parameters (``model.*``) cannot change.
    lmzoo.config.ConfigError or lmzoo.faults.RunFault, with a one-line message, for a folder without a trained
    run, an override it cannot take or a missing checkpoint."""
    trained = open_trained(run_dir, overrides, step)
    return LoadedRun(Path(run_dir), trained.cfg, trained.data.tokenizer, trained.model, trained.step)
