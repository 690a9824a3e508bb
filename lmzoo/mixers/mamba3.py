"""Mamba-3 (Lahoti et al., 2026), single input single output: Mamba-2 with a trapezoidal step, a
complex state carried as data-dependent rotations of B and C, normalised and biased B and C, and
no short convolution.

    x -> in_proj -> (z, x, B, C, dt, A, lam, theta)                        no conv: the trapezoid looks back
    B, C  = rmsnorm(B) + b_B,  rmsnorm(C) + b_C        per-head biases b (start at 1: a time-invariant part)
    dt    = softplus(dt + dt_bias);   A = -max(softplus(A), A_floor);   lam = sigmoid(lam)
    theta = pi tanh(theta)                              rotation rates, shared by the heads, on a fraction of N
    y     = mamba3(x, dt, A, B, C, lam, theta) + D x;   out_proj(y * silu(z))

The recurrence (``lmzoo.ops.mamba3``, equations in its docstring) runs in the form ``attn.method``
names (``auto``: jax-linear-attention's Hopper kernel where it takes the call, else ``chunk``);
decoding carries its state ``{h [H,P,N], previous x, previous rotated B, phase}``.
``attention_matrix`` is the op's exact weights ``y = W x`` (``mamba3_attention``), averaged over
contiguous groups of SSM heads when there are more of them than ``model.n_heads``. Heads read B
and C in groups (``attn.n_groups``), as Mamba-2's do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.mixers.family.linear import chunked_mixing_flops
from lmzoo.mixers.family.ssm import check_dt_range, check_ssm_heads, dt_bias_init
from lmzoo.ops.mamba3 import METHODS, STEP_FORM, mamba3, mamba3_attention, zero_state
from lmzoo.registry import register
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, one_of, positive
from lmzoo.sharding import param


@register("mamba3")
@dataclass
class Mamba3Config(MixerConfig):
    carries_state = True  # continues from a given state (``Mamba3.carry``)
    forms = METHODS  # the op's forms attn.method may name; a class attribute, not a config key

    d_state: int = 32  # N: state entries per head row
    expand: int = 2  # d_inner = expand * d_model
    head_dim: Optional[int] = None  # P; None: d_inner / model.n_heads (one SSM head per model head)
    n_groups: int = 1  # groups of heads sharing the B and C projections
    rope_fraction: float = 0.5  # the fraction of the N state entries that rotate (0.5 or 1.0)
    dt_min: float = 0.001  # dt is initialised log-uniformly in [dt_min, dt_max]
    dt_max: float = 0.1
    A_floor: float = 1e-4  # -A >= A_floor: every step forgets a little
    method: str = "auto"  # auto | jla | naive | scan | chunk (see lmzoo.ops.mamba3)
    chunk_size: int = 64  # tokens per chunk for method=chunk

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, self.forms)
        for key in ("d_state", "expand", "n_groups", "A_floor"):
            positive(f"attn.{key}", getattr(self, key))
        one_of("attn.rope_fraction", self.rope_fraction, (0.5, 1.0))
        if self.d_state * self.rope_fraction < 2:
            raise ConfigError(f"attn.d_state={self.d_state} leaves no pair of state entries to rotate "
                              f"at attn.rope_fraction={self.rope_fraction}")
        check_dt_range(self.dt_min, self.dt_max)
        check_ssm_heads(self.expand, self.head_dim, self.n_groups, model)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """The trapezoid counted as the chunked recurrence it runs as (``lmzoo.ops.mamba3``'s chunk form, jla's
        kernel): one SSD, heads of state [N, P] (``chunked_mixing_flops``); the rotations and the same-step
        term are elementwise, like the gates the count leaves out for every recurrence."""
        d_inner = self.expand * model.d_model
        head_dim = self.head_dim or d_inner // model.n_heads
        return chunked_mixing_flops(d_inner // head_dim, self.d_state, head_dim, self.chunk_size, seq_len)

    def build(self, ctx, *, rngs):
        return Mamba3(self, ctx, rngs=rngs)


class Mamba3(Mixer):
    def __init__(self, cfg: Mamba3Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.method, self.chunk_size, self.A_floor = ctx.n_heads, cfg.method, cfg.chunk_size, cfg.A_floor
        self.d_inner, self.d_state, self.n_groups = cfg.expand * ctx.d_model, cfg.d_state, cfg.n_groups
        self.head_dim = cfg.head_dim or self.d_inner // ctx.n_heads
        self.ssm_heads = self.d_inner // self.head_dim
        self.angles = int(cfg.d_state * cfg.rope_fraction) // 2  # R rotating pairs
        e, h, bc = self.d_inner, self.ssm_heads, cfg.n_groups * cfg.d_state
        self.splits = [e, 2 * e, 2 * e + bc, 2 * e + 2 * bc, 2 * e + 2 * bc + h, 2 * e + 2 * bc + 2 * h,
                       2 * e + 2 * bc + 3 * h]  # z | x | B | C | dt | A | lam | theta
        self.in_proj = dense(ctx, ctx.d_model, self.splits[-1] + self.angles, rngs=rngs)
        self.dt_bias = param(dt_bias_init(rngs.params(), h, cfg.dt_min, cfg.dt_max), None)
        self.B_norm = param(jnp.ones((cfg.d_state,), jnp.float32), None)
        self.C_norm = param(jnp.ones((cfg.d_state,), jnp.float32), None)
        self.B_bias = param(jnp.ones((h, cfg.d_state), jnp.float32), None, None)
        self.C_bias = param(jnp.ones((h, cfg.d_state), jnp.float32), None, None)
        self.D = param(jnp.ones((h,), jnp.float32), None)
        self.out_proj = dense(ctx, e, ctx.d_model, rngs=rngs, residual=True)

    def ssm_inputs(self, x):
        """The op's inputs (x, dt, A, B, C, lam, theta; float32 except x) and the output gate z."""
        batch, length, _ = x.shape
        z, xs, b, c, dt, a, lam, theta = jnp.split(self.in_proj(x), self.splits, axis=-1)
        heads = (batch, length, self.ssm_heads)
        dt = jax.nn.softplus(dt.astype(jnp.float32) + self.dt_bias[...])  # (B, T, H)
        a = -jnp.maximum(jax.nn.softplus(a.astype(jnp.float32)), self.A_floor)
        theta = math.pi * jnp.tanh(theta.astype(jnp.float32))  # (B, T, R), shared by the heads
        b, c = self.biased(self.B_norm, self.B_bias, b), self.biased(self.C_norm, self.C_bias, c)
        theta = jnp.broadcast_to(theta[:, :, None], heads + (self.angles,))
        return xs.reshape(*heads, self.head_dim), dt, a, b, c, jax.nn.sigmoid(lam.astype(jnp.float32)), theta, z

    def biased(self, norm, bias, v):
        """rmsnorm(v) * norm + bias per head: [B, T, G * N] -> [B, T, H, N] float32."""
        batch, length, _ = v.shape
        v = v.astype(jnp.float32).reshape(batch, length, self.n_groups, self.d_state)
        v = v * jax.lax.rsqrt(jnp.mean(v**2, axis=-1, keepdims=True) + 1e-5) * norm[...]
        return jnp.repeat(v, self.ssm_heads // self.n_groups, axis=2) + bias[...]

    def mix(self, x, state=None, method=None, segment_ids=None):
        batch, length, _ = x.shape
        xs, dt, a, b, c, lam, theta, z = self.ssm_inputs(x)
        y, state = mamba3(xs, dt, a, b, c, lam, theta, D=self.D[...], initial_state=state, method=method or self.method,
                          chunk_size=self.chunk_size, segment_ids=segment_ids)
        y = y.reshape(batch, length, self.d_inner).astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
        return self.out_proj(y.astype(x.dtype)), state

    def __call__(self, x, *, positions=None, segment_ids=None):  # order lives in the state: positions are unused
        return self.mix(x, segment_ids=segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        return self.mix(x)

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """(y, the op's state after x) from ``state`` (None: zeros)."""
        return self.mix(x, state, segment_ids=segment_ids)

    def init_state(self, batch_size, max_len):
        return zero_state(batch_size, self.ssm_heads, self.head_dim, self.d_state, self.angles)

    def step(self, x_t, state):
        y, state = self.mix(x_t[:, None], state, method=STEP_FORM)
        return y[:, 0], state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        _, dt, a, b, c, lam, theta, _ = self.ssm_inputs(x)
        weights = mamba3_attention(dt, a, b, c, lam, theta, segment_ids=segment_ids)  # (B, H_ssm, T, T)
        batch, _, length, _ = weights.shape
        return weights.reshape(batch, self.n_heads, -1, length, length).mean(axis=2)

    def state_size(self, max_len):
        return self.ssm_heads * (self.head_dim * self.d_state + self.head_dim + self.d_state + self.angles)
