"""The DPLR rule, GDN-2, KDA and the gated delta rule against fla's naive references.

- ``dplr``: ``fla/ops/generalized_delta_rule/dplr/naive.py`` (``dplr_recurrence``; layout
  [B, H, T, D], q always scaled by K^-1/2, which is lmzoo's ``scale=None``);
- ``gdn2``: ``fla/ops/gdn2/naive.py`` (``naive_recurrent_gdn2``);
- ``delta_rule`` with per-channel gates and grouped value heads: ``fla/ops/kda/naive.py``
  (``naive_recurrent_kda``, HV = 2H), also run as ``dplr`` through ``delta_as_dplr``;
- ``delta_rule`` with one gate per head: ``fla/ops/gated_delta_rule/naive.py``.

fla's naive files compute in float32 whatever their inputs (they cast), and lmzoo's ops accumulate
in float32, so both sides are float32 here (inputs drawn in float64); the tolerance is 1e-4 absolute
on outputs and final states of order one. Odd lengths leave a partial last chunk; every lmzoo form
of each op; initial states throughout.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from _common import fla_naive, max_diff, to_numpy, to_torch

from lmzoo.ops.delta import delta_rule
from lmzoo.ops.dplr import delta_as_dplr, dplr, gdn2

ATOL = 1e-4
SHAPES = ((37, "chunk", 16), (64, "chunk", 64), (45, "chunk", 7), (29, "parallel", 64), (23, "scan", 64))


def inputs(t, *, heads=2, value_heads=2, dk=16, dv=8, seed=0):
    rng = np.random.default_rng(seed + t)
    q = rng.standard_normal((2, t, heads, dk))
    k = rng.standard_normal((2, t, heads, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((2, t, value_heads, dv))
    s0 = rng.standard_normal((2, value_heads, dk, dv))
    return rng, q, k, v, s0


def ours(x):
    return jnp.asarray(x, jnp.float32)


def heads_first(x):
    """lmzoo's [B, T, H, D] as fla's DPLR layout [B, H, T, D], float32 (its naive form casts every
    input but alpha, and mixing dtypes fails in torch)."""
    return to_torch(np.swapaxes(x, 1, 2), np.float32)


def check_dplr() -> float:
    naive = fla_naive("generalized_delta_rule/dplr").dplr_recurrence
    worst = 0.0
    for t, method, chunk in SHAPES:
        rng, q, k, v, s0 = inputs(t)
        kappa = rng.standard_normal(q.shape)
        kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
        a = rng.uniform(0, 1, q.shape)
        alpha, beta, log_g = -kappa, kappa * a, -rng.uniform(0.01, 0.7, q.shape)
        o_ref, s_ref = naive(*(heads_first(x) for x in (q, k, v, alpha, beta, log_g)),
                             initial_state=to_torch(s0, np.float32))
        o, s = dplr(*(ours(x) for x in (q, k, v, alpha, beta, log_g)), initial_state=ours(s0), method=method,
                    chunk_size=chunk)
        what = f"T={t} {method} chunk={chunk}"
        worst = max(worst, max_diff(o, np.swapaxes(to_numpy(o_ref), 1, 2), atol=ATOL, what=f"o {what}"),
                    max_diff(s, s_ref, atol=ATOL, what=f"state {what}"))
    return worst


def check_gdn2() -> float:
    naive = fla_naive("gdn2").naive_recurrent_gdn2
    worst = 0.0
    for t, method, chunk in SHAPES:
        rng, q, k, v, s0 = inputs(t, seed=1)
        log_g = -rng.uniform(0.01, 0.7, k.shape)
        erase, write = rng.uniform(0, 1, k.shape), rng.uniform(0, 1, v.shape)
        o_ref, s_ref = naive(*(to_torch(x) for x in (q, k, v, log_g, erase, write)), initial_state=to_torch(s0),
                             output_final_state=True)
        o, s = gdn2(*(ours(x) for x in (q, k, v, log_g, erase, write)), initial_state=ours(s0), method=method,
                    chunk_size=chunk)
        what = f"T={t} {method} chunk={chunk}"
        worst = max(worst, max_diff(o, o_ref, atol=ATOL, what=f"o {what}"),
                    max_diff(s, s_ref, atol=ATOL, what=f"state {what}"))
    return worst


def check_kda() -> float:
    """Per-channel gates, HV = 4 value heads over H = 2 key heads, through delta_rule and through dplr."""
    naive = fla_naive("kda").naive_recurrent_kda
    worst = 0.0
    for t, method, chunk in SHAPES:
        rng, q, k, v, s0 = inputs(t, value_heads=4, seed=2)
        log_g = -rng.uniform(0.01, 0.7, (2, t, 4, k.shape[-1]))
        beta = rng.uniform(0, 1, (2, t, 4))
        o_ref, s_ref = naive(*(to_torch(x) for x in (q, k, v, log_g, beta)), initial_state=to_torch(s0),
                             output_final_state=True)
        o, s = delta_rule(*(ours(x) for x in (q, k, v, beta, log_g)), initial_state=ours(s0), method=method,
                          chunk_size=chunk)
        what = f"T={t} {method} chunk={chunk}"
        worst = max(worst, max_diff(o, o_ref, atol=ATOL, what=f"o {what}"),
                    max_diff(s, s_ref, atol=ATOL, what=f"state {what}"))
        qv, kv = (np.repeat(x, 2, axis=2) for x in (q, k))  # value head hv uses key head hv // 2
        written, alpha, low_rank_beta = delta_as_dplr(ours(kv), ours(beta), ours(log_g))
        o, s = dplr(ours(qv), written, ours(v), alpha, low_rank_beta, ours(log_g), initial_state=ours(s0),
                    method=method, chunk_size=chunk)
        worst = max(worst, max_diff(o, o_ref, atol=ATOL, what=f"o as dplr {what}"),
                    max_diff(s, s_ref, atol=ATOL, what=f"state as dplr {what}"))
    return worst


def check_gated_delta_rule() -> float:
    naive = fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule
    worst = 0.0
    for t, method, chunk in SHAPES + ((37, "pallas", 16),):
        rng, q, k, v, s0 = inputs(t, seed=3)
        log_g, beta = -rng.uniform(0.01, 0.7, k.shape[:3]), rng.uniform(0, 1, k.shape[:3])
        o_ref, s_ref = naive(*(to_torch(x) for x in (q, k, v, beta, log_g)), initial_state=to_torch(s0),
                             output_final_state=True)
        o, s = delta_rule(*(ours(x) for x in (q, k, v, beta, log_g)), initial_state=ours(s0), method=method,
                          chunk_size=chunk)
        what = f"T={t} {method} chunk={chunk}"
        worst = max(worst, max_diff(o, o_ref, atol=ATOL, what=f"o {what}"),
                    max_diff(s, s_ref, atol=ATOL, what=f"state {what}"))
    return worst


CHECKS = {"dplr": check_dplr, "dplr_gdn2": check_gdn2, "dplr_kda_delta_rule": check_kda,
          "dplr_gated_delta_rule": check_gated_delta_rule}
