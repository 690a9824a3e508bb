"""DeepSeek sparse attention (DSA; DeepSeek-V3.2): a lightning indexer chooses the top-k keys of
each query, and softmax attention runs over those keys only, the same choice for every head.

    q_idx = x W_qi  [HI, DI],   k_idx = x W_ki  [DI] (one per token),   w_idx = (x W_w) HI^−½  [HI]
    I[t, s] = Σ_j w_idx[t, j] relu(DI^−½ q_idx[t, j]·k_idx[s]),   S_t = top-k_s I[t, s]  (s <= t)
    o_t = Σ_{s ∈ S_t} softmax_s(scale q_t·k_s) v_s

The choice is an integer, so the language-model loss cannot train the indexer; as in DeepSeek-V3.2's
sparse stage, the indexer learns from its own loss, ``KL(p_t || softmax_{S_t}(I[t, ·]))`` with p_t the
main attention over S_t averaged over heads and held fixed, sown as ``AuxLoss("indexer")`` times
``indexer_loss_weight``. The indexer reads the input through a stop-gradient: its loss trains its
own projections only, and the main attention never sees its gradient.

Positions: the model's rotary method rotates q and k, and the indexer's q_idx and k_idx, so the
indexer can prefer near keys; ALiBi and ReRoPE (pairwise) are refused. Decoding caches the rotated
keys, the values and the rotated index keys of every token (``DI`` more floats per token).
Documents: a query's indexer sees its own document only (see ``lmzoo.ops.dsa``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lmzoo.mixers.base import AuxLoss, MixerContext, dense
from lmzoo.mixers.family.attention import AttentionConfig, CacheMixer, check_kv_heads, Scoring, cache_append, init_cache
from lmzoo.ops.dsa import METHODS, dsa, dsa_indexer, dsa_indexer_loss, dsa_step, dsa_weights
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig, one_of, positive
from lmzoo.sharding import EMBED, INNER

PAIRWISE_POSITIONS = ("alibi", "rerope", "leaky_rerope")  # act on each query-key score, not on the vectors


@register("dsa")
@dataclass
class DSAConfig(AttentionConfig):
    method: str = "naive"  # naive | gather (lmzoo.ops.dsa.METHODS): the dense reference is the faster on CPUs at a few hundred tokens
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head
    topk: int = 64  # keys each query attends to (all of them for its first topk positions)
    index_heads: int = 4  # HI, the indexer's heads
    index_dim: int = 16  # DI, the width of an indexer head and of the index key
    indexer_loss_weight: float = 1.0  # weight of the indexer's KL loss (0: the indexer stays as initialised)

    def check(self, model: ModelConfig) -> None:
        one_of("attn.method", self.method, METHODS)
        for key in ("topk", "index_heads", "index_dim"):
            positive(f"attn.{key}", getattr(self, key))
        positive("attn.indexer_loss_weight", self.indexer_loss_weight, allow_zero=True)
        if self.index_dim % 2:
            raise ConfigError(f"attn.index_dim={self.index_dim} must be even (rotary positions turn pairs of dims)")
        if self.scale is not None:
            positive("attn.scale", self.scale)
        check_kv_heads(self.n_kv_heads, model)
        for knob in ("window", "logn", "output_gate", "qk_norm"):  # the indexer decides what a query sees
            if getattr(self, knob, None):
                raise ConfigError(f"attn.{knob}={getattr(self, knob)} is not supported by attn.mixer=dsa "
                                  "(leave it unset)")

    def build(self, ctx, *, rngs):
        return DeepSeekSparseAttention(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """The main attention over min(topk, t + 1) keys and the indexer over all t + 1 (its scores in
        the forward, its loss's backward), averaged over a causal sequence; 3 passes x 2 FLOPs."""
        score_width, value_width = self.head_widths(model)
        selected = sum(min(self.topk, t + 1) for t in range(seq_len)) / seq_len
        indexed = (seq_len + 1) / 2
        return 6 * (selected * (score_width + value_width) + indexed * self.index_heads * self.index_dim)


class DeepSeekSparseAttention(CacheMixer):
    def __init__(self, cfg: DSAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.n_kv_heads = ctx.n_heads, cfg.n_kv_heads or ctx.n_heads
        self.head_dim = ctx.d_model // ctx.n_heads
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim)
        if ctx.pos.kind in PAIRWISE_POSITIONS:
            raise ConfigError(f"pos.kind={ctx.pos.kind} is not supported by attn.mixer=dsa (choose a rotary kind or none)")
        self.topk, self.method, self.loss_weight = cfg.topk, cfg.method, cfg.indexer_loss_weight
        self.index_heads, self.index_dim = cfg.index_heads, cfg.index_dim
        d, hd = ctx.d_model, self.head_dim
        self.q_proj = dense(ctx, d, self.n_heads * hd, rngs=rngs)
        self.k_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.v_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.o_proj = dense(ctx, self.n_heads * hd, d, rngs=rngs, residual=True)
        self.index_q_proj = dense(ctx, d, cfg.index_heads * cfg.index_dim, rngs=rngs)
        self.index_k_proj = dense(ctx, d, cfg.index_dim, rngs=rngs, axes=(EMBED, None))  # one key for all heads
        self.index_w_proj = dense(ctx, d, cfg.index_heads, rngs=rngs, axes=(EMBED, INNER))

    def project(self, x, positions):
        """Rotated q [B,T,H,D] and k [B,T,K,D], and v [B,T,K,D]."""
        b, t, _ = x.shape
        rotate = self.scoring.rotate
        q = rotate(self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim), positions)
        k = rotate(self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim), positions)
        return q, k, self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)

    def index_inputs(self, x, positions):
        """The indexer's rotated q_idx [B,T,HI,DI] and k_idx [B,T,DI], and w_idx [B,T,HI], read from x
        through a stop-gradient (the indexer trains on its own loss only)."""
        b, t, _ = x.shape
        x = lax.stop_gradient(x)
        q_idx = self.index_q_proj(x).reshape(b, t, self.index_heads, self.index_dim)
        k_idx = self.index_k_proj(x).reshape(b, t, 1, self.index_dim)
        w_idx = self.index_w_proj(x) * self.index_heads**-0.5
        rotate = self.scoring.rotate
        return rotate(q_idx, positions), rotate(k_idx, positions)[:, :, 0], w_idx

    def forward(self, x, positions=None, segment_ids=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        q, k, v = self.project(x, positions)
        q_idx, k_idx, w_idx = self.index_inputs(x, positions)
        scores, indices = dsa_indexer(q_idx, k_idx, w_idx, topk=self.topk, segment_ids=segment_ids)
        if self.training and self.loss_weight > 0:
            loss = dsa_indexer_loss(q, k, scores, indices, scale=self.scoring.scale, segment_ids=segment_ids)
            self.sow(AuxLoss, "indexer", self.loss_weight * loss)
        y, _ = dsa(q, k, v, None, None, topk=self.topk, indices=indices, scale=self.scoring.scale,
                   segment_ids=segment_ids, method=self.method)  # (B, T, H, D)
        return self.o_proj(y.reshape(b, t, -1)), {"k": k, "v": v, "k_idx": k_idx}

    def init_state(self, batch_size, max_len):
        dtype = self.k_proj.dtype or jnp.float32
        kv = ((self.n_kv_heads, self.head_dim), dtype)
        return init_cache(batch_size, max_len, k=kv, v=kv, k_idx=((self.index_dim,), dtype))

    def step(self, x_t, state):
        t, b = state["t"], x_t.shape[0]
        positions = jnp.full((b, 1), t, jnp.int32)
        q, k, v = self.project(x_t[:, None, :], positions)
        q_idx, k_idx, w_idx = self.index_inputs(x_t[:, None, :], positions)
        state = cache_append(state, k=k[:, 0], v=v[:, 0], k_idx=k_idx[:, 0])
        y, _ = dsa_step(q, state["k"], state["v"], q_idx, state["k_idx"], w_idx, t, topk=self.topk,
                        scale=self.scoring.scale)  # (B, 1, H, D)
        return self.o_proj(y.reshape(b, -1)), state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        """[B, H, T, T]: each head's softmax over its query's selected keys."""
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        q, k, _ = self.project(x, positions)
        _, indices = dsa_indexer(*self.index_inputs(x, positions), topk=self.topk, segment_ids=segment_ids)
        return dsa_weights(q, k, indices, scale=self.scoring.scale, segment_ids=segment_ids)

    def state_size(self, max_len):
        return max_len * (2 * self.n_kv_heads * self.head_dim + self.index_dim)
