"""TTT-Linear (Sun et al., 2024): the state is a linear model per head, trained at test time by one gradient
step of a layer-normed reconstruction loss per token, a mini-batch of ``attn.chunk_size`` tokens at a time.

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|;   eta = base_lr * sigmoid(x W_lr + b_lr)
    u_j = grad of 1/2 |LN(k_j W0 + b0) w + c - (v_j - k_j)|^2 at the mini-batch's start (W0, b0)
    W_t = W0 - eta_t sum_{j<=t} k_j^T u_j,  b_t = b0 - eta_t sum_{j<=t} u_j;   z_t = q_t W_t / sqrt(D) + b_t
    o_t = z_t + LN(z_t) w + c;   y = W_o (swish(x W_g) * headnorm(o))

The inner model's start (W_init [H, D, D] ~ N(0, 1/D), b_init [H, D] = 0) is learnt by the outer loop, as in
the paper; every sequence and every document starts from it. The recurrence is ``lmzoo.ops.ttt_linear``; the
projections, convs, inner norm and output are the family's (``lmzoo.mixers.family.inner``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.inner import InnerModelConfig, InnerModelMixer
from lmzoo.ops.ttt import METHODS, ttt_linear, ttt_linear_step, ttt_linear_weights
from lmzoo.registry import register
from lmzoo.sharding import param


@register("ttt_linear")
@dataclass
class TTTLinearConfig(InnerModelConfig):
    forms = METHODS

    def build(self, ctx, *, rngs):
        return TTTLinear(self, ctx, rngs=rngs)


class TTTLinear(InnerModelMixer):
    def init_rates(self, cfg: TTTLinearConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.w_init = self.start_weights(rngs)
        self.b_init = param(jnp.zeros((self.n_heads, self.head_dim), jnp.float32), None, None)

    def rates(self, x):
        return (self.learning_rate(x),)

    def initial_state(self, batch_size: int):
        """(W0 [B, H, D, D], b0 [B, H, D], dW, db): the learnt start, no updates yet."""
        w = jnp.broadcast_to(self.w_init[...], (batch_size,) + self.w_init.shape)
        b = jnp.broadcast_to(self.b_init[...], (batch_size,) + self.b_init.shape)
        return w, b, jnp.zeros_like(w), jnp.zeros_like(b)

    def mix(self, q, k, v, eta, *, state, method=None, segment_ids=None):
        return ttt_linear(q, k, v, eta, *self.inner_norm(), initial_state=state[:2], method=method or self.method,
                          chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, eta, segment_ids=None):
        return ttt_linear_weights(q, k, eta, chunk_size=self.chunk_size, segment_ids=segment_ids)

    def decode(self, q, k, v, eta, *, state, ends):
        return ttt_linear_step(q, k, v, eta, *self.inner_norm(), state, ends)
