"""Probes: every layer's effective attention matrix reduced to per-head sparsity, entropy and first-key share.

Row statistics are averaged over the batch and over query positions (each causal row i over its
i + 1 visible keys, or over its document's when documents are kept apart); ``position_buckets``
also reports them per span of query positions (in the window), since
how focused attention is depends on how much context a query has.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lmzoo.scoring.catalog import PROBES
from lmzoo.ops.common import causal_mask, same_segment


@nnx.jit(static_argnames="position_buckets")
def _row_stats(model, tokens, segment_ids, position_buckets: int):
    t = tokens.shape[1]
    visible = causal_mask(t)
    if segment_ids is not None:  # a row spans the keys of the query's own document
        visible = visible & same_segment(segment_ids)[:, None]  # (B, 1, T, T)
    spans = np.array_split(np.arange(t), min(position_buckets, t))
    stats = {key: [] for p in PROBES for key in (p.name, f"{p.name}_by_position")}
    for weights in model.attention_matrices(tokens, segment_ids=segment_ids):  # (B, H, T, T) per layer
        for probe in PROBES:
            rows = probe.row_statistic(weights, visible)  # (B, H, T)
            stats[probe.name].append(jnp.nanmean(rows, axis=(0, 2)))  # (H,)
            stats[f"{probe.name}_by_position"].append(jnp.stack([jnp.nanmean(rows[..., s]) for s in spans]))
    return {k: jnp.stack(v) for k, v in stats.items()}, [int(s[-1]) + 1 for s in spans]


def attention_stats(model, tokens, segment_ids=None, *, position_buckets: int = 8) -> dict:
    """{<probe>: [layer][head], "<probe>_by_position": [layer][bucket], "positions": [bucket end]} for each of
    ``lmzoo.scoring.catalog.PROBES`` (sparsity, entropy, first_key);
    with ``segment_ids`` each document's rows over its own keys."""
    segment_ids = None if segment_ids is None else jnp.asarray(segment_ids)
    stats, ends = _row_stats(model, jnp.asarray(tokens), segment_ids, position_buckets)
    out = {k: np.asarray(jax.device_get(v)).tolist() for k, v in stats.items()}
    out["positions"] = ends
    return out


def logged_probes(stats: dict) -> dict:
    """What a training run logs of ``attention_stats``: each logged probe's mean over layers and heads, then the
    per-layer means (over heads) of those logged per layer."""
    logged = {p.logged: float(np.nanmean(stats[p.name])) for p in PROBES if p.logged}
    for probe in (p for p in PROBES if p.per_layer):
        for layer, heads in enumerate(stats[probe.name]):
            logged[f"probe/{probe.name}/layer{layer}"] = float(np.nanmean(heads))
    return logged
