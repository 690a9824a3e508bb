"""The inner model of test-time training (TTT-Linear, Titans' neural memory): what both ops share.

A layer that learns at test time keeps a linear model ``f(x) = x + LN(x W + b)`` per head as its state and,
for each token, takes gradient steps on the reconstruction loss of the token's value from its key,

    loss(W, b; k, v) = 1/2 |LN(k W + b) * w + c - (v - k)|^2        LN without parameters; w, c [D] learnt

(Sun et al., 2024, "Learning to (Learn at Test Time): RNNs with Expressive Hidden States"). Its gradient
with respect to the inner model's prediction ``h = k W + b`` is, by the chain rule through the layer norm,

    g = w * (w * h^ + c - (v - k)),   h^ = (h - mean h) / s,   s = sqrt(var h + eps)
    dloss/dh = (g - mean(g) - h^ * mean(g * h^)) / s                                 (``reconstruction_gradient``)

and so ``dloss/dW = k^T dloss/dh``, ``dloss/db = dloss/dh``: each token's update is an outer product of its key
with this vector, the ops' "update" u. The layer reads its state out at the query ``z = q W + b`` through
the same norm with a residual, ``z + LN(z) * w + c`` (``normed_readout``). Everything here runs in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def layer_norm(x, eps: float) -> tuple[jax.Array, jax.Array]:
    """(x^, s) over the last axis: x^ = (x - mean x) / s, s = sqrt(var x + eps) [..., 1]."""
    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    spread = jnp.sqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    return centred / spread, spread


def reconstruction_gradient(h, target, weight, bias, eps: float) -> jax.Array:
    """d/dh of ``1/2 |LN(h) * weight + bias - target|^2``: h, target [..., D], weight and bias broadcasting
    against them; the layer norm's backward written out (one reduction per term)."""
    normed, spread = layer_norm(h, eps)
    g = weight * (weight * normed + bias - target)
    along = jnp.mean(g * normed, axis=-1, keepdims=True)
    return (g - jnp.mean(g, axis=-1, keepdims=True) - normed * along) / spread


def normed_readout(z, weight, bias, eps: float) -> jax.Array:
    """``z + LN(z) * weight + bias``: the inner model's prediction read out through its norm, with a residual."""
    return z + layer_norm(z, eps)[0] * weight + bias
