"""Log-linear attention against fla's naive reference (``fla/ops/log_linear_attn/naive.py``).

The layouts are lmzoo's and fla's alike: q, k [B, T, G, K] over v [B, T, H, V], g [B, T, H],
level_scales [B, T, H, L]. fla's naive form builds the [T, T] matrix level by level from the block
masks, with no documents and no initial state; its scale defaults to 1, so it is passed explicitly.
Odd lengths leave a partial last chunk; grouped heads (G = 2 over H = 4); every lmzoo form.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from _common import fla_naive, max_diff, to_torch

from lmzoo.ops.log_linear import log_linear_attention

jax.config.update("jax_enable_x64", False)


def log_linear() -> float:
    naive = fla_naive("log_linear_attn").naive_log_linear_attn
    worst = 0.0
    cases = ((37, "chunk", 16), (64, "chunk", 64), (100, "chunk", 7), (45, "scan", 64), (29, "naive", 64))
    for t, method, chunk in cases:
        rng = np.random.default_rng(t)
        levels = math.ceil(math.log2(t)) + 1
        q, k = rng.standard_normal((2, 2, t, 2, 16))
        v = rng.standard_normal((2, t, 4, 8))
        g = -rng.uniform(0.01, 0.5, (2, t, 4))
        lam = rng.uniform(0.1, 2.0, (2, t, 4, levels))
        scale = 16 ** -0.5
        o_ref = naive(*(to_torch(x) for x in (q, k, v, g, lam)), scale=scale)
        o, _ = log_linear_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, lam)), scale=scale,
                                    method=method, chunk_size=chunk)
        worst = max(worst, max_diff(o, o_ref, atol=1e-4, what=f"o T={t} {method} chunk={chunk}"))
    return worst


CHECKS = {"log_linear_attention": log_linear}
