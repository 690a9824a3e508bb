"""The RWKV time-mixing family (RWKV-6, RWKV-7): what its variants share around their different recurrences.

- ``token_shift``: each token mixed with the one before it, the family's only convolution;
- ``LoRA``: the low-rank projections from the model width that make decays, gates and mixing weights data-dependent;
- ``group_norm``: the per-head normalisation of the op's output (a GroupNorm with one group per head);
- ``ShiftedMixer``: a linear-family mixer whose inputs read the previous token, so that decoding carries that token
  beside the op's state. A variant implements ``run(x, state, last, method, segment_ids) -> (y, S)`` and gets
  ``__call__``, ``prefill``, ``carry``, ``init_state``, ``step`` and ``state_size``.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import LinearFamilyMixer
from lmzoo.ops.common import segment_starts
from lmzoo.sharding import EMBED, INNER, param


def lora_rank(d_model: int, fraction: float) -> int:
    """RWKV-7's default LoRA ranks: a fraction of the width, a multiple of 32, at least 32."""
    return max(32, int(round(fraction * d_model / 32)) * 32)


def token_shift(x, last=None, segment_ids=None):
    """x_{t-1} for every t (``last`` [B, D] before the first, zeros by default; zero at segment starts)."""
    last = jnp.zeros_like(x[:, 0]) if last is None else last.astype(x.dtype)
    shifted = jnp.concatenate([last[:, None], x[:, :-1]], axis=1)
    if segment_ids is not None:
        shifted = jnp.where(segment_starts(segment_ids)[..., None], 0.0, shifted).astype(x.dtype)
    return shifted


class LoRA(nnx.Module):
    """``bias + act(x W_1) W_2``: a low-rank projection from the model width into the layer's (``width``, by default
    the model's)."""

    def __init__(self, ctx: MixerContext, rank: int, *, bias: Optional[jax.Array], activation=None, rngs: nnx.Rngs,
                 width: Optional[int] = None):
        d = ctx.d_model
        self.down = dense(ctx, d, rank, rngs=rngs, axes=(EMBED, None))
        self.up = dense(ctx, rank, width or d, rngs=rngs, axes=(None, INNER))
        self.bias = None if bias is None else param(bias, INNER)
        self.activation = activation

    def __call__(self, x):
        h = self.down(x)
        h = self.up(h if self.activation is None else self.activation(h)).astype(jnp.float32)
        return h if self.bias is None else h + self.bias[...]


def group_norm(o, scale, bias, eps: float):
    """Per head: o minus its mean over the head's channels, over their standard deviation; then the per-channel
    affine map ``scale``, ``bias`` [H * Dv]. o [..., H, Dv] -> [..., H * Dv] float32."""
    o = o.astype(jnp.float32)
    centred = o - jnp.mean(o, axis=-1, keepdims=True)
    normed = centred * jax.lax.rsqrt(jnp.mean(centred**2, axis=-1, keepdims=True) + eps)
    return normed.reshape(*o.shape[:-2], -1) * scale + bias


class ShiftedMixer(LinearFamilyMixer):
    """A family mixer whose inputs mix each token with the previous one: decoding carries the op's state S and the
    last token seen (``last`` [B, d_model]). Subclasses set ``d_model`` and implement ``run``."""

    d_model: int
    dtype = None

    def run(self, x, state=None, last=None, method=None, segment_ids=None):
        """(y [B, T, d_model], the op's final state) from ``state`` (None: zeros) with ``last`` before x's first
        token (None: zeros), the op in ``method`` (None: the mixer's)."""
        raise NotImplementedError

    def __call__(self, x, *, positions=None, segment_ids=None):
        return self.run(x, segment_ids=segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        return self.carry(x, None)

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """(y, {"S", "last"} after x) from ``state`` (None: zeros); x's last token is its last document's."""
        state = state or {}
        y, s = self.run(x, state.get("S"), state.get("last"), segment_ids=segment_ids)
        return y, {"S": s, "last": x[:, -1]}

    def init_state(self, batch_size, max_len):
        return {"S": self.recurrent_state(batch_size),
                "last": jnp.zeros((batch_size, self.d_model), self.dtype or jnp.float32)}

    def step(self, x_t, state):
        y, s = self.run(x_t[:, None], state["S"], state["last"], method=self.step_form)
        return y[:, 0], {"S": s, "last": x_t.astype(state["last"].dtype)}

    def state_size(self, max_len):
        return self.n_heads * self.key_dim * self.value_dim + self.d_model
