"""The Forgetting Transformer (FoX; Lin et al., 2025): softmax attention with a forget gate.

    f_t = sigmoid(x_t w_f + b_f)                               one gate per head and token
    logit_ij = scale q_i . k_j + sum_{j<m<=i} log f_m = scale q_i . k_j + c_i - c_j,   c_t = sum_{m<=t} log f_m

Each key fades by the gates of the tokens after it, a learned, data-dependent ALiBi: a head that
keeps f near 1 attends globally, one that lowers it attends locally. No position method by default
(``nope: true``): the gates carry order, which is what FoX proposes for length extrapolation;
``attn.nope=false`` adds the model's position method (RoPE) on top.

The fast path adds ``c_i - c_j`` as a logit bias (a difference of float32 cumulative sums), which
``jax.nn.dot_product_attention`` accepts, through the family's ``Scoring`` (scale, window, log-n
apply as for any softmax-family layer). Decoding caches each key's ``c_j`` beside it and carries
the running ``c_t``, so a step's bias is ``c_t - c_j`` exactly as in the forward.
``b_f`` starts at ``forget_bias_init`` (0: gates near 1/2, local attention that training widens).
``attn.qk_norm`` and ``attn.output_gate`` act as for any softmax-family layer (``family.attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import AttentionConfig, CacheMixer, Scoring, cache_append, init_cache
from lmzoo.positions import default_positions
from lmzoo.registry import register


@register("fox")
@dataclass
class FoxConfig(AttentionConfig):
    head_options = ("output_gate", "qk_norm")
    nope: bool = True  # the forget gates carry order; false: also the model's position method
    forget_bias_init: float = 0.0  # b_f at initialisation (sigmoid(b_f): the gates' starting value)

    def build(self, ctx, *, rngs):
        return ForgettingAttention(self, ctx, rngs=rngs)


class ForgettingAttention(CacheMixer):
    def __init__(self, cfg: FoxConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads, self.head_dim = ctx.n_heads, d // ctx.n_heads
        self.scoring = Scoring(cfg, ctx, head_dim=self.head_dim)
        self.q_proj = dense(ctx, d, d, rngs=rngs)
        self.k_proj = dense(ctx, d, d, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.forget_proj = dense(ctx, d, self.n_heads, rngs=rngs, bias=True)
        self.forget_proj.bias[...] = jnp.full((self.n_heads,), cfg.forget_bias_init, jnp.float32)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)
        self.init_head_options(cfg, ctx, head_dim=self.head_dim, width=d, rngs=rngs)

    def project(self, x):
        """Unrotated q, k, v [B,T,H,D] and the log forget gates [B,T,H] float32 (<= 0)."""
        b, t, _ = x.shape
        split = (b, t, self.n_heads, self.head_dim)
        q, k, v = (proj(x).reshape(split) for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.normalize_qk(q, k)
        return q, k, v, jax.nn.log_sigmoid(self.forget_proj(x).astype(jnp.float32))

    @staticmethod
    def forget_bias(c) -> jax.Array:
        """[B,H,T,T] ``c_i - c_j`` = the log decay from key j to query i (valid for j <= i), from c [B,T,H]."""
        c = c.swapaxes(1, 2)  # (B, H, T)
        return c[..., :, None] - c[..., None, :]

    def forward(self, x, positions=None, segment_ids=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        q, k, v, log_f = self.project(x)
        c = jnp.cumsum(log_f, axis=1)  # (B, T, H) cumulative log gates
        y = self.scoring.parallel(q, k, v, positions, bias=self.forget_bias(c), segment_ids=segment_ids)
        return self.output(y, x), {"k": k, "v": v, "c": c}

    def prefill(self, x, max_len=None, *, positions=None):
        y, state = super().prefill(x, max_len, positions=positions)
        newest = (x.shape[1] - 1) % state["pos"].shape[0]  # the slot of the last token
        return y, {**state, "c_now": state["c"][:, newest]}

    def init_state(self, batch_size, max_len):
        kv = ((self.n_heads, self.head_dim), self.k_proj.dtype or jnp.float32)
        cache = init_cache(batch_size, self.scoring.cache_size(max_len), k=kv, v=kv, c=((self.n_heads,), jnp.float32))
        return {**cache, "c_now": jnp.zeros((batch_size, self.n_heads), jnp.float32)}

    def step(self, x_t, state):
        t = state["t"]
        q, k, v, log_f = self.project(x_t[:, None, :])  # (B, 1, H, D), (B, 1, H)
        c_now = state["c_now"] + log_f[:, 0]  # (B, H) cumulative log gate up to this token
        state = {**cache_append(state, k=k[:, 0], v=v[:, 0], c=c_now), "c_now": c_now}
        bias = (c_now[:, :, None] - state["c"].swapaxes(1, 2))[:, :, None, :]  # (B, H, 1, S)
        weights = self.scoring.cache_weights(q, state["k"], state["pos"], t, bias=bias)
        y = jnp.einsum("bhts,bshd->bthd", weights.astype(state["v"].dtype), state["v"])
        return self.output(y, x_t[:, None])[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        b, t, _ = x.shape
        q, k, _, log_f = self.project(x)
        positions = default_positions(b, t) if positions is None else positions
        bias = self.forget_bias(jnp.cumsum(log_f, axis=1))
        return self.scoring.matrix(q, k, positions, bias=bias, segment_ids=segment_ids)

    def state_size(self, max_len):
        slots = self.scoring.cache_size(max_len)
        return slots * self.n_heads * (2 * self.head_dim + 1) + self.n_heads  # keys, values, c_j; c_t
