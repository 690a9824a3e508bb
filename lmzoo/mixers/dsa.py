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

Head options act on the main attention as for any softmax-family layer
(``lmzoo.mixers.family.attention``): ``attn.qk_norm`` normalises q and k before they are rotated
(the indexer's loss then follows the normalised attention; the indexer's own vectors are not
normalised), ``attn.output_gate`` gates each head's output per channel before the output projection.
``attn.window`` and ``attn.logn`` are refused: the indexer decides which keys a query sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax.numpy as jnp
from flax import nnx
from jax import lax

from lmzoo.mixers.base import AuxLoss, MixerContext, dense
from lmzoo.mixers.family.attention import (HEAD_OPTIONS, AttentionConfig, KVHeadsMixer, Scoring, cache_append,
                                           check_kv_heads, check_rotary_positions)
from lmzoo.ops.dsa import METHODS, dsa, dsa_indexer, dsa_indexer_loss, dsa_step, dsa_weights
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig, positive
from lmzoo.sharding import EMBED, INNER


@register("dsa")
@dataclass
class DSAConfig(AttentionConfig):
    head_options = HEAD_OPTIONS
    forms = METHODS
    unsupported = ("window", "logn")  # the indexer decides what a query sees
    method: str = "naive"  # naive | gather (lmzoo.ops.dsa.METHODS): the dense reference is the faster on CPUs at a
                           # few hundred tokens
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head
    topk: int = 64  # keys each query attends to (all of them for its first topk positions)
    index_heads: int = 4  # HI, the indexer's heads
    index_dim: int = 16  # DI, the width of an indexer head and of the index key
    indexer_loss_weight: float = 1.0  # weight of the indexer's KL loss (0: the indexer stays as initialised)

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        check_kv_heads(self.n_kv_heads, model)
        for key in ("topk", "index_heads", "index_dim"):
            positive(f"attn.{key}", getattr(self, key))
        positive("attn.indexer_loss_weight", self.indexer_loss_weight, allow_zero=True)
        if self.index_dim % 2:
            raise ConfigError(f"attn.index_dim={self.index_dim} must be even (rotary positions turn pairs of dims)")

    def build(self, ctx, *, rngs):
        return DeepSeekSparseAttention(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """The main attention over min(topk, t + 1) keys and the indexer over all t + 1 (its scores in
        the forward, its loss's backward), averaged over a causal sequence; 3 passes x 2 FLOPs."""
        score_width, value_width = self.head_widths(model)
        selected = sum(min(self.topk, t + 1) for t in range(seq_len)) / seq_len
        indexed = (seq_len + 1) / 2
        return 6 * (selected * (score_width + value_width) + indexed * self.index_heads * self.index_dim)


class DeepSeekSparseAttention(KVHeadsMixer):
    def __init__(self, cfg: DSAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        check_rotary_positions(ctx, "dsa")
        self.init_heads(ctx, cfg.n_kv_heads, rngs=rngs)
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim)
        self.topk, self.method, self.loss_weight = cfg.topk, cfg.method, cfg.indexer_loss_weight
        self.index_heads, self.index_dim = cfg.index_heads, cfg.index_dim
        self.init_output(cfg, ctx, rngs=rngs)  # draws its initial values before the indexer's projections
        d = ctx.d_model
        self.index_q_proj = dense(ctx, d, cfg.index_heads * cfg.index_dim, rngs=rngs)
        self.index_k_proj = dense(ctx, d, cfg.index_dim, rngs=rngs, axes=(EMBED, None))  # one key for all heads
        self.index_w_proj = dense(ctx, d, cfg.index_heads, rngs=rngs, axes=(EMBED, INNER))

    def index_inputs(self, x, positions=None):
        """The indexer's rotated q_idx [B,T,HI,DI] and k_idx [B,T,DI], and w_idx [B,T,HI], read from x
        through a stop-gradient (the indexer trains on its own loss only); ``positions`` [B,T] (None: 0 .. T-1)."""
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        x = lax.stop_gradient(x)
        q_idx = self.index_q_proj(x).reshape(b, t, self.index_heads, self.index_dim)
        k_idx = self.index_k_proj(x).reshape(b, t, 1, self.index_dim)
        w_idx = self.index_w_proj(x) * self.index_heads**-0.5
        rotate = self.scoring.rotate
        return rotate(q_idx, positions), rotate(k_idx, positions)[:, :, 0], w_idx

    def forward(self, x, positions=None, segment_ids=None):
        q, k, v = self.rotated_heads(x, positions)
        q_idx, k_idx, w_idx = self.index_inputs(x, positions)
        scores, indices = dsa_indexer(q_idx, k_idx, w_idx, topk=self.topk, segment_ids=segment_ids)
        if self.training and self.loss_weight > 0:
            loss = dsa_indexer_loss(q, k, scores, indices, scale=self.scoring.scale, segment_ids=segment_ids)
            self.sow(AuxLoss, "indexer", self.loss_weight * loss)
        y, _ = dsa(q, k, v, None, None, topk=self.topk, indices=indices, scale=self.scoring.scale,
                   segment_ids=segment_ids, method=self.method)  # (B, T, H, D)
        return self.output(y, x), {"k": k, "v": v, "k_idx": k_idx}

    def init_state(self, batch_size, max_len):
        return self.init_kv_cache(batch_size, max_len, k_idx=((self.index_dim,), self.k_proj.dtype or jnp.float32))

    def step(self, x_t, state):
        x_t, t = x_t[:, None, :], state["t"]
        positions = default_positions(x_t.shape[0], 1, t)
        q, k, v = self.rotated_heads(x_t, positions)
        q_idx, k_idx, w_idx = self.index_inputs(x_t, positions)
        state = cache_append(state, k=k[:, 0], v=v[:, 0], k_idx=k_idx[:, 0])
        y, _ = dsa_step(q, state["k"], state["v"], q_idx, state["k_idx"], w_idx, t, topk=self.topk,
                        scale=self.scoring.scale)  # (B, 1, H, D)
        return self.output(y, x_t)[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        """[B, H, T, T]: each head's softmax over its query's selected keys."""
        q, k, _ = self.rotated_heads(x, positions)
        _, indices = dsa_indexer(*self.index_inputs(x, positions), topk=self.topk, segment_ids=segment_ids)
        return dsa_weights(q, k, indices, scale=self.scoring.scale, segment_ids=segment_ids)
