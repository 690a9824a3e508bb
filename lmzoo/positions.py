"""Position methods applied inside mixers: RoPE and its length-extension variants, ALiBi, or none.

A ``Positions`` object is built once per model from the whole ``pos`` config and handed to every
mixer, so mixers never read position settings themselves. What a method contributes:

- a rotation of queries and keys (``rotate``): ``rope``; ``pi`` (position interpolation: positions
  divided by ``factor``); ``ntk`` (NTK-aware: the base raised so the lowest frequency stretches by
  ``factor`` while the highest stays); ``yarn`` (NTK-by-parts: each frequency interpolated by how
  many turns it makes over the trained length);
- a multiplier on the attention logits (``logit_scale``): YaRN's temperature, ``(0.1 ln s + 1)^2``;
- an additive bias per head (``bias``): ALiBi's ``-slope_h * (i - j)``;
- a score construction (``scores``) that ReRoPE and leaky ReRoPE need: inside ``window`` the
  usual rotated dot product, beyond it the relative position clipped to ``window`` (ReRoPE) or
  grown ``leak`` times slower (leaky ReRoPE) -- two score matrices mixed per query-key pair, so
  these methods cannot use a fused kernel (``clips_distance``).

Neutral settings reproduce plain RoPE: ``factor=1`` for pi/ntk/yarn, a ReRoPE window at least the
sequence length. ``rotate`` keeps its meaning for every kind (ReRoPE kinds rotate like RoPE; ALiBi
and NoPE leave vectors unchanged), so mixers that only rotate still work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from lmzoo.ops.common import segment_starts
from lmzoo.schema import ConfigError, one_of, positive

ROTARY = ("rope", "pi", "ntk", "yarn", "rerope", "leaky_rerope")
KINDS = ROTARY + ("alibi", "none")


@dataclass
class PosConfig:
    """The ``pos`` config (``configs/pos/<kind>.yaml``); any of it can be overridden when evaluating a checkpoint."""

    kind: str = "rope"  # one of KINDS
    base: float = 10000.0  # RoPE base
    factor: float = 1.0  # pi / ntk / yarn: context extension factor s (1: plain RoPE)
    original_len: Optional[int] = None  # yarn: the trained length its ramp refers to; None: data.seq_len
    window: Optional[int] = None  # rerope / leaky_rerope: relative distances kept exact; None: data.seq_len
    leak: float = 16.0  # leaky_rerope: beyond the window, distances grow this many times slower
    yarn_alpha: float = 1.0  # yarn: frequencies turning fewer times than this over original_len are interpolated
    yarn_beta: float = 32.0  # yarn: ... more times than this are kept

    def check(self) -> None:
        one_of("pos.kind", self.kind, KINDS)
        positive("pos.base", self.base)
        if self.factor < 1:
            raise ConfigError(f"pos.factor={self.factor} must be at least 1 (1: no extension)")
        for key in ("original_len", "window"):
            if getattr(self, key) is not None:
                positive(f"pos.{key}", getattr(self, key))
        if self.leak <= 1:
            raise ConfigError(f"pos.leak={self.leak} must be greater than 1")
        if not 0 <= self.yarn_alpha < self.yarn_beta:
            raise ConfigError(
                f"pos.yarn_alpha={self.yarn_alpha} and pos.yarn_beta={self.yarn_beta} need 0 <= alpha < beta"
            )


class Positions:
    """One model's position method; pure functions of positions, no parameters."""

    def __init__(
        self,
        kind: str = "rope",
        base: float = 10000.0,
        *,
        factor: float = 1.0,
        original_len: Optional[int] = None,
        window: Optional[int] = None,
        leak: float = 16.0,
        yarn_alpha: float = 1.0,
        yarn_beta: float = 32.0,
    ):
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not a position method (choose from: {', '.join(KINDS)})")
        if kind == "yarn" and original_len is None:
            raise ValueError("yarn needs original_len, the length the model was trained at")
        if kind in ("rerope", "leaky_rerope") and window is None:
            raise ValueError(f"{kind} needs window, the largest relative distance kept exact")
        self.kind, self.base, self.factor = kind, float(base), float(factor)
        self.original_len, self.window, self.leak = original_len, window, float(leak)
        self.yarn_alpha, self.yarn_beta = float(yarn_alpha), float(yarn_beta)

    @classmethod
    def from_config(cls, cfg, *, train_len: int) -> "Positions":
        """From a ``PosConfig``; ``train_len`` fills the settings that default to the training length."""
        return cls(
            cfg.kind, cfg.base, factor=cfg.factor, original_len=cfg.original_len or train_len,
            window=cfg.window or train_len, leak=cfg.leak, yarn_alpha=cfg.yarn_alpha, yarn_beta=cfg.yarn_beta,
        )

    @classmethod
    def none(cls) -> "Positions":
        return cls("none")

    def __repr__(self) -> str:
        return f"Positions({self.kind!r}, base={self.base}, factor={self.factor}, window={self.window})"

    # ------------------------------------------------------------------ rotation

    @property
    def rotary(self) -> bool:
        return self.kind in ROTARY

    @property
    def clips_distance(self) -> bool:
        """True for ReRoPE kinds: scores need ``scores`` (two rotations), not rotate-then-dot."""
        return self.kind in ("rerope", "leaky_rerope")

    def frequencies(self, dim: int) -> jax.Array:
        """Angular frequency of each rotated pair, [D/2] float32."""
        exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
        if self.kind == "ntk":  # a larger base stretches low frequencies by ~factor, keeps high ones
            return (self.base * self.factor ** (dim / (dim - 2))) ** -exponents
        theta = self.base**-exponents
        if self.kind == "pi":
            return theta / self.factor
        if self.kind == "yarn":
            return theta / self.factor + self.yarn_ramp(theta) * (theta - theta / self.factor)
        return theta

    def yarn_ramp(self, theta: jax.Array) -> jax.Array:
        """1 for frequencies that turn more than ``beta`` times over the trained length (kept), 0 below
        ``alpha`` turns (interpolated), linear in between."""
        turns = self.original_len * theta / (2 * math.pi)
        return jnp.clip((turns - self.yarn_alpha) / (self.yarn_beta - self.yarn_alpha), 0.0, 1.0)

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """Rotate x [B, T, H, D] by its positions [B, T] (ints or floats); identity for alibi/none."""
        if not self.rotary:
            return x
        angles = positions[..., None].astype(jnp.float32) * self.frequencies(x.shape[-1])  # (B, T, D/2)
        cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
        return rotated.astype(x.dtype)

    # ------------------------------------------------------------------ scores

    @property
    def logit_scale(self) -> float:
        """Multiplier on attention logits: YaRN's temperature sqrt(1/t) = 0.1 ln s + 1, squared."""
        if self.kind == "yarn" and self.factor > 1:
            return (0.1 * math.log(self.factor) + 1.0) ** 2
        return 1.0

    def scores(self, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """Position-aware dot products [B, H, T, S] float32 of q [B,T,H,D] and k [B,S,H,D] (unscaled)."""
        near = _dot(self.rotate(q, q_pos), self.rotate(k, k_pos))
        if not self.clips_distance:
            return near
        # beyond the window, relative position w + (i - j - w) / leak: rotate q by i/leak + w(1 - 1/leak)
        # and k by j/leak (ReRoPE: leak = infinity, so q by w and k not at all)
        slow = 0.0 if self.kind == "rerope" else 1.0 / self.leak
        far_q = self.rotate(q, q_pos * slow + self.window * (1.0 - slow))
        far_k = self.rotate(k, k_pos * slow) if slow else k
        far = _dot(far_q, far_k)
        distance = q_pos[:, None, :, None] - k_pos[:, None, None, :]  # (B, 1, T, S)
        return jnp.where(distance < self.window, near, far)

    def bias(self, q_pos: jax.Array, k_pos: jax.Array, n_heads: int) -> Optional[jax.Array]:
        """Additive logit bias [B, H, T, S] float32 (ALiBi), or None."""
        if self.kind != "alibi":
            return None
        distance = (q_pos[:, None, :, None] - k_pos[:, None, None, :]).astype(jnp.float32)  # (B, 1, T, S)
        return -alibi_slopes(n_heads)[None, :, None, None] * distance


def _dot(q: jax.Array, k: jax.Array) -> jax.Array:
    return jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)


def alibi_slopes(n_heads: int) -> jax.Array:
    """ALiBi's geometric head slopes 2^(-8h/n) for h = 1..n; for n not a power of two, those of the
    next lower power of two followed by every other slope of twice that many heads."""
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * h / closest) for h in range(1, closest + 1)]
    if closest < n_heads:
        slopes += [2 ** (-8 * h / (2 * closest)) for h in range(1, 2 * closest + 1, 2)][: n_heads - closest]
    return jnp.asarray(slopes, jnp.float32)


def default_positions(batch: int, length: int, offset=0) -> jax.Array:
    """[B, T] int32 positions offset, offset + 1, ..."""
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32) + offset, (batch, length))


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """[B, T] int32 positions that restart at 0 where each segment (a run of equal ids) starts."""
    steps = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
    began = jax.lax.cummax(jnp.where(segment_starts(segment_ids), steps, 0), axis=1)  # where the current one began
    return steps - began
