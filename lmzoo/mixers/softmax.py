"""Softmax attention and the refinements that keep its form: MHA / GQA / MQA, sliding windows (SWA),
log-n (entropy-invariant) scaling, KeyNorm, QK-norm and the output gate (gated attention).

The knobs shared with the rest of the softmax family (method, window, scale, log-n, NoPE), the
scoring that applies them and the decoding cache live in ``lmzoo.mixers.family.attention``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax.numpy as jnp
from jax import lax

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import AttentionConfig, CacheMixer, check_kv_heads, Scoring, cache_append, init_cache
from lmzoo.ops.attention import repeat_kv
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig


@register("softmax")
@dataclass
class SoftmaxConfig(AttentionConfig):
    head_options = ("output_gate", "qk_norm")
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head (MHA)
    key_norm: bool = False  # KeyNorm: L2-normalise each key head before the dot product

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        check_kv_heads(self.n_kv_heads, model)
        if self.qk_norm and self.key_norm:
            raise ConfigError("attn.qk_norm and attn.key_norm both normalise the keys: set one of them")

    def build(self, ctx, *, rngs):
        return SoftmaxAttention(self, ctx, rngs=rngs)


class SoftmaxAttention(CacheMixer):
    def __init__(self, cfg: SoftmaxConfig, ctx: MixerContext, *, rngs):
        self.n_heads = ctx.n_heads
        self.n_kv_heads = cfg.n_kv_heads or ctx.n_heads
        self.head_dim = ctx.d_model // ctx.n_heads
        self.key_norm = cfg.key_norm
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim, key_norm=cfg.key_norm)
        d, hd = ctx.d_model, self.head_dim
        self.q_proj = dense(ctx, d, self.n_heads * hd, rngs=rngs)
        self.k_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.v_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.o_proj = dense(ctx, self.n_heads * hd, d, rngs=rngs, residual=True)
        self.init_head_options(cfg, ctx, head_dim=hd, width=self.n_heads * hd, rngs=rngs)

    def project(self, x, positions=None):
        """Queries [B,T,H,D], keys and values [B,T,K,D]; q and k rotated when ``positions`` is given
        (what the cache stores is unrotated: the position method acts in ``Scoring``)."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        q, k = self.normalize_qk(q, k)
        if self.key_norm:
            k32 = k.astype(jnp.float32)
            k = (k32 * lax.rsqrt(jnp.sum(k32 * k32, axis=-1, keepdims=True) + 1e-12)).astype(k.dtype)
        if positions is not None:
            q, k = self.scoring.rotate(q, positions), self.scoring.rotate(k, positions)
        return q, k, v

    def forward(self, x, positions=None, segment_ids=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        q, k, v = self.project(x)
        y = self.scoring.parallel(q, k, v, positions, segment_ids=segment_ids)  # (B, T, H, D)
        return self.output(y, x), {"k": k, "v": v}

    def init_state(self, batch_size, max_len):
        kv = ((self.n_kv_heads, self.head_dim), self.k_proj.dtype or jnp.float32)
        return init_cache(batch_size, self.scoring.cache_size(max_len), k=kv, v=kv)

    def step(self, x_t, state):
        t = state["t"]
        q, k, v = self.project(x_t[:, None, :])  # (B, 1, H|K, D)
        state = cache_append(state, k=k[:, 0], v=v[:, 0])
        weights = self.scoring.cache_weights(q, state["k"], state["pos"], t)  # (B, H, 1, S)
        values = repeat_kv(state["v"], self.n_heads // self.n_kv_heads)
        y = jnp.einsum("bhts,bshd->bthd", weights.astype(values.dtype), values)
        return self.output(y, x_t[:, None])[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        b, t, _ = x.shape
        q, k, _ = self.project(x)
        positions = default_positions(b, t) if positions is None else positions
        return self.scoring.matrix(q, k, positions, segment_ids=segment_ids)

    def scored_vectors(self, x, *, positions=None):
        """Queries and keys [B,T,H,D] float32 whose dot products times ``scale`` are this layer's
        logits before masks and biases (rotated by RoPE-like position methods), and ``scale``."""
        b, t, _ = x.shape
        q, k, _ = self.project(x)
        return self.scoring.scored_vectors(q, k, default_positions(b, t) if positions is None else positions)

    def state_size(self, max_len):
        return 2 * self.scoring.cache_size(max_len) * self.n_kv_heads * self.head_dim
