"""The chunked (gated) delta rule with Pallas kernels, forward and backward (``delta_rule(method="pallas")``).

The chunk form of ``lmzoo.ops.delta`` in three stages, each with its own gradient:

1. Within chunks (XLA, every chunk at once; ``lmzoo.ops.ut``): the UT representation turns a
   chunk's sequential rank-one updates into ``w_v``, ``w_k``, and its gates into decays to the
   chunk's end. Batched matmuls with no recurrence, differentiated by JAX.
2. Across chunks (kernels ``delta_states`` and ``delta_state_grads``): per head, in order,

       U_n = w_v - w_k S_n,      S_{n+1} = a_n * S_n + E_n^T U_n

   with ``E = k exp(b_C - b)`` (keys decayed to the chunk's end) and ``a_n = exp(b_C)`` per key
   row. Every product mixes key rows only, so the value columns of S evolve independently: one
   program per (head, block of value columns), holding a [Dk, block] state. Backward, with G_{n+1}
   the cotangent of the state after chunk n and dS_n, dU_n what the outputs send back:

       dU_n^tot = dU_n + E_n G_{n+1},      G_n = dS_n + a_n * G_{n+1} - w_k^T dU_n^tot

   and the rest is parallel over chunks (XLA): ``dw_v = dU^tot``, ``dw_k = -dU^tot S_n^T``,
   ``dE = U G_{n+1}^T``, ``da_n = rowsum(G_{n+1} * S_n)``.
3. Outputs: ``o = (q exp(b)) S_n + P_<=(q, k) U_n`` is gated linear attention's chunk output with U
   in place of the values, so GLA's output kernel and its gradient kernels serve
   (``lmzoo.ops.pallas.gla.chunk_outputs``).

Everything runs in float32 (the op casts its inputs), with float32 matmuls at full precision.
Inside a chunk, GLA's output kernels take the decay between two steps as a difference of sums from
the chunk's start, which keeps their rounding: ~1e-7 of the chunk's total log decay (the XLA chunk
form builds pair decays by halving and stays at ~1e-7 however strong the gates).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from lmzoo.ops.pallas.common import AT_B, HeadMajor, dot, feature_width, launch
from lmzoo.ops.pallas.gla import chunk_cumsum, chunk_outputs, kernel_config
from lmzoo.ops.ut import chunk_terms


@functools.partial(jax.jit, static_argnames=("chunk_size", "block", "platform"))
def delta_rule_pallas(q, k, v, beta, log_g, s0, *, chunk_size=64, block=None, platform=None):
    """q (scaled), k [B,T,H,Dk]; v [B,T,H,Dv]; beta [B,T,H]; log_g None or [B,T,H,Dk|1]; s0 [B,H,Dk,Dv].

    All float32. Returns (o [B,T,H,Dv], S_T [B,H,Dk,Dv]). ``chunk_size`` must be a multiple of 16
    on a GPU; ``block`` splits the state's value columns across programs (default 64 on a GPU).
    """
    d_key, d_value = k.shape[-1], v.shape[-1]
    layout = HeadMajor.of(k, chunk_size)
    dk, dv = feature_width(d_key), feature_width(d_value)
    config = kernel_config(chunk_size, None, block, platform, dk, dv)
    gates = jnp.zeros((*k.shape[:3], 1), jnp.float32) if log_g is None else log_g
    gate_width = 1 if gates.shape[-1] == 1 else dk
    q, k, v, g = (layout.pack(x, width) for x, width in ((q, dk), (k, dk), (v, dv), (gates, gate_width)))
    beta = layout.pack(beta[..., None], 1)[..., 0]

    heads, padded, chunks = q.shape[0], q.shape[1], q.shape[1] // chunk_size
    per_chunk = lambda x: x.reshape(heads, chunks, chunk_size, *x.shape[2:])
    terms = chunk_terms(per_chunk(k), per_chunk(v), per_chunk(beta), None if log_g is None else per_chunk(g))
    whole = lambda x: x.reshape(heads, padded, x.shape[-1])
    starts, u, final = _across_chunks(config, whole(terms.w_k), whole(terms.w_v), whole(terms.keys_to_end),
                                      terms.across, layout.pack_state(s0, dk, dv))
    o = chunk_outputs(config, q, k, u, chunk_cumsum(g, chunk_size), starts)
    return layout.unpack(o, d_value), layout.unpack_state(final, d_key, d_value)


# ----------------------------------------------------------------------------- across chunks


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _across_chunks(config, w_k, w_v, keys_to_end, across, s0):
    """Head-major w_k, keys_to_end [BH,T,Dk], w_v [BH,T,Dv], across [BH,N,Dk|1], s0 [BH,Dk,Dv] ->
    (the state before every chunk [BH,N,Dk,Dv], U [BH,T,Dv], the final state)."""
    return _launch(_states_kernel, "delta_states", config, (w_k, keys_to_end, across), (w_v,), s0, values_out=1)


def _across_chunks_fwd(config, w_k, w_v, keys_to_end, across, s0):
    starts, u, final = _across_chunks(config, w_k, w_v, keys_to_end, across, s0)
    return (starts, u, final), (w_k, keys_to_end, across, starts, u)


def _across_chunks_bwd(config, residuals, cotangents):
    w_k, keys_to_end, across, starts, u = residuals
    d_starts, d_u, d_final = cotangents
    d_after, d_written, d_s0 = _launch(_state_grads_kernel, "delta_state_grads", config, (w_k, keys_to_end, across),
                                       (d_u,), d_final, values_out=1, chunk_values=d_starts)
    heads, length, _ = w_k.shape
    per_chunk = lambda x: x.reshape(heads, length // config.chunk, config.chunk, x.shape[-1])
    matmul = functools.partial(jnp.einsum, precision=lax.Precision.HIGHEST)
    d_w_k = -matmul("hncv,hndv->hncd", per_chunk(d_written), starts).reshape(w_k.shape)
    d_keys_to_end = matmul("hncv,hndv->hncd", per_chunk(u), d_after).reshape(w_k.shape)
    d_across = jnp.sum(d_after * starts, axis=-1)  # [BH, N, Dk]
    if across.shape[-1] == 1:
        d_across = d_across.sum(axis=-1, keepdims=True)
    return d_w_k, d_written, d_keys_to_end, d_across, d_s0


_across_chunks.defvjp(_across_chunks_fwd, _across_chunks_bwd)


def _launch(kernel, name, config, key_side, value_side, start, *, values_out, chunk_values=None):
    """One program per (head, block of value columns) walks the head's chunks.

    ``key_side`` (w_k, keys_to_end [BH,T,Dk], across [BH,N,Dk|1]) are read whole; ``value_side``
    [BH,T,Dv] arrays and ``chunk_values`` [BH,N,Dk,Dv] only in the block's columns. Writes a
    [BH,N,Dk,Dv] array (the carry at every chunk), ``values_out`` [BH,T,Dv] arrays and the carry's
    last value [BH,Dk,Dv].
    """
    w_k, keys_to_end, across = key_side
    heads, length, dk = w_k.shape
    dv, chunks, bv = start.shape[-1], length // config.chunk, config.block_v
    rows = lambda width: pl.BlockSpec((None, length, width), lambda h, j: (h, 0, 0))
    columns = pl.BlockSpec((None, length, bv), lambda h, j: (h, 0, j))
    per_chunk_state = pl.BlockSpec((None, chunks, dk, bv), lambda h, j: (h, 0, 0, j))
    state = pl.BlockSpec((None, dk, bv), lambda h, j: (h, 0, j))
    extra = [] if chunk_values is None else [chunk_values]
    return launch(
        functools.partial(kernel, config.chunk, chunks),
        platform=config.platform,
        grid=(heads, dv // bv),
        in_specs=[rows(dk), rows(dk), pl.BlockSpec((None, chunks, across.shape[-1]), lambda h, j: (h, 0, 0))]
        + [columns] * len(value_side) + [per_chunk_state] * len(extra) + [state],
        out_specs=[per_chunk_state] + [columns] * values_out + [state],
        out_shape=[jax.ShapeDtypeStruct((heads, chunks, dk, dv), jnp.float32)]
        + [jax.ShapeDtypeStruct((heads, length, dv), jnp.float32)] * values_out
        + [jax.ShapeDtypeStruct(start.shape, jnp.float32)],
        name=name,
    )(w_k, keys_to_end, across, *value_side, *extra, start)


def _states_kernel(chunk, chunks, w_k_ref, to_end_ref, across_ref, w_v_ref, s0_ref, starts_ref, u_ref, final_ref):
    def step(n, s):  # s: the state before chunk n, [Dk, block]
        rows = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        starts_ref[n] = s
        u = w_v_ref[rows, :] - dot(w_k_ref[rows, :], s, jnp.float32)  # what the chunk writes
        u_ref[rows, :] = u
        return across_ref[pl.ds(n, 1), :].T * s + dot(to_end_ref[rows, :], u, jnp.float32, AT_B)

    final_ref[...] = lax.fori_loop(0, chunks, step, s0_ref[...])


def _state_grads_kernel(chunk, chunks, w_k_ref, to_end_ref, across_ref, d_u_ref, d_starts_ref, d_final_ref,
                        d_after_ref, d_written_ref, d_s0_ref):
    def step(i, g):  # g: the cotangent of the state after chunk n
        n = chunks - 1 - i
        rows = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        d_after_ref[n] = g
        d_written = d_u_ref[rows, :] + dot(to_end_ref[rows, :], g, jnp.float32)  # through the outputs and S_{n+1}
        d_written_ref[rows, :] = d_written
        return d_starts_ref[n] + across_ref[pl.ds(n, 1), :].T * g - dot(w_k_ref[rows, :], d_written, jnp.float32, AT_B)

    d_s0_ref[...] = lax.fori_loop(0, chunks, step, d_final_ref[...])
