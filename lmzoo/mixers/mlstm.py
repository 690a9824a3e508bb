"""The mLSTM layer of xLSTM (Beck et al., 2024): a matrix memory written through an exponential input gate, read
through a normaliser, on ``lmzoo.ops.mlstm``.

    q, k, v = x W_q, x W_k, x W_v                       per head, no position encoding
    i~ = x w_i + b_i;   log f = logsigmoid(x w_f + b_f)  one input and one forget gate per head and step
    C_t = f_t C_{t-1} + exp(i~_t) k_t v_t^T;   n_t = f_t n_{t-1} + exp(i~_t) k_t
    h_t = C_t^T q_t / max(|n_t . q_t|, 1) / sqrt(Dk)    (computed stabilised: see lmzoo.ops.mlstm)
    y = W_o (sigmoid(x W_g) * headnorm(h))

The exponential input gate lets a token overwrite what the memory holds (a large i~ outweighs the decayed past),
which sigmoid gates cannot; the normaliser n keeps h bounded. The forget gates start near 1 (b_f from 3 to 6 over
the heads, as xLSTM initialises them). Decoding carries (C, n, m), m the stabiliser; ``attention_matrix`` is
the op's effective weights on v, normaliser included, so the matrix times v is the mixing.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import LinearFamilyConfig, LinearFamilyMixer, gated_head_norm
from lmzoo.ops.mlstm import METHODS, STEP_FORM, mlstm, mlstm_weights, zero_state
from lmzoo.registry import register
from lmzoo.sharding import EMBED, param, partitioned


@register("mlstm")
@dataclass
class MLSTMConfig(LinearFamilyConfig):
    forms = METHODS

    method: str = "auto"  # auto | jla | naive | parallel | assoc (see lmzoo.ops.mlstm)

    def build(self, ctx, *, rngs):
        return MLSTM(self, ctx, rngs=rngs)


class MLSTM(LinearFamilyMixer):
    step_form = STEP_FORM  # of lmzoo.ops.mlstm

    def __init__(self, cfg: MLSTMConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads = ctx.n_heads
        self.key_dim = self.value_dim = d // ctx.n_heads
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.q_proj, self.k_proj, self.v_proj = (dense(ctx, d, d, rngs=rngs) for _ in range(3))
        self.i_proj = dense(ctx, d, self.n_heads, rngs=rngs, bias=True, axes=(EMBED, None))
        self.f_proj = dense(ctx, d, self.n_heads, rngs=rngs, axes=(EMBED, None))
        self.f_bias = param(jnp.linspace(3.0, 6.0, self.n_heads), None)  # forget gates from sigmoid(3) to sigmoid(6)
        self.gate = dense(ctx, d, d, rngs=rngs)
        self.norm = nnx.RMSNorm(self.value_dim, epsilon=1e-5, dtype=jnp.float32,
                                scale_init=partitioned(nnx.initializers.ones, None), rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def heads(self, x, positions=None, segment_ids=None):  # the gates carry order: positions are unused
        """q, k, v [B,T,H,D] and the float32 gates: the input gate's log i~ and the forget gate's log f [B,T,H]."""
        b, t, _ = x.shape
        split = (b, t, self.n_heads, self.key_dim)
        q, k, v = (proj(x).reshape(split) for proj in (self.q_proj, self.k_proj, self.v_proj))
        log_i = self.i_proj(x).astype(jnp.float32)
        log_f = jax.nn.log_sigmoid(self.f_proj(x).astype(jnp.float32) + self.f_bias[...])
        return q, k, v, log_i, log_f

    def recurrent_state(self, batch_size: int):
        """(C [B,H,Dk,Dv], n [B,H,Dk], m [B,H]) float32."""
        return zero_state(batch_size, self.n_heads, self.key_dim, self.value_dim)

    def mix(self, q, k, v, log_i, log_f, state=None, method=None, segment_ids=None):
        return mlstm(q, k, v, log_i, log_f, initial_state=state, method=method or self.method, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, log_i, log_f, segment_ids=None):
        return mlstm_weights(q, k, log_i, log_f, segment_ids=segment_ids)

    def output(self, x, o):
        return self.o_proj(gated_head_norm(self.norm, o, self.gate(x), jax.nn.sigmoid, x.dtype))
