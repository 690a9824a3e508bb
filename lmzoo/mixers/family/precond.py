"""The preconditioned delta rule's mixers (preconditioned Gated DeltaNet and KDA, arXiv 2604.21100): the
delta-rule family's mixer whose write key is scaled per channel by a preconditioner of the keys' running
second moment.

    q, k, v, beta, log g      as the delta-rule family (``lmzoo.mixers.family.delta``)
    beta_atk = sigmoid(x W_b);   log g_atk = log sigmoid(x W_d + b_d)            per key head
    A_t = g_atk_t A_{t-1} + beta_atk_t k_t^2;   w_t = k_t * squash(log(A_t + eps) - attn.center)
    S_t = diag(g_t) S_{t-1} + beta_t w_t (v_t - (diag(g_t) S_{t-1})^T k_t)^T;   o_t = S_t^T q_t / sqrt(Dk)

A channel the recent keys have filled (large A) is written more softly, by down to 1/``attn.squash``, a
rarely used one more strongly, by up to ``attn.squash``. The second moment's decay starts at
sigmoid(b_d) = 0.99 (a window of about a hundred tokens) and its step size at a half. The recurrence is
``lmzoo.ops.precond_delta_rule``; a variant supplies its decay (per head or per key channel) and its output,
as the family's variants do, and may group value heads (``attn.value_heads``: HV value heads, each with its
own beta, decay and state S, share a key head's q, k and second moment A). Decoding carries ``(S, A)`` and the
convs' window; ``attention_matrix`` is the op's effective weights on the values
(``lmzoo.ops.precond_delta_rule_weights``). ``attn.method=auto`` (the default) runs jax-linear-attention's
``rwkv7`` kernel for S on a Hopper GPU where it takes the call, and the ``chunk`` form otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer, check_value_heads
from lmzoo.ops.precond_delta import METHODS, STEP_FORM, precond_delta_rule, precond_delta_rule_weights
from lmzoo.schema import ConfigError, ModelConfig
from lmzoo.sharding import param

SECOND_MOMENT_DECAY = 0.99  # the second moment's initial decay per step


@dataclass
class PrecondConfig(DecayConfig):
    """The knobs of the preconditioner, beside the delta-rule family's."""

    forms = METHODS

    method: str = "auto"  # auto | jla | naive | chunk | parallel (see lmzoo.ops.precond_delta)
    value_heads: Optional[int] = None  # HV value heads over model.n_heads query/key heads (a multiple); None: n_heads
    squash: float = 1.5  # the preconditioner lies in [1 / squash, squash]
    center: float = -0.2  # the log second moment at which the preconditioner is 1

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        check_value_heads(self.value_heads, model)
        if not self.squash > 1.0:
            raise ConfigError(f"attn.squash={self.squash} must exceed 1 (the preconditioner lies in "
                              "[1 / squash, squash])")


class PrecondDeltaMixer(DeltaRuleMixer):
    """The family's mixer with the preconditioner; a variant overrides ``init_gates``/``gates`` (and the output)."""

    step_form = STEP_FORM  # of lmzoo.ops.precond_delta

    def __init__(self, cfg: PrecondConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        super().__init__(cfg, ctx, rngs=rngs)
        self.squash, self.center = cfg.squash, cfg.center
        self.atk_proj = dense(ctx, ctx.d_model, 2 * self.n_heads, rngs=rngs)  # [beta_atk | g_atk] logits per key head
        bias = jnp.concatenate([jnp.zeros((self.n_heads,)),
                                jnp.full((self.n_heads,), math.log(SECOND_MOMENT_DECAY / (1 - SECOND_MOMENT_DECAY)))])
        self.atk_bias = param(bias.astype(jnp.float32), None)

    def grouped_value_heads(self, cfg: PrecondConfig, ctx: MixerContext) -> int:
        return cfg.value_heads or ctx.n_heads

    def project(self, x, conv_state=None, segment_ids=None):
        """The family's (q, k, v, beta, log_g) and the second moment's (beta_atk, log_g_atk) [B, T, H] float32."""
        heads, conv_state = super().project(x, conv_state, segment_ids)
        logits = self.atk_proj(x).astype(jnp.float32) + self.atk_bias[...]
        beta_atk, decay_logits = jnp.split(logits, 2, axis=-1)
        return (*heads, jax.nn.sigmoid(beta_atk), jax.nn.log_sigmoid(decay_logits)), conv_state

    def mix(self, q, k, v, beta, log_g, beta_atk, log_g_atk, state=None, method=None, segment_ids=None):
        return precond_delta_rule(q, k, v, beta, log_g, beta_atk, log_g_atk, squash=self.squash, center=self.center,
                                  initial_state=state, method=method or self.method, chunk_size=self.chunk_size,
                                  segment_ids=segment_ids)

    def mix_weights(self, q, k, v, beta, log_g, beta_atk, log_g_atk, segment_ids=None):
        return precond_delta_rule_weights(q, k, beta, log_g, beta_atk, log_g_atk, squash=self.squash,
                                          center=self.center, segment_ids=segment_ids)

    def recurrent_state(self, batch_size: int):
        """(S [B, HV, Dk, Dv], A [B, H, Dk]) float32."""
        return super().recurrent_state(batch_size), jnp.zeros((batch_size, self.n_heads, self.key_dim), jnp.float32)

    def state_size(self, max_len):
        return super().state_size(max_len) + self.n_heads * self.key_dim
