"""Preconditioned Kimi Delta Attention (arXiv 2604.21100): KDA whose write key is scaled per channel by a
preconditioner of the keys' running second moment.

    A_t = g_atk_t A_{t-1} + beta_atk_t k_t^2;   w_t = k_t * squash(log(A_t + eps) - center)
    S_t = diag(g_t) S_{t-1} + beta_t w_t (v_t - (diag(g_t) S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)
    log g_t = -exp(A_log) * softplus(x_t W_1 W_2 + dt_bias)                       one decay per key channel
    y = W_o (sigmoid(x W_up W_down + b) * headnorm(o))                             KDA's low-rank output gate

The preconditioner, grouped value heads, convs, unit q and k, beta and decoding are the preconditioned
family's (``lmzoo.mixers.family.precond``) on ``lmzoo.ops.precond_delta_rule``; the per-channel decay and the
sigmoid output gate are KDA's (``lmzoo.mixers.family.delta``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import SigmoidGatedHeadNorm
from lmzoo.mixers.family.precond import PrecondConfig, PrecondDeltaMixer
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive


@register("precond_kda")
@dataclass
class PrecondKDAConfig(PrecondConfig):
    out_gate_rank: Optional[int] = None  # rank of the output gate's projection; None: the head dimension

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        if self.out_gate_rank is not None:
            positive("attn.out_gate_rank", self.out_gate_rank)

    def build(self, ctx, *, rngs):
        return PrecondKDA(self, ctx, rngs=rngs)


class PrecondKDA(PrecondDeltaMixer):
    def init_gates(self, cfg: PrecondKDAConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=True, rngs=rngs)

    def gates(self, x):
        """log g = -exp(A_log) * softplus(x W_1 W_2 + dt_bias): [B, T, HV, Dk] float32, <= 0."""
        return self.decay(x)

    def init_output(self, cfg: PrecondKDAConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        rank = cfg.out_gate_rank or self.value_dim
        self.out_gate = SigmoidGatedHeadNorm(ctx, self.value_heads, self.value_dim, rank, rngs=rngs)
        self.o_proj = dense(ctx, self.value_heads * self.value_dim, ctx.d_model, rngs=rngs, residual=True)
