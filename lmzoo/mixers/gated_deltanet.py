"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2024) and its per-channel gates (Kimi Delta Attention).

    S_t = diag(g_t) S_{t-1} + beta_t k_t (v_t - (diag(g_t) S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)

with the decay in log space, as Mamba-2 makes it:

    attn.gate=head:     log g_t = -exp(A_log_h) * softplus(x_t W_a + dt_bias_h)          [B, T, H]
    attn.gate=channel:  log g_t = -exp(A_log_h) * softplus(x_t W_1 W_2 + dt_bias_hd)     [B, T, H, Dk]

``A_log`` starts at log U[1, 16] per head and ``dt_bias`` at softplus^-1 of a step size drawn
log-uniformly in [dt_min, dt_max] (Mamba-2's initialisation), so the state keeps a few hundred
tokens at first. Per-channel gates (KDA's) let each key dimension forget at its own rate through a
low-rank projection (rank ``gate_rank``, default the head dimension). The decay and the rest --
convs, unit q and k, beta, head norm and output gate -- are the family's ``DeltaRuleMixer``
(``lmzoo.mixers.family.delta``); Kimi Delta Attention as published (its sigmoid low-rank output
gate, grouped value heads) is the ``kda`` variant.
"""

from __future__ import annotations

from dataclasses import dataclass

from flax import nnx

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, one_of

GATES = ("head", "channel")


@register("gated_deltanet")
@dataclass
class GatedDeltaNetConfig(DecayConfig):
    gate: str = "head"  # head: one decay per head (Gated DeltaNet) | channel: one per key channel (as KDA's)

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        one_of("attn.gate", self.gate, GATES)

    def build(self, ctx, *, rngs):
        return GatedDeltaNet(self, ctx, rngs=rngs)


class GatedDeltaNet(DeltaRuleMixer):
    def init_gates(self, cfg: GatedDeltaNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=cfg.gate == "channel", rngs=rngs)

    def gates(self, x):
        """log g = -exp(A_log) * softplus(x W + dt_bias): [B, T, H] or [B, T, H, Dk], float32, <= 0."""
        return self.decay(x)
