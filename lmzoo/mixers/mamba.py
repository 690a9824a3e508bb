"""Mamba (Gu & Dao, 2023): a selective SSM whose step size Δ and matrices B, C depend on the input.

    x -> in_proj -> (u, z);  u -> causal depthwise conv -> silu -> x_proj -> (Δ_low, B, C)
    Δ = softplus(dt_proj(Δ_low) + dt_bias);  y = selective_scan(u, Δ, A, B, C) + D u;  out_proj(y * silu(z))

The initialisations follow the paper: A = -(1..N) per channel (S4D-real) kept as ``A_log``,
Δ sampled log-uniformly in [dt_min, dt_max] and stored as ``dt_bias = softplus^-1(Δ)``, D = 1.
Decoding carries the conv window (d_conv - 1 inputs) and the SSM state ``[E, N]`` per sequence.
``attention_matrix`` is the "hidden attention" of the selective scan (``ops.selective_attention``):
the d_inner channels are split into ``model.n_heads`` contiguous groups, averaged per group.
With ``segment_ids [B,T]`` (packed documents) the conv and the scan restart at every document start.
``attn.negative_eigenvalues=true`` (Grazzi et al., ICLR 2025, "Mamba [-1, 1]") makes the transition
``2 exp(Δ A) - 1`` (in (-1, 1]) so the state can flip sign, which parity needs; the forms that multiply
transitions carry it (``ops.selective_scan.SIGNED_FORMS``; ``auto`` runs the scan), the others are refused.

The conv block and the Δ initialisation are the family's (``lmzoo.mixers.family.ssm``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, dense, provided_form
from lmzoo.mixers.family.ssm import CausalConv, check_dt_range, dt_bias_init, symmetric_uniform
from lmzoo.ops.selective_scan import (
    METHODS, STEP_FORM, effective_delta, selective_attention, selective_scan, signed_form,
)
from lmzoo.registry import register
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, positive
from lmzoo.sharding import INNER, param, partitioned


@register("mamba")
@dataclass
class MambaConfig(MixerConfig):
    carries_state = True  # continues from a given conv window and scan state (``Mamba.carry``)
    forms = METHODS  # the op's forms attn.method may name; a class attribute, not a config key

    d_state: int = 16  # N: state entries per channel
    d_conv: int = 4  # width of the causal depthwise convolution
    expand: int = 2  # d_inner = expand * d_model
    dt_rank: Optional[int] = None  # rank of the Δ projection; None: ceil(d_model / 16)
    dt_min: float = 0.001  # Δ is initialised log-uniformly in [dt_min, dt_max]
    dt_max: float = 0.1
    method: str = "auto"  # auto (jla's Hopper kernel, else scan) | jla | naive | scan | assoc | chunk | pallas
                          # (lmzoo.ops.selective_scan)
    chunk_size: int = 16  # tokens per chunk (chunk: work grows with chunk_size^2 d_inner N; pallas: steps per
                          # loop turn)
    negative_eigenvalues: bool = False  # the transition 2 exp(Δ A) - 1 in (-1, 1] (Grazzi et al.'s Mamba [-1, 1])

    def check(self, model: ModelConfig) -> None:
        if self.negative_eigenvalues:
            try:
                signed_form(self.method, prefix="attn.")
            except ValueError as error:  # the op's own refusal, worded with the config's names
                raise ConfigError(str(error)) from None
        provided_form(self.method, self.forms)
        for key in ("d_state", "d_conv", "expand", "chunk_size"):
            positive(f"attn.{key}", getattr(self, key))
        if self.dt_rank is not None:
            positive("attn.dt_rank", self.dt_rank)
        check_dt_range(self.dt_min, self.dt_max)
        d_inner = self.expand * model.d_model
        if d_inner % model.n_heads:
            raise ConfigError(f"d_inner = attn.expand * model.d_model = {d_inner} does not split into "
                              f"model.n_heads={model.n_heads} groups")

    def build(self, ctx, *, rngs):
        return Mamba(self, ctx, rngs=rngs)


class Mamba(Mixer):
    def __init__(self, cfg: MambaConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.method, self.chunk_size = ctx.n_heads, cfg.method, cfg.chunk_size
        self.negative_eigenvalues = cfg.negative_eigenvalues
        self.d_inner, self.d_state = cfg.expand * ctx.d_model, cfg.d_state
        self.dt_rank = cfg.dt_rank or math.ceil(ctx.d_model / 16)
        self.dtype = ctx.dtype
        e, n, r = self.d_inner, self.d_state, self.dt_rank
        self.in_proj = dense(ctx, ctx.d_model, 2 * e, rngs=rngs)
        self.conv = CausalConv(e, cfg.d_conv, bias=True, rngs=rngs, recompute=ctx.remat_light)
        self.x_proj = dense(ctx, e, r + 2 * n, rngs=rngs, axes=(INNER, None))
        self.dt_proj = nnx.Linear(r, e, use_bias=False, dtype=ctx.dtype,
                                  kernel_init=partitioned(symmetric_uniform(r**-0.5), None, INNER), rngs=rngs)
        self.dt_bias = param(dt_bias_init(rngs.params(), e, cfg.dt_min, cfg.dt_max), INNER)
        # A = -exp(A_log) = -(1, 2, ..., N) for every channel (S4D-real). Stored flat: the optimiser
        # decays matrices only, and Mamba keeps A (like D and dt_bias) out of weight decay.
        self.A_log = param(jnp.log(jnp.tile(jnp.arange(1, n + 1, dtype=jnp.float32), e)), INNER)  # (E * N,)
        self.D = param(jnp.ones((e,), jnp.float32), INNER)
        self.out_proj = dense(ctx, e, ctx.d_model, rngs=rngs, residual=True)

    def A(self) -> jax.Array:
        return -jnp.exp(self.A_log[...].reshape(self.d_inner, self.d_state))  # (E, N)

    def ssm_inputs(self, x, conv_state=None, segment_ids=None):
        """The scan's inputs for x [B,T,d_model]: u, raw Δ [B,T,E], B, C [B,T,N], gate z [B,T,E], conv window."""
        u, z = jnp.split(self.in_proj(x), 2, axis=-1)  # (B, T, E) each
        u, conv_state = self.conv(u, conv_state, segment_ids=segment_ids, activation=jax.nn.silu)
        dt_low, b, c = jnp.split(self.x_proj(u), [self.dt_rank, self.dt_rank + self.d_state], axis=-1)
        return u, self.dt_proj(dt_low), b, c, z, conv_state

    def mix(self, u, delta, b, c, z, *, initial_state=None, method=None, segment_ids=None):
        return selective_scan(
            u, delta, self.A(), b, c, D=self.D[...], z=z, delta_bias=self.dt_bias[...], delta_softplus=True,
            initial_state=initial_state, method=method or self.method, chunk_size=self.chunk_size,
            segment_ids=segment_ids, negative_eigenvalues=self.negative_eigenvalues,
        )

    def __call__(self, x, *, positions=None, segment_ids=None):  # SSMs carry order in their state: positions are unused
        y, _ = self.mix(*self.ssm_inputs(x, segment_ids=segment_ids)[:5], segment_ids=segment_ids)
        return self.out_proj(y)

    def prefill(self, x, max_len=None, *, positions=None):
        return self.carry(x, None)

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """(y, {"conv", "ssm"} after x) from ``state`` (None: zeros)."""
        state = state or {}
        *inputs, conv = self.ssm_inputs(x, state.get("conv"), segment_ids)
        y, ssm = self.mix(*inputs, initial_state=state.get("ssm"), segment_ids=segment_ids)
        return self.out_proj(y), {"conv": conv, "ssm": ssm}

    def init_state(self, batch_size, max_len):
        return {
            "conv": self.conv.init_state(batch_size, self.dtype),
            "ssm": jnp.zeros((batch_size, self.d_inner, self.d_state), jnp.float32),
        }

    def step(self, x_t, state):
        u, delta, b, c, z, conv = self.ssm_inputs(x_t[:, None], state["conv"])
        y, ssm = self.mix(u, delta, b, c, z, initial_state=state["ssm"], method=STEP_FORM)
        return self.out_proj(y[:, 0]), {"conv": conv, "ssm": ssm}

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        _, delta, b, c, _, _ = self.ssm_inputs(x, segment_ids=segment_ids)
        delta = effective_delta(delta, self.dt_bias[...], True)
        return selective_attention(delta, self.A(), b, c, heads=self.n_heads, segment_ids=segment_ids,
                                   negative_eigenvalues=self.negative_eigenvalues)

    def state_size(self, max_len):
        return (self.conv.width - 1) * self.d_inner + self.d_inner * self.d_state
