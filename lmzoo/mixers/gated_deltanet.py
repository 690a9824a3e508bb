"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2024) and its per-channel gates (Kimi Delta Attention).

    S_t = diag(g_t) S_{t-1} + beta_t k_t (v_t - (diag(g_t) S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)

with the decay in log space, as Mamba-2 makes it:

    attn.gate=head:     log g_t = -exp(A_log_h) * softplus(x_t W_a + dt_bias_h)          [B, T, H]
    attn.gate=channel:  log g_t = -exp(A_log_h) * softplus(x_t W_1 W_2 + dt_bias_hd)     [B, T, H, Dk]

``A_log`` starts at log U[1, 16] per head and ``dt_bias`` at softplus^-1 of a step size drawn
log-uniformly in [dt_min, dt_max] (Mamba-2's initialisation), so the state keeps a few hundred
tokens at first. Per-channel gates (KDA) let each key dimension forget at its own rate through a
low-rank projection (rank ``gate_rank``, default the head dimension). The rest -- convs, unit q
and k, beta, head norm and output gate -- is ``DeltaRuleMixer`` (``lmzoo.mixers.family.delta``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import DeltaRuleConfig, DeltaRuleMixer
from lmzoo.mixers.family.ssm import check_dt_range, dt_bias_init
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, one_of, positive
from lmzoo.sharding import EMBED, INNER, param

GATES = ("head", "channel")


@register("gated_deltanet")
@dataclass
class GatedDeltaNetConfig(DeltaRuleConfig):
    gate: str = "head"  # head: one decay per head (Gated DeltaNet) | channel: one per key channel (KDA)
    gate_rank: Optional[int] = None  # gate=channel: rank of x W_1 W_2; None: the head dimension
    dt_min: float = 0.001  # the gate's step size starts log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        one_of("attn.gate", self.gate, GATES)
        if self.gate_rank is not None:
            positive("attn.gate_rank", self.gate_rank)
        check_dt_range(self.dt_min, self.dt_max)

    def build(self, ctx, *, rngs):
        return GatedDeltaNet(self, ctx, rngs=rngs)


class GatedDeltaNet(DeltaRuleMixer):
    def init_gates(self, cfg: GatedDeltaNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        d, heads = ctx.d_model, self.n_heads
        self.per_channel = cfg.gate == "channel"
        width = heads * self.key_dim if self.per_channel else heads
        if self.per_channel:
            rank = cfg.gate_rank or self.key_dim
            self.gate_proj = nnx.Sequential(dense(ctx, d, rank, rngs=rngs, axes=(EMBED, None)),
                                            dense(ctx, rank, width, rngs=rngs, axes=(None, INNER)))
        else:
            self.gate_proj = dense(ctx, d, width, rngs=rngs)
        self.dt_bias = param(dt_bias_init(rngs.params(), width, cfg.dt_min, cfg.dt_max), None)
        self.A_log = param(jnp.log(jax.random.uniform(rngs.params(), (heads,), jnp.float32, 1.0, 16.0)), None)

    def gates(self, x):
        """log g = -exp(A_log) * softplus(x W + dt_bias): [B, T, H] or [B, T, H, Dk], float32, <= 0."""
        b, t, _ = x.shape
        step = jax.nn.softplus(self.gate_proj(x).astype(jnp.float32) + self.dt_bias[...])  # (B, T, width)
        rate = jnp.exp(self.A_log[...])  # (H,)
        if self.per_channel:
            return -rate[:, None] * step.reshape(b, t, self.n_heads, self.key_dim)
        return -rate * step
