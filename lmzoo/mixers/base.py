"""What every sequence mixer is: the protocol the model, decoder and probes rely on.

A mixer maps ``x [B, T, d_model] -> y [B, T, d_model]`` causally (``__call__(x, *, positions=None,
segment_ids=None)``; with ``segment_ids [B, T]``, equal within a document, each document is mixed as
if it were alone: no weight crosses a boundary, recurrent state and convolution windows restart at
each segment start, and ``positions`` restart there too) and also offers
- ``init_state(batch_size, max_len)`` / ``step(x_t [B, d_model], state) -> (y_t, state)``:
  token-by-token decoding; stepping through a sequence equals ``__call__`` on it;
- ``attention_matrix(x, *, positions=None, segment_ids=None) -> [B, H, T, T]``: the causal weights
  the mixer effectively applies (0 across segments);
- ``prefill(x, max_len=None, *, positions=None) -> (y, state)``: the parallel forward that also
  returns the decoding state, equal to ``init_state(B, max_len)`` stepped through every token of x
  (same structure, shapes and dtypes), so that decoding continues from it with ``step`` at position
  T; ``max_len`` None sizes a cache for x alone;
- ``state_size(max_len)``: floats of decoding state carried per sequence.

Recurrent mixers also offer ``carry`` (optional; ``train.state_passing`` needs it, and a spec whose mixer
has it sets ``carries_state``):
- ``carry(x, state, *, positions=None, segment_ids=None) -> (y, state)``: the parallel forward of x
  continuing from ``state``, the one an earlier ``carry`` returned (None: from the start; every leaf has
  the batch first, and an all-zero row is a fresh start), and the state after x. The state belongs to
  the first segment of x (``segment_ids`` restart recurrences at later starts as in ``__call__``), and
  ``positions`` count on from the state's tokens (the model passes them). Over two pieces of a sequence
  it equals ``__call__`` on the whole: ``carry(x1 ++ x2, None) == carry(x2, carry(x1, None)[1])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.ops.kernels import JLA, jla_ops
from lmzoo.ops.pallas import CHUNK_MULTIPLE
from lmzoo.positions import Positions
from lmzoo.schema import ConfigError, one_of, positive
from lmzoo.sharding import EMBED, INNER, partitioned


class AuxLoss(nnx.Variable):
    """A loss term a mixer adds to the training objective, e.g. a VQ commitment loss.

    Record one in ``__call__`` with ``self.sow(AuxLoss, "<name>", value)``; the trainer adds every
    sown value to the next-token loss and logs it under ``aux/<name>``.
    """


@dataclass(frozen=True)
class MixerContext:
    """What a mixer may know about the model around it."""

    d_model: int
    n_heads: int
    layer: int
    n_layers: int
    dtype: jnp.dtype
    pos: Positions
    init_std: float = 0.02
    train_len: int = 256  # data.seq_len the model trains at (log-n scaling's default base); kept when evaluating longer
    remat_light: bool = False  # model.remat=light: short convs and float32 gated norms keep only their inputs for
                               # the backward


def provided_form(method: str, methods: tuple | list) -> None:
    """attn.method among ``methods``, and jax-linear-attention installed where it names jla's path."""
    one_of("attn.method", method, methods)
    if method == JLA and jla_ops() is None:
        raise ConfigError("attn.method=jla needs jax-linear-attention: pip install -e '.[gpu]' (Python >= 3.12); "
                          "attn.method=auto runs lmzoo's own form without it")


def chunked_form(method: str, chunk_size: int, methods: tuple | list) -> None:
    """attn.method among ``methods`` (``provided_form``) and an attn.chunk_size that form accepts."""
    provided_form(method, methods)
    positive("attn.chunk_size", chunk_size)
    if method == "pallas" and chunk_size % CHUNK_MULTIPLE:
        raise ConfigError(f"attn.chunk_size={chunk_size}: attn.method=pallas needs a multiple of {CHUNK_MULTIPLE} "
                          "(its kernels' matmul blocks)")


def dense(ctx: MixerContext, d_in: int, d_out: int, *, rngs: nnx.Rngs, residual: bool = False, bias: bool = False,
          axes: tuple = None):
    """A projection in the model's compute dtype; residual outputs start smaller with depth (GPT-2).

    ``axes``: the kernel's logical axis names (``lmzoo.sharding``); by default a projection from the
    model width into the layer's own (``EMBED, INNER``), or back for a residual output.
    """
    axes = axes or ((INNER, EMBED) if residual else (EMBED, INNER))
    std = ctx.init_std / math.sqrt(2 * ctx.n_layers) if residual else ctx.init_std
    return nnx.Linear(
        d_in, d_out, use_bias=bias, dtype=ctx.dtype, kernel_init=partitioned(nnx.initializers.normal(std), *axes),
        bias_init=partitioned(nnx.initializers.zeros_init(), axes[1]), rngs=rngs,
    )


class Mixer(nnx.Module):
    """Base class documenting the protocol; subclasses implement every method.

    ``self.training`` is False except in the view of the model the training objective runs
    (``nnx.view(model, training=True)``). Only then does a mixer record auxiliary losses or update
    training-time statistics (VQ's EMA codebook): a plain forward stays a pure function of its
    input, as decoding and probes expect.
    """

    training = False

    def set_view(self, training: bool | None = None) -> None:
        """``nnx.view`` hook: the training objective's view of the model sets ``training=True``."""
        if training is not None:
            self.training = training

    def __call__(self, x: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        raise NotImplementedError

    def init_state(self, batch_size: int, max_len: int):
        raise NotImplementedError

    def prefill(self, x: jax.Array, max_len: int | None = None, *, positions: jax.Array | None = None):
        """``(self(x, positions=positions), state after x)``; ``max_len`` sizes the state as in ``init_state``
        (None: x's length)."""
        raise NotImplementedError

    def step(self, x_t: jax.Array, state):
        raise NotImplementedError

    def attention_matrix(self, x: jax.Array, *, positions: jax.Array | None = None,
                         segment_ids: jax.Array | None = None) -> jax.Array:
        raise NotImplementedError

    def state_size(self, max_len: int) -> int:
        raise NotImplementedError

    # Optional, for recurrent mixers (see the module docstring; ``hasattr(mixer, "carry")`` tells):
    #   carry(x, state, *, positions=None, segment_ids=None) -> (y, state)
    #
    # Optional, for mixers whose weights are a function of query-key dot products (the sparsity
    # experiments read it where a mixer has it):
    #   scored_vectors(x, *, positions=None) -> (q [B,T,H,D], k [B,T,H,D] float32, scale): the vectors
    #   whose dot products times ``scale`` are the layer's logits, before masks and biases.
