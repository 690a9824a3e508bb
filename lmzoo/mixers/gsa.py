"""Gated slot attention (Zhang et al., 2024): a memory of ``attn.num_slots`` slots per head, each with a forget gate
that also sets how much it writes, read by a softmax over the slots.

    q, k, v = swish(x W_q), swish(x W_k), swish(x W_v);   log a = logsigmoid(x W_f) / tau;   s = 1 - a   per head
    K_t = K_{t-1} diag(a_t) + k_t^T s_t;   p_t = softmax(q_t K_t)
    V_t = diag(a_t) V_{t-1} + s_t^T v_t;   o_t = p_t V_t
    y = W_o headnorm(o)

so a slot that forgets much (a near 0) also writes much, HGRN2's tie, applied to both the slots' keys and values
(ABC's bounded memory with GLA's gates). The recurrence is ``lmzoo.ops.gsa``, whose second pass is GLA's op;
``attn.method`` picks the form of both passes. ``attn.gate_normalizer`` (tau, 8 as the paper's) keeps the gates
near 1 at the start, so slots remember long; the query is not scaled (scale 1, as the peer's layer); GSA takes
no position encoding: its gates carry order. Decoding carries both states, ``(K, V)``; ``attention_matrix`` is the
op's effective weights on v (``lmzoo.ops.gsa_weights``). Not included: the optional short convolutions and output
gate of the peer's layer (both off by default there).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import LinearFamilyConfig, LinearFamilyMixer, chunked_mixing_flops
from lmzoo.ops.gsa import METHODS, STEP_FORM, gsa, gsa_weights
from lmzoo.registry import register
from lmzoo.schema import ModelConfig, positive
from lmzoo.sharding import partitioned

SCALE = 1.0  # on q in the first pass: the softmax over the slots reads q K unscaled, as the peer's layer


@register("gsa")
@dataclass
class GSAConfig(LinearFamilyConfig):
    forms = METHODS

    method: str = "chunk"  # naive | chunk | parallel (see lmzoo.ops.gsa)
    num_slots: int = 64  # memory slots per head
    gate_normalizer: float = 8.0  # tau: log a = logsigmoid(.) / tau

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        positive("attn.num_slots", self.num_slots)
        positive("attn.gate_normalizer", self.gate_normalizer)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Two chunked passes: keys against slots, then slots against values."""
        heads, d_key, d_value = self.head_widths(model)
        return (chunked_mixing_flops(heads, d_key, self.num_slots, self.chunk_size, seq_len)
                + chunked_mixing_flops(heads, self.num_slots, d_value, self.chunk_size, seq_len))

    def build(self, ctx, *, rngs):
        return GSA(self, ctx, rngs=rngs)


def slot_gates(logits, normalizer: float):
    """(how much each slot writes, s = 1 - a; its log forget gate, log a) float32 from the gate logits; s =
    -expm1(log a) exactly, without the cancellation of 1 - a where a is near 1 (as it is at tau = 8)."""
    log_a = jax.nn.log_sigmoid(logits.astype(jnp.float32)) / normalizer
    return -jnp.expm1(log_a), log_a


class GSA(LinearFamilyMixer):
    step_form = STEP_FORM  # of lmzoo.ops.gsa

    def __init__(self, cfg: GSAConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads = ctx.n_heads
        self.key_dim = self.value_dim = d // ctx.n_heads
        self.n_slots, self.gate_normalizer = cfg.num_slots, cfg.gate_normalizer
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.q_proj = dense(ctx, d, d, rngs=rngs)
        self.k_proj = dense(ctx, d, d, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.f_proj = dense(ctx, d, self.n_heads * self.n_slots, rngs=rngs)
        ones = partitioned(nnx.initializers.ones, None)
        self.norm = nnx.RMSNorm(self.value_dim, epsilon=1e-5, dtype=jnp.float32, scale_init=ones, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def heads(self, x, positions=None, segment_ids=None):  # the gates carry order: positions are unused
        """q, k [B,T,H,Dk], v [B,T,H,Dv] (swish), the slots' writes s and log forget gates [B,T,H,M] float32."""
        b, t, _ = x.shape
        q, k, v = (jax.nn.silu(p(x)).reshape(b, t, self.n_heads, -1) for p in (self.q_proj, self.k_proj, self.v_proj))
        s, log_a = slot_gates(self.f_proj(x).reshape(b, t, self.n_heads, self.n_slots), self.gate_normalizer)
        return q, k, v, s, log_a

    def mix(self, q, k, v, s, log_a, state=None, method=None, segment_ids=None):
        return gsa(q, k, v, s, log_a, scale=SCALE, initial_state=state, method=method or self.method,
                   chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, s, log_a, segment_ids=None):
        return gsa_weights(q, k, s, log_a, scale=SCALE, chunk_size=self.chunk_size, segment_ids=segment_ids)

    def output(self, x, o):
        return self.o_proj(self.norm(o.astype(jnp.float32)).reshape(*o.shape[:-2], -1).astype(x.dtype))

    def recurrent_state(self, batch_size: int):
        """(K [B, H, Dk, M], V [B, H, M, Dv]) float32."""
        zeros = jnp.zeros((batch_size, self.n_heads, self.key_dim, self.n_slots), jnp.float32)
        return zeros, jnp.zeros((batch_size, self.n_heads, self.n_slots, self.value_dim), jnp.float32)
