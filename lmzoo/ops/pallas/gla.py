"""Chunked gated linear attention as Pallas kernels, forward and backward (``gla(method="pallas")``).

Computes ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t`` for log gates ``g`` per key
dimension or one per head (simple GLA, RetNet; plain linear attention has g = 0). Heads
are laid out ``[BH, T, D]``; T is padded to whole chunks of C steps and D to a power of two (zero
queries, keys, values and gates change nothing).

Five kernels, in the shape of the chunked XLA form:

- ``states``  (sequential over chunks, parallel over heads and state blocks): the state before
  every chunk, ``S_{n+1} = exp(B_n) S_n + (k exp(B_n - b))^T v``, with b the gate's cumulative sum
  inside the chunk and B_n its last row;
- ``outputs`` (parallel over chunks and blocks of value columns): ``o = (q exp(b)) S_n`` plus the
  causal sum inside the chunk;
- ``state_grads`` (sequential, in reverse): the state cotangents ``dS_n = exp(B_n) dS_{n+1} +
  (q exp(b))^T do``;
- ``key_grads`` (parallel over chunks and blocks of key columns): dq and dk of each chunk from S_n
  and dS_{n+1};
- ``value_grads`` (parallel over chunks and blocks of value columns): dv of each chunk.

The state blocks (``block``, 64 x 64 on a GPU) bound what one program holds: no program loads a
whole [Dk, Dv] float32 state, which at head dim 128 overflowed a GPU program's registers.

The gate cotangent needs no kernel: the loss sees g only through q_t exp(G_t) and k_t exp(-G_t)
(G the running sum of g) and through exp(G_T) in the final state, so
``dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + rowsum(dS_T * S_T)``, a reverse cumsum in XLA.

Inside a chunk the causal sum runs over sub-blocks of c steps. For sub-blocks I > J the decay
from key j to query i is split at the start of I: ``q_i exp(b_i - r) . k_j exp(r - b_j)`` with r
the cumulative gate just before I, both factors <= 1, so that part is a matmul that cannot
overflow however strongly the gates decay. On the diagonal sub-blocks the decay is taken per pair
(one key row at a time, exponents masked to <= 0 before exp). Exponents are never positive. With
one gate per head the decay between two steps is one number, so the whole chunk is matmuls with a
[C, C] decay matrix (the ``*_scalar_kernel`` functions).

Matmul operands keep the input dtype (bfloat16 runs the tensor cores); products, states and gates
accumulate in float32, and float32 inputs multiply at full precision.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from lmzoo.ops.pallas.common import A_BT, AT_B, HeadMajor, dot, feature_width, launch, resolve_platform


@functools.partial(jax.jit, static_argnames=("chunk_size", "sub_size", "block", "platform"))
def gla_pallas(q, k, v, log_g, s0, *, chunk_size=64, sub_size=None, block=None, platform=None):
    """q (scaled), k [B,T,H,Dk]; v [B,T,H,Dv]; log_g [B,T,H,Dk|1] float32; s0 [B,H,Dk,Dv] float32.

    Returns (o [B,T,H,Dv] float32, S_T [B,H,Dk,Dv] float32). ``chunk_size`` must be a multiple of
    ``sub_size`` (>= 16 for GPU matmuls); ``block`` splits the state's Dk and Dv across programs in
    the sequential kernels (default: 64 on GPU, whole elsewhere).
    """
    d_key, d_value = k.shape[-1], v.shape[-1]
    layout = HeadMajor.of(k, chunk_size)
    dk, dv = feature_width(d_key), feature_width(d_value)
    config = kernel_config(chunk_size, sub_size, block, platform, dk, dv)
    log_g = log_g.astype(jnp.float32)
    gate_width = dk if log_g.shape[-1] > 1 else 1  # one gate per head stays one column
    o, final = _gla(config, layout.pack(q, dk), layout.pack(k, dk), layout.pack(v, dv), layout.pack(log_g, gate_width),
                    layout.pack_state(s0, dk, dv))
    return layout.unpack(o, d_value), layout.unpack_state(final, d_key, d_value)


def kernel_config(chunk_size, sub_size, block, platform, dk, dv) -> "KernelConfig":
    """The static options of the chunked kernels, checked: chunks split into sub-blocks of
    ``sub_size`` rows (16 by default: the smallest GPU matmul), state blocks of ``block``."""
    sub_size = sub_size or (16 if chunk_size % 16 == 0 else chunk_size)
    if chunk_size % sub_size or sub_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a multiple of sub_size={sub_size}")
    platform = resolve_platform(platform)
    if platform == "gpu" and sub_size < 16:
        raise ValueError(f"chunk_size={chunk_size}: GPU matmuls need sub-blocks of 16 rows (use a multiple of 16)")
    return KernelConfig(chunk_size, sub_size, _block(block, platform, dk), _block(block, platform, dv), platform)


def _block(block, platform, width):
    size = block or (64 if platform == "gpu" else width)
    return min(size, width)


class KernelConfig(NamedTuple):
    """Static kernel options (hashable, for custom_vjp's nondiff argument)."""

    chunk: int
    sub: int
    block_k: int
    block_v: int
    platform: str


# ----------------------------------------------------------------------------- custom_vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gla(config, q, k, v, g, s0):
    return _forward(config, q, k, v, g, s0)[:2]


def _forward(config, q, k, v, g, s0):
    b = chunk_cumsum(g, config.chunk)
    states, final = _states(config, k, v, b, s0)
    return _outputs(config, q, k, v, b, states), final, (q, k, v, b, states, final)


def _gla_fwd(config, q, k, v, g, s0):
    o, final, residuals = _forward(config, q, k, v, g, s0)
    return (o, final), residuals


def _gla_bwd(config, residuals, cotangents):
    q, k, v, b, states, final = residuals
    do, d_final = cotangents
    d_states, d_s0 = _state_grads(config, q, b, do, d_final)
    dq, dk = _key_grads(config, q, k, v, b, do, states, d_states)
    dv = _value_grads(config, q, k, b, do, d_states)
    # dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + the final state's own dependence on every gate
    through_qk = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk
    through_final = jnp.sum(d_final * final, axis=-1)[:, None, :]  # [BH, 1, Dk]
    if b.shape[-1] == 1:  # one gate per head: it multiplies every key dimension
        through_qk, through_final = (x.sum(axis=-1, keepdims=True) for x in (through_qk, through_final))
    dg = lax.cumsum(through_qk, axis=1, reverse=True) + through_final
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg, d_s0


_gla.defvjp(_gla_fwd, _gla_bwd)


def chunk_cumsum(g, chunk):
    """Cumulative log gate from each chunk's start (inclusive), float32 [BH, T, D]."""
    heads, length, width = g.shape
    return jnp.cumsum(g.reshape(heads, length // chunk, chunk, width), axis=2).reshape(g.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def chunk_outputs(config, q, k, v, b, states):
    """The output stage alone, for a recurrence that finds its own states (the delta rule):
    ``o = (q exp(b)) S_n`` plus the causal sum inside each chunk, from head-major q, k [BH,T,Dk],
    v [BH,T,Dv], b (``chunk_cumsum``) and the state before every chunk [BH,N,Dk,Dv]."""
    return _outputs(config, q, k, v, b, states)


def _chunk_outputs_fwd(config, q, k, v, b, states):
    return _outputs(config, q, k, v, b, states), (q, k, v, b, states)


def _chunk_outputs_bwd(config, residuals, do):
    q, k, v, b, states = residuals
    no_later_state = jnp.zeros_like(states)  # nothing flows back from states after a chunk here
    dq, dk = _key_grads(config, q, k, v, b, do, states, no_later_state)
    dv = _value_grads(config, q, k, b, do, no_later_state)
    heads, length, _ = q.shape
    per_chunk = lambda x: x.reshape(heads, length // config.chunk, config.chunk, x.shape[-1])
    queries = per_chunk(q.astype(jnp.float32) * jnp.exp(b))
    d_states = jnp.einsum("hncd,hnce->hnde", queries, per_chunk(do), precision=lax.Precision.HIGHEST)
    # o sees b only through q exp(b) and k exp(-b), as the whole recurrence sees its gates
    db = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk
    if b.shape[-1] == 1:
        db = db.sum(axis=-1, keepdims=True)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), db, d_states


chunk_outputs.defvjp(_chunk_outputs_fwd, _chunk_outputs_bwd)


# ----------------------------------------------------------------------------- launches


def _states(config, k, v, b, s0):
    """The state before every chunk [BH, N, Dk, Dv] and after the last, from S_0."""
    return _through_chunks(_states_kernel, "gla_states", config, k, v, b, s0)


def _state_grads(config, q, b, do, d_final):
    """The cotangent of the state after every chunk [BH, N, Dk, Dv] and of S_0, from that of S_T."""
    return _through_chunks(_state_grads_kernel, "gla_state_grads", config, q, do, b, d_final)


def _through_chunks(kernel, name, config, keys, values, b, start):
    """Launch a kernel that walks each head's chunks in order, one program per (Dk, Dv) state block.

    ``keys`` [BH, T, Dk] (k or q) and ``values`` [BH, T, Dv] (v or do) are read whole, restricted to
    the block's columns; ``start`` [BH, Dk, Dv] is the carried block's first value. Writes the
    carry at every chunk [BH, N, Dk, Dv] and its last value.
    """
    heads, length, dk = keys.shape
    dv, chunks = values.shape[-1], length // config.chunk
    bk, bv = config.block_k, config.block_v
    state_block = pl.BlockSpec((None, bk, bv), lambda h, i, j: (h, i, j))
    return launch(
        functools.partial(kernel, config.chunk, chunks),
        platform=config.platform,
        grid=(heads, dk // bk, dv // bv),
        in_specs=[
            pl.BlockSpec((None, length, bk), lambda h, i, j: (h, 0, i)),
            pl.BlockSpec((None, length, bv), lambda h, i, j: (h, 0, j)),
            _gates_along_t(b, bk),
            state_block,
        ],
        out_specs=[pl.BlockSpec((None, chunks, bk, bv), lambda h, i, j: (h, 0, i, j)), state_block],
        out_shape=[jax.ShapeDtypeStruct((heads, chunks, dk, dv), jnp.float32),
                   jax.ShapeDtypeStruct(start.shape, jnp.float32)],
        name=name,
    )(keys, values, b, start)


def _gates_along_t(b, block_k):
    """The whole sequence of a head's gates: the state block's key columns, or the one column."""
    width = b.shape[-1]
    if width == 1:
        return pl.BlockSpec((None, b.shape[1], 1), lambda h, i, j: (h, 0, 0))
    return pl.BlockSpec((None, b.shape[1], block_k), lambda h, i, j: (h, 0, i))


class _ChunkBlocks:
    """BlockSpecs on the grid (head h, chunk n, column block j) of the parallel kernels.

    A program reads its chunk's rows, either whole in the feature dimension or only the j-th block
    of ``width`` columns, and the state before (or the cotangent after) its chunk restricted to a
    block of key rows or value columns: no program holds a whole [Dk, Dv] float32 state, which at
    head dim 128 overflowed a GPU program's registers.
    """

    def __init__(self, chunk):
        self.chunk = chunk

    def rows(self, width):
        return pl.BlockSpec((None, self.chunk, width), lambda h, n, j: (h, n, 0))

    def columns(self, width):
        return pl.BlockSpec((None, self.chunk, width), lambda h, n, j: (h, n, j))

    def gates(self, b, width):  # one gate per head stays one whole column
        return self.rows(1) if b.shape[-1] == 1 else self.columns(width)

    @staticmethod
    def state_values(dk, width):  # S[:, j-th block of values]
        return pl.BlockSpec((None, None, dk, width), lambda h, n, j: (h, n, 0, j))

    @staticmethod
    def state_keys(width, dv):  # S[j-th block of keys, :]
        return pl.BlockSpec((None, None, width, dv), lambda h, n, j: (h, n, j, 0))


def _parallel(kernel, name, config, grid_columns, in_specs, out_specs, out_shape, *args):
    heads, length = args[0].shape[:2]
    return launch(
        functools.partial(kernel, config.chunk, config.sub),
        platform=config.platform,
        grid=(heads, length // config.chunk, grid_columns),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        name=name,
    )(*args)


def _outputs(config, q, k, v, b, states):
    """o for every chunk, one program per (head, chunk, block of value columns)."""
    dk, dv, bv = q.shape[-1], v.shape[-1], config.block_v
    spec = _ChunkBlocks(config.chunk)
    kernel = _outputs_scalar_kernel if b.shape[-1] == 1 else _outputs_kernel
    in_specs = [spec.rows(dk), spec.rows(dk), spec.columns(bv), spec.rows(b.shape[-1]), spec.state_values(dk, bv)]
    out_shape = jax.ShapeDtypeStruct(v.shape, jnp.float32)
    return _parallel(kernel, "gla_outputs", config, dv // bv, in_specs, spec.columns(bv), out_shape, q, k, v, b, states)


def _key_grads(config, q, k, v, b, do, states, d_states):
    """dq and dk, one program per (head, chunk, block of key columns)."""
    dk, dv, bk = q.shape[-1], v.shape[-1], config.block_k
    spec = _ChunkBlocks(config.chunk)
    in_specs = [spec.columns(bk), spec.columns(bk), spec.rows(dv), spec.gates(b, bk), spec.rows(dv),
                spec.state_keys(bk, dv), spec.state_keys(bk, dv)]
    kernel = _key_grads_scalar_kernel if b.shape[-1] == 1 else _key_grads_kernel
    out_shape = [jax.ShapeDtypeStruct(q.shape, jnp.float32)] * 2
    return _parallel(kernel, "gla_key_grads", config, dk // bk, in_specs, [spec.columns(bk)] * 2, out_shape,
                     q, k, v, b, do, states, d_states)


def _value_grads(config, q, k, b, do, d_states):
    """dv, one program per (head, chunk, block of value columns)."""
    dk, dv, bv = q.shape[-1], do.shape[-1], config.block_v
    spec = _ChunkBlocks(config.chunk)
    in_specs = [spec.rows(dk), spec.rows(dk), spec.rows(b.shape[-1]), spec.columns(bv), spec.state_values(dk, bv)]
    kernel = _value_grads_scalar_kernel if b.shape[-1] == 1 else _value_grads_kernel
    out_shape = jax.ShapeDtypeStruct(do.shape, jnp.float32)
    return _parallel(kernel, "gla_value_grads", config, dv // bv, in_specs, spec.columns(bv), out_shape,
                     q, k, b, do, d_states)


# ----------------------------------------------------------------------------- kernels


def _states_kernel(chunk, chunks, k_ref, v_ref, b_ref, s0_ref, states_ref, final_ref):
    dtype = k_ref.dtype

    def step(n, s):
        start = pl.multiple_of(n * chunk, chunk)
        states_ref[n] = s
        rows = pl.ds(start, chunk)
        b, total = b_ref[rows, :], b_ref[pl.ds(start + chunk - 1, 1), :]  # (C, bk), (1, bk)
        keys = k_ref[rows, :].astype(jnp.float32) * jnp.exp(total - b)  # decayed to the chunk's end
        return jnp.exp(total).T * s + dot(keys, v_ref[rows, :], dtype, AT_B)

    final_ref[...] = lax.fori_loop(0, chunks, step, s0_ref[...])


def _state_grads_kernel(chunk, chunks, q_ref, do_ref, b_ref, d_final_ref, d_states_ref, d_s0_ref):
    dtype = q_ref.dtype

    def step(i, ds):  # ds: cotangent of the state after chunk n
        n = chunks - 1 - i
        start = pl.multiple_of(n * chunk, chunk)
        d_states_ref[n] = ds
        rows = pl.ds(start, chunk)
        b, total = b_ref[rows, :], b_ref[pl.ds(start + chunk - 1, 1), :]
        queries = q_ref[rows, :].astype(jnp.float32) * jnp.exp(b)  # decayed from the chunk's start
        return jnp.exp(total).T * ds + dot(queries, do_ref[rows, :], dtype, AT_B)

    d_s0_ref[...] = lax.fori_loop(0, chunks, step, d_final_ref[...])


class _SubBlock:
    """Rows [I c, (I + 1) c) of a chunk, their gates, and the gate just before them (r)."""

    def __init__(self, b_ref, index, size):
        self.rows = pl.ds(index * size, size)
        self.b = b_ref[self.rows, :]
        self.r = b_ref[pl.ds(index * size - 1, 1), :] if index else jnp.zeros((1, b_ref.shape[1]), jnp.float32)
        self.size = size

    def pair_decay(self, b_ref, j):
        """exp(b_i - b_j) for the rows i of this sub-block against its own row j; 0 where i < j."""
        row = self.rows.start + j
        later = lax.broadcasted_iota(jnp.int32, (self.size, 1), 0) >= j
        return jnp.exp(jnp.where(later, self.b - b_ref[pl.ds(row, 1), :], -jnp.inf)), pl.ds(row, 1)

    def one_hot(self, j):
        return (lax.broadcasted_iota(jnp.int32, (self.size, 1), 0) == j).astype(jnp.float32)


def _over_keys(sub, body, init):
    """``body(j, carry)`` for the keys j of a diagonal sub-block, as a loop rather than unrolled:
    unrolling every key of every sub-block made Triton compile the kernels for minutes."""
    return lax.fori_loop(0, sub, body, init)


def _outputs_kernel(chunk, sub, q_ref, k_ref, v_ref, b_ref, s_ref, o_ref):
    dtype = q_ref.dtype
    blocks = [_SubBlock(b_ref, i, sub) for i in range(chunk // sub)]
    for i, late in enumerate(blocks):
        q = q_ref[late.rows, :].astype(jnp.float32)
        out = dot(q * jnp.exp(late.b), s_ref[...], dtype)  # from the state before the chunk
        q_hat = q * jnp.exp(late.b - late.r)
        for early in blocks[:i]:
            k_hat = k_ref[early.rows, :].astype(jnp.float32) * jnp.exp(late.r - early.b)
            out += dot(dot(q_hat, k_hat, dtype, A_BT), v_ref[early.rows, :], dtype)

        def diagonal(j, out, late=late, q=q):  # the diagonal sub-block, one key at a time
            decay, row = late.pair_decay(b_ref, j)
            weight = jnp.sum(q * k_ref[row, :].astype(jnp.float32) * decay, axis=1, keepdims=True)  # (c, 1)
            return out + weight * v_ref[row, :].astype(jnp.float32)

        o_ref[late.rows, :] = _over_keys(sub, diagonal, out)


def _f32(ref, rows):
    return ref[rows, :].astype(jnp.float32)


def _key_grads_kernel(chunk, sub, q_ref, k_ref, v_ref, b_ref, do_ref, s_ref, ds_ref, dq_ref, dk_ref):
    """dq, dk of one chunk in one block of key columns. With A_ij = q_i exp(b_i - b_j) . k_j and
    D_ij = do_i . v_j (j <= i): dq_i = sum_j D_ij k_j exp(b_i - b_j), dk_j = sum_i D_ij q_i exp(b_i - b_j),
    plus the state terms: dq from S_n, dk from dS_{n+1} (the state after the chunk). The decays act
    column by column, so a block of key columns needs only its own columns of q, k and the gates."""
    dtype = q_ref.dtype
    blocks = [_SubBlock(b_ref, i, sub) for i in range(chunk // sub)]
    total = b_ref[pl.ds(chunk - 1, 1), :]
    dq = [dot(_f32(do_ref, block.rows), s_ref[...], dtype, A_BT) * jnp.exp(block.b) for block in blocks]
    dk = [dot(_f32(v_ref, block.rows), ds_ref[...], dtype, A_BT) * jnp.exp(total - block.b) for block in blocks]
    for i, late in enumerate(blocks):
        q, do = _f32(q_ref, late.rows), _f32(do_ref, late.rows)
        from_r = jnp.exp(late.b - late.r)  # decay from just before sub-block I to each of its rows
        q_hat = q * from_r
        for j, early in enumerate(blocks[:i]):
            to_r = jnp.exp(late.r - early.b)  # decay from each row of J to just before I
            d_scores = dot(do, _f32(v_ref, early.rows), dtype, A_BT)  # D over (I, J)
            dq[i] += dot(d_scores, _f32(k_ref, early.rows) * to_r, dtype) * from_r
            dk[j] += dot(d_scores, q_hat, dtype, AT_B) * to_r

        def diagonal(j, grads, late=late, q=q, do=do):  # the diagonal sub-block, one key at a time
            gq, gk = grads
            decay, row = late.pair_decay(b_ref, j)
            d_col = jnp.sum(do * _f32(v_ref, row), axis=1, keepdims=True)  # D_ij for the rows i
            return (gq + d_col * _f32(k_ref, row) * decay,
                    gk + late.one_hot(j) * jnp.sum(d_col * q * decay, axis=0, keepdims=True))  # key j's row

        dq[i], dk[i] = _over_keys(sub, diagonal, (dq[i], dk[i]))
    for block, gq, gk in zip(blocks, dq, dk):
        dq_ref[block.rows, :], dk_ref[block.rows, :] = gq, gk


def _value_grads_kernel(chunk, sub, q_ref, k_ref, b_ref, do_ref, ds_ref, dv_ref):
    """dv of one chunk in one block of value columns: dv_j = sum_{i >= j} A_ij do_i, plus
    k_j exp(B - b_j) dS_{n+1}. A needs every key column; do and dS only this block's values."""
    dtype = q_ref.dtype
    blocks = [_SubBlock(b_ref, i, sub) for i in range(chunk // sub)]
    total = b_ref[pl.ds(chunk - 1, 1), :]
    dv = [dot(_f32(k_ref, block.rows) * jnp.exp(total - block.b), ds_ref[...], dtype) for block in blocks]
    for i, late in enumerate(blocks):
        q, do = _f32(q_ref, late.rows), _f32(do_ref, late.rows)
        q_hat = q * jnp.exp(late.b - late.r)
        for j, early in enumerate(blocks[:i]):
            k_hat = _f32(k_ref, early.rows) * jnp.exp(late.r - early.b)
            dv[j] += dot(dot(q_hat, k_hat, dtype, A_BT), do, dtype, AT_B)  # A over (I, J), transposed

        def diagonal(j, gv, late=late, q=q, do=do):
            decay, row = late.pair_decay(b_ref, j)
            a_col = jnp.sum(q * _f32(k_ref, row) * decay, axis=1, keepdims=True)  # A_ij for the rows i
            return gv + late.one_hot(j) * jnp.sum(a_col * do, axis=0, keepdims=True)

        dv[i] = _over_keys(sub, diagonal, dv[i])
    for block, gv in zip(blocks, dv):
        dv_ref[block.rows, :] = gv


# One gate per head (simple GLA, RetNet, plain linear attention): the decay between query i and
# key j is one number, so the whole chunk is matmuls with a [C, C] decay matrix, no sub-blocks.


def _decay_matrix(b):
    """exp(b_i - b_j) for j <= i, else 0: b is the chunk's (C, 1) cumulative gate."""
    size = b.shape[0]
    later = lax.broadcasted_iota(jnp.int32, (size, size), 0) >= lax.broadcasted_iota(jnp.int32, (size, size), 1)
    return jnp.exp(jnp.where(later, b - b.T, -jnp.inf))


def _outputs_scalar_kernel(chunk, sub, q_ref, k_ref, v_ref, b_ref, s_ref, o_ref):
    dtype = q_ref.dtype
    q, b = q_ref[...].astype(jnp.float32), b_ref[...]
    scores = dot(q, k_ref[...], dtype, A_BT) * _decay_matrix(b)
    o_ref[...] = dot(q * jnp.exp(b), s_ref[...], dtype) + dot(scores, v_ref[...], dtype)


def _key_grads_scalar_kernel(chunk, sub, q_ref, k_ref, v_ref, b_ref, do_ref, s_ref, ds_ref, dq_ref, dk_ref):
    """The per-dimension kernels' formulas with D = (do v^T) * decay, in one block of key columns."""
    dtype = q_ref.dtype
    q, k, v, do, b = (ref[...].astype(jnp.float32) for ref in (q_ref, k_ref, v_ref, do_ref, b_ref))
    decay, to_end = _decay_matrix(b), jnp.exp(b_ref[pl.ds(chunk - 1, 1), :] - b)
    d_scores = dot(do, v, dtype, A_BT) * decay
    dq_ref[...] = dot(d_scores, k, dtype) + dot(do, s_ref[...], dtype, A_BT) * jnp.exp(b)
    dk_ref[...] = dot(d_scores, q, dtype, AT_B) + dot(v, ds_ref[...], dtype, A_BT) * to_end


def _value_grads_scalar_kernel(chunk, sub, q_ref, k_ref, b_ref, do_ref, ds_ref, dv_ref):
    """dv with A = (q k^T) * decay, in one block of value columns."""
    dtype = q_ref.dtype
    q, k, do, b = (ref[...].astype(jnp.float32) for ref in (q_ref, k_ref, do_ref, b_ref))
    decay, to_end = _decay_matrix(b), jnp.exp(b_ref[pl.ds(chunk - 1, 1), :] - b)
    dv_ref[...] = dot(dot(q, k, dtype, A_BT) * decay, do, dtype, AT_B) + dot(k * to_end, ds_ref[...], dtype)
