"""Softmax attention and the refinements that keep its form: MHA / GQA / MQA, sliding windows (SWA),
log-n (entropy-invariant) scaling and KeyNorm.

``AttentionConfig`` holds the knobs every softmax-family mixer shares (MLA and GAU reuse it), and
``Scoring`` applies them identically in the parallel forward, the decoding step and the probes:
position method, logit scale, log-n factor, window. Decoding caches keys *before* any position
method, together with each slot's position, so every method reads the same cache (ReRoPE rotates
each key two ways); with a window the cache is a ring buffer of ``window`` slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, one_of, positive
from lmzoo.mixers.base import Mixer, MixerContext, dense
from lmzoo.ops.attention import METHODS, causal_mask, logn_scale, repeat_kv, softmax_attention
from lmzoo.positions import Positions, default_positions
from lmzoo.registry import register


@dataclass
class AttentionConfig(MixerConfig):
    """Knobs shared by the softmax family; each can also be switched when evaluating a checkpoint."""

    method: str = "xla"  # reference | xla | cudnn (ReRoPE position kinds always compute the reference form)
    window: Optional[int] = None  # sliding window: a query sees itself and the window - 1 keys before it; None: all
    scale: Optional[float] = None  # logit scale; None: head_dim ** -0.5 (1 with key_norm)
    logn: bool = False  # multiply each query's logits by log(n) / log(logn_base), n = the keys it sees
    logn_base: Optional[int] = None  # None: the training length (data.seq_len)
    logn_clamp: bool = False  # factor max(1, .): unchanged inside the training length
    nope: bool = False  # true: this layer ignores the model's position method (NoPE)

    def check(self, model: ModelConfig) -> None:
        one_of("attn.method", self.method, METHODS)
        if self.window is not None:
            positive("attn.window", self.window)
        if self.scale is not None:
            positive("attn.scale", self.scale)
        if self.logn_base is not None and self.logn_base < 2:
            raise ConfigError(f"attn.logn_base={self.logn_base} must be at least 2")


class Scoring:
    """How one layer turns queries and keys into attention logits and weights.

    ``rotary_dim``: only the trailing ``rotary_dim`` dims of q and k see positions, the rest are
    position-free (MLA's decoupled RoPE); None: all of them.
    """

    def __init__(self, cfg: AttentionConfig, ctx: MixerContext, *, head_dim: int, rotary_dim=None, key_norm=False):
        self.pos = Positions.none() if cfg.nope else ctx.pos
        default_scale = 1.0 if key_norm else head_dim**-0.5  # unit keys: the query's length is the temperature
        self.scale = (default_scale if cfg.scale is None else cfg.scale) * self.pos.logit_scale
        self.window, self.method, self.rotary_dim = cfg.window, cfg.method, rotary_dim
        self.logn_base = (cfg.logn_base or ctx.train_len) if cfg.logn else None
        self.logn_clamp = cfg.logn_clamp

    def cache_size(self, max_len: int) -> int:
        return max_len if self.window is None else min(self.window, max_len)

    def keys_seen(self, query_index: jax.Array) -> jax.Array:
        """How many keys the query at 0-based ``query_index`` attends to."""
        n = query_index + 1
        return n if self.window is None else jnp.minimum(n, self.window)

    def logn_factor(self, n_keys: jax.Array) -> Optional[jax.Array]:
        """Log-n factor per query [T] (n_keys: [T]), or None when log-n scaling is off."""
        return None if self.logn_base is None else logn_scale(n_keys, self.logn_base, clamp=self.logn_clamp)

    def scale_queries(self, q: jax.Array, n_keys: jax.Array) -> jax.Array:
        """Log-n scaling as a per-query factor on q [B,T,H,D]: it multiplies every dot product of the query."""
        factor = self.logn_factor(n_keys)
        if factor is None:
            return q
        return (q.astype(jnp.float32) * factor[None, :, None, None]).astype(q.dtype)

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        r = self.rotary_dim
        if r is None:
            return self.pos.rotate(x, positions)
        return jnp.concatenate([x[..., :-r], self.pos.rotate(x[..., -r:], positions)], axis=-1)

    def logits(self, q, k, q_pos, k_pos, *, free=None) -> jax.Array:
        """Scaled and biased logits [B,H,T,S] float32 of q [B,T,H,D], k [B,S,H,D] (one key head per
        query head); ``free`` adds precomputed position-free dot products (MLA's absorbed latent part)."""
        r = self.rotary_dim
        if r is not None and r < q.shape[-1]:
            content = jnp.einsum("bthd,bshd->bhts", q[..., :-r], k[..., :-r], preferred_element_type=jnp.float32)
            free = content if free is None else free + content
            q, k = q[..., -r:], k[..., -r:]
        scores = self.pos.scores(q, k, q_pos, k_pos)
        if free is not None:
            scores = scores + free
        bias = self.pos.bias(q_pos, k_pos, q.shape[2])
        scores = scores * self.scale
        return scores if bias is None else scores + bias

    def weights(self, q, k, q_pos, k_pos, mask, *, free=None) -> jax.Array:
        """Softmax probabilities [B,H,T,S] float32; k may have fewer heads than q (GQA)."""
        k = repeat_kv(k, q.shape[2] // k.shape[2])
        logits = self.logits(q, k, q_pos, k_pos, free=free)
        return jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)

    def matrix(self, q, k, positions) -> jax.Array:
        """Causal weights [B,H,T,T] of a whole sequence (the probes' view of ``parallel``)."""
        t = q.shape[1]
        q = self.scale_queries(q, self.keys_seen(jnp.arange(t)))
        return self.weights(q, k, positions, positions, causal_mask(t, t, window=self.window))

    def parallel(self, q, k, v, positions) -> jax.Array:
        """Causal attention: q [B,T,H,D], k [B,T,K,D], v [B,T,K,Dv] -> [B,T,H,Dv] in v's dtype."""
        if self.pos.clips_distance:  # two score matrices per pair: no fused kernel computes this
            weights = self.matrix(q, k, positions)
            return jnp.einsum("bhts,bshd->bthd", weights.astype(v.dtype), repeat_kv(v, q.shape[2] // v.shape[2]))
        q = self.scale_queries(q, self.keys_seen(jnp.arange(q.shape[1])))
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        bias = self.pos.bias(positions, positions, q.shape[2])
        d_v = v.shape[-1]
        q, k, v = pad_to_one_head_dim(q, k, v)
        y = softmax_attention(q, k, v, scale=self.scale, window=self.window, bias=bias, method=self.method)
        return y[..., :d_v]

    def cache_logits(self, q, keys, slot_pos, t, *, free=None):
        """Logits [B,H,1,S] of one query per sequence at position ``t`` against a cache of raw keys
        [B,S,H,D] whose slots hold positions ``slot_pos`` [S] (-1: empty), and the mask of visible slots.
        ``free``: position-free dot products of the same (unscaled) query, added to the logits."""
        b, size = q.shape[0], keys.shape[1]
        factor = self.logn_factor(self.keys_seen(t)[None])
        if factor is not None:
            q = self.scale_queries(q, self.keys_seen(t)[None])
            free = None if free is None else free * factor
        q_pos = jnp.full((b, 1), t, jnp.int32)
        k_pos = jnp.broadcast_to(slot_pos, (b, size))
        visible = slot_pos >= 0
        if self.window is not None:
            visible &= slot_pos > t - self.window
        return self.logits(q, keys, q_pos, k_pos, free=free), visible[None, None, None, :]

    def cache_weights(self, q, keys, slot_pos, t, *, free=None) -> jax.Array:
        keys = repeat_kv(keys, q.shape[2] // keys.shape[2])
        logits, visible = self.cache_logits(q, keys, slot_pos, t, free=free)
        return jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)


def pad_to_one_head_dim(q, k, v):
    """Zero-pad q/k or v so all share one head dim (fused kernels need it); dot products are unchanged."""
    d, d_v = q.shape[-1], v.shape[-1]
    pad = lambda x, n: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n)])
    if d_v < d:
        return q, k, pad(v, d - d_v)
    if d_v > d:
        return pad(q, d_v - d), pad(k, d_v - d), v
    return q, k, v


# ----------------------------------------------------------------------------- decoding cache


def init_cache(batch: int, size: int, **fields) -> dict:
    """A cache of ``size`` slots per sequence; ``fields``: name=(per-slot shape, dtype)."""
    cache = {name: jnp.zeros((batch, size, *shape), dtype) for name, (shape, dtype) in fields.items()}
    return {**cache, "pos": jnp.full((size,), -1, jnp.int32), "t": jnp.zeros((), jnp.int32)}


def cache_append(cache: dict, **entries) -> dict:
    """Write one step's entries [B, ...] into slot t mod size (a ring buffer when size < length)."""
    t, size = cache["t"], cache["pos"].shape[0]
    slot = t % size
    written = {
        name: lax.dynamic_update_slice_in_dim(cache[name], value[:, None].astype(cache[name].dtype), slot, axis=1)
        for name, value in entries.items()
    }
    return {**cache, **written, "pos": cache["pos"].at[slot].set(t), "t": t + 1}


# ----------------------------------------------------------------------------- the mixer


@register("softmax")
@dataclass
class SoftmaxConfig(AttentionConfig):
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head (MHA)
    key_norm: bool = False  # KeyNorm: L2-normalise each key head before the dot product

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        kv = self.n_kv_heads or model.n_heads
        positive("attn.n_kv_heads", kv)
        if model.n_heads % kv:
            raise ConfigError(f"model.n_heads={model.n_heads} is not divisible by attn.n_kv_heads={kv}")

    def build(self, ctx, *, rngs):
        return SoftmaxAttention(self, ctx, rngs=rngs)


class SoftmaxAttention(Mixer):
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

    def project(self, x, positions=None):
        """Queries [B,T,H,D], keys and values [B,T,K,D]; q and k rotated when ``positions`` is given
        (what the cache stores is unrotated: the position method acts in ``Scoring``)."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        if self.key_norm:
            k32 = k.astype(jnp.float32)
            k = (k32 * lax.rsqrt(jnp.sum(k32 * k32, axis=-1, keepdims=True) + 1e-12)).astype(k.dtype)
        if positions is not None:
            q, k = self.scoring.rotate(q, positions), self.scoring.rotate(k, positions)
        return q, k, v

    def __call__(self, x, *, positions=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        q, k, v = self.project(x)
        y = self.scoring.parallel(q, k, v, positions)  # (B, T, H, D)
        return self.o_proj(y.reshape(b, t, -1))

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
        return self.o_proj(y.reshape(x_t.shape[0], -1)), state

    def attention_matrix(self, x):
        b, t, _ = x.shape
        q, k, _ = self.project(x)
        return self.scoring.matrix(q, k, default_positions(b, t))

    def state_size(self, max_len):
        return 2 * self.scoring.cache_size(max_len) * self.n_kv_heads * self.head_dim
