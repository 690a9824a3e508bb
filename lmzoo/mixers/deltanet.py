"""DeltaNet (Schlag et al., 2021; Yang et al., 2024): linear attention whose state is edited by the
delta rule instead of only added to.

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)

Each step writes v_t where the unit key k_t points, replacing (by the fraction beta_t) what the
state recalled there, so a key's old association is overwritten rather than summed with the new.
Everything (short convs on q, k, v; L2-normalised q and k; beta = sigmoid(x W_beta); head norm
and output gate) is the family's ``DeltaRuleMixer`` (``lmzoo.mixers.family.delta``) with no gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmzoo.mixers.family.delta import DeltaRuleConfig, DeltaRuleMixer
from lmzoo.registry import register


@register("deltanet")
@dataclass
class DeltaNetConfig(DeltaRuleConfig):
    def build(self, ctx, *, rngs):
        return DeltaRuleMixer(self, ctx, rngs=rngs)
