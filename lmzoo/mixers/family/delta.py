"""The delta-rule family (DeltaNet, Gated DeltaNet, per-channel gated delta): what its variants share.

    q, k, v = silu(causal_conv(x W_qkv))            short depthwise convs (as in the papers)
    q, k    = q / |q|, k / |k|;   beta = sigmoid(x W_beta)        per head
    S_t = diag(g_t) S_{t-1} + beta_t k_t (v_t - (diag(g_t) S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)
    y   = W_o (swish(x W_g) * headnorm(o))

A variant supplies only its gates (``gates(x)``: None for DeltaNet, log decays per head or per key
channel otherwise); everything else is here. The recurrence is ``lmzoo.ops.delta_rule`` in the form
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

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import GatedHeadNorm, LinearFamilyConfig, LinearFamilyMixer
from lmzoo.mixers.family.ssm import CausalConv
from lmzoo.ops.delta import METHODS, delta_rule, delta_rule_weights
from lmzoo.schema import ModelConfig, positive


@dataclass
class DeltaRuleConfig(LinearFamilyConfig):
    """Knobs every delta-rule spec has (the form, chunk length, and the width of the short convs)."""

    forms = METHODS  # the op's forms; a class attribute, not a config key

    method: str = "chunk"  # scan | parallel | chunk | pallas (see lmzoo.ops.delta)
    conv_size: int = 4  # taps of the causal depthwise conv on q, k and v (1: a per-channel scale)

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.conv_size", self.conv_size)


def l2_normalize(x, eps: float = 1e-12) -> jax.Array:
    """x / |x| over the last axis, in float32; exactly unit unless |x|^2 < eps (small projections
    at initialisation included), where the step size of the delta rule relies on |k| = 1."""
    x = x.astype(jnp.float32)
    return x * lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps))


class DeltaRuleMixer(LinearFamilyMixer):
    """The family's mixer; a gated variant overrides ``init_gates`` and ``gates``."""

    def __init__(self, cfg: DeltaRuleConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads = ctx.n_heads
        self.key_dim = self.value_dim = d // ctx.n_heads
        self.method, self.chunk_size, self.dtype = cfg.method, cfg.chunk_size, ctx.dtype
        self.qkv_proj = dense(ctx, d, 3 * d, rngs=rngs)  # [q | k | v], one head after another in each
        self.conv = CausalConv(3 * d, cfg.conv_size, bias=False, rngs=rngs)
        self.beta_proj = dense(ctx, d, self.n_heads, rngs=rngs)
        self.init_gates(cfg, ctx, rngs=rngs)
        self.out_gate = GatedHeadNorm(ctx, self.n_heads, self.value_dim, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def init_gates(self, cfg, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """The gate's parameters (none without gates)."""

    def gates(self, x):
        """float32 log decays [B, T, H] or [B, T, H, Dk] (<= 0), or None for no decay."""
        return None

    def project(self, x, conv_state=None, segment_ids=None):
        """The op's inputs (q, k [B,T,H,Dk] unit, v [B,T,H,Dv], beta [B,T,H], log_g) and the conv window."""
        b, t, _ = x.shape
        mixed, conv_state = self.conv(self.qkv_proj(x), conv_state, segment_ids=segment_ids)
        q, k, v = jnp.split(jax.nn.silu(mixed).reshape(b, t, 3, self.n_heads, -1), 3, axis=2)
        q, k = l2_normalize(q[:, :, 0]).astype(v.dtype), l2_normalize(k[:, :, 0]).astype(v.dtype)
        beta = jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32))
        return (q, k, v[:, :, 0], beta, self.gates(x)), conv_state

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

    def prefill(self, x, max_len=None, *, positions=None):  # the convs carry order: positions are unused
        heads, conv = self.project(x)
        o, s = self.mix(*heads)
        return self.output(x, o), {"S": s, "conv": conv}

    def init_state(self, batch_size, max_len):
        return {"S": self.recurrent_state(batch_size), "conv": self.conv.init_state(batch_size, self.dtype or jnp.float32)}

    def step(self, x_t, state):
        x = x_t[:, None]  # (B, 1, d_model)
        heads, conv = self.project(x, state["conv"])
        o, s = self.mix(*heads, state=state["S"], method="scan")
        return self.output(x, o)[:, 0], {"S": s, "conv": conv}

    def state_size(self, max_len):
        conv_window = (self.conv.width - 1) * self.conv.weight.shape[1]
        return self.n_heads * self.key_dim * self.value_dim + conv_window
