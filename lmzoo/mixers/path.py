"""PaTH attention (Yang et al., 2025, "PaTH attention: position encoding via accumulating Householder
transformations"): softmax attention whose keys reach the query through the reflections of the
tokens between them (``lmzoo.ops.path``):

    w_t = normalize(x_t W_w)  per kv head (W_w of rank w_rank),   beta_t = 2 sigmoid(x_t W_beta + b)  in (0, 2)
    H_t = I - beta_t w_t w_t^T
    l_ij = scale (q_i^T H_i ... H_{j+1} k_j + G_i - G_j),   G_t = sum_{s<=t} log sigmoid(x_s W_g + b_g)  (forget_gate)
    o_i = sum_{j<=i} softmax_j(l_ij) v_j

The reflections are the layer's position encoding (data-dependent where RoPE's rotations depend on
distance alone), so the model's ``pos`` is not applied here; ``forget_gate`` adds FoX's gates
(PaTH-FoX). beta up to 2 lets a reflection flip a direction (negative eigenvalues: state tracking).
fla's layer also passes w through a 3-tap short convolution; here w is a projection of the token
alone, so decoding carries no convolution state.

Decoding caches transformed keys ``k~_j = H_i ... H_{j+1} k_j`` (float32, they change every step),
values and the cumulative gates: on token i every cached key is reflected by H_i, then k_i joins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import KVHeadsMixer, check_kv_heads, HeadOptions, cache_append, mean_keys_seen
from lmzoo.ops.attention import repeat_kv
from lmzoo.ops.path import METHODS, path_attention, path_matrix, reflect_keys
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, one_of, positive
from lmzoo.sharding import EMBED, INNER


@register("path")
@dataclass
class PathConfig(HeadOptions):
    head_options: ClassVar[tuple[str, ...]] = ("output_gate", "qk_norm")
    forms = METHODS  # the op's forms attn.method may name; a class attribute, not a config key
    method: str = "chunk"  # naive | chunk (lmzoo.ops.path; same result)
    chunk_size: int = 32  # tokens per chunk of method=chunk
    n_kv_heads: Optional[int] = None  # None: one key/value head (and reflection) per query head
    scale: Optional[float] = None  # logit scale (gate term included); None: head_dim ** -0.5
    w_rank: Optional[int] = 32  # rank of the reflection directions' projection; None: full
    forget_gate: bool = False  # PaTH-FoX: add FoX's cumulative log forget gates to the logits
    forget_bias_init: float = 0.0  # the forget gates' bias at initialisation

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        one_of("attn.method", self.method, self.forms)
        positive("attn.chunk_size", self.chunk_size)
        for key in ("scale", "w_rank"):
            if getattr(self, key) is not None:
                positive(f"attn.{key}", getattr(self, key))
        check_kv_heads(self.n_kv_heads, model)

    def build(self, ctx, *, rngs):
        return PathAttention(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Logits and weighted values as softmax attention, plus carrying every earlier key through each
        chunk's product of reflections (a head_dim^2 matmul per key per chunk), forward and backward."""
        head_dim = model.d_model // model.n_heads
        carry = model.d_model * head_dim / self.chunk_size
        return 6 * mean_keys_seen(seq_len, None) * (2 * model.d_model + carry)


class PathAttention(KVHeadsMixer):
    def __init__(self, cfg: PathConfig, ctx: MixerContext, *, rngs):
        d = ctx.d_model
        self.init_heads(ctx, cfg.n_kv_heads, rngs=rngs)
        self.scale = self.head_dim**-0.5 if cfg.scale is None else cfg.scale
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        kv_width = self.n_kv_heads * self.head_dim
        if cfg.w_rank:
            self.w_down = dense(ctx, d, cfg.w_rank, rngs=rngs, axes=(EMBED, None))
            self.w_up = dense(ctx, cfg.w_rank, kv_width, rngs=rngs, axes=(None, INNER))
        else:
            self.w_down, self.w_up = None, dense(ctx, d, kv_width, rngs=rngs)
        self.beta_proj = dense(ctx, d, self.n_kv_heads, rngs=rngs, bias=True)
        if cfg.forget_gate:
            self.forget_proj = dense(ctx, d, self.n_heads, rngs=rngs, bias=True)
            self.forget_proj.bias[...] = jnp.full((self.n_heads,), cfg.forget_bias_init, jnp.float32)
        else:
            self.forget_proj = None
        self.init_output(cfg, ctx, rngs=rngs)

    def project(self, x):
        """q [B,T,H,D]; k, v [B,T,K,D]; unit w [B,T,K,D] and beta [B,T,K] float32; log gates [B,T,H] or None."""
        b, t, _ = x.shape
        q, k, v = self.heads(x)
        w = self.w_up(x if self.w_down is None else self.w_down(x)).astype(jnp.float32)
        w = w.reshape(b, t, self.n_kv_heads, self.head_dim)
        w = w * jax.lax.rsqrt(jnp.sum(w * w, axis=-1, keepdims=True) + 1e-12)
        beta = 2.0 * jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32))
        log_g = None if self.forget_proj is None else jax.nn.log_sigmoid(self.forget_proj(x).astype(jnp.float32))
        return q, k, v, w, beta, log_g

    def forward(self, x, positions=None, segment_ids=None):
        q, k, v, w, beta, log_g = self.project(x)
        o, keys = path_attention(q, k, v, w, beta, log_g, scale=self.scale, segment_ids=segment_ids,
                                 method=self.method, chunk_size=self.chunk_size)
        entries = {"k": keys, "v": v}
        if log_g is not None:
            entries["g"] = jnp.cumsum(log_g, axis=1)
        return self.output(o, x), entries

    def prefill(self, x, max_len=None, *, positions=None):
        y, state = super().prefill(x, max_len, positions=positions)
        if "g" in state:
            state = {**state, "g_now": state["g"][:, x.shape[1] - 1]}
        return y, state

    def init_state(self, batch_size, max_len):
        if self.forget_proj is None:
            return self.init_kv_cache(batch_size, max_len, key_dtype=jnp.float32)
        cache = self.init_kv_cache(batch_size, max_len, key_dtype=jnp.float32, g=((self.n_heads,), jnp.float32))
        return {**cache, "g_now": jnp.zeros((batch_size, self.n_heads), jnp.float32)}

    def step(self, x_t, state):
        q, k, v, w, beta, log_g = self.project(x_t[:, None, :])  # (B, 1, ...)
        state = {**state, "k": reflect_keys(state["k"], w[:, 0], beta[:, 0])}  # k~_j <- H_t k~_j; empty slots stay 0
        entries = {"k": k[:, 0], "v": v[:, 0]}
        if log_g is not None:
            g_now = state["g_now"] + log_g[:, 0]
            state, entries["g"] = {**state, "g_now": g_now}, g_now
        state = cache_append(state, **entries)  # slots in time order: the cache never wraps
        keys, values = (repeat_kv(state[name], self.n_heads // self.n_kv_heads) for name in ("k", "v"))
        logits = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), keys)  # (B, H, 1, S)
        if log_g is not None:
            logits = logits + (state["g_now"][:, :, None] - state["g"].swapaxes(1, 2))[:, :, None, :]
        logits = jnp.where(state["pos"] >= 0, logits * self.scale, -jnp.inf)
        weights = jax.nn.softmax(logits, axis=-1)
        o = jnp.einsum("bhts,bshd->bthd", weights, values.astype(jnp.float32)).astype(v.dtype)
        return self.output(o, x_t[:, None])[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        q, k, _, w, beta, log_g = self.project(x)
        return path_matrix(q, k, w, beta, log_g, scale=self.scale, segment_ids=segment_ids, method=self.method,
                           chunk_size=self.chunk_size)
