"""The state-space family's shared parts: the causal depthwise conv block (Mamba's and Mamba-2's
conv over their inputs, H3's shift SSM) and the initialisation and checks of the step size Δ."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.ops.lti import causal_conv1d
from lmzoo.schema import ConfigError, positive
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

    def __init__(self, channels: int, width: int, *, bias: bool, rngs: nnx.Rngs):
        init = symmetric_uniform(1 / math.sqrt(width))
        self.width = width
        self.weight = param(init(rngs.params(), (width, channels)), None, INNER)
        self.bias = param(init(rngs.params(), (channels,)), INNER) if bias else None

    def __call__(self, x, state=None, *, segment_ids=None):
        """(y [B,T,C], the last width-1 inputs [B,width-1,C]); ``segment_ids [B,T]``: no tap reaches into another document."""
        bias = None if self.bias is None else self.bias[...]
        return causal_conv1d(x, self.weight[...], bias, initial_state=state, segment_ids=segment_ids)

    def init_state(self, batch_size: int, dtype) -> jax.Array:
        return jnp.zeros((batch_size, self.width - 1, self.weight.shape[1]), dtype)
