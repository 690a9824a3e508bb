"""Lightning attention (MiniMax-01; Qin et al., 2024, "Lightning Attention-2"): linear attention with a fixed decay
per head, the linear layers of MiniMax-01's hybrid.

    q, k, v = silu(x W_qkv)                                      per head, no position encoding
    S_t = lambda_h S_{t-1} + k_t^T v_t;   o_t = q_t S_t          (scale 1)
    y = W_o (RMSNorm(o) * sigmoid(x W_g))

Head h (from 0) of layer l (of L) decays by ``lambda_h = exp(-s_h (1 - l / (L - 1) + 1e-5))`` with ALiBi's slopes
``s_h = 2^(-8 (h + 1) / H)``, as MiniMax-01's released model: lower layers forget faster, the top layer barely.
(flash-linear-attention's ``lightning_attn`` uses another schedule, ``-(8 / H) (1 - l / L) h`` per step, which
leaves its first head undecayed.) Lightning attention itself is a tiled way of computing this recurrence, which
is ``lmzoo.ops.gla`` with one constant log gate per head (RetNet's algebra, other decays, activations and output),
so ``attn.method`` picks among GLA's forms; its chunk form is the intra-/inter-block split lightning attention
names. The output norm is one RMSNorm over the whole width, then the sigmoid gate.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import GatedMixer, LinearFamilyConfig
from lmzoo.registry import register
from lmzoo.sharding import INNER, partitioned


@register("lightning")
@dataclass
class LightningConfig(LinearFamilyConfig):
    def build(self, ctx, *, rngs):
        return LightningAttention(self, ctx, rngs=rngs)


def lightning_log_decays(n_heads: int, layer: int, n_layers: int) -> jax.Array:
    """[H] float32 log(lambda_h) = -2^(-8 (h + 1) / H) (1 - layer / (n_layers - 1 + 1e-5) + 1e-5)."""
    slopes = 2.0 ** (-8.0 * (jnp.arange(n_heads, dtype=jnp.float32) + 1.0) / n_heads)
    return -slopes * (1.0 - layer / (n_layers - 1 + 1e-5) + 1e-5)


class LightningAttention(GatedMixer):
    scale = 1.0  # MiniMax-01 leaves q k^T unscaled: the output's RMSNorm rescales o

    def __init__(self, cfg: LightningConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads, self.head_dim = ctx.n_heads, d // ctx.n_heads
        self.key_dim = self.value_dim = self.head_dim
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.layer, self.n_layers = ctx.layer, ctx.n_layers  # the decays' schedule: constants, not parameters
        self.qkv_proj = dense(ctx, d, 3 * d, rngs=rngs)
        ones = partitioned(nnx.initializers.ones, INNER)
        self.norm = nnx.RMSNorm(d, epsilon=1e-6, dtype=jnp.float32, scale_init=ones, rngs=rngs)
        self.gate = dense(ctx, d, d, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def heads(self, x, positions=None, segment_ids=None):  # the decays carry order: positions are unused
        """q, k, v [B,T,H,D] and the constant log decays [B,T,H] float32."""
        b, t, _ = x.shape
        qkv = jax.nn.silu(self.qkv_proj(x)).reshape(b, t, self.n_heads, 3 * self.head_dim)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        log_decays = lightning_log_decays(self.n_heads, self.layer, self.n_layers)
        return q, k, v, jnp.broadcast_to(log_decays, (b, t, self.n_heads))

    def output(self, x, o):
        normed = self.norm(o.reshape(*o.shape[:-2], -1)) * jax.nn.sigmoid(self.gate(x).astype(jnp.float32))
        return self.o_proj(normed.astype(x.dtype))
