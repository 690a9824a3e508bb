"""Chunked gated linear attention as Pallas kernels, forward and backward (``gla(method="pallas")``).

Computes ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t`` for log gates ``g`` per key
dimension or one per head (simple GLA, RetNet; plain linear attention has g = 0). Heads
are laid out ``[BH, T, D]``; T is padded to whole chunks of C steps and D to a power of two (zero
queries, keys, values and gates change nothing).

Four kernels, in the shape of the chunked XLA form:

- ``states``  (sequential over chunks, parallel over heads and state blocks): the state before
  every chunk, ``S_{n+1} = exp(B_n) S_n + (k exp(B_n - b))^T v``, with b the gate's cumulative sum
  inside the chunk and B_n its last row;
- ``outputs`` (parallel over chunks): ``o = (q exp(b)) S_n`` plus the causal sum inside the chunk;
- ``state_grads`` (sequential, in reverse): the state cotangents ``dS_n = exp(B_n) dS_{n+1} +
  (q exp(b))^T do``;
- ``input_grads`` (parallel over chunks): dq, dk, dv of each chunk from S_n and dS_{n+1}.

The gate cotangent needs no kernel: the loss sees g only through q_t exp(G_t) and k_t exp(-G_t)
(G the running sum of g) and through exp(G_T) in the final state, so
``dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + rowsum(dS_T * S_T)``, a reverse cumsum in XLA.

Inside a chunk the causal sum runs over sub-blocks of c steps. For sub-blocks I > J the decay
from key j to query i is split at the start of I: ``q_i exp(b_i - r) . k_j exp(r - b_j)`` with r
the cumulative gate just before I, both factors <= 1, so that part is a matmul that cannot
overflow however strongly the gates decay. On the diagonal sub-blocks the decay is taken per pair
(one key row at a time, exponents masked to <= 0 before exp). Exponents are never positive. With
one gate per head the decay between two steps is one number, so the whole chunk is matmuls with a
[C, C] decay matrix (``_outputs_scalar_kernel``, ``_input_grads_scalar_kernel``).

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

from lmzoo.ops.pallas.common import launch, pad_axis, resolve_platform, round_up


@functools.partial(jax.jit, static_argnames=("chunk_size", "sub_size", "block", "platform"))
def gla_pallas(q, k, v, log_g, s0, *, chunk_size=64, sub_size=None, block=None, platform=None):
    """q (scaled), k [B,T,H,Dk]; v [B,T,H,Dv]; log_g [B,T,H,Dk|1] float32; s0 [B,H,Dk,Dv] float32.

    Returns (o [B,T,H,Dv] float32, S_T [B,H,Dk,Dv] float32). ``chunk_size`` must be a multiple of
    ``sub_size`` (>= 16 for GPU matmuls); ``block`` splits the state's Dk and Dv across programs in
    the sequential kernels (default: 64 on GPU, whole elsewhere).
    """
    sub_size = sub_size or (16 if chunk_size % 16 == 0 else chunk_size)  # 16 rows: the smallest GPU matmul
    if chunk_size % sub_size or sub_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a multiple of sub_size={sub_size}")
    platform = resolve_platform(platform)
    if platform == "gpu" and sub_size < 16:
        raise ValueError(f"chunk_size={chunk_size}: GPU matmuls need sub-blocks of 16 rows (use a multiple of 16)")
    batch, length, heads, d_key = k.shape
    d_value = v.shape[-1]
    padded = round_up(length, chunk_size)
    dk, dv = (max(16, pl.next_power_of_2(d)) for d in (d_key, d_value))
    log_g = log_g.astype(jnp.float32)
    gate_width = dk if log_g.shape[-1] > 1 else 1  # one gate per head stays one column

    def head_major(x, width):  # [B, T, H, D] -> [BH, T', D']
        x = x.transpose(0, 2, 1, 3).reshape(batch * heads, length, -1)
        return pad_axis(pad_axis(x, 1, padded), 2, width)

    s0 = pad_axis(pad_axis(s0.reshape(batch * heads, d_key, d_value), 1, dk), 2, dv)
    config = _Config(chunk_size, sub_size, _block(block, platform, dk), _block(block, platform, dv), platform)
    o, final = _gla(config, head_major(q, dk), head_major(k, dk), head_major(v, dv), head_major(log_g, gate_width), s0)
    o = o[:, :length, :d_value].reshape(batch, heads, length, d_value).transpose(0, 2, 1, 3)
    return o, final[:, :d_key, :d_value].reshape(batch, heads, d_key, d_value)


def _block(block, platform, width):
    size = block or (64 if platform == "gpu" else width)
    return min(size, width)


class _Config(NamedTuple):
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
    b = _chunk_cumsum(g, config.chunk)
    states, final = _states(config, k, v, b, s0)
    return _outputs(config, q, k, v, b, states), final, (q, k, v, b, states, final)


def _gla_fwd(config, q, k, v, g, s0):
    o, final, residuals = _forward(config, q, k, v, g, s0)
    return (o, final), residuals


def _gla_bwd(config, residuals, cotangents):
    q, k, v, b, states, final = residuals
    do, d_final = cotangents
    d_states, d_s0 = _state_grads(config, q, b, do, d_final)
    dq, dk, dv = _input_grads(config, q, k, v, b, do, states, d_states)
    # dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + the final state's own dependence on every gate
    through_qk = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk
    through_final = jnp.sum(d_final * final, axis=-1)[:, None, :]  # [BH, 1, Dk]
    if b.shape[-1] == 1:  # one gate per head: it multiplies every key dimension
        through_qk, through_final = (x.sum(axis=-1, keepdims=True) for x in (through_qk, through_final))
    dg = lax.cumsum(through_qk, axis=1, reverse=True) + through_final
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg, d_s0


_gla.defvjp(_gla_fwd, _gla_bwd)


def _chunk_cumsum(g, chunk):
    """Cumulative log gate from each chunk's start (inclusive), float32 [BH, T, D]."""
    heads, length, width = g.shape
    return jnp.cumsum(g.reshape(heads, length // chunk, chunk, width), axis=2).reshape(g.shape)


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
        out_shape=[jax.ShapeDtypeStruct((heads, chunks, dk, dv), jnp.float32), jax.ShapeDtypeStruct(start.shape, jnp.float32)],
        name=name,
    )(keys, values, b, start)


def _gates_along_t(b, block_k):
    """The whole sequence of a head's gates: the state block's key columns, or the one column."""
    width = b.shape[-1]
    if width == 1:
        return pl.BlockSpec((None, b.shape[1], 1), lambda h, i, j: (h, 0, 0))
    return pl.BlockSpec((None, b.shape[1], block_k), lambda h, i, j: (h, 0, i))


def _chunk_spec(chunk, width):
    return pl.BlockSpec((None, chunk, width), lambda h, n: (h, n, 0))


def _outputs(config, q, k, v, b, states):
    heads, length, dk = q.shape
    dv, chunks = v.shape[-1], length // config.chunk
    c = config.chunk
    return launch(
        functools.partial(_outputs_scalar_kernel if b.shape[-1] == 1 else _outputs_kernel, c, config.sub),
        platform=config.platform,
        grid=(heads, chunks),
        in_specs=[_chunk_spec(c, dk), _chunk_spec(c, dk), _chunk_spec(c, dv), _chunk_spec(c, b.shape[-1]), _state_spec(dk, dv)],
        out_specs=_chunk_spec(c, dv),
        out_shape=jax.ShapeDtypeStruct((heads, length, dv), jnp.float32),
        name="gla_outputs",
    )(q, k, v, b, states)


def _input_grads(config, q, k, v, b, do, states, d_states):
    heads, length, dk = q.shape
    dv, chunks = v.shape[-1], length // config.chunk
    c = config.chunk
    key_spec, value_spec = _chunk_spec(c, dk), _chunk_spec(c, dv)
    return launch(
        functools.partial(_input_grads_scalar_kernel if b.shape[-1] == 1 else _input_grads_kernel, c, config.sub),
        platform=config.platform,
        grid=(heads, chunks),
        in_specs=[key_spec, key_spec, value_spec, _chunk_spec(c, b.shape[-1]), value_spec, _state_spec(dk, dv), _state_spec(dk, dv)],
        out_specs=[key_spec, key_spec, value_spec],
        out_shape=[jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v)],
        name="gla_input_grads",
    )(q, k, v, b, do, states, d_states)


def _state_spec(dk, dv):
    return pl.BlockSpec((None, None, dk, dv), lambda h, n: (h, n, 0, 0))


# ----------------------------------------------------------------------------- kernels


def _dot(a, b, dtype, contract=((1,), (0,))):
    """a . b contracting the given axes, operands in ``dtype`` and a float32 result."""
    precision = lax.Precision.HIGHEST if dtype == jnp.float32 else None
    return lax.dot_general(
        a.astype(dtype), b.astype(dtype), (contract, ((), ())), precision=precision, preferred_element_type=jnp.float32
    )


_AT_B = ((0,), (0,))  # a^T b
_A_BT = ((1,), (1,))  # a b^T


def _states_kernel(chunk, chunks, k_ref, v_ref, b_ref, s0_ref, states_ref, final_ref):
    dtype = k_ref.dtype

    def step(n, s):
        start = pl.multiple_of(n * chunk, chunk)
        states_ref[n] = s
        rows = pl.ds(start, chunk)
        b, total = b_ref[rows, :], b_ref[pl.ds(start + chunk - 1, 1), :]  # (C, bk), (1, bk)
        keys = k_ref[rows, :].astype(jnp.float32) * jnp.exp(total - b)  # decayed to the chunk's end
        return jnp.exp(total).T * s + _dot(keys, v_ref[rows, :], dtype, _AT_B)

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
        return jnp.exp(total).T * ds + _dot(queries, do_ref[rows, :], dtype, _AT_B)

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
        out = _dot(q * jnp.exp(late.b), s_ref[...], dtype)  # from the state before the chunk
        q_hat = q * jnp.exp(late.b - late.r)
        for early in blocks[:i]:
            k_hat = k_ref[early.rows, :].astype(jnp.float32) * jnp.exp(late.r - early.b)
            out += _dot(_dot(q_hat, k_hat, dtype, _A_BT), v_ref[early.rows, :], dtype)

        def diagonal(j, out, late=late, q=q):  # the diagonal sub-block, one key at a time
            decay, row = late.pair_decay(b_ref, j)
            weight = jnp.sum(q * k_ref[row, :].astype(jnp.float32) * decay, axis=1, keepdims=True)  # (c, 1)
            return out + weight * v_ref[row, :].astype(jnp.float32)

        o_ref[late.rows, :] = _over_keys(sub, diagonal, out)


def _input_grads_kernel(chunk, sub, q_ref, k_ref, v_ref, b_ref, do_ref, s_ref, ds_ref, dq_ref, dk_ref, dv_ref):
    """dq, dk, dv of one chunk. With A_ij = q_i exp(b_i - b_j) . k_j and D_ij = do_i . v_j (j <= i):
    dq_i = sum_j D_ij k_j exp(b_i - b_j),  dk_j = sum_i D_ij q_i exp(b_i - b_j),  dv_j = sum_i A_ij do_i,
    plus the state terms: dq from S_n, dk and dv from dS_{n+1} (the state after the chunk)."""
    dtype = q_ref.dtype
    blocks = [_SubBlock(b_ref, i, sub) for i in range(chunk // sub)]
    total = b_ref[pl.ds(chunk - 1, 1), :]
    f32 = lambda ref, rows: ref[rows, :].astype(jnp.float32)
    dq, dk, dv = [], [], []
    for block in blocks:
        to_end = jnp.exp(total - block.b)
        dq.append(_dot(f32(do_ref, block.rows), s_ref[...], dtype, _A_BT) * jnp.exp(block.b))
        dk.append(_dot(f32(v_ref, block.rows), ds_ref[...], dtype, _A_BT) * to_end)
        dv.append(_dot(f32(k_ref, block.rows) * to_end, ds_ref[...], dtype))
    for i, late in enumerate(blocks):
        q, do = f32(q_ref, late.rows), f32(do_ref, late.rows)
        from_r = jnp.exp(late.b - late.r)  # decay from just before sub-block I to each of its rows
        q_hat = q * from_r
        for j, early in enumerate(blocks[:i]):
            to_r = jnp.exp(late.r - early.b)  # decay from each row of J to just before I
            k_hat = f32(k_ref, early.rows) * to_r
            scores = _dot(q_hat, k_hat, dtype, _A_BT)  # A over (I, J)
            d_scores = _dot(do, f32(v_ref, early.rows), dtype, _A_BT)  # D over (I, J)
            dq[i] += _dot(d_scores, k_hat, dtype) * from_r
            dk[j] += _dot(d_scores, q_hat, dtype, _AT_B) * to_r
            dv[j] += _dot(scores, do, dtype, _AT_B)

        def diagonal(j, grads, late=late, q=q, do=do):  # the diagonal sub-block, one key at a time
            gq, gk, gv = grads
            decay, row = late.pair_decay(b_ref, j)
            k_j, v_j = f32(k_ref, row), f32(v_ref, row)
            d_col = jnp.sum(do * v_j, axis=1, keepdims=True)  # D_ij for the rows i
            a_col = jnp.sum(q * k_j * decay, axis=1, keepdims=True)  # A_ij
            row_j = late.one_hot(j)  # places key j's (1, D) row in the sub-block
            return (gq + d_col * k_j * decay,
                    gk + row_j * jnp.sum(d_col * q * decay, axis=0, keepdims=True),
                    gv + row_j * jnp.sum(a_col * do, axis=0, keepdims=True))

        dq[i], dk[i], dv[i] = _over_keys(sub, diagonal, (dq[i], dk[i], dv[i]))
    for block, gq, gk, gv in zip(blocks, dq, dk, dv):
        dq_ref[block.rows, :], dk_ref[block.rows, :], dv_ref[block.rows, :] = gq, gk, gv


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
    scores = _dot(q, k_ref[...], dtype, _A_BT) * _decay_matrix(b)
    o_ref[...] = _dot(q * jnp.exp(b), s_ref[...], dtype) + _dot(scores, v_ref[...], dtype)


def _input_grads_scalar_kernel(chunk, sub, q_ref, k_ref, v_ref, b_ref, do_ref, s_ref, ds_ref, dq_ref, dk_ref, dv_ref):
    """The per-dimension kernel's formulas with A = (q k^T) * decay and D = (do v^T) * decay."""
    dtype = q_ref.dtype
    q, k, v, do, b = (ref[...].astype(jnp.float32) for ref in (q_ref, k_ref, v_ref, do_ref, b_ref))
    decay, to_end = _decay_matrix(b), jnp.exp(b_ref[pl.ds(chunk - 1, 1), :] - b)
    scores, d_scores = _dot(q, k, dtype, _A_BT) * decay, _dot(do, v, dtype, _A_BT) * decay
    dq_ref[...] = _dot(d_scores, k, dtype) + _dot(do, s_ref[...], dtype, _A_BT) * jnp.exp(b)
    dk_ref[...] = _dot(d_scores, q, dtype, _AT_B) + _dot(v, ds_ref[...], dtype, _A_BT) * to_end
    dv_ref[...] = _dot(scores, do, dtype, _AT_B) + _dot(k * to_end, ds_ref[...], dtype)
