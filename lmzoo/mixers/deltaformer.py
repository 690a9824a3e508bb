"""DeltaFormer (Zhong et al., 2025, "Understanding Transformer from the Perspective of Associative Memory"):
softmax attention over values that a delta rule with a softmax kernel writes first (``lmzoo.ops.deltaformer``):

    q, k, v = x W_q, x W_k, x W_v  (rotated by the model's position method),   beta_t = sigmoid(x_t W_beta + b)
    u_t = v_t - beta_t sum_{j<t} softmax_j(scale k_t . k_j) u_j         the keys against each other
    o_t = sum_{j<=t} softmax_j(scale q_t . k_j) u_j                      softmax attention over u

Each token stores the part of its value that the softmax memory of the earlier tokens does not already recall
at its key, which lets the layer track state that plain attention cannot (the paper's argument), for the
price of a second attention and a triangular solve. The write compares keys with keys (as fla's layer does;
the op also takes separate write queries). Positions act as rotations of q and k before both attentions;
ALiBi and ReRoPE, which act on each query-key pair, are refused, and so are a window and log-n scaling (the
write reads every earlier token). Decoding caches the rotated keys and the written values u (float32): a
token's u needs only the cache, and its output reads the cache and itself (``deltaformer_step``).
``attention_matrix`` is the effective weights on v, ``A (I + diag(beta) P)^{-1}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import (AttentionConfig, KVHeadsMixer, Scoring, cache_append, check_kv_heads,
                                           check_rotary_positions, init_cache, mean_keys_seen)
from lmzoo.ops.deltaformer import METHODS, deltaformer, deltaformer_step, deltaformer_weights
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive


@register("deltaformer")
@dataclass
class DeltaFormerConfig(AttentionConfig):
    head_options = ("output_gate", "qk_norm")
    forms = METHODS
    unsupported = ("window", "logn")  # the write reads every earlier token
    method: str = "chunk"  # naive | chunk | parallel (lmzoo.ops.deltaformer; same result)
    chunk_size: int = 64  # tokens per chunk of the written values' solve
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.chunk_size", self.chunk_size)
        check_kv_heads(self.n_kv_heads, model)

    def build(self, ctx, *, rngs):
        return DeltaFormer(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Two attentions over the keys a token sees (the read per query head, the write per kv head) and the
        solve's blocks on the diagonal, forward and backward."""
        kv_width = (self.n_kv_heads or model.n_heads) * model.d_model // model.n_heads
        return 6 * (mean_keys_seen(seq_len, None) * (2 * model.d_model + 2 * kv_width) + self.chunk_size * kv_width)


class DeltaFormer(KVHeadsMixer):
    def __init__(self, cfg: DeltaFormerConfig, ctx: MixerContext, *, rngs):
        check_rotary_positions(ctx, "deltaformer")
        self.init_heads(ctx, cfg.n_kv_heads, rngs=rngs)
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim)
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.beta_proj = dense(ctx, ctx.d_model, self.n_kv_heads, rngs=rngs, bias=True)
        self.init_output(cfg, ctx, rngs=rngs)

    def project(self, x, positions=None):
        """Rotated q [B,T,H,D] and k [B,T,K,D], v [B,T,K,D], and beta [B,T,K] float32 in (0, 1)."""
        beta = jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32))
        return *self.rotated_heads(x, positions), beta

    def forward(self, x, positions=None, segment_ids=None):
        q, k, v, beta = self.project(x, positions)
        o, (_, u) = deltaformer(q, k, v, beta, scale=self.scoring.scale, segment_ids=segment_ids, method=self.method,
                                chunk_size=self.chunk_size)
        return self.output(o, x), {"k": k, "u": u}

    def init_state(self, batch_size, max_len):
        shape = (self.n_kv_heads, self.head_dim)
        return init_cache(batch_size, max_len, k=(shape, self.k_proj.dtype or jnp.float32), u=(shape, jnp.float32))

    def step(self, x_t, state):
        x_t = x_t[:, None, :]
        q, k, v, beta = self.project(x_t, default_positions(x_t.shape[0], 1, state["t"]))
        earlier = jnp.broadcast_to(state["pos"] >= 0, state["u"].shape[:2])  # (B, S): the tokens before
        o, u = deltaformer_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], state["k"], state["u"], earlier,
                                scale=self.scoring.scale)
        state = cache_append(state, k=k[:, 0], u=u)  # slots in time order: the cache never wraps
        return self.output(o[:, None].astype(v.dtype), x_t)[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        q, k, _, beta = self.project(x, positions)
        return deltaformer_weights(q, k, beta, scale=self.scoring.scale, segment_ids=segment_ids,
                                   chunk_size=self.chunk_size)
