"""Native sparse attention (NSA; Yuan et al., 2025): compressed, selected and sliding-window
attention, mixed per head by gates read from the input.

    g_cmp, g_slc, g_win = sigmoid(x W_g + b_g)                       [B, T, heads] each
    o = g_slc ⊙ attend(selected blocks) + g_cmp ⊙ attend(block means) + g_win ⊙ attend(last w keys)

(``lmzoo.ops.nsa`` has the branches' equations.) Keys are compressed by block means, as the op
defines them: the paper's learned compressor (an MLP over each block with intra-block positions)
would add parameters that the block means' gradient already trains through W_k, and the means
keep compression exact for decoding from a cache. The selection reuses the compression branch's
probabilities, so the top-k choice costs no extra scores; it is an integer choice, trained
through the compressed branch only, as in the paper. Query heads share their key/value head's
selection (GQA, ``n_kv_heads``). The window branch is ``attn.window`` (None: no window branch).

Positions: keys and queries are rotated before compression (block means of rotated keys), so
position methods that rotate work; ALiBi and ReRoPE, which act on each query-key pair, cannot
reach a block mean and are refused. Decoding caches the *rotated* keys and the values of every
token (selection may reach any block), and recomputes the block means of the cache each step.
Documents: each is cut into blocks from its own first token (see ``lmzoo.ops.nsa``).

Head options act as for any softmax-family layer (``lmzoo.mixers.family.attention``): ``attn.qk_norm``
normalises q and k before they are rotated (block means are then means of normalised keys),
``attn.output_gate`` gates the branches' gated sum per channel before the output projection.
``attn.logn`` is refused: the branches see different numbers of keys (block means, selected tokens,
the window), so no single factor per query fits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import (HEAD_OPTIONS, AttentionConfig, KVHeadsMixer, Scoring, cache_append,
                                           check_kv_heads, check_rotary_positions)
from lmzoo.ops.nsa import METHODS, nsa, nsa_step, nsa_weights
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive


@register("nsa")
@dataclass
class NSAConfig(AttentionConfig):
    head_options = HEAD_OPTIONS
    forms = METHODS
    unsupported = ("logn",)  # each branch sees its own keys: one log-n factor does not fit
    # naive | parallel | gather, one result (lmzoo.ops.nsa): parallel (one [T, T] product) is the fastest on a CPU at a
    # few hundred tokens; gather reads only the selected blocks' keys (long sequences)
    method: str = "parallel"
    n_kv_heads: Optional[int] = None  # None: one key/value head (and one block choice) per query head
    block_size: int = 16  # tokens per block, compressed and selected
    block_counts: int = 4  # blocks each kv head selects per query, the first and the two latest included

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        check_kv_heads(self.n_kv_heads, model)
        positive("attn.block_size", self.block_size)
        positive("attn.block_counts", self.block_counts)

    def build(self, ctx, *, rngs):
        return NativeSparseAttention(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Scores and weighted values over the keys a query reads in each branch (block means,
        selected tokens, window), averaged over a causal sequence, forward and backward."""
        score_width, value_width = self.head_widths(model)
        keys = sum(self.keys_read(t) for t in range(seq_len)) / seq_len
        return 6 * keys * (score_width + value_width)

    def keys_read(self, t: int) -> int:
        window = min(self.window, t + 1) if self.window else 0
        return (t + 1) // self.block_size + min(self.block_counts * self.block_size, t + 1) + window


class NativeSparseAttention(KVHeadsMixer):
    def __init__(self, cfg: NSAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        check_rotary_positions(ctx, "nsa")
        self.init_heads(ctx, cfg.n_kv_heads, rngs=rngs)
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim)
        self.options = dict(block_counts=cfg.block_counts, block_size=cfg.block_size, window=cfg.window or 0,
                            scale=self.scoring.scale)
        self.method = cfg.method
        self.gate_proj = dense(ctx, ctx.d_model, 3 * self.n_heads, rngs=rngs, bias=True)  # sigmoid(0) = 1/2 per branch
        self.init_output(cfg, ctx, rngs=rngs)

    def project(self, x, positions=None):
        """Rotated q [B,T,H,D] and k [B,T,K,D], v [B,T,K,D], and the gates (cmp, slc, win) [B,T,H] float32."""
        b, t, _ = x.shape
        gates = jax.nn.sigmoid(self.gate_proj(x).astype(jnp.float32)).reshape(b, t, 3, self.n_heads)
        return *self.rotated_heads(x, positions), tuple(gates[:, :, i] for i in range(3))

    def forward(self, x, positions=None, segment_ids=None):
        q, k, v, gates = self.project(x, positions)
        y, _ = nsa(q, k, v, *gates, segment_ids=segment_ids, method=self.method, **self.options)  # (B, T, H, D)
        return self.output(y, x), {"k": k, "v": v}

    def init_state(self, batch_size, max_len):
        return self.init_kv_cache(batch_size, max_len)

    def step(self, x_t, state):
        x_t, t = x_t[:, None, :], state["t"]
        q, k, v, gates = self.project(x_t, default_positions(x_t.shape[0], 1, t))
        state = cache_append(state, k=k[:, 0], v=v[:, 0])
        y = nsa_step(q, state["k"], state["v"], *gates, t, **self.options)  # (B, 1, H, D)
        return self.output(y, x_t)[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        """[B, H, T, T]: the three branches' weights on the tokens, each scaled by its gate (the
        compressed branch's spread evenly over each block), so rows sum to the gates' sum."""
        q, k, _, gates = self.project(x, positions)
        return nsa_weights(q, k, *gates, segment_ids=segment_ids, **self.options)
