"""RWKV-7 "Goose" time mixing (Peng et al., 2025): the DPLR rule with RWKV-7's parametrisation.

Token shift mixes each token with the one before it, per channel and per use (c in r, w, k, v, a, g):

    x_c = x_t + mu_c * (x_{t-1} - x_t)
    r = x_r W_r;  k = x_k W_k;  v = x_v W_v                                        per head [H, D]
    log w = -exp(-1/2) * sigmoid(w_0 + tanh(x_w W_w1) W_w2)   (w in (0.545, 1): the decay)
    a = sigmoid(a_0 + x_a W_a1 W_a2)  (in-context learning rate);   g = sigmoid(x_g W_g1) W_g2
    kappa_hat = normalize(k * k_k) per head;    k <- k * (1 + (a - 1) * k_a)
    S_t = diag(w_t) S_{t-1} + (kappa_hat_t * a_t)(-kappa_hat_t^T S_{t-1}) + k_t v_t^T;    o_t = S_t^T r_t
    y = W_o (g * (groupnorm(o) + (sum_d r_t k_t rho_k) v_t))

that is ``lmzoo.ops.dplr`` with alpha = -kappa_hat, beta = kappa_hat * a, exp(g) = w and scale 1
(RWKV-7's own: r is not normalised; the group norm, one group per head, rescales o). The state
update removes a's share of what S holds along kappa_hat and writes k v^T: with a = 1 it is the
delta rule along kappa_hat with a decoupled write key. The last term ("bonus") lets a token read
its own value through r . (k * rho_k) per head, outside the state.

Not included: the value residual (v mixed with the first layer's v), which needs the model to
pass a tensor between layers. Decoding carries S and the last token (for the shift);
``attention_matrix`` is the DPLR op's weights on v from a zero state (``lmzoo.ops.dplr_weights``),
before the group norm and without the bonus term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import l2_normalize
from lmzoo.mixers.family.linear import LinearFamilyConfig
from lmzoo.mixers.family.rwkv import LoRA, ShiftedMixer, group_norm, lora_rank, token_shift
from lmzoo.ops.dplr import METHODS, STEP_FORM, dplr, dplr_weights
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive
from lmzoo.sharding import EMBED, INNER, param

MAX_LOG_DECAY = math.exp(-0.5)  # |log w| < e^{-1/2}: every step keeps at least 54.5% of the state
SHIFTED = ("r", "w", "k", "v", "a", "g")  # the inputs token shift mixes, each with its own mu


@register("rwkv7")
@dataclass
class RWKV7Config(LinearFamilyConfig):
    forms = METHODS
    delta = True  # the generalised delta rule reads its state before each write

    method: str = "auto"  # auto | jla | naive | parallel | chunk (see lmzoo.ops.dplr)
    decay_rank: Optional[int] = None  # rank of the decay's LoRA; None: max(32, d_model / 16) rounded to 32
    a_rank: Optional[int] = None  # rank of the in-context learning rate's LoRA; None: as decay_rank
    gate_rank: Optional[int] = None  # rank of the output gate's LoRA; None: max(32, d_model / 8) rounded to 32

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        for key in ("decay_rank", "a_rank", "gate_rank"):
            if getattr(self, key) is not None:
                positive(f"attn.{key}", getattr(self, key))

    def build(self, ctx, *, rngs):
        return RWKV7(self, ctx, rngs=rngs)


def shift_mix_init(layer: int, n_layers: int, d: int) -> jax.Array:
    """RWKV-7's token-shift weights [6, d]: lower layers and later channels lean more on the
    previous token (ratio 1 at the bottom layer, ~0 at the top)."""
    low = 1.0 - layer / n_layers  # 1 at the bottom
    high = layer / max(n_layers - 1, 1)  # 0 at the bottom, 1 at the top
    channel = jnp.arange(d, dtype=jnp.float32) / d
    powers = {"r": 1.0 - channel ** (0.2 * low), "w": 1.0 - channel ** (0.9 * low),
              "k": 1.0 - (channel ** (0.9 * low) + 0.4 * high), "v": 1.0 - (channel ** (0.4 * low) + 0.6 * high),
              "a": 1.0 - channel ** (0.9 * low), "g": 1.0 - channel ** (0.2 * low)}
    return jnp.stack([powers[name] for name in SHIFTED])


def decay_bias_init(layer: int, n_layers: int, d: int) -> jax.Array:
    """w_0 from RWKV-7: channel n of each layer starts at log(-log w) ~ -7 + 5 (n / d)^(0.85 + ...),
    slow decays in the first channels, faster ones in the last."""
    high = layer / max(n_layers - 1, 1)
    channel = jnp.arange(d, dtype=jnp.float32) / max(d - 1, 1)
    return -7.0 + 5.0 * channel ** (0.85 + 1.0 * high**0.5) + 0.5


class RWKV7(ShiftedMixer):
    matrix_acts_on_values = False  # the weights are the DPLR op's on v, before the group norm and the bonus term
    step_form = STEP_FORM  # of lmzoo.ops.dplr
    def __init__(self, cfg: RWKV7Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        d, layer, layers = ctx.d_model, ctx.layer, ctx.n_layers
        self.n_heads, self.d_model = ctx.n_heads, d
        self.key_dim = self.value_dim = d // ctx.n_heads
        self.method, self.chunk_size, self.dtype = cfg.method, cfg.chunk_size, ctx.dtype
        self.shift_mix = param(shift_mix_init(layer, layers, d), None, EMBED)
        self.r_proj, self.k_proj, self.v_proj = (dense(ctx, d, d, rngs=rngs) for _ in range(3))
        rank = cfg.decay_rank or lora_rank(d, 1 / 16)
        self.w_lora = LoRA(ctx, rank, bias=decay_bias_init(layer, layers, d), activation=jnp.tanh, rngs=rngs)
        self.a_lora = LoRA(ctx, cfg.a_rank or rank, bias=jnp.zeros((d,)), rngs=rngs)
        self.g_lora = LoRA(ctx, cfg.gate_rank or lora_rank(d, 1 / 8), bias=None, activation=jax.nn.sigmoid, rngs=rngs)
        self.k_k = param(jnp.full((d,), 0.85), INNER)  # the removal key's per-channel weight
        self.k_a = param(jnp.ones((d,)), INNER)  # how much a also scales the write key
        self.r_k = param(jnp.zeros((d,)), INNER)  # the bonus term's per-channel weight
        self.norm_scale = param(jnp.ones((d,)), INNER)
        self.norm_bias = param(jnp.zeros((d,)), INNER)
        self.norm_eps = 1e-5 * self.value_dim
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def project(self, x, last=None, segment_ids=None):
        """The op's inputs (r, k, v, alpha, beta, log_w [B,T,H,D]), the output gate g [B,T,d] and the bonus
        weights r * k * rho_k [B,T,H,D]."""
        b, t, d = x.shape
        previous = token_shift(x, last, segment_ids)
        mixed = x[None] + self.shift_mix[...][:, None, None].astype(x.dtype) * (previous - x)[None]  # (6, B, T, d)
        xr, xw, xk, xv, xa, xg = mixed
        per_head = lambda a: a.reshape(*a.shape[:-1], self.n_heads, -1)  # noqa: E731  (..., d) -> (..., H, D)
        r, k, v = (per_head(proj(a)) for proj, a in ((self.r_proj, xr), (self.k_proj, xk), (self.v_proj, xv)))
        log_w = -MAX_LOG_DECAY * jax.nn.sigmoid(per_head(self.w_lora(xw)))
        a = jax.nn.sigmoid(per_head(self.a_lora(xa)))
        k32 = k.astype(jnp.float32)
        kappa = l2_normalize(k32 * per_head(self.k_k[...]))  # unit per head
        k32 = k32 * (1.0 + (a - 1.0) * per_head(self.k_a[...]))
        bonus = r.astype(jnp.float32) * k32 * per_head(self.r_k[...])
        return (r, k32.astype(v.dtype), v, -kappa, kappa * a, log_w), self.g_lora(xg), bonus

    def heads(self, x, positions=None, segment_ids=None):  # token shift carries order: positions are unused
        return self.project(x, segment_ids=segment_ids)[0]

    def mix(self, r, k, v, alpha, beta, log_w, state=None, method=None, segment_ids=None):
        return dplr(r, k, v, alpha, beta, log_w, scale=1.0, initial_state=state, method=method or self.method,
                    chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, r, k, v, alpha, beta, log_w, segment_ids=None):
        return dplr_weights(r, k, alpha, beta, log_w, scale=1.0, segment_ids=segment_ids)

    def group_norm(self, o):
        """o [..., H, Dv] -> [..., H * Dv] float32, normalised per head (``lmzoo.mixers.family.rwkv.group_norm``)."""
        return group_norm(o, self.norm_scale[...], self.norm_bias[...], self.norm_eps)

    def finish(self, x, o, v, gate, bonus):
        own = jnp.sum(bonus, axis=-1, keepdims=True) * v.astype(jnp.float32)  # (B, T, H, Dv): the token's own value
        mixed = self.group_norm(o) + own.reshape(*own.shape[:-2], -1)
        return self.o_proj((mixed * gate).astype(x.dtype))

    def run(self, x, state=None, last=None, method=None, segment_ids=None):
        heads, gate, bonus = self.project(x, last, segment_ids)
        o, s = self.mix(*heads, state=state, method=method, segment_ids=segment_ids)
        return self.finish(x, o, heads[2], gate, bonus), s
