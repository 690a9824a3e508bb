"""NSA and DSA against fla's naive references (``fla/ops/{nsa,dsa}/naive.py``).

Layouts are alike ([B, T, H, D]). fla's NSA file imports two helpers from ``fla.ops.utils`` (whose
package imports Triton), so they are given here in plain PyTorch before the file is loaded: the
block means (``mean_pooling``) and the per-sequence block offsets (``prepare_chunk_offsets``).
fla's ``naive_nsa`` wants G = HQ/H a power of two >= 16 and flash-attn for its window branch: the
whole op is compared at HQ = 16 over H = 1 without a window; the branches at HQ = 4 over H = 2.
Documents: fla's varlen (``cu_seqlens``, batch 1) against lmzoo's ``segment_ids``; both count
blocks and indices from each sequence's start. Top-k choices compare as sets; DSA's ReLU scores
tie at 0, so its sets are compared on rows without a tie at the cut, and its outputs with fla's
choice passed to lmzoo.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import jax.numpy as jnp
import numpy as np
import torch
from _common import fla_naive, max_diff, to_torch

dsa_ops = importlib.import_module("lmzoo.ops.dsa")  # the modules: lmzoo.ops exports functions of the same names
nsa_ops = importlib.import_module("lmzoo.ops.nsa")


def _block_means(x, block_size, cu_seqlens=None):
    """fla's mean_pooling: [B, T, H, D] -> [B, ⌈T/bs⌉, H, D] (per sequence with cu_seqlens, batch 1)."""
    if cu_seqlens is None:
        return torch.stack([x[:, c * block_size:(c + 1) * block_size].mean(1)
                            for c in range(math.ceil(x.shape[1] / block_size))], 1)
    parts = [_block_means(x[:, a:b], block_size) for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())]
    return torch.cat(parts, 1)


def _chunk_offsets(cu_seqlens, block_size):
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.cat([cu_seqlens.new_zeros(1), torch.cumsum((lengths + block_size - 1) // block_size, 0)])


def _load_nsa():
    utils = types.ModuleType("fla.ops.utils")
    utils.prepare_chunk_offsets = _chunk_offsets
    pooling = types.ModuleType("fla.ops.utils.pooling")
    pooling.mean_pooling = _block_means
    sys.modules.setdefault("fla.ops.utils", utils)
    sys.modules.setdefault("fla.ops.utils.pooling", pooling)
    return fla_naive("nsa")


def _ids(lengths):
    return jnp.asarray(np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])[None], jnp.int32)


def _cu(lengths):
    return torch.tensor(np.cumsum([0, *lengths]), dtype=torch.long)


def _same_sets(ours, theirs, what):
    a, b = np.sort(np.asarray(ours), -1), np.sort(np.asarray(theirs), -1)
    assert a.shape == b.shape and (a == b).all(), f"{what}: {int((a != b).any(-1).sum())} rows choose other blocks"


def _inputs(seed, b, t, hq, h, d):
    rng = np.random.default_rng(seed)
    return rng, rng.standard_normal((b, t, hq, d)), rng.standard_normal((b, t, h, d)), rng.standard_normal((b, t, h, d))


def nsa_branches() -> float:
    """Compression (o, lse), top-k (sets) and selection (with fla's indices) at HQ = 4 over H = 2."""
    fla = _load_nsa()
    worst = 0.0
    for t, bs, s in ((37, 8, 3), (50, 16, 3), (19, 4, 4)):
        _, q, k, v = _inputs(t, 2, t, 4, 2, 16)
        scale = 16**-0.5
        k_cmp, v_cmp = (np.asarray(nsa_ops.nsa_block_means(jnp.asarray(x, jnp.float32), bs)) for x in (k, v))
        o_ref, lse_ref = fla.naive_nsa_compression(to_torch(q), to_torch(k_cmp), to_torch(v_cmp), bs, scale)
        o, lse = nsa_ops.nsa_compression(*(jnp.asarray(x, jnp.float32) for x in (q, k_cmp, v_cmp)), block_size=bs)
        lse, lse_ref = np.asarray(lse), lse_ref.numpy()
        assert (np.isneginf(lse) == np.isneginf(lse_ref)).all(), "lse: other queries see no block"
        seen = np.isfinite(lse)
        what = f"T={t} bs={bs}"
        worst = max(worst, max_diff(o, o_ref, atol=1e-5, what=f"o_cmp {what}"),
                    max_diff(lse[seen], lse_ref[seen], atol=1e-5, what=f"lse {what}"))
        idx_ref = fla.naive_nsa_topk(to_torch(q), to_torch(k_cmp), s, bs, scale)
        idx = nsa_ops.nsa_topk(jnp.asarray(q, jnp.float32), jnp.asarray(k_cmp, jnp.float32), block_counts=s,
                               block_size=bs)
        _same_sets(idx, idx_ref.numpy(), f"top-k {what}")
        o_ref = fla.naive_nsa_selection(to_torch(q), to_torch(k), to_torch(v), idx_ref, bs, scale)
        for method in nsa_ops.SELECTION:
            o = nsa_ops.nsa_selection(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), jnp.asarray(idx_ref.numpy()),
                                      block_size=bs, method=method)
            worst = max(worst, max_diff(o, o_ref, atol=1e-5, what=f"o_slc {what} {method}"))
    return worst


def nsa_whole() -> float:
    """``nsa`` (gates, no window) at HQ = 16 over H = 1, without and with documents (varlen)."""
    fla = _load_nsa()
    worst = 0.0
    for lengths, bs, s in (((45,), 8, 3), ((13, 24, 8), 4, 3), ((30, 17), 8, 4)):
        t = sum(lengths)
        rng, q, k, v = _inputs(t, 1, t, 16, 1, 16)
        g_cmp, g_slc = (1 / (1 + np.exp(-rng.standard_normal((1, t, 16)))) for _ in range(2))
        docs = len(lengths) > 1
        o_ref, idx_ref = fla.naive_nsa(*(to_torch(x, np.float32) for x in (q, k, v, g_cmp, g_slc)), block_counts=s,
                                       block_size=bs, cu_seqlens=_cu(lengths) if docs else None,
                                       return_block_indices=True)
        for method in nsa_ops.METHODS:
            o, idx = nsa_ops.nsa(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, g_cmp, g_slc)), block_counts=s,
                                 block_size=bs, segment_ids=_ids(lengths) if docs else None, method=method)
            what = f"documents {lengths} bs={bs} {method}"
            _same_sets(idx, idx_ref.numpy(), f"top-k {what}")
            worst = max(worst, max_diff(o, o_ref, atol=1e-5, what=f"o {what}"))
    return worst


def dsa() -> float:
    """Indices (sets, on rows without a tie at the cut) and outputs (with fla's choice, and our own
    where the sets agree), grouped heads, without and with documents."""
    fla = fla_naive("dsa")
    worst = 0.0
    for lengths, topk in (((41,), 8), ((15, 26), 5), ((33,), 64)):
        t = sum(lengths)
        rng, q, k, v = _inputs(t, 1, t, 4, 2, 16)
        q_idx, k_idx, w_idx = (rng.standard_normal((1, t, 4, 8)), rng.standard_normal((1, t, 8)),
                               rng.standard_normal((1, t, 4)))
        docs = len(lengths) > 1
        cu, ids = (_cu(lengths), _ids(lengths)) if docs else (None, None)
        torch_args = [to_torch(x, np.float32) for x in (q, k, v, q_idx, k_idx, w_idx)]
        o_ref, idx_ref = fla.naive_dsa(*torch_args, topk=topk, cu_seqlens=cu, return_indices=True)
        jax_args = [jnp.asarray(x, jnp.float32) for x in (q, k, v, q_idx, k_idx, w_idx)]
        what = f"documents {lengths} topk={topk}"
        scores, idx = dsa_ops.dsa_indexer(*jax_args[3:], topk=topk, segment_ids=ids)
        ranked = -np.sort(-np.asarray(scores)[0], -1)  # each row's scores, highest first
        cut = np.minimum(topk, np.asarray(jnp.isfinite(scores)).sum(-1)[0])
        clean = [r for r in range(t) if cut[r] == ranked.shape[1] or ranked[r, cut[r] - 1] > ranked[r, cut[r]]]
        _same_sets(np.asarray(idx)[0, clean], idx_ref.numpy()[0, clean], f"indices {what} ({len(clean)}/{t} rows)")
        for method in dsa_ops.METHODS:
            o, _ = dsa_ops.dsa(*jax_args, topk=topk, indices=jnp.asarray(idx_ref.numpy(), jnp.int32),
                               segment_ids=ids, method=method)
            worst = max(worst, max_diff(o, o_ref, atol=1e-5, what=f"o {what} {method}"))
        o, _ = dsa_ops.dsa(*jax_args, topk=topk, segment_ids=ids)
        worst = max(worst, max_diff(np.asarray(o)[0, clean], o_ref.numpy()[0, clean], atol=1e-5,
                                    what=f"o (own choice) {what}"))
    return worst


CHECKS = {"nsa_branches": nsa_branches, "nsa": nsa_whole, "dsa": dsa}
