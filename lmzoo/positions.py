"""Position encodings applied inside mixers: rotary embeddings (RoPE) or none.

A ``Positions`` object is built once per model from the ``pos`` config and handed to every
mixer, so mixers never read position settings themselves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


class Positions:
    """Rotary position embedding over the full head dimension (half-split rotation)."""

    def __init__(self, kind: str = "rope", base: float = 10000.0):
        self.kind = kind
        self.base = base

    def frequencies(self, dim: int) -> jax.Array:
        return self.base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)  # [D/2]

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """Rotate x [B, T, H, D] by its positions [B, T]; identity when kind == 'none'."""
        if self.kind == "none":
            return x
        angles = positions[..., None].astype(jnp.float32) * self.frequencies(x.shape[-1])  # [B,T,D/2]
        cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
        return rotated.astype(x.dtype)


def default_positions(batch: int, length: int, offset=0) -> jax.Array:
    """[B, T] int32 positions offset, offset + 1, ..."""
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32) + offset, (batch, length))
