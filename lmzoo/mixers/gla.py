"""Gated linear attention (Yang et al., 2023): a data-dependent forget gate per key dimension.

    log_g = logsigmoid(x W_1 W_2 + b) / tau          (low-rank gate, temperature tau)
    S_t = diag(exp(log_g_t)) S_{t-1} + k_t^T v_t;     o_t = q_t S_t / sqrt(Dk)
    y = W_o (swish(x W_r) * headnorm(o))

Keys and queries are ``key_ratio * d_model`` wide (the paper halves them), values ``d_model``.
Dividing the log gate by tau = 16 keeps gates near 1 at initialisation (about 0.96 per step) so
the state remembers long spans from the start. GLA takes no position encoding: its gates carry
order, so the model's ``pos`` setting does not reach it. ``attn.method`` picks the form of
``lmzoo.ops.gla``; ``attention_matrix`` is ``scale * (q_i * prod_{j<m<=i} g_m) . k_j``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, positive
from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.mixers.retnet import GatedHeadNorm
from lmzoo.ops.gated import gla, gla_weights
from lmzoo.ops.linear import METHODS
from lmzoo.registry import register


@register("gla")
@dataclass
class GLAConfig(MixerConfig):
    key_ratio: float = 0.5  # query/key width as a fraction of d_model (the paper: 0.5)
    gate_rank: int = 16  # rank of the gate projection W_1 W_2
    gate_temperature: float = 16.0  # tau in log_g = logsigmoid(x W_1 W_2 + b) / tau
    method: str = "chunk"  # parallel | scan | assoc | chunk | pallas (see lmzoo.ops.gated)
    chunk_size: int = 64  # tokens per chunk for method=chunk

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, METHODS)
        for key in ("key_ratio", "gate_rank", "gate_temperature"):
            positive(f"attn.{key}", getattr(self, key))
        width = self.key_ratio * model.d_model
        if width != int(width) or int(width) % model.n_heads:
            raise ConfigError(
                f"attn.key_ratio={self.key_ratio} gives a key width of {width} = key_ratio * model.d_model, "
                f"which must be a whole multiple of model.n_heads={model.n_heads}"
            )

    def build(self, ctx, *, rngs):
        return GatedLinearAttention(self, ctx, rngs=rngs)


class GatedLinearAttention(Mixer):
    def __init__(self, cfg: GLAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads, self.temperature = ctx.n_heads, cfg.gate_temperature
        self.key_dim, self.value_dim = int(cfg.key_ratio * d) // ctx.n_heads, d // ctx.n_heads
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.q_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.k_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.gate_down = dense(ctx, d, cfg.gate_rank, rngs=rngs)
        self.gate_up = dense(ctx, cfg.gate_rank, self.n_heads * self.key_dim, rngs=rngs, bias=True)
        self.out_gate = GatedHeadNorm(ctx, self.n_heads, self.value_dim, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def heads(self, x, positions=None):
        """q, k [B,T,H,Dk], v [B,T,H,Dv] and the float32 log gates [B,T,H,Dk] (<= 0)."""
        b, t, _ = x.shape
        keys = (b, t, self.n_heads, self.key_dim)
        logits = self.gate_up(self.gate_down(x)).astype(jnp.float32)
        log_g = (jax.nn.log_sigmoid(logits) / self.temperature).reshape(keys)
        q, k = self.q_proj(x).reshape(keys), self.k_proj(x).reshape(keys)
        return q, k, self.v_proj(x).reshape(b, t, self.n_heads, self.value_dim), log_g

    def mix(self, q, k, v, log_g, state=None, method=None):
        """Per-head output [B,T,H,Dv] (before norm, gate and projection) and the state."""
        return gla(q, k, v, log_g, initial_state=state, method=method or self.method, chunk_size=self.chunk_size)

    def output(self, x, o):
        """y [..., d_model] from the per-head mixing o [..., H, Dv]: head norm, swish gate by x, projection."""
        return self.o_proj(self.out_gate(x, o))

    def __call__(self, x, *, positions=None):  # the gates carry order: positions are unused
        return self.output(x, self.mix(*self.heads(x))[0])

    def init_state(self, batch_size, max_len):
        return jnp.zeros((batch_size, self.n_heads, self.key_dim, self.value_dim), jnp.float32)

    def step(self, x_t, state):
        x = x_t[:, None]  # (B, 1, d_model)
        o, state = self.mix(*self.heads(x), state=state, method="scan")
        return self.output(x, o)[:, 0], state

    def attention_matrix(self, x):
        q, k, _, log_g = self.heads(x)
        return gla_weights(q, k, log_g)

    def state_size(self, max_len):
        return self.n_heads * self.key_dim * self.value_dim
