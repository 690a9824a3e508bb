"""RWKV-6 "Finch" time mixing (Peng et al., 2024): data-dependent token shift and a data-dependent decay per key
channel, on ``lmzoo.ops.rwkv6``.

Token shift with data-dependent mixing weights (one low-rank projection shared by the five uses c in r, w, k, v, g):

    delta = x_{t-1} - x_t;    xx = x_t + mu_x * delta
    mu_c = lambda_c + tanh(xx W_1)_c W_2,c;    x_c = x_t + mu_c * delta
    r = x_r W_r;  k = x_k W_k  (key width key_ratio * d_model);  v = x_v W_v;  g = x_g W_g
    log w = -exp(w_0 + tanh(x_w W_w1) W_w2)                         (per key channel)
    o_t = r_t (S_{t-1} + diag(u) k_t^T v_t);   S_t = diag(w_t) S_{t-1} + k_t^T v_t
    y = W_o (groupnorm(o) * swish(g))

with no 1/sqrt(d) on r (RWKV's own scale; the group norm, one group per head, rescales o). The bonus u lets a
token read its own key-value product at its own weight before it enters the state. Initialisation follows the
paper's code: mixing weights leaning on the previous token in lower layers and early channels, decays from slow
(first channels) to fast (last), and u alternating around a layer-dependent ramp.

Decoding carries S and the last token (``lmzoo.mixers.family.rwkv.ShiftedMixer``); ``attention_matrix`` is the
op's weights on v from a zero state (``lmzoo.ops.rwkv6.rwkv6_weights``, the bonus on the diagonal), before the
group norm and the gate.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import LinearFamilyConfig, check_key_ratio, key_ratio_head_widths
from lmzoo.mixers.family.rwkv import LoRA, ShiftedMixer, group_norm, token_shift
from lmzoo.ops.rwkv6 import METHODS, STEP_FORM, rwkv6, rwkv6_weights
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive
from lmzoo.sharding import EMBED, INNER, param

SHIFTED = ("r", "w", "k", "v", "g")  # the inputs token shift mixes, each with its own data-dependent weight


@register("rwkv6")
@dataclass
class RWKV6Config(LinearFamilyConfig):
    forms = METHODS

    method: str = "auto"  # auto | jla | naive | parallel | chunk (see lmzoo.ops.rwkv6)
    key_ratio: float = 0.5  # receptance/key width as a fraction of d_model (the paper's layer: 0.5)
    mix_rank: int = 32  # rank of the shared projection that makes the token-shift weights data-dependent
    decay_rank: int = 64  # rank of the decay's projection

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        for key in ("key_ratio", "mix_rank", "decay_rank"):
            positive(f"attn.{key}", getattr(self, key))
        check_key_ratio(self.key_ratio, model)

    def head_widths(self, model: ModelConfig) -> tuple[int, int, int]:
        return key_ratio_head_widths(self.key_ratio, model)

    def build(self, ctx, *, rngs):
        return RWKV6(self, ctx, rngs=rngs)


def shift_init(layer: int, n_layers: int, d: int) -> jax.Array:
    """The paper's token-shift weights [6, d] (mu_x, then lambda_c for r, w, k, v, g): ``1 - (n / d)^p`` with
    powers that make lower layers lean more on the previous token."""
    deep = 1.0 - layer / n_layers  # 1 at the bottom layer, -> 0 at the top
    channel = jnp.arange(d, dtype=jnp.float32) / d
    powers = {"x": deep, "r": 0.5 * deep, "w": deep, "k": deep, "g": 0.5 * deep}
    rows = {name: 1.0 - channel**p for name, p in powers.items()}
    rows["v"] = 1.0 - (channel**deep + 0.3 * layer / max(n_layers - 1, 1))
    return jnp.stack([rows[name] for name in ("x", *SHIFTED)])


def decay_init(layer: int, n_layers: int, width: int) -> jax.Array:
    """w_0 [width]: ``-6 + 5 (n / (width - 1))^(0.7 + 1.3 l / (L - 1))``, so log w = -exp(w_0) runs from about
    -0.0025 (slow, first channels) to -e (fast, last)."""
    high = layer / max(n_layers - 1, 1)
    channel = jnp.arange(width, dtype=jnp.float32) / max(width - 1, 1)
    return -6.0 + 5.0 * channel ** (0.7 + 1.3 * high)


def bonus_init(layer: int, n_layers: int, width: int) -> jax.Array:
    """u [width]: a ramp from l / (L - 1) down to 0 over the channels, plus -0.1, 0, 0.1 in turn."""
    high = layer / max(n_layers - 1, 1)
    n = jnp.arange(width, dtype=jnp.float32)
    return high * (1.0 - n / max(width - 1, 1)) + ((n + 1) % 3 - 1) * 0.1


class RWKV6(ShiftedMixer):
    matrix_acts_on_values = False  # the weights are the op's on v, before the group norm and the gate
    step_form = STEP_FORM  # of lmzoo.ops.rwkv6

    def __init__(self, cfg: RWKV6Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        d, layer, layers = ctx.d_model, ctx.layer, ctx.n_layers
        self.n_heads, self.d_model, self.dtype = ctx.n_heads, d, ctx.dtype
        self.key_dim, self.value_dim = int(cfg.key_ratio * d) // ctx.n_heads, d // ctx.n_heads
        self.method, self.chunk_size, self.mix_rank = cfg.method, cfg.chunk_size, cfg.mix_rank
        width = self.n_heads * self.key_dim
        self.shift_mix = param(shift_init(layer, layers, d), None, EMBED)  # mu_x, then lambda_c per input
        self.mix_down = dense(ctx, d, len(SHIFTED) * cfg.mix_rank, rngs=rngs, axes=(EMBED, None))
        self.mix_up = param(jnp.zeros((len(SHIFTED), cfg.mix_rank, d)), None, None, EMBED)  # the paper starts at 0
        self.r_proj = dense(ctx, d, width, rngs=rngs)
        self.k_proj = dense(ctx, d, width, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.g_proj = dense(ctx, d, d, rngs=rngs)
        self.w_lora = LoRA(ctx, cfg.decay_rank, bias=decay_init(layer, layers, width), activation=jnp.tanh,
                           width=width, rngs=rngs)
        self.bonus = param(bonus_init(layer, layers, width).reshape(self.n_heads, self.key_dim), None, None)
        self.norm_scale = param(jnp.ones((d,)), INNER)
        self.norm_bias = param(jnp.zeros((d,)), INNER)
        self.norm_eps = 1e-5 * self.value_dim
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def project(self, x, last=None, segment_ids=None):
        """The op's inputs (r, k [B,T,H,Dk], v [B,T,H,Dv], log_w [B,T,H,Dk] float32) and the output gate g [B,T,d]."""
        delta = token_shift(x, last, segment_ids) - x
        mu = self.shift_mix[...].astype(x.dtype)  # (6, d)
        low = jnp.tanh(self.mix_down(x + mu[0] * delta))  # (B, T, 5 r)
        low = low.reshape(*low.shape[:-1], len(SHIFTED), self.mix_rank)  # (B, T, 5, r)
        weights = jnp.einsum("btcr,crd->cbtd", low, self.mix_up[...].astype(x.dtype)) + mu[1:, None, None]
        xr, xw, xk, xv, xg = x[None] + weights * delta[None]  # (5, B, T, d) -> five (B, T, d)
        per_head = lambda a: a.reshape(*a.shape[:-1], self.n_heads, -1)  # noqa: E731  (..., d) -> (..., H, D)
        r, k, v = per_head(self.r_proj(xr)), per_head(self.k_proj(xk)), per_head(self.v_proj(xv))
        log_w = -jnp.exp(per_head(self.w_lora(xw)))
        return (r, k, v, log_w), self.g_proj(xg)

    def heads(self, x, positions=None, segment_ids=None):  # token shift carries order: positions are unused
        return self.project(x, segment_ids=segment_ids)[0]

    def mix(self, r, k, v, log_w, state=None, method=None, segment_ids=None):
        return rwkv6(r, k, v, log_w, self.bonus[...], scale=1.0, initial_state=state, method=method or self.method,
                     chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, r, k, v, log_w, segment_ids=None):
        return rwkv6_weights(r, k, log_w, self.bonus[...], scale=1.0, segment_ids=segment_ids)

    def run(self, x, state=None, last=None, method=None, segment_ids=None):
        heads, gate = self.project(x, last, segment_ids)
        o, s = self.mix(*heads, state=state, method=method, segment_ids=segment_ids)
        mixed = group_norm(o, self.norm_scale[...], self.norm_bias[...], self.norm_eps)
        return self.o_proj((mixed * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)), s
