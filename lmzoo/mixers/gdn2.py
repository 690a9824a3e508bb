"""GDN-2: the delta rule with separate erase and write gates per channel (``lmzoo.ops.gdn2``).

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|
    log g_t = -exp(A_log) * softplus(x_t W_1 W_2 + dt_bias)        per key channel   [B, T, H, Dk]
    erase_t = sigmoid(x_t W_e)   [B, T, H, Dk];    write_t = sigmoid(x_t W_w)   [B, T, H, Dv]
    S'_t = diag(exp(g_t)) S_{t-1};   S_t = S'_t + k_t (write_t * v_t - S'_t^T (erase_t * k_t))^T
    o_t = S_t^T q_t / sqrt(Dk);   y = W_o (swish(x W_g) * headnorm(o))

Where KDA forgets and writes along k_t by one step size beta_t, GDN-2 erases each key channel by
its own amount and writes each value channel by its own amount; erase = write = beta is KDA. The
op runs as the DPLR rule (``lmzoo.ops.dplr``, alpha = exp(g) * erase * k, beta = -k). The convs,
unit q and k, the decay, the output and decoding are the delta-rule family's
(``lmzoo.mixers.family.delta``). ``attention_matrix`` is the op's weights on the written values
``write * v`` (a per-channel write leaves no single matrix on v).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.delta import DecayConfig, DeltaRuleMixer
from lmzoo.ops.dplr import METHODS, STEP_FORM, gdn2, gdn2_weights
from lmzoo.registry import register


@register("gdn2")
@dataclass
class GDN2Config(DecayConfig):
    forms = METHODS

    method: str = "auto"  # auto | jla | naive | parallel | chunk (see lmzoo.ops.dplr)

    def build(self, ctx, *, rngs):
        return GDN2(self, ctx, rngs=rngs)


class GDN2(DeltaRuleMixer):
    matrix_acts_on_values = False  # the weights act on write * v: a per-channel write gate leaves no single matrix on v
    step_form = STEP_FORM  # of lmzoo.ops.dplr
    def init_step_sizes(self, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """The erase gate per key channel and the write gate per value channel, in place of beta."""
        d = ctx.d_model
        self.erase_proj = dense(ctx, d, self.n_heads * self.key_dim, rngs=rngs)
        self.write_proj = dense(ctx, d, self.n_heads * self.value_dim, rngs=rngs)

    def init_gates(self, cfg: GDN2Config, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        self.init_decay(cfg, ctx, per_channel=True, rngs=rngs)

    def gates(self, x):
        return self.decay(x)

    def project(self, x, conv_state=None, segment_ids=None):
        """(q, k [B,T,H,Dk] unit, v [B,T,H,Dv], log_g, erase [B,T,H,Dk], write [B,T,H,Dv]) and the conv window."""
        (q, k, v), conv_state = self.queries_keys_values(x, conv_state, segment_ids)
        erase, write = (jax.nn.sigmoid(proj(x).astype(jnp.float32)).reshape(a.shape)
                        for proj, a in ((self.erase_proj, k), (self.write_proj, v)))
        return (q, k, v, self.gates(x), erase, write), conv_state

    def mix(self, q, k, v, log_g, erase, write, state=None, method=None, segment_ids=None):
        return gdn2(q, k, v, log_g, erase, write, initial_state=state, method=method or self.method,
                    chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, log_g, erase, write, segment_ids=None):
        return gdn2_weights(q, k, log_g, erase, segment_ids=segment_ids)
