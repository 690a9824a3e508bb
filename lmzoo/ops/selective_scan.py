"""Mamba-1's selective scan in four agreeing forms, and its "hidden attention" matrix.

    h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t        y_t = C_t h_t + D u_t        y_t <- y_t * silu(z_t)

per channel d (``h_t[d]`` has N entries), with ``Δ = softplus(delta + delta_bias)`` when asked.
``method`` picks the form of the recurrence; all give the same numbers:
- "naive": the recurrence above written out step by step, each channel reading its group's B and
  C by index (the reference the other forms are tested against);
- "scan":  ``lax.scan`` over time, one token per step. It discretises inside the step, so no
  [B, T, D, N] tensor is built in the forward pass: the fastest form on a CPU, and the default;
- "assoc": ``lax.associative_scan`` over (decay, input) pairs: O(log T) depth, O(T D N) memory;
- "chunk": within a chunk of ``chunk_size`` tokens every state is a masked sum over earlier
  tokens weighted by exp(cum_t - cum_s) (cumulative log-decays, exponentiated only after the
  causal mask), and the state is carried recurrently from chunk to chunk. Each chunk is
  rematerialised in the backward pass, so memory stays O(T D N + L^2 D N) for chunk length L;
- "pallas": a Pallas kernel (``lmzoo.ops.pallas.selective_scan``) that runs the recurrence in
  on-chip memory, one program per sequence and block of channels, with a kernel for the backward
  pass that recomputes each chunk's states from the state saved at its start. Triton on a GPU,
  Mosaic on a TPU, interpret mode (slow, for checking) on a CPU. Δ's bias and softplus, D and the
  gate stay in XLA around it.

Documents: with ``segment_ids [B,T]`` (equal within a document) the state restarts at each segment
start, ``h_t = Δ_t B_t u_t`` there, as if every document ran alone from a zero state (the initial
state belongs to the first). Every form forgets exactly: "naive", "scan", "assoc" and "pallas"
multiply the decay by a keep factor (0 at a start, 1 elsewhere); "chunk" masks the pairs of steps in
two documents (rather than adding ``RESET_LOG_DECAY`` to its cumulative log decays, whose rounding
would then grow with the reset's 40 nats). Without ``segment_ids`` nothing of this is computed.

Negative eigenvalues (``negative_eigenvalues=True``, Grazzi et al., ICLR 2025, "Mamba [-1, 1]"): the transition
``exp(Δ_t A)`` becomes ``2 exp(Δ_t A) - 1``, in (-1, 1], the input term unchanged; the state may then flip sign
from step to step, which parity needs. Only the forms that multiply transitions carry it ("naive", "scan",
"assoc", and "auto", which runs "scan": no provider kernel has this transition); "chunk" (cumulative log decays)
and "pallas" (its kernel exponentiates inside) refuse it in one line, and so does "jla".
``selective_attention`` takes the same switch (its pairwise products then formed directly, not from log decays).

Axes: B batch, T time, D channels (Mamba's d_inner), N state size, G groups sharing B and C
(channel d reads group d // (D / G)). Everything is computed in float32; ``y`` is returned in
``u``'s dtype and the state ``[B, D, N]`` in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import Forms, causal_mask, check_form, same_segment, segment_starts, to_chunks
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.pallas.selective_scan import selective_scan_pallas

METHODS = Forms("naive", "scan", "assoc", "chunk", "pallas", *PROVIDER_FORMS)

STEP_FORM = "scan"  # the form mixers decode one token with (their ``step``): it discretises inside the step
SIGNED_FORMS = ("naive", "scan", "assoc")  # the forms that multiply transitions, so carry negative ones


def grouped(x: jax.Array, channels: int) -> jax.Array:
    """B or C, shared ``[B,T,N]`` or grouped ``[B,T,G,N]``, as ``[B,T,G,N]`` float32."""
    x = x.astype(jnp.float32)
    x = x[:, :, None, :] if x.ndim == 3 else x
    if channels % x.shape[2]:
        raise ValueError(f"B/C have {x.shape[2]} groups, which does not divide the {channels} channels")
    return x


def per_channel(x: jax.Array, channels: int) -> jax.Array:
    """Grouped ``[..., G, N]`` -> ``[..., D, N]``: channel d reads group d // (D / G)."""
    groups = x.shape[-2]
    if groups == 1:
        return jnp.broadcast_to(x, (*x.shape[:-2], channels, x.shape[-1]))
    return jnp.repeat(x, channels // groups, axis=-2)


def effective_delta(delta, delta_bias=None, delta_softplus=False) -> jax.Array:
    """Δ in float32: ``delta + delta_bias``, through softplus when ``delta_softplus``."""
    delta = delta.astype(jnp.float32)
    if delta_bias is not None:
        delta = delta + delta_bias.astype(jnp.float32)
    return jax.nn.softplus(delta) if delta_softplus else delta


def signed_transition(decay: jax.Array) -> jax.Array:
    """Grazzi et al.'s extended range: the transition ``exp(Δ A)`` in (0, 1] mapped to ``2 exp(Δ A) - 1`` in (-1, 1]."""
    return 2.0 * decay - 1.0


def signed_form(method: str, prefix: str = "") -> str:
    """The form that runs ``method`` with negative eigenvalues (``auto``: the scan), or a one-line ValueError naming
    the settings as ``prefix`` + name (a mixer's config passes ``attn.``)."""
    if method == kernels.AUTO:
        return STEP_FORM
    if method not in SIGNED_FORMS:
        raise ValueError(f"{prefix}negative_eigenvalues=true needs {prefix}method in "
                         f"{', '.join((kernels.AUTO, *SIGNED_FORMS))} (the forms that multiply transitions); "
                         f"{prefix}method={method!r} works in log space or a kernel that cannot carry a negative "
                         "transition")
    return method


def selective_scan(
    u, delta, A, B, C, *, D=None, z=None, delta_bias=None, delta_softplus=False,
    initial_state=None, method="scan", chunk_size=64, segment_ids=None, negative_eigenvalues=False,
):
    """u, delta, z ``[B,T,D]``; A ``[D,N]``; B, C ``[B,T,N]`` or ``[B,T,G,N]``; D, delta_bias ``[D]``.

    Returns ``(y [B,T,D], final_state [B,D,N] float32)``; ``initial_state`` is ``[B,D,N]``;
    ``segment_ids [B,T]`` (int) restart the state at every document start. ``method="auto"`` runs jla's
    Hopper kernel (its ``mamba1``, the same scan) where it takes the call and ``"scan"`` otherwise.
    ``negative_eigenvalues``: the transition ``2 exp(Δ A) - 1`` (``SIGNED_FORMS`` only; ``auto`` runs the scan).
    """
    method = check_form(method, METHODS, chunk_size)
    if negative_eigenvalues:
        form = signed_form(method)
        kernels.note("selective_scan", form, "negative eigenvalues: no provider kernel" if form != method else "")
        return selective_scan_form(
            u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
            initial_state=initial_state, method=form, chunk_size=chunk_size, segment_ids=segment_ids,
            negative_eigenvalues=True)
    mapped = lambda: kernels.JlaCall(  # noqa: E731  (jla's names: q = C, k = B, v = u, its own D, z and bias)
        "mamba1", C, B, u, {"dt": delta, "a": A},
        {"d": D, "z": z, "dt_bias": delta_bias, "dt_softplus": delta_softplus, "initial_state": initial_state,
         "segment_ids": segment_ids})
    own = lambda form: selective_scan_form(  # noqa: E731
        u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus, initial_state=initial_state,
        method=form, chunk_size=chunk_size, segment_ids=segment_ids)
    return kernels.dispatch("selective_scan", method, "scan", mapped, own, u.dtype)


@functools.partial(jax.jit, static_argnames=("delta_softplus", "method", "chunk_size", "negative_eigenvalues"))
def selective_scan_form(u, delta, A, B, C, *, D, z, delta_bias, delta_softplus, initial_state, method, chunk_size,
                        segment_ids, negative_eigenvalues=False):
    """``selective_scan`` in one of lmzoo's own forms (``negative_eigenvalues``: one of ``SIGNED_FORMS``)."""
    if negative_eigenvalues:
        signed_form(method)  # a form that would drop the sign is refused, never run
    batch, _, channels = u.shape
    u32, A = u.astype(jnp.float32), A.astype(jnp.float32)
    delta = effective_delta(delta, delta_bias, delta_softplus)
    B, C = grouped(B, channels), grouped(C, channels)
    h0 = (jnp.zeros((batch, channels, A.shape[-1]), jnp.float32) if initial_state is None
          else initial_state.astype(jnp.float32))
    starts = None if segment_ids is None else segment_starts(segment_ids)  # (B, T) bool
    keep = None if starts is None else 1.0 - starts.astype(jnp.float32)  # multiplies the decay: 0 forgets
    if method == "naive":
        y, h = _naive(u32, delta, A, B, C, h0, keep, negative_eigenvalues)
    elif method == "scan":
        y, h = _scan(u32, delta, A, B, C, h0, keep, negative_eigenvalues)
    elif method == "pallas":
        y, h = selective_scan_pallas(u32, delta, A, B, C, h0, starts=starts, chunk_size=chunk_size)
    else:  # the parallel forms work on the discretised sequence
        log_a = delta[..., None] * A  # (B, T, D, N) log of the per-step decay
        bu = (delta * u32)[..., None] * per_channel(B, channels)  # (B, T, D, N)
        c = per_channel(C, channels)
        if method == "assoc":
            y, h = _assoc(log_a, bu, c, h0, keep, negative_eigenvalues)
        else:
            y, h = _chunked(log_a, bu, c, h0, chunk_size, starts)  # (B, T, D), (B, D, N)
    if D is not None:
        y = y + D.astype(jnp.float32) * u32
    if z is not None:
        y = y * jax.nn.silu(z.astype(jnp.float32))
    return y.astype(u.dtype), h


# The recurrent forms take keep [B,T] float32 (0 where a document starts) or None (one document), and ``signed``:
# the transition 2 exp(Δ A) - 1 (negative eigenvalues) in place of exp(Δ A). Off, their computation is unchanged.


def _naive(u, delta, A, B, C, h0, keep=None, signed=False):
    """The definition, one step at a time: u, delta [B,T,D], A [D,N], B, C [B,T,G,N], h0 [B,D,N]."""
    channels, groups = u.shape[-1], B.shape[2]
    group = jnp.arange(channels) // (channels // groups)  # the group each channel reads

    def step(h, inputs):
        u_t, delta_t, b_t, c_t, *keep_t = inputs  # (B, D), (B, D), (B, G, N), (B, G, N), [(B,)]
        decay = jnp.exp(delta_t[..., None] * A)  # (B, D, N)
        if signed:
            decay = signed_transition(decay)
        if keep_t:
            decay = decay * keep_t[0][:, None, None]
        h = decay * h + delta_t[..., None] * b_t[:, group] * u_t[..., None]
        return h, jnp.sum(c_t[:, group] * h, axis=-1)

    steps = (u, delta, B, C) if keep is None else (u, delta, B, C, keep)
    h, y = lax.scan(step, h0, tuple(a.swapaxes(0, 1) for a in steps))
    return y.swapaxes(0, 1), h


def _scan(u, delta, A, B, C, h0, keep=None, signed=False):
    channels = u.shape[-1]

    def step(h, inputs):
        u_t, delta_t, b_t, c_t, *keep_t = inputs  # (B, D), (B, D), (B, G, N), (B, G, N), [(B,)]
        decay = jnp.exp(delta_t[..., None] * A)
        if signed:
            decay = signed_transition(decay)
        if keep_t:
            decay = decay * keep_t[0][:, None, None]
        h = decay * h + (delta_t * u_t)[..., None] * per_channel(b_t, channels)
        return h, jnp.sum(per_channel(c_t, channels) * h, axis=-1)

    steps = (u, delta, B, C) if keep is None else (u, delta, B, C, keep)
    h, y = lax.scan(step, h0, tuple(a.swapaxes(0, 1) for a in steps))
    return y.swapaxes(0, 1), h


def _assoc(log_a, bu, c, h0, keep=None, signed=False):
    def combine(earlier, later):  # compose h -> a h + b: first `earlier`, then `later`
        a1, b1 = earlier
        a2, b2 = later
        return a1 * a2, a2 * b1 + b2

    if signed:  # the transitions themselves, whatever their sign (the products below never take a log)
        return _assoc_transitions(combine, signed_transition(jnp.exp(log_a)), bu, c, h0, keep)
    bu = bu.at[:, 0].add(jnp.exp(log_a[:, 0]) * h0)  # the initial state enters with the first step (never a start)
    decay = jnp.exp(log_a) if keep is None else jnp.exp(log_a) * keep[:, :, None, None]  # (B, T, D, N)
    _, h = lax.associative_scan(combine, (decay, bu), axis=1)  # (B, T, D, N)
    return jnp.sum(c * h, axis=-1), h[:, -1]


def _assoc_transitions(combine, transition, bu, c, h0, keep):
    """The associative scan over given transitions [B,T,D,N] (negative ones included)."""
    bu = bu.at[:, 0].add(transition[:, 0] * h0)  # the initial state enters with the first step (never a start)
    decay = transition if keep is None else transition * keep[:, :, None, None]
    _, h = lax.associative_scan(combine, (decay, bu), axis=1)  # (B, T, D, N)
    return jnp.sum(c * h, axis=-1), h[:, -1]


def _chunked(log_a, bu, c, h0, chunk_size, starts=None):
    """``starts`` [B,T] bool or None: where documents start."""
    length = log_a.shape[1]

    def time_last(x):  # (B, T, D, N) -> (chunks, B, D, N, L): pairwise decays become L x L matrices
        return to_chunks(x, chunk_size).transpose(1, 0, 3, 4, 2)  # padded steps decay by 1 and add nothing

    chunks = (time_last(log_a), time_last(bu), time_last(c))
    if starts is not None:  # (chunks, B, L); padded steps start nothing
        chunks += (to_chunks(starts.astype(jnp.int32), chunk_size).swapaxes(0, 1),)
    body = jax.checkpoint(_within_chunk)  # keep only chunk boundaries for the backward pass
    h, y = lax.scan(body, h0, chunks)  # y: (chunks, B, D, L)
    y = y.transpose(1, 0, 3, 2)  # (B, chunks, L, D)
    return y.reshape(y.shape[0], -1, y.shape[-1])[:, :length], h


def _within_chunk(h, chunk):
    log_a, bu, c, *starts = chunk  # (B, D, N, L) each, and [(B, L)] with documents
    size = log_a.shape[-1]
    cum = jnp.cumsum(log_a, axis=-1)  # log decay from the chunk's start through step t
    visible = causal_mask(size)  # the pairs (t, s) that add
    if starts:  # steps t, s share a document when no start lies in (s, t]
        opened = jnp.cumsum(starts[0], axis=-1)[:, None, None]  # (B, 1, 1, L) documents begun in this chunk so far
        visible = visible & (opened[..., :, None] == opened[..., None, :])
    pair = jnp.where(visible, cum[..., :, None] - cum[..., None, :], -jnp.inf)  # (B, D, N, L_t, L_s)
    within = jnp.einsum("bdnts,bdns->bdnt", jnp.exp(pair), bu)
    carried = jnp.exp(cum)  # the entering state's decay (computed here, as before documents, for the same rounding)
    if starts:  # the entering state reaches the chunk's first document only
        carried = jnp.where(opened == 0, carried, 0.0)
    states = within + carried * h[..., None]
    return states[..., -1], jnp.sum(c * states, axis=2)  # (B, D, N), (B, D, L)


@functools.partial(jax.jit, static_argnames=("heads", "block_size", "negative_eigenvalues"))
def selective_attention(delta, A, B, C, *, heads=None, block_size=64, segment_ids=None,
                        negative_eigenvalues=False) -> jax.Array:
    """Mamba's "hidden attention": the causal weights with ``y_i[d] = Σ_j α_ij[d] u_j[d]``.

    ``α_ij[d] = Σ_n C_i[n] exp(Σ_{j<m≤i} Δ_m[d] A[d,n]) Δ_j[d] B_j[n]`` for j ≤ i, zero above;
    ``y`` is the scan's output before the D skip and the gate. ``delta`` is Δ itself (after any
    bias and softplus). Returns ``[B,D,T,T]``; with ``heads=H`` the channels are split into H
    contiguous groups of D / H and averaged within each group: ``[B,H,T,T]``. With ``segment_ids``
    the weights between two documents are zero (within one they do not depend on the others).

    Computed one channel of every head at a time (memory O(B H T^2)) in blocks of ``block_size``:
    diagonal blocks pairwise, off-diagonal blocks as matmuls over the state entries with the
    decay split at block boundaries (every factor ≤ 1), so only O(T N) exponentials per channel.
    With ``negative_eigenvalues`` (the transitions ``2 exp(Δ A) - 1``, which have no logarithm) the products of
    transitions are formed query by query instead (memory O(B T D N) a step, O(B D T^2) in all).
    """
    batch, length, channels = delta.shape
    heads = heads or channels
    if channels % heads:
        raise ValueError(f"heads={heads} does not divide the {channels} channels")
    if negative_eigenvalues:
        alpha = _signed_attention(delta.astype(jnp.float32), A.astype(jnp.float32), grouped(B, channels),
                                  grouped(C, channels))
        alpha = alpha.reshape(batch, heads, channels // heads, length, length).mean(axis=2)
        return alpha if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], alpha, 0.0)
    per_head, n = channels // heads, A.shape[-1]
    pad = -length % block_size  # padded steps have Δ = 0: no decay, no input
    delta = jnp.pad(delta.astype(jnp.float32), ((0, 0), (0, pad), (0, 0)))
    padded = length + pad
    B, C = (jnp.pad(grouped(x, channels), ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (B, C))
    cum = jnp.cumsum(delta[..., None] * A.astype(jnp.float32), axis=1)  # (B, T, D, N)
    b_in = delta[..., None] * per_channel(B, channels)  # Δ_j B_j

    def by_channel_in_group(x):  # (B, T, D, N) -> (D/H, B, H, T, N)
        return x.reshape(batch, padded, heads, per_head, n).transpose(3, 0, 2, 1, 4)

    def add_channel(total, inputs):
        return total + _channel_attention(*inputs, block_size), None

    total = jnp.zeros((batch, heads, padded, padded), jnp.float32)
    inputs = tuple(map(by_channel_in_group, (cum, b_in, per_channel(C, channels))))
    total, _ = lax.scan(add_channel, total, inputs)
    alpha = total[..., :length, :length] / per_head
    if segment_ids is not None:
        alpha = jnp.where(same_segment(segment_ids)[:, None], alpha, 0.0)
    return alpha


def _signed_attention(delta, A, B, C):
    """α [B,D,T,T] under the transitions ``2 exp(Δ A) - 1``: query i's products over (j, i] are query i - 1's times
    step i's transition, and 1 at j = i (zero for j > i, never written)."""
    channels = delta.shape[-1]
    transition = signed_transition(jnp.exp(delta[..., None] * A))  # (B, T, D, N)
    b_in = delta[..., None] * per_channel(B, channels)  # Δ_j B_j
    c = per_channel(C, channels)

    def query(products, inputs):  # products (B, T_j, D, N) over (j, i - 1]
        a_i, c_i, i = inputs
        products = (products * a_i[:, None]).at[:, i].set(1.0)
        return products, jnp.einsum("bdn,bjdn->bdj", c_i, products * b_in)

    steps = (transition.swapaxes(0, 1), c.swapaxes(0, 1), jnp.arange(delta.shape[1]))
    _, alpha = lax.scan(query, jnp.zeros_like(b_in), steps)  # (T_i, B, D, T_j)
    return alpha.transpose(1, 2, 0, 3)


def _channel_attention(cum, b_in, c, block):
    """α [B,H,T,T] of one channel per head from cum, Δ B and C, each [B,H,T,N]."""
    batch, heads, length, n = cum.shape
    blocks = length // block
    cum, b_in, c = (x.reshape(batch, heads, blocks, block, n) for x in (cum, b_in, c))
    last = cum[..., -1, :]  # (B, H, blocks, N): cumulative log decay at each block's last step
    before = jnp.concatenate([jnp.zeros_like(last[:, :, :1]), last[:, :, :-1]], axis=2)  # ... just before each block
    q = c * jnp.exp(cum - before[..., None, :])  # decay from the block's start to i
    k = b_in * jnp.exp(last[..., None, :] - cum)  # decay from j to its block's end
    earlier = jnp.tril(jnp.ones((blocks, blocks), bool), -1)[..., None]
    gap = jnp.exp(jnp.where(earlier, before[:, :, :, None] - last[:, :, None, :], -jnp.inf))  # (B, H, I, J, N), J < I
    off_diagonal = jnp.einsum("bhIin,bhIJn,bhJjn->bhIiJj", q, gap, k)
    pair = cum[..., :, None, :] - cum[..., None, :, :]  # (B, H, blocks, L_i, L_j, N)
    pair = jnp.where(causal_mask(block)[..., None], pair, -jnp.inf)
    diagonal = jnp.einsum("bhIin,bhIijn,bhIjn->bhIij", c, jnp.exp(pair), b_in)
    alpha = off_diagonal + jnp.einsum("bhIij,IJ->bhIiJj", diagonal, jnp.eye(blocks))
    return alpha.reshape(batch, heads, length, length)
