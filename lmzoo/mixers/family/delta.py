"""The delta-rule family (DeltaNet, Gated DeltaNet, KDA, GDN-2 ...): what its variants share.

    q, k, v = silu(causal_conv(x W_qkv))            short depthwise convs (as in the papers)
    q, k    = q / |q|, k / |k|;   beta = sigmoid(x W_beta)        per head
    S_t = diag(g_t) S_{t-1} + beta_t k_t (v_t - (diag(g_t) S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)
    y   = W_o (swish(x W_g) * headnorm(o))

A variant supplies only its gates (``gates(x)``: None for DeltaNet, log decays per head or per key
channel otherwise; ``init_decay``/``decay`` below are the Mamba-2-style decay the gated variants
share), and may change the step sizes (``init_step_sizes``: GDN-2's erase and write gates in
place of beta), the output (``init_output``/``output``) or use grouped value heads
(``grouped_value_heads``: HV value heads over the H query/key heads, each with its own beta, gates
and state; ``lmzoo.ops.delta_rule`` pairs value head hv with key head hv // (HV / H)); everything
else is here. The recurrence is ``lmzoo.ops.delta_rule`` in the form
``attn.method`` names. Unit keys and beta in (0, 1) make every step's ``I - beta k k^T`` a
contraction, so the state cannot blow up however long the sequence.

The convs make the op's inputs depend on the last ``conv_size - 1`` tokens, so decoding carries
their window next to the state S (``init_state``/``step`` extend the linear family's), and
``state_size`` counts both. The attention matrix is the delta rule's effective weights on the
values, ``scale * P_<=(q, k) (I + diag(beta) P_<(k, k))^{-1} diag(beta)`` (see ``lmzoo.ops.delta``),
which the forward applies exactly (no positions: order lives in the state and the convs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import GatedHeadNorm, LinearFamilyConfig, LinearFamilyMixer, gated_head_norm
from lmzoo.mixers.family.ssm import CausalConv, check_dt_range, dt_bias_init
from lmzoo.ops.delta import METHODS, STEP_FORM, delta_rule, delta_rule_weights
from lmzoo.schema import ConfigError, ModelConfig, positive
from lmzoo.sharding import EMBED, INNER, param, partitioned


@dataclass
class DeltaRuleConfig(LinearFamilyConfig):
    """Knobs every delta-rule spec has (the form, chunk length, and the width of the short convs)."""

    forms = METHODS  # the op's forms; a class attribute, not a config key
    delta = True

    method: str = "auto"  # auto | jla | naive | parallel | chunk | pallas (see lmzoo.ops.delta)
    conv_size: int = 4  # taps of the causal depthwise conv on q, k and v (1: a per-channel scale)
    qk_norm_eps: Optional[float] = None  # None: q/|q| with |q|^2 floored at 1e-12; a value: q/sqrt(|q|^2 + eps)
                                         # (fla: 1e-6)

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.conv_size", self.conv_size)
        if self.qk_norm_eps is not None:
            positive("attn.qk_norm_eps", self.qk_norm_eps)


@dataclass
class DecayConfig(DeltaRuleConfig):
    """The knobs of the family's Mamba-2-style decay (``DeltaRuleMixer.init_decay``)."""

    gate_rank: Optional[int] = None  # per-channel gates: rank of x W_1 W_2; None: the head dimension
    dt_min: float = 0.001  # the gate's step size starts log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        if self.gate_rank is not None:
            positive("attn.gate_rank", self.gate_rank)
        check_dt_range(self.dt_min, self.dt_max)


def check_value_heads(value_heads: Optional[int], model: ModelConfig) -> None:
    """``attn.value_heads`` (HV, grouped value heads): None, or a positive multiple of model.n_heads."""
    if value_heads is not None:
        positive("attn.value_heads", value_heads)
        if value_heads % model.n_heads:
            raise ConfigError(f"attn.value_heads={value_heads} must be a multiple of model.n_heads={model.n_heads}")


def l2_normalize(x, eps: float = 1e-12, *, added: Optional[float] = None) -> jax.Array:
    """x / |x| over the last axis, in float32; exactly unit unless |x|^2 < eps (small projections
    at initialisation included), where the step size of the delta rule relies on |k| = 1. With
    ``added``, x / sqrt(|x|^2 + added) instead (flash-linear-attention's form, ``attn.qk_norm_eps``)."""
    x = x.astype(jnp.float32)
    squared = jnp.sum(x * x, axis=-1, keepdims=True)
    return x * lax.rsqrt(jnp.maximum(squared, eps) if added is None else squared + added)


class DeltaRuleMixer(LinearFamilyMixer):
    """The family's mixer; a gated variant overrides ``init_gates`` and ``gates``."""

    value_heads: Optional[int] = None  # HV; None (a subclass with its own __init__): n_heads
    step_form = STEP_FORM  # of lmzoo.ops.delta; a variant on another op names its op's

    def __init__(self, cfg: DeltaRuleConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads = ctx.n_heads
        self.key_dim = self.value_dim = d // ctx.n_heads
        self.value_heads = self.grouped_value_heads(cfg, ctx)
        self.method, self.chunk_size, self.dtype = cfg.method, cfg.chunk_size, ctx.dtype
        self.qk_norm_eps = cfg.qk_norm_eps
        width = 2 * d + self.value_heads * self.value_dim
        self.qkv_proj = dense(ctx, d, width, rngs=rngs)  # [q | k | v], one head after another in each
        self.conv = CausalConv(width, cfg.conv_size, bias=False, rngs=rngs, recompute=ctx.remat_light)
        self.init_step_sizes(ctx, rngs=rngs)
        self.init_gates(cfg, ctx, rngs=rngs)
        self.init_output(cfg, ctx, rngs=rngs)

    def grouped_value_heads(self, cfg, ctx: MixerContext) -> int:
        """HV, the value heads (a multiple of the n_heads query/key heads): n_heads unless a variant groups."""
        return ctx.n_heads

    def init_step_sizes(self, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """beta's projection, one step size per value head."""
        self.beta_proj = dense(ctx, ctx.d_model, self.value_heads, rngs=rngs)

    def init_gates(self, cfg, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """The gate's parameters (none without gates)."""

    def gates(self, x):
        """float32 log decays [B, T, HV] or [B, T, HV, Dk] (<= 0), or None for no decay."""
        return None

    def init_output(self, cfg, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """``W_o (swish(x W_g) * headnorm(o))`` over the value heads."""
        self.out_gate = GatedHeadNorm(ctx, self.value_heads, self.value_dim, rngs=rngs)
        self.o_proj = dense(ctx, self.value_heads * self.value_dim, ctx.d_model, rngs=rngs, residual=True)

    def init_decay(self, cfg: DecayConfig, ctx: MixerContext, *, per_channel: bool, rngs: nnx.Rngs) -> None:
        """Mamba-2's decay per value head or per key channel (a low-rank projection of rank
        ``gate_rank``): ``A_log`` from log U[1, 16] per head, ``dt_bias`` softplus^-1 of a step drawn
        log-uniformly in [dt_min, dt_max], so that the state first keeps a few hundred tokens."""
        d, heads = ctx.d_model, self.value_heads
        self.per_channel = per_channel
        width = heads * self.key_dim if per_channel else heads
        if per_channel:
            rank = cfg.gate_rank or self.key_dim
            self.gate_proj = nnx.Sequential(dense(ctx, d, rank, rngs=rngs, axes=(EMBED, None)),
                                            dense(ctx, rank, width, rngs=rngs, axes=(None, INNER)))
        else:
            self.gate_proj = dense(ctx, d, width, rngs=rngs)
        self.dt_bias = param(dt_bias_init(rngs.params(), width, cfg.dt_min, cfg.dt_max), None)
        self.A_log = param(jnp.log(jax.random.uniform(rngs.params(), (heads,), jnp.float32, 1.0, 16.0)), None)

    def decay(self, x):
        """log g = -exp(A_log) * softplus(x W + dt_bias): [B, T, HV] or [B, T, HV, Dk], float32, <= 0."""
        b, t, _ = x.shape
        step = jax.nn.softplus(self.gate_proj(x).astype(jnp.float32) + self.dt_bias[...])  # (B, T, width)
        rate = jnp.exp(self.A_log[...])  # (HV,)
        if self.per_channel:
            return -rate[:, None] * step.reshape(b, t, self.value_heads, self.key_dim)
        return -rate * step

    def project(self, x, conv_state=None, segment_ids=None):
        """The op's inputs (q, k [B,T,H,Dk] unit, v [B,T,HV,Dv], beta [B,T,HV], log_g) and the conv window."""
        (q, k, v), conv_state = self.queries_keys_values(x, conv_state, segment_ids)
        beta = jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32))
        return (q, k, v, beta, self.gates(x)), conv_state

    def queries_keys_values(self, x, conv_state=None, segment_ids=None):
        """(q, k [B,T,H,Dk] unit, v [B,T,HV,Dv]) through the short convs, and the conv window."""
        b, t, d = x.shape
        mixed, conv_state = self.conv(self.qkv_proj(x), conv_state, segment_ids=segment_ids, activation=jax.nn.silu)
        q, k, v = jnp.split(mixed, [d, 2 * d], axis=-1)
        q, k = (l2_normalize(a.reshape(b, t, self.n_heads, self.key_dim), added=self.qk_norm_eps).astype(v.dtype)
                for a in (q, k))
        return (q, k, v.reshape(b, t, -1, self.value_dim)), conv_state

    def heads(self, x, positions=None, segment_ids=None):  # the state and the convs carry order: positions are unused
        return self.project(x, segment_ids=segment_ids)[0]

    def mix(self, q, k, v, beta, log_g, state=None, method=None, segment_ids=None):
        method = method or self.method
        return delta_rule(q, k, v, beta, log_g, initial_state=state, method=method, chunk_size=self.chunk_size,
                          segment_ids=segment_ids)

    def mix_weights(self, q, k, v, beta, log_g, segment_ids=None):
        return delta_rule_weights(q, k, beta, log_g, segment_ids=segment_ids)

    def output(self, x, o):
        return self.o_proj(self.out_gate(x, o))

    def prefill(self, x, max_len=None, *, positions=None):
        return self.carry(x, None)

    def carry(self, x, state, *, positions=None, segment_ids=None):  # the convs carry order: positions are unused
        """(y, {"S", "conv"} after x) from ``state`` (None: zeros): the delta rule's state and the convs' window."""
        state = state or {}
        heads, conv = self.project(x, state.get("conv"), segment_ids)
        o, s = self.mix(*heads, state=state.get("S"), segment_ids=segment_ids)
        return self.output(x, o), {"S": s, "conv": conv}

    def init_state(self, batch_size, max_len):
        return {"S": self.recurrent_state(batch_size),
                "conv": self.conv.init_state(batch_size, self.dtype or jnp.float32)}

    def step(self, x_t, state):
        x = x_t[:, None]  # (B, 1, d_model)
        heads, conv = self.project(x, state["conv"])
        o, s = self.mix(*heads, state=state["S"], method=self.step_form)
        return self.output(x, o)[:, 0], {"S": s, "conv": conv}

    def recurrent_state(self, batch_size: int):
        """S [B, HV, Dk, Dv] float32: one state per value head."""
        heads = self.value_heads or self.n_heads
        return jnp.zeros((batch_size, heads, self.key_dim, self.value_dim), jnp.float32)

    def state_size(self, max_len):
        conv_window = (self.conv.width - 1) * self.conv.weight.shape[1]
        return (self.value_heads or self.n_heads) * self.key_dim * self.value_dim + conv_window


class SigmoidGatedHeadNorm(nnx.Module):
    """``sigmoid(x W_up W_down + b) * headnorm(o)``: each head RMS-normalised in float32, gated through a low rank."""

    def __init__(self, ctx: MixerContext, heads: int, head_dim: int, rank: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.gate = nnx.Sequential(dense(ctx, ctx.d_model, rank, rngs=rngs, axes=(EMBED, None)),
                                   dense(ctx, rank, heads * head_dim, rngs=rngs, bias=True, axes=(None, INNER)))
        self.norm = nnx.RMSNorm(head_dim, epsilon=eps, dtype=jnp.float32,
                                scale_init=partitioned(nnx.initializers.ones, None), rngs=rngs)
        self.recompute = ctx.remat_light

    def __call__(self, x, o):
        """x [..., d_model], o [..., H, Dv] -> [..., H * Dv] in x's dtype."""
        return gated_head_norm(self.norm, o, self.gate(x), jax.nn.sigmoid, x.dtype, recompute=self.recompute)
