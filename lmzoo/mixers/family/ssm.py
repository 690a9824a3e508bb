"""The state-space family's shared parts: the causal depthwise conv block (Mamba's and Mamba-2's
conv over their inputs, H3's shift SSM) and the initialisation and checks of the step size Δ.

Mamba-2's layer around its op is shared too (``SSDMixer``, settings ``SSDConfig``), for every
variant that changes only the op it runs on the same inputs (Mamba-2's SSD, log-linear Mamba-2's
Fenwick levels):

    x -> in_proj -> (z, xBC, dt);  xBC -> causal depthwise conv -> silu -> (x, B, C)
    dt = softplus(dt + dt_bias);  A = -exp(A_log);  y = op(x, dt, A, B, C) + D x
    out_proj(rmsnorm(y * silu(z)))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.ops.common import recompute_in_backward
from lmzoo.ops.lti import causal_conv1d
from lmzoo.ops.ssd import METHODS as SSD_FORMS
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, positive
from lmzoo.sharding import INNER, param


def check_dt_range(dt_min: float, dt_max: float) -> None:
    positive("attn.dt_min", dt_min)
    if dt_max < dt_min:
        raise ConfigError(f"attn.dt_max={dt_max} must be at least attn.dt_min={dt_min}")


def dt_bias_init(key, size: int, dt_min: float, dt_max: float, floor: float = 1e-4) -> jax.Array:
    """softplus^-1 of Δ drawn log-uniformly in [dt_min, dt_max], so that softplus(bias) starts at Δ."""
    log_dt = jax.random.uniform(key, (size,), jnp.float32, math.log(dt_min), math.log(dt_max))
    dt = jnp.maximum(jnp.exp(log_dt), floor)
    return dt + jnp.log(-jnp.expm1(-dt))  # inverse of softplus


def symmetric_uniform(bound: float):
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


class CausalConv(nnx.Module):
    """Depthwise causal conv over [B, T, C] (PyTorch Conv1d's default init); carries its window when decoding."""

    def __init__(self, channels: int, width: int, *, bias: bool, rngs: nnx.Rngs, recompute: bool = False):
        init = symmetric_uniform(1 / math.sqrt(width))
        self.width, self.recompute = width, recompute  # recompute: keep only x for the backward (model.remat=light)
        self.weight = param(init(rngs.params(), (width, channels)), None, INNER)
        self.bias = param(init(rngs.params(), (channels,)), INNER) if bias else None

    def __call__(self, x, state=None, *, segment_ids=None, activation=None):
        """(activation(y) [B,T,C], the last width-1 inputs [B,width-1,C]); ``segment_ids [B,T]``: no tap reaches
        into another document. The activation runs inside the op, so that its backward keeps only x."""
        bias = None if self.bias is None else self.bias[...]
        return causal_conv1d(x, self.weight[...], bias, initial_state=state, segment_ids=segment_ids,
                             activation=activation, recompute=self.recompute)

    def init_state(self, batch_size: int, dtype) -> jax.Array:
        return jnp.zeros((batch_size, self.width - 1, self.weight.shape[1]), dtype)


def gated_rms_norm(y, z, weight, *, groups: int):
    """RMSNorm(y * silu(z)) [..., E] over each of ``groups`` groups of channels, in float32, returned in y's dtype."""
    gated = (y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).reshape(*y.shape[:-1], groups, -1)
    normed = gated * jax.lax.rsqrt(jnp.mean(gated**2, axis=-1, keepdims=True) + 1e-5)
    return (normed.reshape(y.shape) * weight).astype(y.dtype)


def check_ssm_heads(expand: int, head_dim, n_groups: int, model: ModelConfig) -> None:
    """SSM heads of ``head_dim`` (None: d_inner / n_heads) tile d_inner = expand * d_model, come in a
    multiple of the model's heads and split evenly into ``n_groups``."""
    d_inner = expand * model.d_model
    head_dim = head_dim or d_inner // model.n_heads
    positive("attn.head_dim", head_dim)
    if d_inner % head_dim:
        raise ConfigError(f"attn.head_dim={head_dim} does not divide d_inner = attn.expand * model.d_model = {d_inner}")
    heads = d_inner // head_dim
    if heads % model.n_heads:
        raise ConfigError(f"{heads} SSM heads (d_inner / attn.head_dim) are not a multiple of "
                          f"model.n_heads={model.n_heads}")
    if heads % n_groups:
        raise ConfigError(f"attn.n_groups={n_groups} does not divide the {heads} SSM heads")


@dataclass
class SSDConfig(MixerConfig):
    """Knobs of a Mamba-2-style layer around an SSD op (``SSDMixer``): state and conv sizes, heads,
    B/C groups, the Δ initialisation, and the op's form and chunk length."""

    forms = SSD_FORMS  # the op's forms; a class attribute, not a config key (a variant with another op sets its own)
    carries_state = True  # the layer continues from a given conv window and op state (``carry``)

    d_state: int = 32  # N: state entries per head row
    d_conv: int = 4  # width of the causal depthwise convolution over x, B and C
    expand: int = 2  # d_inner = expand * d_model
    head_dim: Optional[int] = None  # P; None: d_inner / model.n_heads (one SSM head per model head)
    n_groups: int = 1  # groups of heads sharing B and C
    dt_min: float = 0.001  # dt is initialised log-uniformly in [dt_min, dt_max]
    dt_max: float = 0.1
    method: str = "chunk"  # one of ``forms`` (see the variant's op)
    chunk_size: int = 64  # tokens per chunk for the chunked forms

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, self.forms)
        for key in ("d_state", "d_conv", "expand", "n_groups"):
            positive(f"attn.{key}", getattr(self, key))
        check_dt_range(self.dt_min, self.dt_max)
        check_ssm_heads(self.expand, self.head_dim, self.n_groups, model)


class SSDMixer(Mixer):
    """Mamba-2's layer without its op: the input projection to (z, xBC, dt), the causal conv over
    x, B and C, Δ = softplus(dt + dt_bias), the decay A = -exp(A_log), the skip D and the gated
    RMSNorm before ``out_proj``. Subclasses run their op on ``ssm_inputs`` and implement the mixer
    protocol (``__call__``, ``prefill``, ``carry``, ``init_state``, ``step``, ``attention_matrix``, ``state_size``);
    parameters they add come after these, so these initialise the same in every subclass."""

    def __init__(self, cfg: SSDConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.method, self.chunk_size = ctx.n_heads, cfg.method, cfg.chunk_size
        self.d_inner, self.d_state, self.n_groups = cfg.expand * ctx.d_model, cfg.d_state, cfg.n_groups
        self.head_dim = cfg.head_dim or self.d_inner // ctx.n_heads
        self.ssm_heads = self.d_inner // self.head_dim
        self.dtype = ctx.dtype
        e, h, bc = self.d_inner, self.ssm_heads, cfg.n_groups * cfg.d_state
        self.in_proj = dense(ctx, ctx.d_model, 2 * e + 2 * bc + h, rngs=rngs)  # z, x, B, C, dt
        self.conv = CausalConv(e + 2 * bc, cfg.d_conv, bias=True, rngs=rngs, recompute=ctx.remat_light)
        self.recompute_norm = ctx.remat_light
        self.dt_bias = param(dt_bias_init(rngs.params(), h, cfg.dt_min, cfg.dt_max), None)
        self.A_log = param(jnp.log(jax.random.uniform(rngs.params(), (h,), jnp.float32, 1.0, 16.0)), None)
        self.D = param(jnp.ones((h,), jnp.float32), None)
        self.norm_weight = param(jnp.ones((e,), jnp.float32), INNER)
        self.out_proj = dense(ctx, e, ctx.d_model, rngs=rngs, residual=True)

    def ssm_inputs(self, x, conv_state=None, segment_ids=None):
        """x [B,T,H,P], dt [B,T,H] (positive, float32), B and C [B,T,G,N], gate z [B,T,E], conv window."""
        batch, length, _ = x.shape
        e, bc = self.d_inner, self.n_groups * self.d_state
        z, xbc, dt = jnp.split(self.in_proj(x), [e, 2 * e + 2 * bc], axis=-1)
        xbc, conv_state = self.conv(xbc, conv_state, segment_ids=segment_ids, activation=jax.nn.silu)
        xs, b, c = jnp.split(xbc, [e, e + bc], axis=-1)
        groups = (batch, length, self.n_groups, self.d_state)
        dt = jax.nn.softplus(dt.astype(jnp.float32) + self.dt_bias[...])  # (B, T, H)
        xs = xs.reshape(batch, length, self.ssm_heads, self.head_dim)  # (B, T, H, P)
        return xs, dt, b.reshape(groups), c.reshape(groups), z, conv_state

    def A(self) -> jax.Array:
        return -jnp.exp(self.A_log[...])  # (H,)

    def gated_norm(self, y, z):
        """RMSNorm(y * silu(z)) over each group of d_inner / n_groups channels, in float32.

        Autodiff keeps nine [B, T, d_inner] float32 copies of y; with ``model.remat=light`` it keeps only
        y, z and the weight and makes them again in the backward pass (``recompute_in_backward``)."""
        norm = functools.partial(gated_rms_norm, groups=self.n_groups)
        if self.recompute_norm:
            norm = recompute_in_backward(norm)
        return norm(y, z, self.norm_weight[...])

    def conv_state_size(self) -> int:
        """Entries of the conv window decoding carries over x, B and C."""
        return (self.conv.width - 1) * (self.d_inner + 2 * self.n_groups * self.d_state)
