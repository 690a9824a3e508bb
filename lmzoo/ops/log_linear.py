"""Log-linear attention (Guo et al., 2025): gated linear attention whose past is split by a Fenwick
tree into O(log T) blocks, each read with its own data-dependent weight.

    o_t = scale * sum_{s<=t} lam[t, l(t,s)] exp(G_t - G_s) (q_t . k_s) v_s,    G_t = sum_{m<=t} log_g_m
    l(t, s) = bit_length(t XOR s)

Level 0 is the token itself; level l >= 1 of query t is the block [t - t mod 2^l, t - t mod 2^(l-1))
of 2^(l-1) keys, empty unless bit l-1 of t is set: the levels partition [0, t]. ``lam`` is
``level_scales [B, T, H, L]``, indexed by the query. With every lam = 1 it is Mamba-2 / simple GLA
(``lmzoo.ops.gated.gla`` with one gate per head). Grouped heads: q, k ``[B, T, G, Dk]`` over
v ``[B, T, H, Dv]``, value head h reads group h // (H / G).

Positions. t and s count from the start of their document (``segment_ids [B, T]``: no weight
crosses a boundary, the state restarts), the first document from ``start`` (the tokens an
``initial_state`` already holds). ``L >= ceil(log2 T) + 1`` covers every level; past that, levels
beyond L - 1 share level L - 1's weight (and its state), so decoding past the trained length is defined.

The state at position p (the next token's) holds one matrix per level, ``[B, H, L - 1, Dk, Dv]``:
slot l = sum_{s<p, l(p,s)=l} exp(G_{p-1} - G_s) k_s v_s^T for l = 1 .. L-1 (level 0 is always the
token being read). Stepping p -> p + 1 is a binary carry: with z the number of trailing ones of p,
slots 1..z and the token's own k v^T merge into slot z + 1, every other slot keeps its block.

Every slot is a dyadic block of keys, aligned to its size, so any later query t sees all of it at
one level: ``min(max(l, bit_length(t XOR (p with its low l bits cleared))), L - 1)`` (``slot_levels``;
the max only matters for a slot an arbitrary initial state fills while the block is empty). That
makes chunking exact at any chunk size and any document start. Forms (``method``):

- ``"naive"``: the masked quadratic form above (``log_linear_weights``), written from the definition;
- ``"scan"``:  the carry recurrence one token at a time (``log_linear_step``: decoding);
- ``"chunk"``: inside chunks the quadratic form with the level mask; across chunks the slots of the
  state entering each chunk, each read at its level and carried to the next chunk's position. Without
  documents or an initial state and from a start known in advance, every chunk begins at a multiple
  of 2^z, where slots 1..z are empty: only the others are carried and read (``empty_slots``; at
  T = 256 in chunks of 64, 2 of 8), which makes the form as cheap as GLA's there.

Decays are sums over nearby steps only (segment sums inside a chunk, sums from a chunk's edges
across), every exponent <= 0, so any gate strength is exact. Gates, level weights, decays and
states are float32 whatever the input dtype; o has v's dtype.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lmzoo.ops.common import (
    Forms, check_form, decay_since, decay_until_end, from_chunks, one_document, same_segment, segment_starts,
    segment_sums, to_chunks,
)

METHODS = Forms("naive", "scan", "chunk")
MAX_LEVELS = 31  # positions are int32


def log_linear_attention(q, k, v, log_g, level_scales, *, scale=None, initial_state=None, start=0, method="chunk",
                         chunk_size=64, segment_ids=None):
    """q, k [B,T,G,Dk]; v [B,T,H,Dv]; log_g [B,T,H] (<= 0); level_scales [B,T,H,L].

    ``initial_state`` [B,H,L-1,Dk,Dv] holds the first document's ``start`` earlier tokens (int or [B]);
    ``segment_ids`` [B,T] restart positions and state at every document start.
    Returns (o [B,T,H,Dv] in v's dtype, the state after the last token, float32).
    """
    method = check_form(method, METHODS, chunk_size)
    known = segment_ids is None and initial_state is None and isinstance(start, int)  # chunk starts known in advance
    empty = empty_slots(start, min(chunk_size, v.shape[1])) if known else 0
    return _attention(q, k, v, log_g, level_scales, scale=scale, initial_state=initial_state, start=start,
                      method=method, chunk_size=chunk_size, segment_ids=segment_ids, empty_slots=empty)


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size", "empty_slots"))
def _attention(q, k, v, log_g, level_scales, *, scale, initial_state, start, method, chunk_size, segment_ids,
               empty_slots):
    levels = check_levels(level_scales)
    batch, _, heads, d_value = v.shape
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q32, k32 = (per_value_head(a, heads) for a in (q, k))
    ids = one_document(v.shape[:2]) if segment_ids is None else segment_ids
    form = functools.partial(_chunk, empty_slots=empty_slots) if method == "chunk" else _FORMS[method]
    start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (batch,))
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, levels - 1, q.shape[-1], d_value), jnp.float32)
    out, state = form(
        q32 * scale, k32, v.astype(jnp.float32), log_g.astype(jnp.float32), level_scales.astype(jnp.float32),
        document_positions(ids, start), ids, initial_state.astype(jnp.float32), start, chunk_size,
    )
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def log_linear_weights(q, k, log_g, level_scales, *, scale=None, start=0, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 (no initial state):
    ``scale * lam[t, l(t,s)] exp(G_t - G_s) q_t . k_s`` for s <= t in one document, else 0."""
    check_levels(level_scales)
    heads = log_g.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ids = one_document(log_g.shape[:2]) if segment_ids is None else segment_ids
    start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (log_g.shape[0],))
    return _weights(per_value_head(q, heads) * scale, per_value_head(k, heads), log_g.astype(jnp.float32),
                    level_scales.astype(jnp.float32), document_positions(ids, start), ids)


@functools.partial(jax.jit, static_argnames=("scale",))
def log_linear_step(q_t, k_t, v_t, log_g_t, level_scales_t, state, position, *, scale=None):
    """One token at ``position`` (int or [B], from its document's start) on the state before it:
    q_t, k_t [B,G,Dk]; v_t [B,H,Dv]; log_g_t [B,H]; level_scales_t [B,H,L]; state [B,H,L-1,Dk,Dv].
    Returns (o_t [B,H,Dv] in v_t's dtype, the state at position + 1)."""
    check_levels(level_scales_t)
    heads = v_t.shape[1]
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    q32, k32 = (per_value_head(a[:, None], heads)[:, 0] for a in (q_t, k_t))
    position = jnp.broadcast_to(jnp.asarray(position, jnp.int32), (v_t.shape[0],))
    out, state = _step(q32 * scale, k32, v_t.astype(jnp.float32), log_g_t.astype(jnp.float32),
                       level_scales_t.astype(jnp.float32), state.astype(jnp.float32), position)
    return out.astype(v_t.dtype), state


# ----------------------------------------------------------------------------- levels and positions


def check_levels(level_scales) -> int:
    levels = level_scales.shape[-1]
    if not 2 <= levels <= MAX_LEVELS:
        raise ValueError(f"level_scales has {levels} levels; use 2 to {MAX_LEVELS} (ceil(log2 T) + 1 covers T tokens)")
    return levels


def empty_slots(start: int, size: int) -> int:
    """Slots empty in the state at every position start + n * size: those of the trailing zero bits
    those positions all share (a Fenwick state at a multiple of 2^z holds no block smaller than 2^z)."""
    step = math.gcd(start, size)  # gcd(0, size) = size
    return (step & -step).bit_length() - 1


def per_value_head(x, heads: int) -> jax.Array:
    """q or k [B,T,G,Dk] as [B,T,H,Dk] float32: value head h reads group h // (H / G)."""
    groups = x.shape[2]
    if heads % groups:
        raise ValueError(f"q and k have {groups} heads, which does not divide the {heads} value heads")
    return jnp.repeat(x.astype(jnp.float32), heads // groups, axis=2)


def bit_length(x: jax.Array) -> jax.Array:
    """Bits needed to write the non-negative int32 x (0 for 0)."""
    return 32 - lax.clz(x.astype(jnp.int32))


def level(query_pos, key_pos, levels: int) -> jax.Array:
    """l(t, s) = bit_length(t XOR s), levels past L - 1 sharing L - 1."""
    return jnp.minimum(bit_length(query_pos ^ key_pos), levels - 1)


def slot_levels(query_pos, state_pos, levels: int) -> jax.Array:
    """[..., L-1]: the level at which a query at ``query_pos`` reads slots 1..L-1 of the state at ``state_pos``.

    Slot l of that state is the block of keys ending where state_pos's low l-1 bits are cleared, all
    sharing state_pos's bits from l up (those of ``block``); a later query differs from them first at
    bit ``bit_length(query XOR block) - 1``, the same for the whole block."""
    slots = jnp.arange(1, levels, dtype=jnp.int32)
    block = state_pos[..., None] & ~((1 << slots) - 1)
    return jnp.minimum(jnp.maximum(slots, bit_length(query_pos[..., None] ^ block)), levels - 1)


def document_positions(segment_ids, start) -> jax.Array:
    """[B, T] int32: each token's position in its document; the first document begins at ``start`` [B]."""
    steps = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
    began = lax.cummax(jnp.where(segment_starts(segment_ids), steps, 0), axis=1)  # where the current one began
    return steps - began + jnp.where(began == 0, start[:, None], 0)


def slot_one_hot(levels_of, levels: int) -> jax.Array:
    """Levels 1..L-1 as one-hot rows over the L-1 slots (level 0, never a slot, gives a zero row)."""
    return jax.nn.one_hot(levels_of - 1, levels - 1, dtype=jnp.float32)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,H,Dv], log_g [B,T,H], lam [B,T,H,L],
# positions and ids [B,T], the state S0 [B,H,L-1,Dk,Dv] and its position ``start`` [B].


def _weights(q, k, log_g, lam, positions, ids) -> jax.Array:
    """[B, H, T, S]: lam[t, l(t,s)] exp(G_t - G_s) q_t . k_s inside one document, 0 elsewhere."""
    decay = jnp.exp(segment_sums(log_g[..., None]))[..., 0]  # (B, T, S, H), exactly 0 above the diagonal
    levels_of = level(positions[:, :, None], positions[:, None, :], lam.shape[-1])  # (B, T, S)
    lam_ts = jnp.take_along_axis(lam[:, :, None], levels_of[..., None, None], axis=-1)[..., 0]  # (B, T, S, H)
    pair = decay * lam_ts * same_segment(ids)[..., None]
    return jnp.einsum("bthd,bshd->bhts", q, k) * jnp.moveaxis(pair, -1, 1)


def _naive(q, k, v, log_g, lam, positions, ids, s0, start, chunk_size):
    levels = lam.shape[-1]
    out = jnp.einsum("bhts,bshe->bthe", _weights(q, k, log_g, lam, positions, ids), v)
    first = ~jnp.cumsum(segment_starts(ids), axis=1).astype(bool)  # (B, T) tokens of the first document
    # the initial state: each slot at the level it has for the query, decayed from the start
    slot_lam = jnp.take_along_axis(lam, slot_levels(positions, start[:, None], levels)[:, :, None], axis=-1)
    q_read = q * (jnp.exp(decay_since(log_g, axis=1)) * first[..., None])[..., None]
    out = out + jnp.einsum("bthd,bthm,bhmde->bthe", q_read, slot_lam, s0)
    # the final state, at the position after the last token: every key of the last document in its slot
    after = positions[:, -1] + 1
    key_slot = slot_one_hot(level(after[:, None], positions, levels), levels) * (ids == ids[:, -1:])[..., None]
    to_end = jnp.exp(decay_until_end(log_g, axis=1))  # (B, T, H)
    final = jnp.einsum("btm,bth,bthd,bthe->bhmde", key_slot, to_end, k, v)
    moved = slot_one_hot(slot_levels(after, start, levels), levels) * first[:, -1, None, None]  # (B, old, new)
    carried = jnp.exp(jnp.sum(log_g, axis=1))[..., None, None, None] * jnp.einsum("bmn,bhmde->bhnde", moved, s0)
    return out, final + carried


def _step(q_t, k_t, v_t, log_g_t, lam_t, state, position):
    """Token at ``position`` [B]: read the decayed slots at their levels (and itself at level 0), then carry."""
    levels = lam_t.shape[-1]
    state = jnp.exp(log_g_t)[..., None, None, None] * state  # (B, H, L-1, Dk, Dv)
    own = jnp.sum(q_t * k_t, axis=-1, keepdims=True) * lam_t[..., :1] * v_t  # (B, H, Dv)
    out = own + jnp.einsum("bhd,bhm,bhmde->bhe", q_t, lam_t[..., 1:], state)
    # position's trailing ones z: slots 1..z and this token join slot z + 1 (bit_length(p XOR p+1) = z + 1)
    carry = bit_length(position ^ (position + 1))  # (B,)
    merging = (jnp.arange(1, levels) < carry[:, None]).astype(jnp.float32)  # (B, L-1)
    merged = jnp.einsum("bm,bhmde->bhde", merging, state) + k_t[..., :, None] * v_t[..., None, :]
    into = slot_one_hot(jnp.minimum(carry, levels - 1), levels)  # (B, L-1)
    state = (1 - merging)[:, None, :, None, None] * state + into[:, None, :, None, None] * merged[:, :, None]
    return out, state


def _scan(q, k, v, log_g, lam, positions, ids, s0, start, chunk_size):
    restarts = segment_starts(ids)

    def step(state, inputs):
        restart, position, *token = inputs
        state = jnp.where(restart[:, None, None, None, None], 0.0, state)
        out, state = _step(*token, state, position)
        return state, out

    steps = (restarts, positions, q, k, v, log_g, lam)
    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in steps))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, log_g, lam, positions, ids, s0, start, chunk_size, empty_slots=0):
    """``empty_slots``: slots 1..empty_slots of the state entering every chunk are known to be empty
    (no documents, no initial state, chunks starting at multiples of 2^empty_slots), so only the
    slots above them are carried and read between chunks; the final state has them all."""
    length, levels = q.shape[1], lam.shape[-1]
    size = min(chunk_size, length)
    pad = -length % size
    # padded steps continue the last document (k = 0 and log_g = 0 there: they add and decay nothing)
    positions = jnp.concatenate([positions, positions[:, -1:] + jnp.arange(1, pad + 1, dtype=jnp.int32)], axis=1)
    ids = jnp.pad(ids, [(0, 0), (0, pad)], mode="edge")
    qc, kc, vc, gc, lc, pc, ic = (to_chunks(a, size) for a in (q, k, v, log_g, lam, positions, ids))
    # (B, N, C) a document began between the chunk's start and this step
    restarted = jnp.cumsum(to_chunks(segment_starts(ids), size), axis=2) > 0
    chunks = np.arange(pc.shape[1])
    last = np.minimum((chunks + 1) * size, length) - 1 - chunks * size  # each chunk's last real step
    after = pc[:, chunks, last] + 1  # (B, N) the position after each chunk
    state_pos = jnp.concatenate([start[:, None], after[:, :-1]], axis=1)  # (B, N) the position of the state entering
    passes = ~restarted[:, chunks, last]  # (B, N) no document begins in the chunk

    # across chunks: the slots of the state after each chunk (keys of the chunk's last document only)
    real = jnp.arange(pc.shape[1] * size).reshape(pc.shape[1:]) < length
    joins = (ic == ic[:, chunks, last][..., None]) & real  # (B, N, C)
    key_slot = slot_one_hot(level(after[..., None], pc, levels), levels) * joins[..., None]  # (B, N, C, L-1)
    keys = kc * jnp.exp(decay_until_end(gc, axis=2))[..., None]  # (B, N, C, H, Dk) decayed to the chunk's end
    moved = slot_one_hot(slot_levels(after, state_pos, levels), levels) * passes[..., None, None]  # (B, N, old, new)
    total = jnp.sum(gc, axis=2)  # (B, N, H) log decay across each chunk

    def carry(state, chunk):  # the state after the chunk from the state entering it
        move, log_decay, update = chunk
        decayed = jnp.exp(log_decay)[..., None, None, None] * jnp.einsum("bmn,bhmde->bhnde", move, state)
        return decayed + update, state

    empty_slots = min(empty_slots, levels - 2)  # the last slot also holds every farther level: never known empty
    kept = slice(empty_slots, None)  # the slots carried between chunks
    added = jnp.einsum("bncm,bnchd,bnche->nbhmde", key_slot[:, :-1, :, kept], keys[:, :-1], vc[:, :-1])
    steps = (moved[:, :-1, kept, kept].swapaxes(0, 1), total[:, :-1].swapaxes(0, 1), added)
    if len(chunks) > 1:
        into_last, entering = lax.scan(carry, s0[:, :, kept], steps)  # entering chunks 0..N-2, then N-1
    else:  # one chunk: the empty scan's result written out, since kernels.traced_choices runs ops with jit disabled,
        # where an empty scan cannot tell its output type
        into_last, entering = s0[:, :, kept], jnp.zeros((0, *s0[:, :, kept].shape), s0.dtype)
    entering = jnp.concatenate([entering, into_last[None]], axis=0)  # (N, B, H, slots kept, Dk, Dv)
    into_last = jnp.pad(into_last, [(0, 0), (0, 0), (empty_slots, 0), (0, 0), (0, 0)])
    final, _ = carry(into_last, (moved[:, -1], total[:, -1], jnp.einsum("bcm,bchd,bche->bhmde", key_slot[:, -1],
                                                                       keys[:, -1], vc[:, -1])))

    # reading the entering state: queries before any document start in their chunk, each slot at its level
    read_levels = jax.nn.one_hot(slot_levels(pc, state_pos[..., None], levels)[..., kept], levels, dtype=jnp.float32)
    slot_lam = jnp.einsum("bncml,bnchl->bnchm", read_levels, lc)  # (B, N, C, H, slots kept)
    q_read = qc * (jnp.exp(decay_since(gc, axis=2)) * ~restarted[..., None])[..., None]
    across = jnp.einsum("bnchd,bnchm,nbhmde->bnche", q_read, slot_lam, entering)
    out = _within_chunks(qc, kc, vc, gc, lc, pc, ic) + across
    return from_chunks(out, length), final


def _within_chunks(q, k, v, log_g, lam, positions, ids):
    """The quadratic form inside each chunk: q, k, v, log_g, lam [B, N, C, H, *], positions and ids [B, N, C]."""
    decay = jnp.exp(segment_sums(log_g[..., None]))[..., 0]  # (B, N, C(i), C(j), H), 0 above the diagonal
    levels = lam.shape[-1]
    levels_of = level(positions[..., :, None], positions[..., None, :], levels)  # (B, N, C, C)
    mask = jax.nn.one_hot(levels_of, levels, dtype=jnp.float32) * same_segment_chunks(ids)[..., None]
    pair = jnp.einsum("bnijl,bnihl->bnhij", mask, lam) * jnp.moveaxis(decay, -1, 2)  # (B, N, H, C, C)
    scores = jnp.einsum("bnihd,bnjhd->bnhij", q, k) * pair
    return jnp.einsum("bnhij,bnjhe->bnihe", scores, v)


def same_segment_chunks(ids) -> jax.Array:
    """[B, N, C, C] bool: queries and keys of one chunk in one document."""
    return ids[..., :, None] == ids[..., None, :]


_FORMS = {"naive": _naive, "scan": _scan, "chunk": _chunk}
