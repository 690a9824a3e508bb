"""Gated DeltaProduct and Comba against fla's naive references.

- ``delta_product``: ``fla/ops/gated_delta_product/naive.py`` (``naive_recurrent_gated_delta_product``;
  its keys, values and betas hold the n_h sub-steps of token t at rows t * n_h + j of a [B, T * n_h, H, *]
  layout, lmzoo's at [B, T, H, n_h, *]), with and without the per-token gate, beta in (0, 2);
- ``comba``: ``fla/ops/comba/naive.py``'s ``naive_chunk_comba`` (the semantics of fla's kernels: the
  prediction reads the state before the decay). Its ``naive_recurrent_comba`` decays first and
  disagrees with its own kernels; ``check_comba`` also measures that it differs from lmzoo's op, so a
  change of either side shows up here.

Both sides float32 (inputs drawn in float64), 1e-4 absolute on outputs and final states of order one;
odd lengths leave a partial last chunk; every lmzoo form; initial states throughout.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from _common import fla_naive, max_diff, to_numpy, to_torch

from lmzoo.ops.comba import comba
from lmzoo.ops.delta_product import delta_product

ATOL = 1e-4
SHAPES = ((37, "chunk", 16), (64, "chunk", 64), (45, "chunk", 7), (29, "parallel", 64), (23, "scan", 64))


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def ours(x):
    return jnp.asarray(x, jnp.float32)


def theirs(x):
    return to_torch(x, np.float32)


def check_delta_product() -> float:
    naive = fla_naive("gated_delta_product").naive_recurrent_gated_delta_product
    worst = 0.0
    for steps, gated in ((2, True), (3, False), (1, True)):
        for t, method, chunk in SHAPES:
            rng = np.random.default_rng(t + 10 * steps)
            b, h, dk, dv = 2, 2, 16, 8
            q = rng.standard_normal((b, t, h, dk))
            k = unit(rng.standard_normal((b, t, h, steps, dk)))
            v = rng.standard_normal((b, t, h, steps, dv))
            beta = rng.uniform(0.0, 2.0, (b, t, h, steps))  # negative eigenvalues
            log_g = -rng.uniform(0.01, 0.7, (b, t, h)) if gated else None
            s0 = rng.standard_normal((b, h, dk, dv))
            flat = lambda x: np.moveaxis(x, 3, 2).reshape(b, t * steps, h, *x.shape[4:])  # noqa: E731
            o_ref, s_ref = naive(theirs(q), theirs(flat(k)), theirs(flat(v)), None if log_g is None else theirs(log_g),
                                 theirs(flat(beta[..., None])[..., 0]), dk**-0.5, initial_state=theirs(s0),
                                 num_householder=steps)
            o, s = delta_product(ours(q), ours(k), ours(v), ours(beta), None if log_g is None else ours(log_g),
                                 initial_state=ours(s0), method=method, chunk_size=chunk)
            what = f"delta_product n_h={steps} gated={gated} T={t} {method}/{chunk}"
            worst = max(worst, max_diff(o, o_ref, atol=ATOL, what=f"{what} o"),
                        max_diff(s, s_ref, atol=ATOL, what=f"{what} S"))
    return worst


def check_comba() -> float:
    module = fla_naive("comba")
    worst = 0.0
    for t, method, chunk in SHAPES:
        rng = np.random.default_rng(t)
        b, h, dk, dv = 2, 2, 16, 8
        q, k, p = (unit(rng.standard_normal((b, t, h, dk))) for _ in range(3))
        p = 0.7 * p
        v = rng.standard_normal((b, t, h, dv))
        beta = rng.uniform(0.0, 1.0, (b, t, h))
        log_g = -rng.uniform(0.01, 0.7, (b, t, h))
        s0 = rng.standard_normal((b, h, dk, dv))
        o_ref, s_ref = module.naive_chunk_comba(*(theirs(x) for x in (q, k, v, p, log_g, beta)), chunk_size=16,
                                                initial_state=theirs(s0), output_final_state=True)
        o, s = comba(*(ours(x) for x in (q, k, v, p, beta, log_g)), initial_state=ours(s0), method=method,
                     chunk_size=chunk)
        what = f"comba T={t} {method}/{chunk}"
        worst = max(worst, max_diff(o, o_ref, atol=ATOL, what=f"{what} o"),
                    max_diff(s, s_ref, atol=ATOL, what=f"{what} S"))
        decayed_first, _ = module.naive_recurrent_comba(*(theirs(x) for x in (q, k, v, p, beta, log_g)),
                                                        initial_state=theirs(s0), output_final_state=True)
        gap = float(np.max(np.abs(to_numpy(o) - to_numpy(decayed_first))))
        assert gap > 1e-2, (f"{what}: fla's naive_recurrent_comba (decay first) now agrees ({gap:.1e}): "
                            "re-read the contract")
    return worst


CHECKS = {"delta_product": check_delta_product, "comba": check_comba}
