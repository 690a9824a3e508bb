"""Stick-breaking and PaTH attention against fla's naive references (``fla/ops/{stickbreaking_attn,path_attn}``).

Both layouts are lmzoo's and fla's alike ([B, T, H, D]); grouped heads (HQ = 4 over H = 2), odd lengths
that leave a partial last chunk. fla's naive PaTH takes a per-query-head log gate and scales it with
the logits, as lmzoo's contract does; fla's stick-breaking returns rem as ``prod (1 - sigmoid)``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from _common import fla_naive, max_diff, to_torch

from lmzoo.ops.path import path_attention
from lmzoo.ops.stick_breaking import stick_breaking_attention


def _inputs(seed, b, t, hq, h, d):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, hq, d))
    k, v = rng.standard_normal((b, t, h, d)), rng.standard_normal((b, t, h, d))
    return rng, q, k, v


def stick_breaking() -> float:
    naive = fla_naive("stickbreaking_attn").naive_stickbreaking_attn
    worst = 0.0
    for t, attend_current, method in ((37, False, "blocked"), (70, True, "blocked"), (19, False, "naive")):
        _, q, k, v = _inputs(t, 2, t, 4, 2, 16)
        q *= 2.0  # logits of a few units: sigmoids far from 1/2
        o_ref, rem_ref = naive(*(to_torch(x) for x in (q, k, v)), attend_current=attend_current)
        o, rem = stick_breaking_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)),
                                          attend_current=attend_current, method=method)
        what = f"T={t} attend_current={attend_current} {method}"
        worst = max(worst, max_diff(o, o_ref, atol=1e-4, what=f"o {what}"),
                    max_diff(rem, rem_ref, atol=1e-5, what=f"rem {what}"))
    return worst


def path() -> float:
    naive = fla_naive("path_attn").naive_path_attn
    worst = 0.0
    for t, gated, method, chunk in ((37, True, "chunk", 16), (45, False, "chunk", 64), (19, True, "naive", 64)):
        rng, q, k, v = _inputs(t + 1, 2, t, 4, 2, 16)
        w = rng.standard_normal((2, t, 2, 16))
        w /= np.linalg.norm(w, axis=-1, keepdims=True)
        beta = 2.0 / (1.0 + np.exp(-rng.standard_normal((2, t, 2))))  # (0, 2): negative eigenvalues too
        log_g = -np.log1p(np.exp(-(rng.standard_normal((2, t, 4)) + 2.0))) if gated else np.zeros((2, t, 4))
        scale = 16 ** -0.5
        o_ref = naive(*(to_torch(x, np.float32) for x in (q, k, v, w, beta, log_g)), scale=scale, chunk_size=16)
        o, _ = path_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, w, beta)),
                              jnp.asarray(log_g, jnp.float32) if gated else None, scale=scale, method=method,
                              chunk_size=chunk)
        worst = max(worst, max_diff(o, o_ref, atol=1e-4, what=f"o T={t} gated={gated} {method}"))
    return worst


CHECKS = {"stickbreaking_attention": stick_breaking, "path_attention": path}
