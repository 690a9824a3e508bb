"""HGRN2 (Qin et al., 2024): the gated linear RNN HGRN with its hidden state expanded into a matrix by an outer
product, which makes it gated linear attention whose key is tied to the forget gate.

    q = swish(x W_q);   log f = logsigmoid(x W_f);   k = 1 - f;   v = x W_i               per head
    S_t = diag(f_t) S_{t-1} + k_t^T v_t;   o_t = q_t S_t / sqrt(Dk)
    y = W_o RMSNorm(o)

so a channel that forgets much (f near 0) also writes much (k near 1), the input and forget gates of HGRN tied
as ``1 - f``. The recurrence is ``lmzoo.ops.gla`` with a gate per key channel (a ``GatedMixer`` of
``lmzoo.mixers.family.linear``, with HGRN2's output instead of the gated head norm: one RMSNorm over the whole
width); ``attn.method`` picks its form. ``attn.expand_ratio`` is the key (forget) width per head, the state's
expansion (None: d_model / n_heads, as the peer's layer gives by default). HGRN2 takes no position encoding: its
gates carry order. Not included: the layer-wise lower bound on the forget gate (HGRN's learned, increasing with
depth), which needs a parameter shared across the layers, and the optional short convolutions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import GatedMixer, LinearFamilyConfig
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive
from lmzoo.sharding import INNER, partitioned


@register("hgrn2")
@dataclass
class HGRN2Config(LinearFamilyConfig):
    expand_ratio: Optional[int] = None  # key (forget gate) width per head; None: d_model / n_heads

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        if self.expand_ratio is not None:
            positive("attn.expand_ratio", self.expand_ratio)

    def head_widths(self, model: ModelConfig) -> tuple[int, int, int]:
        head = model.d_model // model.n_heads
        return model.n_heads, self.expand_ratio or head, head

    def build(self, ctx, *, rngs):
        return HGRN2(self, ctx, rngs=rngs)


def tied_gates(logits):
    """(key k = 1 - f, log forget gate log f) float32 from the forget logits: k = sigmoid(-logits) exactly, without
    the cancellation of 1 - f where f is near 1."""
    logits = logits.astype(jnp.float32)
    return jax.nn.sigmoid(-logits), jax.nn.log_sigmoid(logits)


class HGRN2(GatedMixer):
    def __init__(self, cfg: HGRN2Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads = ctx.n_heads
        self.key_dim, self.value_dim = cfg.expand_ratio or d // ctx.n_heads, d // ctx.n_heads
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.q_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.f_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.i_proj = dense(ctx, d, d, rngs=rngs)
        ones = partitioned(nnx.initializers.ones, INNER)
        self.norm = nnx.RMSNorm(d, epsilon=1e-5, dtype=jnp.float32, scale_init=ones, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def heads(self, x, positions=None, segment_ids=None):  # the gates carry order: positions are unused
        """q, k [B,T,H,Dk] (k float32, in (0, 1)), v [B,T,H,Dv] and the float32 log forget gates [B,T,H,Dk]."""
        b, t, _ = x.shape
        keys = (b, t, self.n_heads, self.key_dim)
        k, log_f = tied_gates(self.f_proj(x).reshape(keys))
        q = jax.nn.silu(self.q_proj(x)).reshape(keys)
        return q, k.astype(x.dtype), self.i_proj(x).reshape(b, t, self.n_heads, self.value_dim), log_f

    def output(self, x, o):
        return self.o_proj(self.norm(o.reshape(*o.shape[:-2], -1)).astype(x.dtype))
