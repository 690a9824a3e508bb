"""RetNet's multi-scale retention (Sun et al., 2023): linear attention with a fixed decay per head.

    q, k = rotate(x W_q), rotate(x W_k);  S_t = gamma_h S_{t-1} + k_t^T v_t;  o_t = q_t S_t / sqrt(D)
    y = W_o (swish(x W_g) * headnorm(o))

Head h decays by ``gamma_h = 1 - 2^(-5-h)``, the paper's formula applied to the head index
whatever the number of heads (as in the authors' code): 4 heads keep half-lives of about 22, 44,
89 and 177 tokens, 12 heads reach ~45k tokens, so fewer heads than the paper's models means only
the faster decays. q and k are rotated by the model's position encoding (``ctx.pos.rotate``: RoPE,
the rotation part of xPos; its length-dependent scaling is left out since gamma_h already decays),
so ``pos=none`` turns the rotation off. The paper's GroupNorm is a per-head normalisation here
(RMS, with a learned scale shared by the heads). The retention itself is ``lmzoo.ops.gla`` with a
constant per-head log gate (a ``GatedMixer`` of ``lmzoo.mixers.family.linear``); ``attn.method``
picks its form.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import GatedMixer, LinearFamilyConfig
from lmzoo.registry import register


@register("retnet")
@dataclass
class RetNetConfig(LinearFamilyConfig):
    def build(self, ctx, *, rngs):
        return Retention(self, ctx, rngs=rngs)


def retention_log_decays(n_heads: int) -> jax.Array:
    """[H] float32 log(gamma_h), gamma_h = 1 - 2^(-5-h)."""
    return jnp.log1p(-(2.0 ** (-5.0 - jnp.arange(n_heads, dtype=jnp.float32))))


class Retention(GatedMixer):
    def __init__(self, cfg: RetNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.head_dim = ctx.n_heads, ctx.d_model // ctx.n_heads
        self.key_dim = self.value_dim = self.head_dim
        self.method, self.chunk_size, self.pos = cfg.method, cfg.chunk_size, ctx.pos
        d = ctx.d_model
        self.q_proj = dense(ctx, d, d, rngs=rngs)
        self.k_proj = dense(ctx, d, d, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.init_output(ctx, rngs=rngs)

    def heads(self, x, positions, segment_ids=None):
        """The retention inputs: rotated q, k [B,T,H,D], v [B,T,H,D] and log decays [B,T,H]."""
        b, t, _ = x.shape
        split = (b, t, self.n_heads, self.head_dim)
        q = self.pos.rotate(self.q_proj(x).reshape(split), positions)
        k = self.pos.rotate(self.k_proj(x).reshape(split), positions)
        log_g = jnp.broadcast_to(retention_log_decays(self.n_heads), (b, t, self.n_heads))
        return q, k, self.v_proj(x).reshape(split), log_g
