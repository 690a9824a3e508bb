"""Mamba-1's selective scan as Pallas kernels, forward and backward, tied by ``jax.custom_vjp``.

Per channel d and state entry n (channel d reads group g(d) = d // (D / G) of B and C):

    h_t[d,n] = exp(Δ_t[d] A[d,n]) h_{t-1}[d,n] + Δ_t[d] B_t[g(d),n] u_t[d]      y_t[d] = Σ_n C_t[g(d),n] h_t[d,n]

The inputs are float32 and already prepared by ``lmzoo.ops.selective_scan`` (Δ after its bias and
softplus); the D skip and the z gate stay there too, in XLA. Returns y ``[B,T,D]`` and h_T ``[B,D,N]``.

Documents: ``starts [B,T]`` (True where a document begins) become a keep factor per sequence and
step, 0 at a start and 1 elsewhere, that multiplies the decay exp(Δ_t A): the state is forgotten
exactly, for one multiply a step. Without ``starts`` the kernels are traced without that input,
exactly as before.

Layout. The grid is (sequence, channel block): one program runs the whole recurrence of
``block_channels`` (bd) channels of one sequence, a ``lax.fori_loop`` over chunks of ``chunk_size``
steps whose steps are unrolled. The wrapper lays the arrays out block-major, so that every block
is the full last two dimensions of its array: u and Δ as [B, blocks, T, bd] (one step is a row
(1, bd)), B and C as [B, G, N, T] (one step is a column (N, 1)), A and states as [.., blocks, N, bd].
With the state held as (N, bd), a step is a column times a row and y_t = Σ_n C_t h_t is a sum over
axis 0: nothing is transposed or sliced inside the kernels. Padding: channels per group up to a
multiple of bd (a block never straddles two groups; padded channels have u = Δ = 0), N up to a
power of two (A = B = C = 0 there: those entries stay 0), T up to a multiple of the chunk
(u = Δ = 0: decay 1 and no input, the state passes through unchanged; their keep factor is 1).
The keep factors are laid out like B and C, as [B, 1, T'] (one step is a (1, 1) column).

Backward. The forward also writes the state entering every chunk ([B, blocks, chunks, N, bd],
O(T D N / L) memory instead of O(T D N)). The backward walks the chunks in reverse: it recomputes
the chunk's L states from its boundary state (kept live as L tiles), then walks the steps in
reverse carrying dL/dh_t, seeded with the final state's cotangent; what is left at the start is
dL/dh_0. dB and dC sum over channels: each program writes its block's partial sums (dA: its
sequence's) and XLA adds the blocks of a group (the sequences).

Platforms (``lmzoo.ops.pallas.common``): "gpu" lowers through Triton, which needs every loaded
tile to be a power of two in size (hence bd and N padded) and cannot slice values, only refs;
"tpu" lowers through Mosaic, which accepts any size because blocks keep full last two dims; "cpu"
runs the same kernels in interpret mode.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from lmzoo.ops.pallas.common import launch, pad_axis, resolve_platform, round_up


def selective_scan_pallas(u, delta, A, B, C, h0, *, starts=None, chunk_size=16, block_channels=64, platform=None):
    """u, delta (effective Δ) ``[B,T,D]``; A ``[D,N]``; B, C ``[B,T,G,N]``; h0 ``[B,D,N]``, all float32;
    ``starts [B,T]`` bool or None: where the state restarts from zero (document starts).

    Returns ``(y [B,T,D], h_T [B,D,N])`` in float32; differentiable in all six float inputs.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be positive")
    if block_channels < 1 or block_channels & (block_channels - 1):
        raise ValueError(f"block_channels={block_channels} must be a power of two")
    _, length, channels = u.shape
    _, _, groups, n = B.shape
    if channels % groups:
        raise ValueError(f"B/C have {groups} groups, which does not divide the {channels} channels")
    layout = Layout(length, channels, groups, n, chunk_size, block_channels)
    u, delta = (layout.pack_sequence(x.astype(jnp.float32)) for x in (u, delta))
    B, C = (layout.pack_shared(x.astype(jnp.float32)) for x in (B, C))
    A, h0 = (layout.pack_state(x.astype(jnp.float32)) for x in (A, h0))
    keep = None if starts is None else layout.pack_keep(starts)
    y, h_last = _scan(u, delta, A, B, C, h0, keep, chunk_size, resolve_platform(platform))
    return layout.unpack_sequence(y), layout.unpack_state(h_last)


@dataclass(frozen=True)
class Layout:
    """Between the op's arrays and the kernels' block-major, padded ones (plain XLA, differentiated by JAX)."""

    length: int
    channels: int
    groups: int
    n: int
    chunk: int
    max_block: int

    @property
    def per_group(self) -> int:
        return self.channels // self.groups

    @property
    def block(self) -> int:  # bd: a power of two, no wider than a group needs
        return min(self.max_block, pl.next_power_of_2(self.per_group))

    @property
    def padded_group(self) -> int:
        return round_up(self.per_group, self.block)

    @property
    def padded_length(self) -> int:
        return round_up(self.length, self.chunk)

    @property
    def padded_n(self) -> int:
        return pl.next_power_of_2(self.n)

    @property
    def blocks(self) -> int:
        return self.groups * self.padded_group // self.block

    def pack_sequence(self, x):  # [B,T,D] -> [B, blocks, T', bd]
        x = x.reshape(*x.shape[:2], self.groups, self.per_group)
        x = pad_axis(pad_axis(x, 1, self.padded_length), 3, self.padded_group)
        return x.reshape(x.shape[0], self.padded_length, self.blocks, self.block).swapaxes(1, 2)

    def unpack_sequence(self, x):  # [B, blocks, T', bd] -> [B,T,D]
        x = x.swapaxes(1, 2).reshape(x.shape[0], self.padded_length, self.groups, self.padded_group)
        return x[:, : self.length, :, : self.per_group].reshape(x.shape[0], self.length, self.channels)

    def pack_state(self, x):  # [..., D, N] -> [..., blocks, N', bd]
        x = x.reshape(*x.shape[:-2], self.groups, self.per_group, self.n)
        x = pad_axis(pad_axis(x, -2, self.padded_group), -1, self.padded_n)
        return x.reshape(*x.shape[:-3], self.blocks, self.block, self.padded_n).swapaxes(-1, -2)

    def unpack_state(self, x):  # [..., blocks, N', bd] -> [..., D, N]
        x = x.swapaxes(-1, -2).reshape(*x.shape[:-3], self.groups, self.padded_group, self.padded_n)
        return x[..., : self.per_group, : self.n].reshape(*x.shape[:-3], self.channels, self.n)

    def pack_shared(self, x):  # B or C [B,T,G,N] -> [B, G, N', T']
        x = pad_axis(pad_axis(x, 1, self.padded_length), 3, self.padded_n)
        return x.transpose(0, 2, 3, 1)

    def pack_keep(self, starts):  # [B,T] bool -> keep factors [B, 1, T'] float32 (padded steps start nothing)
        return 1.0 - pad_axis(starts.astype(jnp.float32), 1, self.padded_length)[:, None, :]


# ----------------------------------------------------------------------------- custom_vjp over the packed arrays
# The rule covers the two kernels only; the padding and transposes around them are plain XLA,
# which JAX differentiates (cotangents are sliced back and padded entries dropped). ``keep`` is
# None (no documents) or the keep factors, which come from integer ids: their cotangent is zero.


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _scan(u, delta, A, B, C, h0, keep, chunk, platform):
    y, h_last, _ = _forward(u, delta, A, B, C, h0, keep, chunk, platform)
    return y, h_last


def _scan_fwd(u, delta, A, B, C, h0, keep, chunk, platform):
    y, h_last, boundaries = _forward(u, delta, A, B, C, h0, keep, chunk, platform)
    return (y, h_last), (u, delta, A, B, C, keep, boundaries)


def _scan_bwd(chunk, platform, residuals, cotangents):
    u, delta, A, B, C, keep, boundaries = residuals
    dy, dh_last = cotangents
    du, ddelta, dA, dB, dC, dh0 = _backward(u, delta, A, B, C, keep, boundaries, dy, dh_last, chunk, platform)
    batch, blocks, n, length = dB.shape
    groups = B.shape[1]

    def per_group(partials):  # [B, blocks, N', T'] -> [B, G, N', T']: add the blocks of each group
        return partials.reshape(batch, groups, blocks // groups, n, length).sum(axis=2)

    dkeep = None if keep is None else jnp.zeros_like(keep)
    return du, ddelta, dA.sum(axis=0), per_group(dB), per_group(dC), dh0, dkeep


_scan.defvjp(_scan_fwd, _scan_bwd)


# ----------------------------------------------------------------------------- launches


def _specs(u, B, chunks):
    """BlockSpecs on the (sequence i, channel block j) grid; every block is its array's full last two dims.

    Block j reads group j // per_group of B and C: ``lax.div`` (j >= 0) rather than ``//``, whose
    floor semantics lower through ``sign``, which Mosaic lowers only on a known TPU generation.
    """
    _, blocks, length, width = u.shape
    n, per_group = B.shape[2], blocks // B.shape[1]
    return {
        "sequence": pl.BlockSpec((None, None, length, width), lambda i, j: (i, j, 0, 0)),
        "shared": pl.BlockSpec((None, None, n, length), lambda i, j: (i, lax.div(j, per_group), 0, 0)),
        "block_partial": pl.BlockSpec((None, None, n, length), lambda i, j: (i, j, 0, 0)),
        "A": pl.BlockSpec((None, n, width), lambda i, j: (j, 0, 0)),
        "state": pl.BlockSpec((None, None, n, width), lambda i, j: (i, j, 0, 0)),
        "boundaries": pl.BlockSpec((None, None, chunks, n, width), lambda i, j: (i, j, 0, 0, 0)),
        "keep": pl.BlockSpec((None, 1, length), lambda i, j: (i, 0, 0)),
    }


def _with_keep(specs, arrays, keep, spec):
    """The kernels' inputs, with the keep factors last when there are documents."""
    if keep is None:
        return specs, arrays
    return [*specs, spec["keep"]], [*arrays, keep]


def _forward(u, delta, A, B, C, h0, keep, chunk, platform):
    batch, blocks, length, width = u.shape
    chunks, n = length // chunk, B.shape[2]
    spec = _specs(u, B, chunks)
    state = jax.ShapeDtypeStruct(h0.shape, jnp.float32)
    in_specs, inputs = _with_keep(
        [spec["sequence"], spec["sequence"], spec["A"], spec["shared"], spec["shared"], spec["state"]],
        [u, delta, A, B, C, h0], keep, spec,
    )
    return launch(
        functools.partial(_forward_kernel, chunk=chunk, resets=keep is not None),
        platform=platform,
        grid=(batch, blocks),
        in_specs=in_specs,
        out_specs=[spec["sequence"], spec["state"], spec["boundaries"]],
        out_shape=[
            jax.ShapeDtypeStruct(u.shape, jnp.float32),
            state,
            jax.ShapeDtypeStruct((batch, blocks, chunks, n, width), jnp.float32),
        ],
        name="selective_scan_forward",
    )(*inputs)


def _backward(u, delta, A, B, C, keep, boundaries, dy, dh_last, chunk, platform):
    batch, blocks, length, width = u.shape
    n = B.shape[2]
    spec = _specs(u, B, boundaries.shape[2])
    sequence = jax.ShapeDtypeStruct(u.shape, jnp.float32)
    state = jax.ShapeDtypeStruct(dh_last.shape, jnp.float32)
    partial = jax.ShapeDtypeStruct((batch, blocks, n, length), jnp.float32)
    in_specs, inputs = _with_keep(
        [
            spec["sequence"], spec["sequence"], spec["A"], spec["shared"], spec["shared"],
            spec["boundaries"], spec["sequence"], spec["state"],
        ],
        [u, delta, A, B, C, boundaries, dy, dh_last], keep, spec,
    )
    return launch(
        functools.partial(_backward_kernel, chunk=chunk, resets=keep is not None),
        platform=platform,
        grid=(batch, blocks),
        in_specs=in_specs,
        out_specs=[
            spec["sequence"], spec["sequence"], spec["state"],
            spec["block_partial"], spec["block_partial"], spec["state"],
        ],
        # du, dΔ; dA for this sequence's block; dB, dC partial over the block's channels; dh0
        out_shape=[sequence, sequence, state, partial, partial, state],
        name="selective_scan_backward",
    )(*inputs)


# ----------------------------------------------------------------------------- kernels
# In a program: u, Δ, y refs (T', bd); B, C refs (N', T'); A and states (N', bd); keep (1, T') when
# there are documents. Step t reads the row t of u and Δ ((1, bd)) and the column t of B, C and keep
# ((N', 1), (1, 1)). The kernels take their inputs, then their outputs; with ``resets`` the keep
# factors are the last input.


def _step_inputs(t, u_ref, delta_ref, b_ref, c_ref):
    row = pl.ds(t, 1)
    return u_ref[row, :], delta_ref[row, :], b_ref[:, row], c_ref[:, row]


def _decay(t, delta_t, a, keep_ref):
    """exp(Δ_t A) (N', bd), times step t's keep factor when there are documents."""
    decay = jnp.exp(delta_t * a)
    return decay if keep_ref is None else decay * keep_ref[:, pl.ds(t, 1)]


def _split_refs(refs, inputs: int, resets: bool):
    """(the inputs without keep, keep_ref or None, the outputs)."""
    if resets:
        return refs[: inputs], refs[inputs], refs[inputs + 1 :]
    return refs[: inputs], None, refs[inputs:]


def _forward_kernel(*refs, chunk, resets):
    (u_ref, delta_ref, a_ref, b_ref, c_ref, h0_ref), keep_ref, (y_ref, h_last_ref, boundary_ref) = _split_refs(
        refs, 6, resets)
    a = a_ref[...]

    def one_chunk(i, h):
        boundary_ref[i] = h  # the state entering chunk i: where the backward restarts
        start = pl.multiple_of(i * chunk, chunk)
        for s in range(chunk):
            u_t, delta_t, b_t, c_t = _step_inputs(start + s, u_ref, delta_ref, b_ref, c_ref)
            h = _decay(start + s, delta_t, a, keep_ref) * h + b_t * (delta_t * u_t)
            y_ref[pl.ds(start + s, 1), :] = jnp.sum(c_t * h, axis=0, keepdims=True)
        return h

    h_last_ref[...] = lax.fori_loop(0, boundary_ref.shape[0], one_chunk, h0_ref[...])


def _backward_kernel(*refs, chunk, resets):
    inputs, keep_ref, outputs = _split_refs(refs, 8, resets)
    u_ref, delta_ref, a_ref, b_ref, c_ref, boundary_ref, dy_ref, dh_last_ref = inputs
    du_ref, ddelta_ref, da_ref, db_ref, dc_ref, dh0_ref = outputs
    # With decay_t = exp(Δ_t A) (times keep_t) and g = dL/dh_t (through y_t and through h_{t+1}):
    #   dL/dh_{t-1} = decay_t g;  dL/d(Δ_t A) = g decay_t h_{t-1} =: q
    #   dΔ_t = Σ_n (q A + g B_t u_t);  du_t = Δ_t Σ_n g B_t;  dA += q Δ_t
    #   dB_t = Σ_d g Δ_t u_t;  dC_t = Σ_d dy_t h_t  (sums over this block's channels only)
    a = a_ref[...]
    chunks = boundary_ref.shape[0]

    def one_chunk(k, carry):
        dh, da = carry  # dh: dL/dh at the end of this chunk, from the steps after it
        i = chunks - 1 - k
        start = pl.multiple_of(i * chunk, chunk)
        states = [boundary_ref[i]]  # recompute h_{start-1} .. h_{start+L-1} from the saved boundary
        for s in range(chunk):
            u_t, delta_t, b_t, _ = _step_inputs(start + s, u_ref, delta_ref, b_ref, c_ref)
            states.append(_decay(start + s, delta_t, a, keep_ref) * states[-1] + b_t * (delta_t * u_t))
        for s in reversed(range(chunk)):
            t, row = start + s, pl.ds(start + s, 1)
            u_t, delta_t, b_t, c_t = _step_inputs(t, u_ref, delta_ref, b_ref, c_ref)
            dy_t = dy_ref[row, :]
            decay = _decay(t, delta_t, a, keep_ref)
            dh = dh + c_t * dy_t
            q = dh * decay * states[s]
            dh_b = jnp.sum(dh * b_t, axis=0, keepdims=True)  # (1, bd)
            du_ref[row, :] = delta_t * dh_b
            ddelta_ref[row, :] = jnp.sum(q * a, axis=0, keepdims=True) + u_t * dh_b
            db_ref[:, row] = jnp.sum(dh * (delta_t * u_t), axis=1, keepdims=True)
            dc_ref[:, row] = jnp.sum(dy_t * states[s + 1], axis=1, keepdims=True)
            da = da + q * delta_t
            dh = decay * dh
        return dh, da

    dh, da = lax.fori_loop(0, chunks, one_chunk, (dh_last_ref[...], jnp.zeros_like(a)))
    dh0_ref[...] = dh
    da_ref[...] = da
