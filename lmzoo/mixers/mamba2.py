"""Mamba-2 (Dao & Gu, 2024): a scalar decay per head turns the selective scan into SSD, which is gated
linear attention with one gate per head (``lmzoo.ops.ssd`` runs on ``lmzoo.ops.gated.gla``).

    x -> in_proj -> (z, xBC, dt);  xBC -> causal depthwise conv -> silu -> (x, B, C)
    dt = softplus(dt + dt_bias);  y = ssd(x, dt, A, B, C) + D x;  out_proj(rmsnorm(y * silu(z)))

Heads of size P share one decay ``A_h = -exp(A_log_h)`` (A_log initialised to log U[1, 16]) and,
in groups, the projections B and C (like grouped-query attention's keys). The gated RMSNorm
normalises each group of d_inner / n_groups channels. Decoding carries the conv window over
x, B and C and the state ``[H, P, N]``; the linear family's base (``family.linear``) does not fit,
since the gate z comes from the same projection as the op's inputs and SSD takes (x, dt, A, B, C, D).
``attention_matrix`` is SSD's own per-head matrix (``ops.ssd_attention``); when there are more SSM heads than
``model.n_heads`` they are averaged
in contiguous groups. With ``segment_ids [B,T]`` (packed documents) the conv and SSD restart at
every document start. The projections, conv, Δ, A, D and gated norm are the state-space family's
(``family.ssm.SSDMixer``, settings ``family.ssm.SSDConfig``); this module runs ``ssd`` on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from lmzoo.mixers.family.linear import chunked_mixing_flops
from lmzoo.mixers.family.ssm import SSDConfig, SSDMixer
from lmzoo.ops.ssd import STEP_FORM, ssd, ssd_attention
from lmzoo.registry import register
from lmzoo.schema import ModelConfig


@register("mamba2")
@dataclass
class Mamba2Config(SSDConfig):
    method: str = "auto"  # auto | jla | naive | scan | chunk | pallas (see lmzoo.ops.ssd)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """SSD counted as the chunked linear recurrence it is: heads of state [N, P] (``chunked_mixing_flops``)."""
        d_inner = self.expand * model.d_model
        head_dim = self.head_dim or d_inner // model.n_heads
        return chunked_mixing_flops(d_inner // head_dim, self.d_state, head_dim, self.chunk_size, seq_len)

    def build(self, ctx, *, rngs):
        return Mamba2(self, ctx, rngs=rngs)


class Mamba2(SSDMixer):
    def mix(self, x, conv_state=None, ssm_state=None, method=None, segment_ids=None):
        batch, length, _ = x.shape
        xs, dt, b, c, z, conv_state = self.ssm_inputs(x, conv_state, segment_ids)
        y, ssm_state = ssd(
            xs, dt, self.A(), b, c, D=self.D[...], initial_state=ssm_state,
            chunk_size=self.chunk_size, method=method or self.method, segment_ids=segment_ids,
        )
        y = self.gated_norm(y.reshape(batch, length, self.d_inner), z)
        return self.out_proj(y), conv_state, ssm_state

    def __call__(self, x, *, positions=None, segment_ids=None):  # SSMs carry order in their state: positions are unused
        return self.mix(x, segment_ids=segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        return self.carry(x, None)

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """(y, {"conv", "ssm"} after x) from ``state`` (None: zeros)."""
        state = state or {}
        y, conv, ssm = self.mix(x, state.get("conv"), state.get("ssm"), segment_ids=segment_ids)
        return y, {"conv": conv, "ssm": ssm}

    def init_state(self, batch_size, max_len):
        return {
            "conv": self.conv.init_state(batch_size, self.dtype),
            "ssm": jnp.zeros((batch_size, self.ssm_heads, self.head_dim, self.d_state), jnp.float32),
        }

    def step(self, x_t, state):
        y, conv, ssm = self.mix(x_t[:, None], state["conv"], state["ssm"], method=STEP_FORM)
        return y[:, 0], {"conv": conv, "ssm": ssm}

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        _, dt, b, c, _, _ = self.ssm_inputs(x, segment_ids=segment_ids)
        weights = ssd_attention(dt, self.A(), b, c, segment_ids=segment_ids)  # (B, H_ssm, T, T)
        batch, _, length, _ = weights.shape
        return weights.reshape(batch, self.n_heads, -1, length, length).mean(axis=2)

    def state_size(self, max_len):
        return self.conv_state_size() + self.ssm_heads * self.head_dim * self.d_state
