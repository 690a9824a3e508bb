"""Gated DeltaProduct (Siems et al., 2025): n_h delta-rule steps per token (``attn.householder_steps``),
so that each token's transition is a product of n_h generalised Householder matrices.

    q, k_j, v_j = silu(causal_conv(x W_qkv))          j = 0 .. n_h - 1: keys and values of their own
    q, k_j = q / |q|, k_j / |k_j|;   beta_j = r * sigmoid(x W_beta)    r = 2 with negative eigenvalues, else 1
    S <- g_t S_{t-1};  S <- S + beta_j k_j (v_j - S^T k_j)^T for each j;  o_t = S^T q_t / sqrt(Dk)
    y = W_o (swish(x W_g) * headnorm(o))

The gate (``attn.gate=head``) is Gated DeltaNet's, ``log g_t = -exp(A_log_h) softplus(x W_a + dt_bias_h)``,
applied once per token (``attn.gate=none``: no decay). With ``attn.negative_eigenvalues=true`` each
step's ``I - beta k k^T`` has eigenvalue ``1 - beta`` in (-1, 1) along k: a product of two such
reflections can rotate the state, which tracks parity and permutations; with beta in (0, 1) and
n_h = 1 it is Gated DeltaNet. The recurrence is ``lmzoo.ops.delta_product`` in the form
``attn.method`` names; everything else (the convs and their decoding window, the head norm, output
gate, decoding) is the delta-rule family's (``lmzoo.mixers.family.delta``).

``attention_matrix``: the op's weights on each sub-step's value, summed over a token's n_h sub-steps
(exact when a token's sub-step values coincide; its rows reproduce o only through the sub-step weights
of ``lmzoo.ops.delta_product_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer, l2_normalize
from lmzoo.mixers.family.ssm import CausalConv
from lmzoo.ops.delta_product import METHODS, STEP_FORM, delta_product, delta_product_weights
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, one_of, positive

GATES = ("head", "none")


@register("deltaproduct")
@dataclass
class DeltaProductConfig(DecayConfig):
    forms = METHODS

    householder_steps: int = 2  # n_h: delta-rule steps per token
    negative_eigenvalues: bool = True  # beta in (0, 2) (eigenvalues in (-1, 1)); false: beta in (0, 1)
    gate: str = "head"  # head: one decay per head and token (Gated DeltaProduct) | none

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.householder_steps", self.householder_steps)
        one_of("attn.gate", self.gate, GATES)

    def build(self, ctx, *, rngs):
        return DeltaProduct(self, ctx, rngs=rngs)


class DeltaProduct(DeltaRuleMixer):
    matrix_acts_on_values = False  # the weights act on each sub-step's value, not on one value per token
    step_form = STEP_FORM  # of lmzoo.ops.delta_product
    def __init__(self, cfg: DeltaProductConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        # The family's layout with n_h keys and values per token: [q | k_0 .. k_{n-1} | v_0 .. v_{n-1}].
        d, self.n_heads, self.steps = ctx.d_model, ctx.n_heads, cfg.householder_steps
        self.key_dim = self.value_dim = d // ctx.n_heads
        self.value_heads = self.n_heads
        self.method, self.chunk_size, self.dtype = cfg.method, cfg.chunk_size, ctx.dtype
        self.qk_norm_eps = cfg.qk_norm_eps
        self.beta_range = 2.0 if cfg.negative_eigenvalues else 1.0
        width = (1 + 2 * self.steps) * d
        self.qkv_proj = dense(ctx, d, width, rngs=rngs)
        self.conv = CausalConv(width, cfg.conv_size, bias=False, rngs=rngs, recompute=ctx.remat_light)
        self.beta_proj = dense(ctx, d, self.steps * self.n_heads, rngs=rngs)
        self.init_gates(cfg, ctx, rngs=rngs)
        self.init_output(cfg, ctx, rngs=rngs)

    def init_gates(self, cfg: DeltaProductConfig, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.gated = cfg.gate == "head"
        if self.gated:
            self.init_decay(cfg, ctx, per_channel=False, rngs=rngs)

    def gates(self, x):
        """The family's decay, log g = -exp(A_log) * softplus(x W_a + dt_bias): [B, T, H] float32 (< 0), or None."""
        return self.decay(x) if self.gated else None

    def project(self, x, conv_state=None, segment_ids=None):
        """q [B,T,H,Dk] unit, k [B,T,H,n_h,Dk] unit, v [B,T,H,n_h,Dv], beta [B,T,H,n_h], log_g; the conv window."""
        b, t, d = x.shape
        mixed, conv_state = self.conv(self.qkv_proj(x), conv_state, segment_ids=segment_ids, activation=jax.nn.silu)
        q, k, v = jnp.split(mixed, [d, (1 + self.steps) * d], axis=-1)
        per_step = (b, t, self.n_heads, self.steps, self.key_dim)
        q = l2_normalize(q.reshape(b, t, self.n_heads, self.key_dim), added=self.qk_norm_eps).astype(v.dtype)
        k = l2_normalize(k.reshape(per_step), added=self.qk_norm_eps).astype(v.dtype)
        beta = self.beta_range * jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32))
        heads = (q, k, v.reshape(per_step), beta.reshape(b, t, self.n_heads, self.steps), self.gates(x))
        return heads, conv_state

    def mix(self, q, k, v, beta, log_g, state=None, method=None, segment_ids=None):
        return delta_product(q, k, v, beta, log_g, initial_state=state, method=method or self.method,
                             chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, beta, log_g, segment_ids=None):
        return delta_product_weights(q, k, beta, log_g, segment_ids=segment_ids).sum(axis=-1)
