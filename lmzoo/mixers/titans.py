"""Titans' neural memory (Behrouz et al., 2025), as a mixer: a linear memory per head trained at test time by
gradient descent with momentum and forgetting, a mini-batch of ``attn.chunk_size`` tokens at a time.

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|
    theta = base_lr * sigmoid(x W_lr + b_lr);   1 - alpha, eta = sigmoid(x W_g + b_g)      per head and token
    S_t = eta_t S_{t-1} - theta_t grad |LN(k_t P) w + c - (v_t - k_t)|^2   (P: the memory at the mini-batch's start)
    M_t = (1 - alpha_t) M_{t-1} + S_t;   o_t = z_t + LN(z_t) w + c,   z_t = q_t M_t
    y   = W_o (swish(x W_g') * headnorm(o))

The memory's start M_init [H, D, D] ~ N(0, 1/D) is learnt (the momentum starts at 0); every sequence and
document starts from it. The forget gate starts near keeping everything (1 - alpha = sigmoid(4 .. 6) over the
heads), the momentum near 0.9 (sigmoid(2)). The recurrence is ``lmzoo.ops.titans``; the projections, convs,
inner norm and output are the family's (``lmzoo.mixers.family.inner``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.inner import InnerModelConfig, InnerModelMixer
from lmzoo.ops.titans import METHODS, titans, titans_step, titans_weights
from lmzoo.registry import register
from lmzoo.sharding import EMBED, param


@register("titans")
@dataclass
class TitansConfig(InnerModelConfig):
    forms = METHODS

    def build(self, ctx, *, rngs):
        return Titans(self, ctx, rngs=rngs)


class Titans(InnerModelMixer):
    def init_rates(self, cfg: TitansConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        heads = self.n_heads
        self.gate_proj = dense(ctx, ctx.d_model, 2 * heads, rngs=rngs, axes=(EMBED, None))  # [forget | momentum]
        self.gate_bias = param(jnp.stack([jnp.linspace(4.0, 6.0, heads), jnp.full((heads,), 2.0)]), None, None)
        self.m_init = self.start_weights(rngs)

    def rates(self, x):
        """theta, log(1 - alpha), log eta [B, T, H] float32."""
        b, t, _ = x.shape
        gates = self.gate_proj(x).astype(jnp.float32).reshape(b, t, 2, self.n_heads) + self.gate_bias[...]
        return self.learning_rate(x), jax.nn.log_sigmoid(gates[:, :, 0]), jax.nn.log_sigmoid(gates[:, :, 1])

    def initial_state(self, batch_size: int):
        """(M [B, H, D, D], S, P): the learnt memory, no momentum, the memory as the gradient point."""
        memory = jnp.broadcast_to(self.m_init[...], (batch_size,) + self.m_init.shape)
        return memory, jnp.zeros_like(memory), memory

    def mix(self, q, k, v, theta, log_decay, log_momentum, *, state, method=None, segment_ids=None):
        return titans(q, k, v, theta, log_decay, log_momentum, *self.inner_norm(), initial_state=state[:2],
                      method=method or self.method, chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, theta, log_decay, log_momentum, segment_ids=None):
        return titans_weights(q, k, theta, log_decay, log_momentum, segment_ids=segment_ids)

    def decode(self, q, k, v, theta, log_decay, log_momentum, *, state, ends):
        return titans_step(q, k, v, theta, log_decay, log_momentum, *self.inner_norm(), state, ends)
