"""Preconditioned Gated DeltaNet (arXiv 2604.21100): Gated DeltaNet whose write key is scaled per channel by a
preconditioner of the keys' running second moment.

    A_t = g_atk_t A_{t-1} + beta_atk_t k_t^2;   w_t = k_t * squash(log(A_t + eps) - center)
    S_t = g_t S_{t-1} + beta_t w_t (v_t - (g_t S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)
    log g_t = -exp(A_log_h) softplus(x W_a + dt_bias_h)                                     one decay per head

Everything but the decay -- the preconditioner, grouped value heads (``attn.value_heads``, as Qwen3-Next's),
the convs, unit q and k, beta, head norm, output gate and decoding -- is the preconditioned family's
(``lmzoo.mixers.family.precond``) on ``lmzoo.ops.precond_delta_rule``.
"""

from __future__ import annotations

from dataclasses import dataclass

from flax import nnx

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.precond import PrecondConfig, PrecondDeltaMixer
from lmzoo.registry import register


@register("precond_gated_deltanet")
@dataclass
class PrecondGatedDeltaNetConfig(PrecondConfig):
    def build(self, ctx, *, rngs):
        return PrecondGatedDeltaNet(self, ctx, rngs=rngs)


class PrecondGatedDeltaNet(PrecondDeltaMixer):
    def init_gates(self, cfg: PrecondGatedDeltaNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=False, rngs=rngs)

    def gates(self, x):
        """log g = -exp(A_log) * softplus(x W + dt_bias): [B, T, HV] float32, <= 0."""
        return self.decay(x)
