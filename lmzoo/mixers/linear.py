"""Linear attention (Katharopoulos et al., 2020): softmax's exp(q . k) replaced by phi(q) . phi(k).

    o_t = sum_{s<=t} (phi(q_t) . phi(k_s)) v_s [ / sum_{s<=t} phi(q_t) . phi(k_s) ]   (normalize)
    y = W_o o

Feature maps (``attn.feature_map``), applied per head in float32:
- ``elu+1``: elu(x) + 1 > 0, the paper's choice;
- ``relu``: max(x, 0) (a query with no positive entry attends to nothing);
- ``identity``: no map; unnormalised only, since its denominator can be zero or negative;
- ``favor+``: Performer's positive random features (Choromanski et al., 2021),
  ``phi(x) = exp(w_i . x' - |x'|^2 / 2) / sqrt(m)`` with ``x' = x / D^(1/4)`` and m orthogonal
  Gaussian rows w_i, so that phi(q) . phi(k) estimates exp(q . k / sqrt(D)). The exponent is at
  most |w_i|^2 / 2 whatever x is, so no stabilising shift (which would break causality for keys)
  is needed. The projection is drawn once at initialisation from the ``params`` stream, kept in a
  ``RandomFeatures`` variable (saved in checkpoints, never optimised) and not redrawn.

No position encoding is applied (rotating q and k before a feature map does not give relative
positions); order comes from the causal sum. ``attn.method`` picks the form of
``lmzoo.ops.linear_attention``; decoding carries the state (S, z) of size m x D (+ m) per head.
The layer is a ``LinearFamilyMixer`` (``lmzoo.mixers.family.linear``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import MixerContext, dense
from lmzoo.mixers.family.linear import LinearFamilyConfig, LinearFamilyMixer
from lmzoo.ops.linear import METHODS, linear_attention, linear_attention_weights
from lmzoo.registry import register
from lmzoo.schema import ConfigError, ModelConfig, one_of, positive

FEATURE_MAPS = ("elu+1", "relu", "identity", "favor+")


@register("linear")
@dataclass
class LinearConfig(LinearFamilyConfig):
    forms = METHODS  # of lmzoo.ops.linear_attention

    feature_map: str = "elu+1"  # elu+1 | relu | identity | favor+
    normalize: bool = True  # divide by phi(q_t) . sum_{s<=t} phi(k_s) (the paper's form)
    n_features: Optional[int] = None  # favor+: random features per head; None: the head dim

    def check(self, model: ModelConfig) -> None:
        one_of("attn.feature_map", self.feature_map, FEATURE_MAPS)
        super().check(model)
        if self.n_features is not None:
            positive("attn.n_features", self.n_features)
            if self.feature_map != "favor+":
                raise ConfigError(f"attn.n_features is only used by attn.feature_map=favor+ (got {self.feature_map})")
        if self.normalize and self.feature_map == "identity":
            raise ConfigError(
                "attn.normalize=true needs a non-negative feature map: attn.feature_map=identity can make "
                "the denominator zero or negative (use elu+1, relu or favor+, or attn.normalize=false)"
            )

    def build(self, ctx, *, rngs):
        return LinearAttention(self, ctx, rngs=rngs)


class RandomFeatures(nnx.Variable):
    """A fixed random projection: part of the model's state (checkpointed) but not an nnx.Param."""


def orthogonal_gaussian(key: jax.Array, rows: int, dim: int) -> jax.Array:
    """[rows, dim]: blocks of ``dim`` orthogonal directions, each row scaled to a Gaussian vector's norm.

    Each row is then distributed like a standard Gaussian vector (so the features are unbiased),
    while rows within a block are orthogonal (which lowers the estimator's variance). The
    directions are uniformly random: QR of Gaussians with signs fixed by R's diagonal (without that
    fix the QR convention biases them, and the features with them).
    """
    direction_key, norm_key = jax.random.split(key)
    q, r = jnp.linalg.qr(jax.random.normal(direction_key, (-(-rows // dim), dim, dim)))  # (blocks, D, D)
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    directions = jnp.swapaxes(q, 1, 2).reshape(-1, dim)[:rows]  # the columns of each block, as rows
    return directions * jnp.linalg.norm(jax.random.normal(norm_key, (rows, dim)), axis=-1, keepdims=True)


class LinearAttention(LinearFamilyMixer):
    def __init__(self, cfg: LinearConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads, self.head_dim = ctx.n_heads, d // ctx.n_heads
        self.feature_map, self.normalize = cfg.feature_map, cfg.normalize
        self.method, self.chunk_size = cfg.method, cfg.chunk_size
        self.q_proj = dense(ctx, d, d, rngs=rngs)
        self.k_proj = dense(ctx, d, d, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)
        self.key_dim, self.value_dim = self.head_dim, self.head_dim  # features per head, value dims per head
        if cfg.feature_map == "favor+":
            self.key_dim = cfg.n_features or self.head_dim
            self.projection = RandomFeatures(orthogonal_gaussian(rngs.params(), self.key_dim, self.head_dim))
        # favor+ features already hold the softmax temperature; other maps use the op's default
        self.scale = 1.0 if cfg.feature_map == "favor+" else self.key_dim**-0.5

    def features(self, x: jax.Array) -> jax.Array:
        """phi(x) [..., head_dim] -> [..., key_dim], float32."""
        x = x.astype(jnp.float32)
        if self.feature_map == "elu+1":
            return jax.nn.elu(x) + 1.0
        if self.feature_map == "relu":
            return jax.nn.relu(x)
        if self.feature_map == "identity":
            return x
        x = x * self.head_dim**-0.25
        logits = x @ self.projection[...].T - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)  # (..., m)
        return jnp.exp(logits) * self.key_dim**-0.5

    def heads(self, x, positions=None, segment_ids=None):  # no position encoding: see the module docstring
        """phi(q), phi(k) [B,T,H,key_dim] float32 and v [B,T,H,head_dim]."""
        b, t, _ = x.shape
        split = (b, t, self.n_heads, self.head_dim)
        q, k = self.features(self.q_proj(x).reshape(split)), self.features(self.k_proj(x).reshape(split))
        return q, k, self.v_proj(x).reshape(split)

    def scored_vectors(self, x, *, positions=None):
        """Feature-mapped queries and keys [B,T,H,key_dim] whose dot products times ``scale`` are the
        layer's unnormalised weights, and ``scale``."""
        q, k, _ = self.heads(x)
        return q, k, self.scale

    def mix(self, q, k, v, state=None, method=None, segment_ids=None):
        return linear_attention(
            q, k, v, scale=self.scale, normalize=self.normalize, initial_state=state,
            method=method or self.method, chunk_size=self.chunk_size, segment_ids=segment_ids,
        )

    def mix_weights(self, q, k, v, segment_ids=None):
        return linear_attention_weights(q, k, scale=self.scale, normalize=self.normalize, segment_ids=segment_ids)

    def output(self, x, o):
        return self.o_proj(o.reshape(*o.shape[:-2], -1))

    def recurrent_state(self, batch_size):
        s = super().recurrent_state(batch_size)
        return (s, jnp.zeros(s.shape[:-1], jnp.float32)) if self.normalize else s  # with the key sum z [B,H,m]
