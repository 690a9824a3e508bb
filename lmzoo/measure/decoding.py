"""Decoding: sampling text from a model, one compiled step per new token.

``generate`` reads the prompt once with ``LM.prefill`` (which also fills the decoding state), then
runs one compiled ``step`` per new token.

Sampling: ``temperature=0`` is greedy (argmax); otherwise logits / temperature, restricted to the
``top_k`` most likely tokens and then to the smallest set whose probability reaches ``top_p``
(nucleus), are sampled with keys drawn from ``seed``: the same seed gives the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lmzoo.cli import shown_as
from lmzoo.config import ConfigError
from lmzoo.model import LM
from lmzoo.record.checkpoints import split_model


@dataclass
class Sampling:
    """How to continue the prompt (the arguments besides run_dir and overrides of the run's config)."""

    prompt: str = shown_as("<text>", "")  # the text to continue, taken verbatim
    max_new_tokens: int = 256  # tokens added at most (fewer where the end-of-sequence token comes first)
    temperature: float = 0.8  # 0: greedy
    top_k: Optional[int] = None  # keep the k most likely tokens; None: all
    top_p: Optional[float] = None  # keep the fewest most likely tokens whose probability reaches p; None: all
    seed: int = 0  # draws the sampling keys: the same seed gives the same text
    num_samples: int = 1  # samples decoded together as one batch

    def check(self) -> None:
        if not self.prompt:
            raise ConfigError("prompt is empty: give the text to continue, e.g. prompt='def '")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if not 0 <= self.temperature < float("inf"):  # written so that NaN fails too
            raise ConfigError(f"temperature={self.temperature} must be a finite number of at least 0 (0: greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k={self.top_k} must be at least 1")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p} must lie in (0, 1]")
        if self.num_samples < 1:
            raise ConfigError(f"num_samples={self.num_samples} must be at least 1")


def sample(logits: jax.Array, key: jax.Array, s: Sampling) -> jax.Array:
    """Next tokens [B] int32 from logits [B, V] float32."""
    if s.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / s.temperature
    if s.top_k is not None and s.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, s.top_k)[0][:, -1:]  # (B, 1)
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if s.top_p is not None and s.top_p < 1:
        order = jnp.argsort(-logits, axis=-1)
        probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the likelier tokens: the first is always kept
        drop = jnp.zeros_like(before, bool).at[jnp.arange(logits.shape[0])[:, None], order].set(before >= s.top_p)
        logits = jnp.where(drop, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def state_bytes(model: LM, batch: int, max_len: int) -> int:
    """Bytes of the decoding state of ``batch`` sequences of up to ``max_len`` tokens (nothing allocated)."""
    shapes = jax.eval_shape(lambda: model.init_state(batch, max_len))
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))


def check_fits(model: LM, prompt_len: int, s: Sampling, budget: int) -> None:
    """ConfigError when the decoding state (a cache that grows with the length, for some mixers) cannot fit."""
    need = state_bytes(model, s.num_samples, prompt_len + s.max_new_tokens)
    if need > budget:
        raise ConfigError(
            f"max_new_tokens={s.max_new_tokens}: {prompt_len} prompt tokens plus max_new_tokens need a "
            f"{need / 2**30:.1f} GiB decoding state for num_samples={s.num_samples}, over the "
            f"{budget / 2**30:.1f} GiB of memory available (ask for fewer tokens or samples)")


def generate(model: LM, prompt_ids: np.ndarray, s: Sampling, *, eos_id: Optional[int] = None,
             on_token: Callable[[np.ndarray], None] = lambda tokens: None) -> np.ndarray:
    """New tokens [num_samples, <= max_new_tokens] after ``prompt_ids`` [T]; ``on_token`` hears each step's
    tokens [num_samples] as they come. Stops early once every sample has produced ``eos_id``."""
    graphdef, weights = split_model(model)
    build = lambda w: nnx.merge(graphdef, w["params"], w["extra"])
    max_len = len(prompt_ids) + s.max_new_tokens

    @jax.jit
    def prefill(w, tokens, key):
        logits, state = build(w).prefill(tokens, max_len)
        return sample(logits[:, -1], key, s), state

    @jax.jit
    def step(w, token, state, key):
        logits, state = build(w).step(token, state)
        return sample(logits, key, s), state

    key = jax.random.key(s.seed)
    prompt = jnp.tile(jnp.asarray(prompt_ids, jnp.int32), (s.num_samples, 1))
    token, state = prefill(weights, prompt, jax.random.fold_in(key, 0))
    produced, ended = [], np.zeros(s.num_samples, bool)
    for i in range(1, s.max_new_tokens + 1):
        produced.append(np.asarray(token))
        on_token(produced[-1])
        ended |= produced[-1] == eos_id
        if i == s.max_new_tokens or ended.all():
            break
        token, state = step(weights, token, state, jax.random.fold_in(key, i))
    return np.stack(produced, axis=1)


def until_eos(tokens: np.ndarray, eos_id: Optional[int]) -> np.ndarray:
    """``tokens`` [T] up to (without) the first ``eos_id``."""
    ends = np.flatnonzero(tokens == eos_id)
    return tokens[: ends[0]] if len(ends) else tokens
