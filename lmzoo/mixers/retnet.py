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
constant per-head log gate; ``attn.method`` picks its form.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.schema import MixerConfig, ModelConfig
from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.ops.gated import gla, gla_weights
from lmzoo.ops.linear import METHODS
from lmzoo.positions import default_positions
from lmzoo.registry import register


@register("retnet")
@dataclass
class RetNetConfig(MixerConfig):
    method: str = "chunk"  # parallel | scan | assoc | chunk | pallas (see lmzoo.ops.gated)
    chunk_size: int = 64  # tokens per chunk for method=chunk

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, METHODS)

    def build(self, ctx, *, rngs):
        return Retention(self, ctx, rngs=rngs)


def retention_log_decays(n_heads: int) -> jax.Array:
    """[H] float32 log(gamma_h), gamma_h = 1 - 2^(-5-h)."""
    return jnp.log1p(-(2.0 ** (-5.0 - jnp.arange(n_heads, dtype=jnp.float32))))


class GatedHeadNorm(nnx.Module):
    """``swish(x W_g) * headnorm(o)``: each head's output RMS-normalised in float32, then gated by x."""

    def __init__(self, ctx: MixerContext, heads: int, head_dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.gate = dense(ctx, ctx.d_model, heads * head_dim, rngs=rngs)
        self.norm = nnx.RMSNorm(head_dim, epsilon=eps, dtype=jnp.float32, rngs=rngs)

    def __call__(self, x, o):
        """x [..., d_model], o [..., H, Dv] -> [..., H * Dv] in x's dtype."""
        normed = self.norm(o.astype(jnp.float32)).reshape(*o.shape[:-2], -1)  # (..., H * Dv)
        return (normed * jax.nn.silu(self.gate(x).astype(jnp.float32))).astype(x.dtype)


class Retention(Mixer):
    def __init__(self, cfg: RetNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.head_dim = ctx.n_heads, ctx.d_model // ctx.n_heads
        self.method, self.chunk_size, self.pos = cfg.method, cfg.chunk_size, ctx.pos
        d = ctx.d_model
        self.q_proj = dense(ctx, d, d, rngs=rngs)
        self.k_proj = dense(ctx, d, d, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.out_gate = GatedHeadNorm(ctx, self.n_heads, self.head_dim, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def heads(self, x, positions):
        """The retention inputs: rotated q, k [B,T,H,D], v [B,T,H,D] and log decays [B,T,H]."""
        b, t, _ = x.shape
        split = (b, t, self.n_heads, self.head_dim)
        q = self.pos.rotate(self.q_proj(x).reshape(split), positions)
        k = self.pos.rotate(self.k_proj(x).reshape(split), positions)
        log_g = jnp.broadcast_to(retention_log_decays(self.n_heads), (b, t, self.n_heads))
        return q, k, self.v_proj(x).reshape(split), log_g

    def mix(self, q, k, v, log_g, state=None, method=None):
        """Per-head retention output [B,T,H,D] (before norm, gate and projection) and the state."""
        return gla(q, k, v, log_g, initial_state=state, method=method or self.method, chunk_size=self.chunk_size)

    def output(self, x, o):
        """y [..., d_model] from the per-head mixing o [..., H, Dv]: head norm, swish gate by x, projection."""
        return self.o_proj(self.out_gate(x, o))

    def __call__(self, x, *, positions=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        return self.output(x, self.mix(*self.heads(x, positions))[0])

    def init_state(self, batch_size, max_len):
        shape = (batch_size, self.n_heads, self.head_dim, self.head_dim)
        return {"S": jnp.zeros(shape, jnp.float32), "t": jnp.zeros((), jnp.int32)}

    def step(self, x_t, state):
        x = x_t[:, None]  # (B, 1, d_model)
        positions = jnp.full((x.shape[0], 1), state["t"], jnp.int32)
        o, s = self.mix(*self.heads(x, positions), state=state["S"], method="scan")
        return self.output(x, o)[:, 0], {"S": s, "t": state["t"] + 1}

    def attention_matrix(self, x):
        b, t, _ = x.shape
        q, k, _, log_g = self.heads(x, default_positions(b, t))
        return gla_weights(q, k, log_g)  # scale * (q_i . k_j) * gamma_h^(i - j)

    def state_size(self, max_len):
        return self.n_heads * self.head_dim * self.head_dim
