"""Stick-breaking attention (Tan et al., 2025, "Scaling stick-breaking attention"): no softmax; each
query gives its nearest key the share sigmoid(z) of a unit stick, the next key that share of the rest,
and so on back in time (``lmzoo.ops.stick_breaking``):

    z_ij = scale q_i . k_j,   A_ij = sigmoid(z_ij) prod_{j<l<i} (1 - sigmoid(z_il)),   o_i = sum_{j<i} A_ij v_j
    remainder="current":  o_i += rem_i v_i,  rem_i = 1 - sum_j A_ij   (the stick left over goes to the token itself)

Recency comes from the order in which the stick is broken, so the layer takes no position method
(the model's ``pos`` is not applied here). ``remainder="current"`` is the paper's layer, whose
weights then sum to one per query; ``"drop"`` leaves the rest unused (fla's layer). ``attend_current``
lets the query's own key take a share first (then V(i) = {j <= i}). Decoding caches keys and values
like softmax attention and breaks the stick over the cache in time order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import jax.numpy as jnp

from lmzoo.mixers.base import MixerContext
from lmzoo.mixers.family.attention import KVHeadsMixer, check_kv_heads, HeadOptions, cache_append, mean_keys_seen
from lmzoo.ops.attention import repeat_kv
from lmzoo.ops.stick_breaking import METHODS, stick_breaking_attention, stick_breaking_matrix, stick_breaking_weights
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, one_of, positive

REMAINDERS = ("current", "drop")


@register("stickbreaking")
@dataclass
class StickBreakingConfig(HeadOptions):
    head_options: ClassVar[tuple[str, ...]] = ("output_gate", "qk_norm")
    forms = METHODS  # the op's forms attn.method may name; a class attribute, not a config key
    method: str = "blocked"  # naive | blocked (lmzoo.ops.stick_breaking; same result)
    n_kv_heads: Optional[int] = None  # None: one key/value head per query head
    scale: Optional[float] = None  # logit scale; None: head_dim ** -0.5
    attend_current: bool = False  # the query's own key breaks the stick first
    remainder: str = "current"  # current: o_i += rem_i v_i (weights sum to 1) | drop

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        one_of("attn.method", self.method, self.forms)
        one_of("attn.remainder", self.remainder, REMAINDERS)
        if self.scale is not None:
            positive("attn.scale", self.scale)
        check_kv_heads(self.n_kv_heads, model)

    def build(self, ctx, *, rngs):
        return StickBreakingAttention(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Logits and weighted values over the keys a query sees, forward and backward, as softmax attention."""
        return 6 * mean_keys_seen(seq_len, None) * 2 * model.d_model


class StickBreakingAttention(KVHeadsMixer):
    def __init__(self, cfg: StickBreakingConfig, ctx: MixerContext, *, rngs):
        self.init_heads(ctx, cfg.n_kv_heads, rngs=rngs)
        self.scale = self.head_dim**-0.5 if cfg.scale is None else cfg.scale
        self.method, self.attend_current = cfg.method, cfg.attend_current
        self.keep_remainder = cfg.remainder == "current"
        self.init_output(cfg, ctx, rngs=rngs)

    def with_remainder(self, o, rem, v_now):
        """o [B,T,H,D] plus rem [B,T,H] times each token's own value v_now [B,T,K,D], when kept."""
        if not self.keep_remainder:
            return o
        v_now = repeat_kv(v_now, self.n_heads // self.n_kv_heads).astype(jnp.float32)
        return (o.astype(jnp.float32) + rem[..., None] * v_now).astype(o.dtype)

    def forward(self, x, positions=None, segment_ids=None):
        q, k, v = self.heads(x)
        o, rem = stick_breaking_attention(q, k, v, scale=self.scale, attend_current=self.attend_current,
                                          segment_ids=segment_ids, method=self.method)
        return self.output(self.with_remainder(o, rem, v), x), {"k": k, "v": v}

    def init_state(self, batch_size, max_len):
        return self.init_kv_cache(batch_size, max_len)

    def step(self, x_t, state):
        t = state["t"]
        q, k, v = self.heads(x_t[:, None, :])  # (B, 1, H|K, D)
        state = cache_append(state, k=k[:, 0], v=v[:, 0])  # slots in time order: the cache never wraps
        keys, values = (repeat_kv(state[name], self.n_heads // self.n_kv_heads) for name in ("k", "v"))
        logits = jnp.einsum("bthd,bshd->bhts", q, keys, preferred_element_type=jnp.float32) * self.scale
        pos = state["pos"]
        visible = (pos >= 0) & ((pos <= t) if self.attend_current else (pos < t))
        weights, log_rem = stick_breaking_weights(logits, visible)  # (B, H, 1, S), (B, H, 1)
        o = jnp.einsum("bhts,bshd->bthd", weights, values.astype(jnp.float32)).astype(v.dtype)
        o = self.with_remainder(o, jnp.exp(log_rem).swapaxes(1, 2), v)
        return self.output(o, x_t[:, None])[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        """The stick-breaking weights A [B,H,T,T], with each query's remainder on the diagonal when kept."""
        q, k, _ = self.heads(x)
        weights, rem = stick_breaking_matrix(q, k, scale=self.scale, attend_current=self.attend_current,
                                             segment_ids=segment_ids)
        if self.keep_remainder:
            weights = weights + jnp.eye(x.shape[1]) * rem.swapaxes(1, 2)[..., None]
        return weights
