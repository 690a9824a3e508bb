"""Multi-head latent attention (MLA, DeepSeek-V2): keys and values from one shared low-rank latent.

Each token writes a latent ``c = norm(x W_dkv)`` of ``kv_rank`` dims; per head, content keys are
``c W_uk`` and values ``c W_uv``. RoPE cannot act on keys rebuilt from a cached latent without
undoing the compression, so position lives in a separate ``rope_dim``-wide key, one per token and
shared by all heads, and a matching query part:
``logit = scale * (q_c . k_c + rope(q_r) . rope(k_r))``, ``scale = (head_dim + rope_dim)^-1/2``.

Decoding caches only ``c`` and the (unrotated) rope key: ``kv_rank + rope_dim`` floats per token
instead of ``2 * heads * head_dim``. The up-projections are absorbed: the query's content part is
mapped into latent space (``q_c W_uk^T``) and scored against the cached latents directly, and the
attention-weighted latent is mapped to values only once per head (``W_uv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import AttentionConfig, CacheMixer, Scoring, cache_append, init_cache
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig, positive
from lmzoo.sharding import EMBED, INNER, partitioned


@register("mla")
@dataclass
class MLAConfig(AttentionConfig):
    # no qk_norm: the absorbed decoding scores queries against cached latents and never forms per-head
    # keys to normalise (the latent itself is RMS-normalised already)
    head_options = ("output_gate",)
    kv_rank: Optional[int] = None  # latent width d_c cached per token; None: 4 x head_dim (DeepSeek-V2's ratio)
    q_rank: Optional[int] = None  # queries through a latent of this width too; None: straight from x
    rope_dim: Optional[int] = None  # width of the decoupled RoPE query/key part; None: head_dim // 2

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        for key in ("kv_rank", "q_rank", "rope_dim"):
            if getattr(self, key) is not None:
                positive(f"attn.{key}", getattr(self, key))
        rope_dim = self.rope_dim or (model.d_model // model.n_heads) // 2
        if rope_dim % 2:
            raise ConfigError(f"attn.rope_dim={rope_dim} must be even (RoPE rotates pairs of dims)")

    def build(self, ctx, *, rngs):
        return MultiHeadLatentAttention(self, ctx, rngs=rngs)

    def head_widths(self, model: ModelConfig) -> tuple[int, int]:
        head_dim, _, rope_dim = ranks(self, model.d_model, model.n_heads)
        return model.n_heads * (head_dim + rope_dim), model.n_heads * head_dim  # scores see the rope part too


def ranks(cfg: MLAConfig, d_model: int, n_heads: int) -> tuple[int, int, int]:
    """(head_dim, kv_rank, rope_dim) with their defaults filled in."""
    head_dim = d_model // n_heads
    return head_dim, cfg.kv_rank or 4 * head_dim, cfg.rope_dim or head_dim // 2


class MultiHeadLatentAttention(CacheMixer):
    def __init__(self, cfg: MLAConfig, ctx: MixerContext, *, rngs):
        self.n_heads = ctx.n_heads
        self.head_dim, self.kv_rank, self.rope_dim = ranks(cfg, ctx.d_model, ctx.n_heads)
        h, hd, dr, d = ctx.n_heads, self.head_dim, self.rope_dim, ctx.d_model
        self.scoring = Scoring(cfg, ctx, head_dim=hd + dr, rotary_dim=dr)
        if cfg.q_rank:
            self.q_down = dense(ctx, d, cfg.q_rank, rngs=rngs, axes=(EMBED, None))
            self.q_norm = nnx.RMSNorm(cfg.q_rank, dtype=ctx.dtype, scale_init=partitioned(nnx.initializers.ones, None),
                                      rngs=rngs)
        else:
            self.q_down = self.q_norm = None
        self.q_up = dense(ctx, cfg.q_rank or d, h * (hd + dr), rngs=rngs, axes=(None if cfg.q_rank else EMBED, INNER))
        self.kv_down = dense(ctx, d, self.kv_rank, rngs=rngs, axes=(EMBED, None))
        self.kv_norm = nnx.RMSNorm(self.kv_rank, dtype=ctx.dtype, scale_init=partitioned(nnx.initializers.ones, None),
                                   rngs=rngs)
        self.k_up = dense(ctx, self.kv_rank, h * hd, rngs=rngs, axes=(None, INNER))
        self.v_up = dense(ctx, self.kv_rank, h * hd, rngs=rngs, axes=(None, INNER))
        self.k_rope = dense(ctx, d, dr, rngs=rngs, axes=(EMBED, None))
        self.o_proj = dense(ctx, h * hd, d, rngs=rngs, residual=True)
        self.init_head_options(cfg, ctx, head_dim=hd, width=h * hd, rngs=rngs)

    def queries(self, x):
        """[B, T, H, head_dim + rope_dim]: content part first, rope part last."""
        b, t, _ = x.shape
        z = x if self.q_down is None else self.q_norm(self.q_down(x))
        return self.q_up(z).reshape(b, t, self.n_heads, self.head_dim + self.rope_dim)

    def latents(self, x):
        """What decoding caches: the normalised latent [B,T,kv_rank] and the rope key [B,T,rope_dim]."""
        return self.kv_norm(self.kv_down(x)), self.k_rope(x)

    def keys_values(self, latent, rope_key):
        """Full per-head keys [B,T,H,head_dim + rope_dim] and values [B,T,H,head_dim] from the latent."""
        b, t, _ = latent.shape
        h, hd = self.n_heads, self.head_dim
        k_content = self.k_up(latent).reshape(b, t, h, hd)
        k_rope = jnp.broadcast_to(rope_key[:, :, None, :], (b, t, h, self.rope_dim))  # one rope key for all heads
        keys = jnp.concatenate([k_content, k_rope.astype(k_content.dtype)], axis=-1)
        return keys, self.v_up(latent).reshape(b, t, h, hd)

    def forward(self, x, positions=None, segment_ids=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        latent, rope_key = self.latents(x)
        k, v = self.keys_values(latent, rope_key)
        y = self.scoring.parallel(self.queries(x), k, v, positions, segment_ids=segment_ids)  # (B, T, H, head_dim)
        return self.output(y, x), {"latent": latent, "rope_key": rope_key}

    def init_state(self, batch_size, max_len):
        dtype = self.kv_down.dtype or jnp.float32
        size = self.scoring.cache_size(max_len)
        return init_cache(batch_size, size, latent=((self.kv_rank,), dtype), rope_key=((self.rope_dim,), dtype))

    def step(self, x_t, state):
        """Absorbed decoding: scores and values computed in latent space, never rebuilding keys."""
        t, b = state["t"], x_t.shape[0]
        h, hd, dr, dc = self.n_heads, self.head_dim, self.rope_dim, self.kv_rank
        latent, rope_key = self.latents(x_t[:, None, :])
        state = cache_append(state, latent=latent[:, 0], rope_key=rope_key[:, 0])
        q = self.queries(x_t[:, None, :])  # (B, 1, H, hd + dr)
        w_uk = self.k_up.kernel[...].reshape(dc, h, hd).astype(q.dtype)
        q_latent = jnp.einsum("bthd,chd->bthc", q[..., :hd], w_uk)  # (B, 1, H, dc): q_c W_uk^T
        cached = state["latent"]  # (B, S, dc)
        content = jnp.einsum("bthc,bsc->bhts", q_latent, cached, preferred_element_type=jnp.float32)
        rope_keys = jnp.broadcast_to(state["rope_key"][:, :, None, :], (b, cached.shape[1], h, dr))
        weights = self.scoring.cache_weights(q[..., hd:], rope_keys, state["pos"], t, free=content)  # (B, H, 1, S)
        mixed = jnp.einsum("bhts,bsc->bthc", weights.astype(cached.dtype), cached)  # (B, 1, H, dc)
        w_uv = self.v_up.kernel[...].reshape(dc, h, hd).astype(mixed.dtype)
        y = jnp.einsum("bthc,chd->bthd", mixed, w_uv)  # (B, 1, H, hd)
        return self.output(y, x_t[:, None])[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        b, t, _ = x.shape
        k, _ = self.keys_values(*self.latents(x))
        positions = default_positions(b, t) if positions is None else positions
        return self.scoring.matrix(self.queries(x), k, positions, segment_ids=segment_ids)

    def state_size(self, max_len):
        return self.scoring.cache_size(max_len) * (self.kv_rank + self.rope_dim)
