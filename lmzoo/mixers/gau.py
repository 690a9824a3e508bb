"""Gated attention unit (GAU, from FLASH): attention and gating in one layer, meant to replace the MLP too.

From ``x [B,T,d]``: ``u, v = silu(x W_u), silu(x W_v)`` of width ``e = expansion * d`` and one
shared low-dimensional ``z = silu(x W_z)`` of width ``s = qk_dim``, turned into queries and keys by
per-dimension scale and offset (``q = z * gamma_q + beta_q``, ``k = z * gamma_k + beta_k``). With
one attention head of width s,

    A = relu(q k^T / sqrt(s))^2 / n      (weights="relu2", n = the keys the query sees)
    A = softmax(q k^T / sqrt(s))          (weights="softmax")
    y = (u * (A v)) W_o

Positions act on q and k through the model's position method, as in any softmax-family layer.
A GAU has one head; ``attention_matrix`` repeats it in every head slot so probes see [B,H,T,T].
Models made only of GAU layers drop the separate MLP with ``model.mlp=false`` (configs/attn/gau.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.attention import AttentionConfig, CacheMixer, Scoring, cache_append, init_cache
from lmzoo.ops import causal_mask
from lmzoo.ops.common import same_segment
from lmzoo.positions import default_positions
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, one_of, positive
from lmzoo.sharding import param

WEIGHTS = ("relu2", "softmax")


@register("gau")
@dataclass
class GAUConfig(AttentionConfig):
    expansion: float = 2.0  # e = expansion * d_model: width of the gate u and the values v
    qk_dim: int = 128  # s: width of the shared query/key projection (one head)
    weights: str = "relu2"  # relu2: relu(qk/sqrt(s))^2 / n  |  softmax

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.expansion", self.expansion)
        positive("attn.qk_dim", self.qk_dim)
        one_of("attn.weights", self.weights, WEIGHTS)

    def build(self, ctx, *, rngs):
        return GatedAttentionUnit(self, ctx, rngs=rngs)

    def head_widths(self, model: ModelConfig) -> tuple[int, int]:
        return self.qk_dim, int(self.expansion * model.d_model)  # one head: s-wide scores, e-wide values


class GatedAttentionUnit(CacheMixer):
    def __init__(self, cfg: GAUConfig, ctx: MixerContext, *, rngs):
        self.n_heads = ctx.n_heads  # head slots of attention_matrix; the unit itself has one head
        self.e, self.s = int(cfg.expansion * ctx.d_model), cfg.qk_dim
        self.relu2 = cfg.weights == "relu2"
        self.scoring = Scoring(cfg, ctx, head_dim=self.s)
        self.in_proj = dense(ctx, ctx.d_model, 2 * self.e + self.s, rngs=rngs)
        # q and k start as z itself (gamma near 1, beta 0) so the first steps already attend
        gamma = 1.0 + ctx.init_std * jax.random.normal(rngs.params(), (2, self.s))
        self.gamma, self.beta = param(gamma, None, None), param(jnp.zeros((2, self.s)), None, None)
        self.o_proj = dense(ctx, self.e, ctx.d_model, rngs=rngs, residual=True)

    def project(self, x):
        """Gate u [B,T,e], queries and keys [B,T,1,s], values [B,T,1,e]."""
        u, v, z = jnp.split(jax.nn.silu(self.in_proj(x)), [self.e, 2 * self.e], axis=-1)
        gamma, beta = self.gamma[...].astype(z.dtype), self.beta[...].astype(z.dtype)
        q, k = z * gamma[0] + beta[0], z * gamma[1] + beta[1]
        return u, q[:, :, None, :], k[:, :, None, :], v[:, :, None, :]

    def relu2_weights(self, logits, mask, n_keys):
        """relu(logits)^2 / n, zero where masked; logits [B,1,T,S], n_keys [T] or [B, T]."""
        n = jnp.asarray(n_keys, jnp.float32)
        n = n[:, None] if n.ndim == 1 else n[:, None, :, None]
        return jnp.where(mask, jnp.square(jax.nn.relu(logits)) / n, 0.0)

    def weights(self, q, k, positions, segment_ids=None):
        """[B, 1, T, T] float32 causal weights of the unit's single head (0 across segments)."""
        if not self.relu2:
            return self.scoring.matrix(q, k, positions, segment_ids=segment_ids)
        t = q.shape[1]
        n_keys = self.scoring.queries_keys_seen(positions, segment_ids)
        logits = self.scoring.logits(self.scoring.scale_queries(q, n_keys), k, positions, positions)
        mask = causal_mask(t, t, window=self.scoring.window)
        if segment_ids is not None:
            mask = mask & same_segment(segment_ids)[:, None]
        return self.relu2_weights(logits, mask, n_keys)

    def forward(self, x, positions=None, segment_ids=None):
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        u, q, k, v = self.project(x)
        if self.relu2:
            y = jnp.einsum("bhts,bshd->bthd", self.weights(q, k, positions, segment_ids).astype(v.dtype), v)
        else:
            y = self.scoring.parallel(q, k, v, positions, segment_ids=segment_ids)
        return self.o_proj(u * y[:, :, 0]), {"k": k, "v": v}  # (B, T, d)

    def init_state(self, batch_size, max_len):
        dtype = self.in_proj.dtype or jnp.float32
        size = self.scoring.cache_size(max_len)
        return init_cache(batch_size, size, k=((1, self.s), dtype), v=((1, self.e), dtype))

    def step(self, x_t, state):
        t = state["t"]
        u, q, k, v = self.project(x_t[:, None, :])
        state = cache_append(state, k=k[:, 0], v=v[:, 0])
        if self.relu2:
            logits, visible = self.scoring.cache_logits(q, state["k"], state["pos"], t)  # (B, 1, 1, S)
            weights = self.relu2_weights(logits, visible, self.scoring.keys_seen(t)[None])
        else:
            weights = self.scoring.cache_weights(q, state["k"], state["pos"], t)
        y = jnp.einsum("bhts,bshd->bthd", weights.astype(state["v"].dtype), state["v"])  # (B, 1, 1, e)
        return self.o_proj(u[:, 0] * y[:, 0, 0]), state

    def scored_vectors(self, x, *, positions=None):
        """Queries and keys [B,T,1,s] float32 whose dot products times ``scale`` are the unit's logits
        (rotated by RoPE-like position methods), and ``scale``."""
        b, t, _ = x.shape
        _, q, k, _ = self.project(x)
        return self.scoring.scored_vectors(q, k, default_positions(b, t) if positions is None else positions)

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        b, t, _ = x.shape
        _, q, k, _ = self.project(x)
        positions = default_positions(b, t) if positions is None else positions
        w = self.weights(q, k, positions, segment_ids)  # (B, 1, T, T)
        return jnp.broadcast_to(w, (b, self.n_heads, t, t))

    def state_size(self, max_len):
        return self.scoring.cache_size(max_len) * (self.s + self.e)
