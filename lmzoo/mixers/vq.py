"""Transformer-VQ: softmax attention whose keys are vector-quantised, which makes it linear-time.

Keys are RMS-normalised per head (so they live on the codebook's scale) and replaced by their
nearest codeword; the forward uses the codeword, gradients pass straight through to the key
(straight-through estimator). A commitment loss ``commitment * mean |k - sg(codeword)|^2`` keeps
keys near their codewords; it is sown as ``AuxLoss("commitment")``, which the trainer adds to the
objective and logs. The codebook is not a parameter: it is the ratio of two running statistics
(``CodebookEMA``: per-codeword counts and key sums) updated by exponential moving average in every
training forward -- and only there, so evaluation, decoding and probes see a fixed codebook.

With quantised keys, all earlier blocks collapse into per-codeword counts and value sums
(``lmzoo.ops.vq``): the parallel forward is linear in the length (``method="blocked"``) and
decoding carries a cache of ``heads * codebook_size * (head_dim + 1)`` floats whatever the length.
Quantised keys cannot carry a rotation, so this layer uses no position method (NoPE): order comes
from the causal mask alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lmzoo.mixers.base import AuxLoss, Mixer, MixerContext, dense
from lmzoo.ops import causal_mask
from lmzoo.ops.common import same_segment
from lmzoo.ops.vq import METHODS, gather_codewords, init_vq_cache, vq_attention, vq_cache_fill, vq_step
from lmzoo.registry import register
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, one_of, positive


class CodebookEMA(nnx.Variable):
    """Running codebook statistics: updated by moving averages in training forwards, not by gradients."""


@register("vq")
@dataclass
class VQConfig(MixerConfig):
    forms = METHODS  # the op's forms attn.method may name; a class attribute, not a config key

    codebook_size: int = 128  # codewords per head (S)
    block_size: int = 64  # queries per block of the linear-time form
    method: str = "blocked"  # blocked (linear time) or naive (the quadratic reference; lmzoo.ops.vq)
    commitment: float = 0.25  # weight of the commitment loss
    ema_decay: float = 0.99  # codebook statistics' moving-average decay

    def check(self, model: ModelConfig) -> None:
        one_of("attn.method", self.method, self.forms)
        positive("attn.codebook_size", self.codebook_size)
        positive("attn.block_size", self.block_size)
        positive("attn.commitment", self.commitment, allow_zero=True)
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"attn.ema_decay={self.ema_decay} must lie in [0, 1)")

    def build(self, ctx, *, rngs):
        return VQAttention(self, ctx, rngs=rngs)


def rms_normalise(x: jax.Array) -> jax.Array:
    """Parameter-free RMS normalisation of the last axis (in float32): entries of unit scale."""
    x32 = x.astype(jnp.float32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


class VQAttention(Mixer):
    def __init__(self, cfg: VQConfig, ctx: MixerContext, *, rngs):
        self.n_heads, self.head_dim = ctx.n_heads, ctx.d_model // ctx.n_heads
        self.n_codes, self.block_size, self.method = cfg.codebook_size, cfg.block_size, cfg.method
        self.commitment_weight, self.decay = cfg.commitment, cfg.ema_decay
        d, h, hd = ctx.d_model, self.n_heads, self.head_dim
        self.q_proj = dense(ctx, d, h * hd, rngs=rngs)
        self.k_proj = dense(ctx, d, h * hd, rngs=rngs)
        self.v_proj = dense(ctx, d, h * hd, rngs=rngs)
        self.o_proj = dense(ctx, h * hd, d, rngs=rngs, residual=True)
        codewords = jax.random.normal(rngs.params(), (h, self.n_codes, hd))  # unit-scale, like normalised keys
        self.code_counts = CodebookEMA(jnp.ones((h, self.n_codes)))
        self.code_sums = CodebookEMA(codewords)

    def codebook(self) -> jax.Array:
        """[H, S, D] float32: running key sum / running count of each codeword."""
        return self.code_sums[...] / jnp.maximum(self.code_counts[...], 1e-12)[..., None]

    def quantise(self, k: jax.Array, codebook: jax.Array) -> jax.Array:
        """Index [B,T,H] of the codeword nearest to each key [B,T,H,D]."""
        k32 = k.astype(jnp.float32)
        distance = jnp.sum(codebook**2, -1) - 2 * jnp.einsum("bthd,hsd->bths", k32, codebook)  # |k|^2 is shared
        return jnp.argmin(distance, axis=-1)

    def project(self, x):
        """Queries, normalised keys and values, all [B,T,H,D]."""
        b, t, _ = x.shape
        shape = (b, t, self.n_heads, self.head_dim)
        q = self.q_proj(x).reshape(shape)
        return q, rms_normalise(self.k_proj(x).reshape(shape)), self.v_proj(x).reshape(shape)

    def __call__(self, x, *, positions=None, segment_ids=None):  # positions unused: quantised keys carry no rotation
        return self.forward(x, segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        y, codes, v = self.forward(x)
        return y, vq_cache_fill(codes, v, self.n_codes)

    def forward(self, x, segment_ids=None):
        """y [B,T,d_model], each key's codeword index [B,T,H] and the values [B,T,H,D]."""
        b, t, _ = x.shape
        q, k, v = self.project(x)
        codebook = self.codebook()
        codes = self.quantise(k, codebook)
        codewords = gather_codewords(codebook, codes).astype(k.dtype)
        k_hat = k + lax.stop_gradient(codewords - k)  # straight-through: value of the codeword, gradient of k
        if self.training:
            error = jnp.mean(jnp.square(k.astype(jnp.float32) - lax.stop_gradient(codewords.astype(jnp.float32))))
            self.sow(AuxLoss, "commitment", self.commitment_weight * error)
            self.update_codebook(lax.stop_gradient(k), codes)
        y = vq_attention(q, k_hat, codes, codebook.astype(q.dtype), v, block_size=self.block_size, method=self.method,
                         segment_ids=segment_ids)
        return self.o_proj(y.reshape(b, t, -1)), codes, v

    def update_codebook(self, k: jax.Array, codes: jax.Array) -> None:
        """One moving-average step of the per-codeword counts and key sums towards this batch's."""
        onehot = jax.nn.one_hot(codes, self.n_codes, dtype=jnp.float32)  # (B, T, H, S)
        counts = onehot.sum((0, 1))  # (H, S)
        sums = jnp.einsum("bths,bthd->hsd", onehot, k.astype(jnp.float32))
        # rebound rather than written in place: the trainer's forward runs inside jax.grad, a deeper
        # trace than the one that made these variables, and NNX refuses in-place writes across traces
        self.code_counts = CodebookEMA(self.decay * self.code_counts[...] + (1 - self.decay) * counts)
        self.code_sums = CodebookEMA(self.decay * self.code_sums[...] + (1 - self.decay) * sums)

    def init_state(self, batch_size, max_len):
        return init_vq_cache(batch_size, self.n_heads, self.n_codes, self.head_dim)  # no growth with max_len

    def step(self, x_t, state):
        q, k, v = self.project(x_t[:, None, :])
        codebook = self.codebook()
        codes = self.quantise(k, codebook)
        y, state = vq_step(state, q[:, 0], codes[:, 0], codebook.astype(q.dtype), v[:, 0])  # (B, H, D)
        return self.o_proj(y.reshape(x_t.shape[0], -1)), state

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        q, k, _ = self.project(x)
        codebook = self.codebook()
        keys = gather_codewords(codebook, self.quantise(k, codebook))
        t = x.shape[1]
        scores = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), keys) * self.head_dim**-0.5
        visible = causal_mask(t, t) if segment_ids is None else causal_mask(t, t) & same_segment(segment_ids)[:, None]
        return jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)

    def state_size(self, max_len):
        return self.n_heads * self.n_codes * (self.head_dim + 1)
