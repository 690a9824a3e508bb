"""Softmax attention with grouped key/value heads: MHA (K = H), GQA (1 < K < H), MQA (K = 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.config import ConfigError, MixerConfig, ModelConfig, one_of, positive
from lmzoo.mixers.base import Mixer, MixerContext, dense
from lmzoo.ops.attention import METHODS, attention_weights, softmax_attention
from lmzoo.positions import default_positions
from lmzoo.registry import register


@dataclass
class SoftmaxConfig(MixerConfig):
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head (MHA)
    method: str = "xla"  # reference | xla | cudnn

    def check(self, model: ModelConfig) -> None:
        one_of("attn.method", self.method, METHODS)
        kv = self.n_kv_heads or model.n_heads
        positive("attn.n_kv_heads", kv)
        if model.n_heads % kv:
            raise ConfigError(f"model.n_heads={model.n_heads} is not divisible by attn.n_kv_heads={kv}")


@register("softmax", config=SoftmaxConfig)
class SoftmaxAttention(Mixer):
    def __init__(self, cfg: SoftmaxConfig, ctx: MixerContext, *, rngs):
        self.n_heads = ctx.n_heads
        self.n_kv_heads = cfg.n_kv_heads or ctx.n_heads
        self.head_dim = ctx.d_model // ctx.n_heads
        self.method = cfg.method
        self.pos = ctx.pos
        d, hd = ctx.d_model, self.head_dim
        self.q_proj = dense(ctx, d, self.n_heads * hd, rngs=rngs)
        self.k_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.v_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.o_proj = dense(ctx, self.n_heads * hd, d, rngs=rngs, residual=True)

    def project(self, x, positions):
        """Rotated queries [B,T,H,D] and keys [B,T,K,D], values [B,T,K,D]."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        return self.pos.rotate(q, positions), self.pos.rotate(k, positions), v

    def __call__(self, x, *, positions=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        q, k, v = self.project(x, positions)
        y = softmax_attention(q, k, v, scale=self.head_dim**-0.5, method=self.method)  # (B, T, H, D)
        return self.o_proj(y.reshape(b, t, -1))

    def init_state(self, batch_size, max_len):
        shape = (batch_size, max_len, self.n_kv_heads, self.head_dim)
        dtype = self.k_proj.dtype or jnp.float32
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype), "t": jnp.zeros((), jnp.int32)}

    def step(self, x_t, state):
        b, t = x_t.shape[0], state["t"]
        q, k, v = self.project(x_t[:, None, :], jnp.full((b, 1), t, jnp.int32))
        keys = lax.dynamic_update_slice_in_dim(state["k"], k.astype(state["k"].dtype), t, axis=1)
        values = lax.dynamic_update_slice_in_dim(state["v"], v.astype(state["v"].dtype), t, axis=1)
        filled = jnp.arange(keys.shape[1]) <= t  # cache slots written so far
        bias = jnp.where(filled, 0.0, -jnp.inf)[None, None, None, :]
        y = softmax_attention(q, keys, values, scale=self.head_dim**-0.5, causal=False, bias=bias, method="reference")
        return self.o_proj(y.reshape(b, -1)), {"k": keys, "v": values, "t": t + 1}

    def attention_matrix(self, x):
        b, t, _ = x.shape
        q, k, _ = self.project(x, default_positions(b, t))
        return attention_weights(q, k, scale=self.head_dim**-0.5)

    def state_size(self, max_len):
        return 2 * max_len * self.n_kv_heads * self.head_dim
