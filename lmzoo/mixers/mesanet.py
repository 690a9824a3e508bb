"""MesaNet (von Oswald et al., 2025): each step outputs the ridge regression of the values on the keys seen so
far, evaluated at the query, the least-squares problem solved in context by conjugate gradients.

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|;   beta = sigmoid(x W_beta)
    log g_t = -exp(A_log_h) softplus(x W_a + dt_bias_h)                                  one decay per head
    H_t = g_t H_{t-1} + beta_t k_t k_t^T;   G_t = g_t G_{t-1} + beta_t k_t v_t^T
    o_t = G_t^T (H_t + diag(lamb))^{-1} q_t     (``attn.cg_steps`` conjugate-gradient steps)
    y   = W_o (swish(x W_g) * headnorm(o))

The ridge penalty lamb [H, Dk] = softplus(lamb_raw) + ``attn.lamb_min`` is learnt per head and channel, and
starts at 1. The recurrence is ``lmzoo.ops.mesa_net``; the convs, unit q and k, beta, the decay, the head
norm and output gate are the delta-rule family's (``lmzoo.mixers.family.delta``). Decoding carries both
sums, ``(H, G)``, and the conv window; the solve at each decoded token runs the same conjugate-gradient steps
as the forward, so decoding equals it. ``attention_matrix`` is the op's effective weights on the values
(``lmzoo.ops.mesa_net_weights``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer
from lmzoo.ops.mesa import METHODS, STEP_FORM, mesa_net, mesa_net_weights
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig, positive
from lmzoo.sharding import param


@register("mesanet")
@dataclass
class MesaNetConfig(DecayConfig):
    forms = METHODS

    method: str = "chunk"  # naive | chunk | parallel (see lmzoo.ops.mesa)
    cg_steps: int = 30  # conjugate-gradient steps per solve, the same in every form and in decoding
    lamb_min: float = 0.25  # the ridge penalty's floor

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.cg_steps", self.cg_steps)
        if not self.lamb_min >= 0.0:
            raise ConfigError(f"attn.lamb_min={self.lamb_min} must be >= 0")

    def build(self, ctx, *, rngs):
        return MesaNet(self, ctx, rngs=rngs)


class MesaNet(DeltaRuleMixer):
    step_form = STEP_FORM  # of lmzoo.ops.mesa

    def init_gates(self, cfg: MesaNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=False, rngs=rngs)
        self.cg_steps, self.lamb_min = cfg.cg_steps, cfg.lamb_min
        start = math.log(math.expm1(max(1.0 - cfg.lamb_min, 1e-3)))  # softplus^-1: lamb starts at 1 (or just above)
        self.lamb_raw = param(jnp.full((self.n_heads, self.key_dim), start, jnp.float32), None, None)

    def gates(self, x):
        return self.decay(x)

    def ridge(self):
        """lamb [H, Dk] float32, >= attn.lamb_min."""
        return jax.nn.softplus(self.lamb_raw[...]) + self.lamb_min

    def mix(self, q, k, v, beta, log_g, state=None, method=None, segment_ids=None):
        return mesa_net(q, k, v, beta, log_g, self.ridge(), cg_steps=self.cg_steps, initial_state=state,
                        method=method or self.method, chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, beta, log_g, segment_ids=None):
        return mesa_net_weights(q, k, beta, log_g, self.ridge(), cg_steps=self.cg_steps, segment_ids=segment_ids)

    def recurrent_state(self, batch_size: int):
        """(H [B, H, Dk, Dk], G [B, H, Dk, Dv]) float32."""
        keys = jnp.zeros((batch_size, self.n_heads, self.key_dim, self.key_dim), jnp.float32)
        return keys, super().recurrent_state(batch_size)

    def state_size(self, max_len):
        return super().state_size(max_len) + self.n_heads * self.key_dim * self.key_dim
