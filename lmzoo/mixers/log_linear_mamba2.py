"""Log-linear Mamba-2 (Guo et al., 2025): Mamba-2 whose SSD reads its past through a Fenwick tree of
O(log T) states, each level with its own data-dependent weight (``lmzoo.ops.log_linear``).

    x -> in_proj -> (z, xBC, dt);  xBC -> causal depthwise conv -> silu -> (x, B, C)
    dt = softplus(dt + dt_bias);  lam = softplus(W_lvl * (x W_lam))            [B, T, H, L]
    y_t = sum_{s<=t} lam[t, l(t,s)] exp(sum_{s<m<=t} dt_m A) (C_t . B_s) dt_s x_s + D x_t
    out_proj(rmsnorm(y * silu(z)))

l(t, s) = bit_length(t XOR s) is the Fenwick level of key s for query t. Everything but lam is
Mamba-2's (the state-space family's ``family.ssm.SSDMixer``, as in ``lmzoo.mixers.mamba2``): with
every lam = 1 the layer is Mamba-2. lam comes from the layer's input through its own projection,
scaled per head and level by ``W_lvl`` (ones at first, as in the paper's code), so at initialisation
every level weighs about softplus(0) = 0.69. ``attn.levels``
sets L (by default enough for ``data.seq_len``); keys beyond level L - 1 share its weight, so
longer evaluations keep working. Decoding carries the conv window, the L - 1 level states
``[H, L-1, N, P]`` and the position, merging levels as the position's bits carry.
``attention_matrix`` is the op's [T, T] weights times dt_s; when there are more SSM heads than
``model.n_heads`` they are averaged in contiguous groups. With ``segment_ids [B,T]`` (packed
documents) the conv, the positions and the states restart at every document start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.ssm import SSDConfig, SSDMixer
from lmzoo.ops.log_linear import MAX_LEVELS, METHODS, log_linear_attention, log_linear_step, log_linear_weights
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig
from lmzoo.sharding import param


def levels_for(seq_len: int) -> int:
    """ceil(log2 T) + 1: levels 0 .. bit_length(T - 1) cover every pair of T tokens."""
    return max(2, int(seq_len - 1).bit_length() + 1)


@register("log_linear_mamba2")
@dataclass
class LogLinearMamba2Config(SSDConfig):
    forms = METHODS  # naive | scan | chunk (see lmzoo.ops.log_linear)

    levels: Optional[int] = None  # L level weights per head; None: ceil(log2 data.seq_len) + 1

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        if self.levels is not None and not 2 <= self.levels <= MAX_LEVELS:
            raise ConfigError(f"attn.levels={self.levels} must be in 2..{MAX_LEVELS} (null: enough for data.seq_len)")

    def build(self, ctx, *, rngs):
        return LogLinearMamba2(self, ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Reading the level states a query sees beyond the one state Mamba-2 reads (an [N, P]
        product per head each), averaged over positions, forward and backward: 3 passes x 2 FLOPs
        per multiply-add. Mamba-2's own constant cost per token is not counted (as for the linear family)."""
        levels = self.levels or levels_for(seq_len)
        d_inner = self.expand * model.d_model
        return 6 * mean_extra_levels(seq_len, levels) * d_inner * self.d_state


def mean_extra_levels(seq_len: int, levels: int) -> float:
    """Non-empty level states a query at t < seq_len reads, less one, averaged over t.

    Slot l (1 .. L-1) of position t holds keys when bit l-1 of t is set; the last slot also holds
    every key of a higher level."""
    t = np.arange(seq_len)
    low = t & ((1 << (levels - 2)) - 1)  # bits read by slots 1 .. L-2 as themselves
    slots = np.array([bin(x).count("1") for x in low]) + (t >> (levels - 2) > 0)
    return float(np.maximum(slots - 1, 0).mean())


class LogLinearMamba2(SSDMixer):
    def __init__(self, cfg: LogLinearMamba2Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        super().__init__(cfg, ctx, rngs=rngs)  # Mamba-2's parameters first, so they initialise as Mamba-2's
        self.levels = cfg.levels or levels_for(ctx.train_len)
        self.level_proj = dense(ctx, ctx.d_model, self.ssm_heads * self.levels, rngs=rngs)
        self.level_weight = param(jnp.ones((self.ssm_heads, self.levels), jnp.float32), None, None)

    # ------------------------------------------------------------------ the levels

    def level_scales(self, x) -> jax.Array:
        """lam = softplus(W_lvl * (x W_lam)) [B, T, H, L] float32, positive."""
        projected = self.level_proj(x).astype(jnp.float32).reshape(*x.shape[:2], self.ssm_heads, self.levels)
        return jax.nn.softplus(self.level_weight[...] * projected)

    def mix(self, x, conv_state=None, levels_state=None, start=0, segment_ids=None):
        """(y, conv window, level states) for x [B, T, d_model] whose first token sits at ``start``."""
        batch, length, _ = x.shape
        xs, dt, b, c, z, conv_state = self.ssm_inputs(x, conv_state, segment_ids)
        x32 = xs.astype(jnp.float32)
        y, levels_state = log_linear_attention(
            c, b, dt[..., None] * x32, dt * self.A(), self.level_scales(x), scale=1.0, initial_state=levels_state,
            start=start, method=self.method, chunk_size=self.chunk_size, segment_ids=segment_ids,
        )
        y = (y + self.D[...][:, None] * x32).astype(xs.dtype)
        return self.out_proj(self.gated_norm(y.reshape(batch, length, self.d_inner), z)), conv_state, levels_state

    # ------------------------------------------------------------------ the mixer protocol

    def __call__(self, x, *, positions=None, segment_ids=None):  # the op counts positions itself
        return self.mix(x, segment_ids=segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        y, conv, levels = self.mix(x)
        return y, {"conv": conv, "levels": levels, "t": jnp.full((), x.shape[1], jnp.int32)}

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """(y, {"conv", "levels"} after x) from ``state`` (None: zeros); the first document of x starts at
        ``positions[:, 0]`` (the Fenwick levels are a function of it)."""
        state = state or {}
        start = 0 if positions is None else positions[:, 0]
        y, conv, levels = self.mix(x, state.get("conv"), state.get("levels"), start, segment_ids)
        return y, {"conv": conv, "levels": levels}

    def init_state(self, batch_size, max_len):
        return {
            "conv": self.conv.init_state(batch_size, self.dtype),
            "levels": jnp.zeros((batch_size, self.ssm_heads, self.levels - 1, self.d_state, self.head_dim),
                                jnp.float32),
            "t": jnp.zeros((), jnp.int32),
        }

    def step(self, x_t, state):
        """One token: the level states merge as the position's bits carry (``ops.log_linear_step``)."""
        x = x_t[:, None]
        xs, dt, b, c, z, conv = self.ssm_inputs(x, state["conv"])
        x32 = xs[:, 0].astype(jnp.float32)  # (B, H, P)
        y, levels = log_linear_step(c[:, 0], b[:, 0], dt[:, 0, :, None] * x32, dt[:, 0] * self.A(),
                                    self.level_scales(x)[:, 0], state["levels"], state["t"], scale=1.0)
        y = (y + self.D[...][:, None] * x32).astype(xs.dtype)
        out = self.out_proj(self.gated_norm(y.reshape(x_t.shape[0], 1, self.d_inner), z))
        return out[:, 0], {"conv": conv, "levels": levels, "t": state["t"] + 1}

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        _, dt, b, c, _, _ = self.ssm_inputs(x, segment_ids=segment_ids)
        weights = log_linear_weights(c, b, dt * self.A(), self.level_scales(x), scale=1.0, segment_ids=segment_ids)
        weights = weights * dt.swapaxes(1, 2)[:, :, None, :]  # v = dt x: the weight on x_s carries dt_s
        batch, _, length, _ = weights.shape
        return weights.reshape(batch, self.n_heads, -1, length, length).mean(axis=2)

    def state_size(self, max_len):
        levels = (self.levels - 1) * self.ssm_heads * self.head_dim * self.d_state
        return self.conv_state_size() + levels + 1  # + the position
