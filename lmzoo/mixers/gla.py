"""Gated linear attention (Yang et al., 2023): a data-dependent forget gate per key dimension.

    log_g = logsigmoid(x W_1 W_2 + b) / tau          (low-rank gate, temperature tau)
    S_t = diag(exp(log_g_t)) S_{t-1} + k_t^T v_t;     o_t = q_t S_t / sqrt(Dk)
    y = W_o (swish(x W_r) * headnorm(o))

Keys and queries are ``key_ratio * d_model`` wide (the paper halves them), values ``d_model``.
Dividing the log gate by tau = 16 keeps gates near 1 at initialisation (about 0.96 per step) so
the state remembers long spans from the start. GLA takes no position encoding: its gates carry
order, so the model's ``pos`` setting does not reach it. ``attn.method`` picks the form of
``lmzoo.ops.gla``; ``attention_matrix`` is ``scale * (q_i * prod_{j<m<=i} g_m) . k_j``. The output
half (head norm, swish gate, projection) is ``GatedMixer``'s (``lmzoo.mixers.family.linear``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import GatedMixer, LinearFamilyConfig, check_key_ratio, key_ratio_head_widths
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive
from lmzoo.sharding import EMBED, INNER


@register("gla")
@dataclass
class GLAConfig(LinearFamilyConfig):
    key_ratio: float = 0.5  # query/key width as a fraction of d_model (the paper: 0.5)
    gate_rank: int = 16  # rank of the gate projection W_1 W_2
    gate_temperature: float = 16.0  # tau in log_g = logsigmoid(x W_1 W_2 + b) / tau

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        for key in ("key_ratio", "gate_rank", "gate_temperature"):
            positive(f"attn.{key}", getattr(self, key))
        check_key_ratio(self.key_ratio, model)

    def head_widths(self, model: ModelConfig) -> tuple[int, int, int]:
        return key_ratio_head_widths(self.key_ratio, model)

    def build(self, ctx, *, rngs):
        return GatedLinearAttention(self, ctx, rngs=rngs)


class GatedLinearAttention(GatedMixer):
    def __init__(self, cfg: GLAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads, self.temperature = ctx.n_heads, cfg.gate_temperature
        self.key_dim, self.value_dim = int(cfg.key_ratio * d) // ctx.n_heads, d // ctx.n_heads
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.q_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.k_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.gate_down = dense(ctx, d, cfg.gate_rank, rngs=rngs, axes=(EMBED, None))
        self.gate_up = dense(ctx, cfg.gate_rank, self.n_heads * self.key_dim, rngs=rngs, bias=True, axes=(None, INNER))
        self.init_output(ctx, rngs=rngs)

    def heads(self, x, positions=None, segment_ids=None):  # the gates carry order: positions are unused
        """q, k [B,T,H,Dk], v [B,T,H,Dv] and the float32 log gates [B,T,H,Dk] (<= 0)."""
        b, t, _ = x.shape
        keys = (b, t, self.n_heads, self.key_dim)
        logits = self.gate_up(self.gate_down(x)).astype(jnp.float32)
        log_g = (jax.nn.log_sigmoid(logits) / self.temperature).reshape(keys)
        q, k = self.q_proj(x).reshape(keys), self.k_proj(x).reshape(keys)
        return q, k, self.v_proj(x).reshape(b, t, self.n_heads, self.value_dim), log_g
