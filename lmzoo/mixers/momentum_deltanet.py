"""Momentum DeltaNet: the gated delta rule whose state moves by a decaying momentum of its updates, as
gradient descent with momentum moves weights (the delta rule is one gradient step on ||S^T k - v||^2).

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|
    beta = sigmoid(x W_beta);   eta = sigmoid(x W_eta);   mu = sigmoid(x W_mu + mu_bias)      per head
    log alpha_t = -exp(A_log_h) softplus(x W_a + dt_bias_h)                                  per head
    M_t = mu_t M_{t-1} - eta_t k_t (v_t - S_{t-1}^T k_t)^T;   S_t = alpha_t S_{t-1} - beta_t M_t
    o_t = S_t^T q_t / sqrt(Dk);   y = W_o (swish(x W_g) * headnorm(o))

The recurrence is ``lmzoo.ops.momentum_delta_rule`` with the prediction key p = k; the convs, unit q and
k, beta, the decay, the head norm and output gate, and decoding are the delta-rule family's
(``lmzoo.mixers.family.delta``). The momentum's bias starts at ``attn.momentum_init`` (0.5 by default),
so the state first keeps about two steps of past updates in motion. Decoding carries both states,
``(S, M)``, and the conv window. With beta eta < 1 < 2 (1 + mu) every step of the heavy ball on a unit
key is stable. ``attention_matrix`` is the op's effective weights on the values
(``lmzoo.ops.momentum_delta_rule_weights``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer
from lmzoo.ops.momentum_delta import METHODS, STEP_FORM, momentum_delta_rule, momentum_delta_rule_weights
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig
from lmzoo.sharding import param


@register("momentum_deltanet")
@dataclass
class MomentumDeltaNetConfig(DecayConfig):
    forms = METHODS

    method: str = "chunk"  # naive | chunk | parallel (see lmzoo.ops.momentum_delta)
    momentum_init: float = 0.5  # the momentum mu's value at a zero projection, in (0, 1)

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        if not 0.0 < self.momentum_init < 1.0:
            raise ConfigError(f"attn.momentum_init={self.momentum_init} must lie in (0, 1)")

    def build(self, ctx, *, rngs):
        return MomentumDeltaNet(self, ctx, rngs=rngs)


class MomentumDeltaNet(DeltaRuleMixer):
    step_form = STEP_FORM  # of lmzoo.ops.momentum_delta

    def init_gates(self, cfg: MomentumDeltaNetConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=False, rngs=rngs)  # alpha: the family's Mamba-2-style decay per head
        self.eta_proj = dense(ctx, ctx.d_model, self.n_heads, rngs=rngs)
        self.mu_proj = dense(ctx, ctx.d_model, self.n_heads, rngs=rngs)
        logit = math.log(cfg.momentum_init / (1.0 - cfg.momentum_init))
        self.mu_bias = param(jnp.full((self.n_heads,), logit, jnp.float32), None)

    def project(self, x, conv_state=None, segment_ids=None):
        """(q, k, v, beta, eta, log_alpha, log_mu), each gate [B, T, H] float32, and the conv window."""
        (q, k, v, beta, log_alpha), conv_state = super().project(x, conv_state, segment_ids)
        eta = jax.nn.sigmoid(self.eta_proj(x).astype(jnp.float32))
        log_mu = jax.nn.log_sigmoid(self.mu_proj(x).astype(jnp.float32) + self.mu_bias[...])
        return (q, k, v, beta, eta, log_alpha, log_mu), conv_state

    def gates(self, x):
        return self.decay(x)

    def mix(self, q, k, v, beta, eta, log_alpha, log_mu, state=None, method=None, segment_ids=None):
        return momentum_delta_rule(q, k, v, k, beta, eta, log_alpha, log_mu, initial_state=state,
                                   method=method or self.method, chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, beta, eta, log_alpha, log_mu, segment_ids=None):
        return momentum_delta_rule_weights(q, k, k, beta, eta, log_alpha, log_mu, segment_ids=segment_ids)

    def recurrent_state(self, batch_size: int):
        """(S, M), each [B, H, Dk, Dv] float32."""
        return (super().recurrent_state(batch_size),) * 2

    def state_size(self, max_len):
        return super().state_size(max_len) + self.n_heads * self.key_dim * self.value_dim
