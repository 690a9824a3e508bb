"""Causal linear attention: the running sum ``S_t = S_{t-1} + k_t^T v_t`` read out as ``o_t = scale q_t S_t``.

This is gated linear attention without a gate, so the op maps onto ``lmzoo.ops.gated.gla`` with
``log_g=None`` (which builds no decay tensor) and has the same forms (``method``): "naive" (the
step-by-step reference), "parallel", "scan", "assoc", "chunk" and "pallas"; see that module.
Feature maps are the caller's business (the mixer applies them to q and k); this op is the causal
sum. ``o_t`` includes token t.

State: ``S [B, H, Dk, Dv]`` float32. With ``normalize=True`` (Katharopoulos et al., 2020) the output
is ``scale q_t S_t / (scale q_t . z_t + eps)`` with ``z_t = sum_{s<=t} k_s`` the running key sum, and
the state is the pair ``(S [B, H, Dk, Dv], z [B, H, Dk])``; ``scale`` then cancels except against
``eps``. The denominator is one more value column (a column of ones), so the normalised op is the
same sum. Sums accumulate in float32 (every form, the Pallas kernels included); ``o`` has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lmzoo.ops.gated import METHODS, STEP_FORM, gla, gla_weights

__all__ = ["METHODS", "STEP_FORM", "linear_attention", "linear_attention_weights"]


@functools.partial(jax.jit, static_argnames=("scale", "normalize", "eps"))
def linear_attention_weights(q, k, *, scale=None, normalize=False, eps=1e-6, segment_ids=None) -> jax.Array:
    """The causal weights [B, H, T, S] float32 the op applies to v (no initial state).

    ``scale q_i . k_j`` for j <= i (and in i's segment); normalised, each row divided by its sum
    ``scale q_i . z_i + eps``.
    """
    weights = gla_weights(q, k, scale=scale, segment_ids=segment_ids)
    if normalize:
        weights = weights / (weights.sum(-1, keepdims=True) + eps)
    return weights


@functools.partial(jax.jit, static_argnames=("scale", "normalize", "eps", "method", "chunk_size"))
def linear_attention(
    q, k, v, *, scale=None, normalize=False, eps=1e-6, initial_state=None, method="chunk", chunk_size=64,
    segment_ids=None,
):
    """Causal linear attention. q, k [B, T, H, Dk], v [B, T, H, Dv] -> (o [B, T, H, Dv], final state).

    See the module docstring for the state layout and ``lmzoo.ops.gated`` for the forms; with
    ``segment_ids`` [B, T] the sums (and key sums) restart at each segment start.
    """
    if not normalize:  # gla itself: inputs in their own dtype, which jla's kernels take (method="auto")
        out, state = gla(q, k, v, scale=scale, initial_state=initial_state, method=method, chunk_size=chunk_size,
                         segment_ids=segment_ids)
        return out.astype(v.dtype), state
    q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
    d_value = v.shape[-1]
    state = initial_state
    if normalize:  # carry the key sum as one more value column of ones
        v32 = jnp.concatenate([v32, jnp.ones_like(v32[..., :1])], axis=-1)  # (B, T, H, Dv + 1)
        if initial_state is not None:
            s0, z0 = (s.astype(jnp.float32) for s in initial_state)
            state = jnp.concatenate([s0, z0[..., None]], axis=-1)  # (B, H, Dk, Dv + 1)
    out, state = gla(q32, k32, v32, scale=scale, initial_state=state, method=method, chunk_size=chunk_size,
                     segment_ids=segment_ids)
    if normalize:
        out = out[..., :d_value] / (out[..., d_value:] + eps)
        state = (state[..., :d_value], state[..., d_value])
    return out.astype(v.dtype), state
