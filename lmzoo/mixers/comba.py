"""Comba (Hu et al., 2025): a gated delta rule with closed-loop control -- the prediction reads the
state before the decay through a scaled key, and the read-out subtracts a correction.

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|;   beta = sigmoid(x W_beta)
    p_t = sigmoid(d_h) k_t                                     the prediction key (``d`` starts at 1)
    S_t = g_t S_{t-1} + beta_t k_t (v_t - S_{t-1}^T p_t)^T     log g_t = -exp(A_log_h) softplus(x W_a + dt_bias_h)
    o_t = S_t^T (q_t - D_h p_t) / sqrt(Dk)                     output correction (``attn.output_correction``)
    y   = W_o (swish(x W_g) * headnorm(o))

The recurrence is ``lmzoo.ops.comba``; the convs, head norm, output gate and decoding are the
delta-rule family's (``lmzoo.mixers.family.delta``), whose projections this mixer extends with p and
the corrected query. Scaling the unit key by sigmoid(d) < 1 erases less of what the state recalls
than it writes (flash-linear-attention's layer also L2-normalises p inside its kernel, which cancels
that scale; here it is kept, as in the paper). ``attention_matrix`` is the op's effective weights
on the values (``lmzoo.ops.comba_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer
from lmzoo.ops.comba import METHODS, STEP_FORM, comba, comba_weights
from lmzoo.registry import register
from lmzoo.sharding import param


@register("comba")
@dataclass
class CombaConfig(DecayConfig):
    forms = METHODS

    method: str = "auto"  # auto | jla | naive | parallel | chunk (see lmzoo.ops.comba)
    output_correction: bool = True  # o = S^T (q - D p); false: o = S^T q
    correction_init: float = 1.0  # D's initial value (the paper finds 0.02 sometimes better for small models)

    def build(self, ctx, *, rngs):
        return Comba(self, ctx, rngs=rngs)


class Comba(DeltaRuleMixer):
    step_form = STEP_FORM  # of lmzoo.ops.comba

    def init_gates(self, cfg: CombaConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        heads = self.n_heads
        self.init_decay(cfg, ctx, per_channel=False, rngs=rngs)  # the family's Mamba-2-style decay per head
        self.inner_decay = param(jnp.ones((heads,), jnp.float32), None)
        self.correction = (param(jnp.full((heads,), cfg.correction_init, jnp.float32), None)
                           if cfg.output_correction else None)

    def gates(self, x):
        """log g = -exp(A_log) * softplus(x W_a + dt_bias): [B, T, H] float32 (< 0)."""
        return self.decay(x)

    def project(self, x, conv_state=None, segment_ids=None):
        """The family's (q, k, v, beta, log_g) with the prediction key p and the corrected query."""
        (q, k, v, beta, log_g), conv_state = super().project(x, conv_state, segment_ids)
        p = jax.nn.sigmoid(self.inner_decay[...])[:, None] * k.astype(jnp.float32)  # (B, T, H, Dk)
        if self.correction is not None:
            q = q.astype(jnp.float32) - self.correction[...][:, None] * p
        return (q.astype(v.dtype), k, v, p.astype(v.dtype), beta, log_g), conv_state

    def mix(self, q, k, v, p, beta, log_g, state=None, method=None, segment_ids=None):
        return comba(q, k, v, p, beta, log_g, initial_state=state, method=method or self.method,
                     chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, p, beta, log_g, segment_ids=None):
        return comba_weights(q, k, p, beta, log_g, segment_ids=segment_ids)
