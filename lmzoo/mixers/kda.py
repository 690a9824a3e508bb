"""Kimi Delta Attention (KDA; Kimi Team, "Kimi Linear", 2025): the delta rule with one decay per key
channel, short convolutions and a sigmoid output gate.

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|;   beta = sigmoid(x W_beta)
    log g_t = -exp(A_log) * softplus(x_t W_1 W_2 + dt_bias)                        [B, T, HV, Dk]
    S'_t = diag(exp(g_t)) S_{t-1};   S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)
    y = W_o (sigmoid(x W_up W_down + b) * headnorm(o))

Each key channel forgets at its own rate (a low-rank projection, rank ``gate_rank``), and the
output gate is low-rank too (rank ``out_gate_rank``) and a sigmoid, as in Kimi Linear. With
``value_heads`` = HV > n_heads, HV value heads (each with its own beta, decay and state) share the
n_heads query/key heads, value head hv reading key head hv // (HV / n_heads). The convs, unit q and
k, beta, the decay and decoding are the delta-rule family's (``lmzoo.mixers.family.delta``); the
op is ``lmzoo.ops.delta_rule`` with per-channel gates (every form, the Pallas kernels included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer, SigmoidGatedHeadNorm, check_value_heads
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive


@register("kda")
@dataclass
class KDAConfig(DecayConfig):
    value_heads: Optional[int] = None  # HV value heads over model.n_heads query/key heads (a multiple); None: n_heads
    out_gate_rank: Optional[int] = None  # rank of the output gate's projection; None: the head dimension

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        if self.out_gate_rank is not None:
            positive("attn.out_gate_rank", self.out_gate_rank)
        check_value_heads(self.value_heads, model)

    def build(self, ctx, *, rngs):
        return KDA(self, ctx, rngs=rngs)


class KDA(DeltaRuleMixer):
    def grouped_value_heads(self, cfg: KDAConfig, ctx: MixerContext) -> int:
        return cfg.value_heads or ctx.n_heads

    def init_gates(self, cfg: KDAConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=True, rngs=rngs)

    def gates(self, x):
        return self.decay(x)

    def init_output(self, cfg: KDAConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        rank = cfg.out_gate_rank or self.value_dim
        self.out_gate = SigmoidGatedHeadNorm(ctx, self.value_heads, self.value_dim, rank, rngs=rngs)
        self.o_proj = dense(ctx, self.value_heads * self.value_dim, ctx.d_model, rngs=rngs, residual=True)
