"""Mamba-2 (Dao & Gu, 2024): a scalar decay per head turns the selective scan into SSD, which is gated
linear attention with one gate per head (``lmzoo.ops.ssd`` runs on ``lmzoo.ops.gated.gla``).

    x -> in_proj -> (z, xBC, dt);  xBC -> causal depthwise conv -> silu -> (x, B, C)
    dt = softplus(dt + dt_bias);  y = ssd(x, dt, A, B, C) + D x;  out_proj(rmsnorm(y * silu(z)))

Heads of size P share one decay ``A_h = -exp(A_log_h)`` (A_log initialised to log U[1, 16]) and,
in groups, the projections B and C (like grouped-query attention's keys). The gated RMSNorm
normalises each group of d_inner / n_groups channels. Decoding carries the conv window over
x, B and C and the state ``[H, P, N]``; the linear family's base (``family.linear``) does not fit,
since the gate z comes from the same projection as the op's inputs and SSD takes (x, dt, A, B, C, D). ``attention_matrix`` is SSD's own per-head matrix
(``ops.ssd_attention``); when there are more SSM heads than ``model.n_heads`` they are averaged
in contiguous groups. With ``segment_ids [B,T]`` (packed documents) the conv and SSD restart at
every document start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.mixers.family.ssm import CausalConv, check_dt_range, dt_bias_init
from lmzoo.ops.ssd import METHODS, ssd, ssd_attention
from lmzoo.registry import register
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, positive
from lmzoo.sharding import INNER, param


@register("mamba2")
@dataclass
class Mamba2Config(MixerConfig):
    d_state: int = 32  # N: state entries per head row
    d_conv: int = 4  # width of the causal depthwise convolution over x, B and C
    expand: int = 2  # d_inner = expand * d_model
    head_dim: Optional[int] = None  # P; None: d_inner / model.n_heads (one SSM head per model head)
    n_groups: int = 1  # groups of heads sharing B and C
    dt_min: float = 0.001  # dt is initialised log-uniformly in [dt_min, dt_max]
    dt_max: float = 0.1
    method: str = "chunk"  # scan | chunk | pallas (see lmzoo.ops.ssd)
    chunk_size: int = 64  # tokens per chunk for method=chunk|pallas

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, METHODS)
        for key in ("d_state", "d_conv", "expand", "n_groups"):
            positive(f"attn.{key}", getattr(self, key))
        check_dt_range(self.dt_min, self.dt_max)
        d_inner = self.expand * model.d_model
        head_dim = self.head_dim or d_inner // model.n_heads
        positive("attn.head_dim", head_dim)
        if d_inner % head_dim:
            raise ConfigError(f"attn.head_dim={head_dim} does not divide d_inner = attn.expand * model.d_model = {d_inner}")
        heads = d_inner // head_dim
        if heads % model.n_heads:
            raise ConfigError(f"{heads} SSM heads (d_inner / attn.head_dim) are not a multiple of model.n_heads={model.n_heads}")
        if heads % self.n_groups:
            raise ConfigError(f"attn.n_groups={self.n_groups} does not divide the {heads} SSM heads")

    def build(self, ctx, *, rngs):
        return Mamba2(self, ctx, rngs=rngs)


class Mamba2(Mixer):
    def __init__(self, cfg: Mamba2Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.method, self.chunk_size = ctx.n_heads, cfg.method, cfg.chunk_size
        self.d_inner, self.d_state, self.n_groups = cfg.expand * ctx.d_model, cfg.d_state, cfg.n_groups
        self.head_dim = cfg.head_dim or self.d_inner // ctx.n_heads
        self.ssm_heads = self.d_inner // self.head_dim
        self.dtype = ctx.dtype
        e, h, bc = self.d_inner, self.ssm_heads, cfg.n_groups * cfg.d_state
        self.in_proj = dense(ctx, ctx.d_model, 2 * e + 2 * bc + h, rngs=rngs)  # z, x, B, C, dt
        self.conv = CausalConv(e + 2 * bc, cfg.d_conv, bias=True, rngs=rngs)
        self.dt_bias = param(dt_bias_init(rngs.params(), h, cfg.dt_min, cfg.dt_max), None)
        self.A_log = param(jnp.log(jax.random.uniform(rngs.params(), (h,), jnp.float32, 1.0, 16.0)), None)
        self.D = param(jnp.ones((h,), jnp.float32), None)
        self.norm_weight = param(jnp.ones((e,), jnp.float32), INNER)
        self.out_proj = dense(ctx, e, ctx.d_model, rngs=rngs, residual=True)

    def ssm_inputs(self, x, conv_state=None, segment_ids=None):
        """x [B,T,H,P], dt [B,T,H] (positive, float32), B and C [B,T,G,N], gate z [B,T,E], conv window."""
        batch, length, _ = x.shape
        e, bc = self.d_inner, self.n_groups * self.d_state
        z, xbc, dt = jnp.split(self.in_proj(x), [e, 2 * e + 2 * bc], axis=-1)
        xbc, conv_state = self.conv(xbc, conv_state, segment_ids=segment_ids)
        xs, b, c = jnp.split(jax.nn.silu(xbc), [e, e + bc], axis=-1)
        groups = (batch, length, self.n_groups, self.d_state)
        dt = jax.nn.softplus(dt.astype(jnp.float32) + self.dt_bias[...])  # (B, T, H)
        xs = xs.reshape(batch, length, self.ssm_heads, self.head_dim)  # (B, T, H, P)
        return xs, dt, b.reshape(groups), c.reshape(groups), z, conv_state

    def A(self) -> jax.Array:
        return -jnp.exp(self.A_log[...])  # (H,)

    def gated_norm(self, y, z):
        """RMSNorm(y * silu(z)) over each group of d_inner / n_groups channels, in float32."""
        gated = (y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).reshape(*y.shape[:-1], self.n_groups, -1)
        normed = gated * jax.lax.rsqrt(jnp.mean(gated**2, axis=-1, keepdims=True) + 1e-5)
        return (normed.reshape(y.shape) * self.norm_weight[...]).astype(y.dtype)

    def mix(self, x, conv_state=None, ssm_state=None, method=None, segment_ids=None):
        batch, length, _ = x.shape
        xs, dt, b, c, z, conv_state = self.ssm_inputs(x, conv_state, segment_ids)
        y, ssm_state = ssd(
            xs, dt, self.A(), b, c, D=self.D[...], initial_state=ssm_state,
            chunk_size=self.chunk_size, method=method or self.method, segment_ids=segment_ids,
        )
        y = self.gated_norm(y.reshape(batch, length, self.d_inner), z)
        return self.out_proj(y), conv_state, ssm_state

    def __call__(self, x, *, positions=None, segment_ids=None):  # SSMs carry order in their state: positions are unused
        return self.mix(x, segment_ids=segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        y, conv, ssm = self.mix(x)
        return y, {"conv": conv, "ssm": ssm}

    def init_state(self, batch_size, max_len):
        return {
            "conv": self.conv.init_state(batch_size, self.dtype),
            "ssm": jnp.zeros((batch_size, self.ssm_heads, self.head_dim, self.d_state), jnp.float32),
        }

    def step(self, x_t, state):
        y, conv, ssm = self.mix(x_t[:, None], state["conv"], state["ssm"], method="scan")
        return y[:, 0], {"conv": conv, "ssm": ssm}

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        _, dt, b, c, _, _ = self.ssm_inputs(x, segment_ids=segment_ids)
        weights = ssd_attention(dt, self.A(), b, c, segment_ids=segment_ids)  # (B, H_ssm, T, T)
        batch, _, length, _ = weights.shape
        return weights.reshape(batch, self.n_heads, -1, length, length).mean(axis=2)

    def state_size(self, max_len):
        conv_channels = self.d_inner + 2 * self.n_groups * self.d_state
        return (self.conv.width - 1) * conv_channels + self.ssm_heads * self.head_dim * self.d_state
