"""Mixture of block attention (MoBA; Lu et al., 2025, "MoBA: Mixture of Block Attention for Long-Context LLMs"):
causal softmax attention in which each query reads its own block of ``attn.block_size`` tokens and the
``attn.topk - 1`` earlier blocks whose mean key it scores highest (``lmzoo.ops.moba``):

    gate_c = q_t . mean(k in block c)   for the earlier blocks c,    chosen = own block + top (topk - 1) by gate
    o_t = softmax attention over the chosen blocks' tokens up to t

A mixture of experts over the past, with blocks as experts and a parameter-free router. The choice is
discrete: the keys learn through the attention only. Query heads of one key/value head share its choice
(``n_kv_heads``; the paper's choice per head when each query head has its own). Keys and queries are rotated
before the block means (as NSA's), so position methods that rotate work; ALiBi and ReRoPE, which act on each
query-key pair, are refused, and so are a window and log-n scaling (a query sees its chosen blocks only).
Decoding caches the rotated keys and the values of every token and recomputes the block means of the cache each
step. Documents are cut into blocks from their own first token. Head options act as for any softmax-family
layer (``lmzoo.mixers.family.attention``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from flax import nnx

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.attention import (HEAD_OPTIONS, AttentionConfig, KVHeadsMixer, Scoring, cache_append,
                                           check_kv_heads, check_rotary_positions)
from lmzoo.ops.moba import METHODS, moba, moba_step, moba_weights
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive


@register("moba")
@dataclass
class MoBAConfig(AttentionConfig):
    head_options = HEAD_OPTIONS
    forms = METHODS
    unsupported = ("window", "logn")  # a query sees its chosen blocks only
    method: str = "gather"  # naive | gather (lmzoo.ops.moba; same result): gather reads only the chosen blocks' keys
    n_kv_heads: Optional[int] = None  # None: one key/value head (and one block choice) per query head
    block_size: int = 16  # tokens per block
    topk: int = 3  # blocks each query reads, its own included

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        check_kv_heads(self.n_kv_heads, model)
        positive("attn.block_size", self.block_size)
        positive("attn.topk", self.topk)

    def build(self, ctx, *, rngs):
        return MixtureOfBlockAttention(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Scores and weighted values over the tokens a query reads (its chosen blocks up to itself) and its gates
        against the earlier blocks' mean keys, averaged over a causal sequence, forward and backward."""
        score_width, value_width = self.head_widths(model)
        keys = sum(self.keys_read(t) for t in range(seq_len)) / seq_len
        return 6 * (keys * (score_width + value_width) + seq_len / (2 * self.block_size) * score_width)

    def keys_read(self, t: int) -> int:
        return min(t % self.block_size + 1 + (self.topk - 1) * self.block_size, t + 1)


class MixtureOfBlockAttention(KVHeadsMixer):
    def __init__(self, cfg: MoBAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        check_rotary_positions(ctx, "moba")
        self.init_heads(ctx, cfg.n_kv_heads, rngs=rngs)
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim)
        self.options = dict(topk=cfg.topk, block_size=cfg.block_size, scale=self.scoring.scale)
        self.method = cfg.method
        self.init_output(cfg, ctx, rngs=rngs)

    def forward(self, x, positions=None, segment_ids=None):
        q, k, v = self.rotated_heads(x, positions)
        y, _ = moba(q, k, v, segment_ids=segment_ids, method=self.method, **self.options)  # (B, T, H, D)
        return self.output(y, x), {"k": k, "v": v}

    def init_state(self, batch_size, max_len):
        return self.init_kv_cache(batch_size, max_len)

    def step(self, x_t, state):
        x_t, t = x_t[:, None, :], state["t"]
        q, k, v = self.rotated_heads(x_t, default_positions(x_t.shape[0], 1, t))
        state = cache_append(state, k=k[:, 0], v=v[:, 0])  # slots in time order: the cache never wraps
        y = moba_step(q, state["k"], state["v"], t, **self.options)  # (B, 1, H, D)
        return self.output(y, x_t)[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        q, k, _ = self.rotated_heads(x, positions)
        return moba_weights(q, k, segment_ids=segment_ids, **self.options)
