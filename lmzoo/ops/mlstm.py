"""The mLSTM of xLSTM (Beck et al., 2024): a matrix memory with an exponential input gate, a normaliser state and a
stabiliser state.

Per head, with the input gate's log ``i~_t`` (unbounded: the gate is exp(i~)) and a forget gate's log
``log f_t <= 0``, the states C [Dk, Dv], n [Dk] and m (a scalar) evolve as

    m_t = max(log f_t + m_{t-1}, i~_t)
    C_t = exp(log f_t + m_{t-1} - m_t) C_{t-1} + exp(i~_t - m_t) k_t v_t^T
    n_t = exp(log f_t + m_{t-1} - m_t) n_{t-1} + exp(i~_t - m_t) k_t
    h_t = C_t^T q_t / max(|n_t . q_t|, exp(-m_t))            (q scaled by ``scale``)

m only keeps the exponentials in range: C and n are the unstabilised sums times exp(-m_t), so h is the same
for any m. Unrolled (from a zero state), key j reaches query i with weight ``(q_i . k_j) exp(F_ij + i~_j)``, F_ij the
sum of log f over j < m <= i, divided by ``max(|row sum|, 1)``; ``parallel`` computes exactly that, each row
stabilised by its own maximum exponent (xLSTM's parallel form).

Forms (``method``): ``"naive"`` the recurrence step by step (the reference); ``"parallel"`` the weights
materialised ([T, T] per head, the initial state a column of its own); ``"assoc"`` an associative scan over
(log decay, m, C, n), whose operator carries the stabiliser: combining an earlier span with a later one,
``m = max(a_2 + m_1, m_2)`` and ``C = exp(a_2 + m_1 - m) C_1 + exp(m_2 - m) C_2`` (n alike), ``a = a_1 + a_2``.
The state is the tuple (C [B,H,Dk,Dv], n [B,H,Dk], m [B,H]), float32; a sequence starts from the empty state
(``zero_state``: zeros and m = ``EMPTY_M``, so its first m is its first input gate), as jax-linear-attention's
reference does. Documents (``segment_ids``): the states restart from the empty state at each segment start (the
scan's operator stops at a start).

Kernel providers (``lmzoo.ops.kernels``): ``"jla"`` runs jax-linear-attention's ``mlstm`` kind (``jla_call``: the
same recurrence, stabiliser, empty state and document restarts); ``"auto"`` would run jla's Mosaic GPU kernel where
jla qualifies it for its own ``auto`` and it takes the call, and ``"assoc"`` otherwise. jla 0.1 registers that
kernel opt-in only (its bf16 numerator loses precision where q is nearly orthogonal to the state's keys), so today
``auto`` runs ``"assoc"`` on every device, recorded with that reason.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (Forms, causal_mask, check_form, decay_until_end, same_segment, segment_starts,
                              segment_sums)
from lmzoo.ops.kernels import PROVIDER_FORMS

METHODS = Forms("naive", "parallel", "assoc", *PROVIDER_FORMS)
BEST = "assoc"  # the form ``auto`` runs where jla's kernel does not (``lmzoo.ops.kernels``)
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def mlstm(q, k, v, log_i, log_f, *, scale=None, initial_state=None, method="assoc", segment_ids=None):
    """q, k [B,T,H,Dk], v [B,T,H,Dv], log_i (the input gate's pre-activation) and log_f (<= 0) [B,T,H].

    ``initial_state``: (C [B,H,Dk,Dv], n [B,H,Dk], m [B,H]) or None (zeros). ``method="jla"`` runs
    jax-linear-attention's ``mlstm``; ``"auto"`` its Hopper kernel where jla qualifies it, ``"assoc"`` otherwise.
    Returns (h [B,T,H,Dv] in v's dtype, the final (C, n, m) float32)."""
    method = check_form(method, METHODS)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out, state = kernels.dispatch(
        "mlstm", method, BEST, lambda: jla_call(q, k, v, log_i, log_f, scale, initial_state, segment_ids),
        lambda form: _mlstm(q, k, v, log_i, log_f, scale=scale, initial_state=initial_state, method=form,
                            segment_ids=segment_ids), v.dtype)
    return out, tuple(state)  # jla's state is its own named tuple: lmzoo's is a plain (C, n, m)


def jla_call(q, k, v, log_i, log_f, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """``mlstm`` as jla's ``mlstm``: the same recurrence, stabiliser and empty state (g = log f, i = log i~; q
    scaled by ``scale``), and jla restarts from the empty state at a segment start, as here. jla adds ``eps`` to
    the denominator ``max(|n . q|, exp(-m))``: 0 here, so it divides by lmzoo's. Its floor ``exp(-m)`` is capped at
    exp(80), which differs from lmzoo's only where every write reaching a step weighs under exp(-80) (both h ~ 0)."""
    gates = {"g": log_f.astype(jnp.float32), "i": log_i.astype(jnp.float32)}
    options = {"scale": scale, "initial_state": kernels.state_or_none(initial_state), "segment_ids": segment_ids,
               "eps": 0.0}
    return kernels.JlaCall("mlstm", q, k, v, gates, options)


EMPTY_M = -1e30  # the empty state's stabiliser: every real contribution outweighs it (finite: no inf - inf)


def zero_state(batch: int, heads: int, d_key: int, d_value: int):
    """(C, n, m) at the start of a sequence (and of every segment), float32: zero memories, m = ``EMPTY_M``."""
    return (jnp.zeros((batch, heads, d_key, d_value), jnp.float32), jnp.zeros((batch, heads, d_key), jnp.float32),
            jnp.full((batch, heads), EMPTY_M, jnp.float32))


@functools.partial(jax.jit, static_argnames=("scale", "method"))
def _mlstm(q, k, v, log_i, log_f, *, scale, initial_state, method, segment_ids):
    batch, length, heads, d_key = k.shape
    state = zero_state(batch, heads, d_key, v.shape[-1]) if initial_state is None else initial_state
    state = tuple(s.astype(jnp.float32) for s in state)
    starts = jnp.zeros((batch, length), bool) if segment_ids is None else segment_starts(segment_ids)
    q32, k32, v32, i32, f32 = (a.astype(jnp.float32) for a in (q, k, v, log_i, log_f))
    out, final = _FORMS[method](q32 * scale, k32, v32, i32, f32, starts, state)
    return out.astype(v.dtype), final


@functools.partial(jax.jit, static_argnames=("scale",))
def mlstm_weights(q, k, log_i, log_f, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S] float32 that ``mlstm`` applies to v from a zero state; 0 across
    segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q32, k32 = q.astype(jnp.float32) * scale, k.astype(jnp.float32)
    weights, top, _ = _weights(q32, k32, log_i.astype(jnp.float32), log_f.astype(jnp.float32), segment_ids)
    return weights / jnp.maximum(jnp.abs(jnp.sum(weights, axis=-1)), jnp.exp(-top))[..., None]


def _weights(q, k, log_i, log_f, segment_ids, m0=None):
    """(weights [B,H,T,S], each row's exponents' maximum [B,H,T], the initial state's exponent [B,H,T]): rows
    divided by max(|row sum + the state's share|, exp(-max)). ``m0`` [B,H]: the initial state's stabiliser."""
    decay = jnp.moveaxis(segment_sums(log_f[..., None])[..., 0], -1, 1)  # (B, H, T, S): F_ij, -inf above
    exponent = decay + jnp.moveaxis(log_i, -1, 1)[:, :, None, :]  # F_ij + i~_j
    if segment_ids is not None:
        exponent = jnp.where(same_segment(segment_ids)[:, None], exponent, -jnp.inf)
    from_state = None
    if m0 is not None:  # the state decays through every step up to i: m0 + F_i0, cut at the first segment start
        from_state = jnp.moveaxis(jnp.cumsum(log_f, axis=1), -1, 1) + m0[..., None]  # (B, H, T)
        if segment_ids is not None:
            cut = jnp.cumsum(segment_starts(segment_ids), axis=1)[:, None] > 0
            from_state = jnp.where(cut, -jnp.inf, from_state)
    top = jnp.max(exponent, axis=-1) if from_state is None else jnp.maximum(jnp.max(exponent, axis=-1), from_state)
    scores = jnp.einsum("bihd,bjhd->bhij", q, k) * jnp.exp(exponent - top[..., None])
    return jnp.where(causal_mask(q.shape[1]), scores, 0.0), top, from_state


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,H,Dv], log_i, log_f [B,T,H], the segment starts
# [B,T] bool and the state (C, n, m).


def _naive(q, k, v, log_i, log_f, starts, state):
    """The recurrence, one step at a time, independent of the other forms."""
    def step(carry, inputs):
        c, n, m = carry
        q_t, k_t, v_t, i_t, f_t, start = inputs  # (B, H, Dk), (B, H, Dk), (B, H, Dv), (B, H), (B, H), (B,)
        reset = start.reshape(-1, 1)  # a new document starts from the empty state
        c, n, m = jnp.where(reset[..., None, None], 0.0, c), jnp.where(reset[..., None], 0.0, n), jnp.where(
            reset, EMPTY_M, m)
        m_new = jnp.maximum(f_t + m, i_t)
        kept, written = jnp.exp(f_t + m - m_new), jnp.exp(i_t - m_new)  # (B, H)
        c = kept[..., None, None] * c + written[..., None, None] * k_t[..., :, None] * v_t[..., None, :]
        n = kept[..., None] * n + written[..., None] * k_t
        below = jnp.maximum(jnp.abs(jnp.sum(n * q_t, axis=-1)), jnp.exp(-m_new))  # (B, H)
        return (c, n, m_new), jnp.einsum("bhd,bhde->bhe", q_t, c) / below[..., None]

    final, out = lax.scan(step, state, tuple(a.swapaxes(0, 1) for a in (q, k, v, log_i, log_f, starts)))
    return out.swapaxes(0, 1), final


def _parallel(q, k, v, log_i, log_f, starts, state):
    c0, n0, m0 = state
    segment_ids = jnp.cumsum(starts, axis=1)
    weights, top, from_state = _weights(q, k, log_i, log_f, segment_ids, m0)  # (B,H,T,S), (B,H,T), (B,H,T)
    state_share = jnp.exp(from_state - top)  # (B, H, T): the initial state's weight in each row's units
    numerator = jnp.einsum("bhij,bjhe->bihe", weights, v) + jnp.einsum(
        "bihd,bhde,bhi->bihe", q, c0, state_share)
    row = jnp.sum(weights, axis=-1) + jnp.einsum("bihd,bhd,bhi->bhi", q, n0, state_share)  # n_i . q_i, stabilised
    below = jnp.maximum(jnp.abs(row), jnp.exp(-top))  # (B, H, T)
    out = numerator / jnp.moveaxis(below, 1, 2)[..., None]
    return out, _final_state(k, v, log_i, log_f, starts, state)


def _assoc(q, k, v, log_i, log_f, starts, state):
    """The stabilised recurrence as an associative scan over spans (a, m, C, n, cut): a span's total log decay, its
    stabiliser, its stabilised C and n, and whether it holds a segment start (which nothing before it crosses)."""
    a, m, c, n, cut = lax.associative_scan(_combine, _with_state(_spans(k, v, log_i, log_f, starts), state))
    below = jnp.maximum(jnp.abs(jnp.einsum("tbhd,bthd->tbh", n, q)), jnp.exp(-m))
    out = jnp.einsum("bthd,tbhde->bthe", q, c) / below.swapaxes(0, 1)[..., None]
    return out, (c[-1], n[-1], m[-1])


def _spans(k, v, log_i, log_f, starts):
    """Each step as a span, time first: its own stabiliser is its input gate (the empty state's m adds nothing)."""
    spans = (log_f, log_i, k[..., :, None] * v[..., None, :], k, starts[..., None])
    return tuple(x.swapaxes(0, 1) for x in spans)


def _combine(earlier, later):
    a1, m1, c1, n1, cut1 = earlier
    a2, m2, c2, n2, cut2 = later
    m = jnp.where(cut2, m2, jnp.maximum(a2 + m1, m2))
    kept = jnp.exp(jnp.where(cut2, -jnp.inf, a2 + m1 - m))  # what the earlier span still weighs; 0 past a cut
    written = jnp.exp(m2 - m)
    return (a1 + a2, m, kept[..., None, None] * c1 + written[..., None, None] * c2,
            kept[..., None] * n1 + written[..., None] * n2, cut1 | cut2)


def _with_state(spans, state):
    """The first step's span with the initial state folded in (step 0 never starts a segment)."""
    c0, n0, m0 = state
    first = _combine((jnp.zeros_like(spans[0][0]), m0, c0, n0, jnp.zeros_like(spans[4][0])),
                     tuple(x[0] for x in spans))
    return tuple(x.at[0].set(f) for x, f in zip(spans, first))


def _final_state(k, v, log_i, log_f, starts, state):
    """(C, n, m) after the last step in closed form, as the recurrence leaves them: keys decayed to the end, those
    before the last segment start forgotten, and the initial state decayed too (the empty state after a start)."""
    c0, n0, m0 = state
    after = jnp.flip(jnp.cumsum(jnp.flip(starts, 1), axis=1), 1) - starts  # segment starts after each step
    last_document = (after == 0)[..., None]  # (B, T, 1)
    exponent = jnp.where(last_document, log_i + decay_until_end(log_f, axis=1), -jnp.inf)  # (B, T, H)
    restarted = jnp.any(starts, axis=1)[:, None]  # (B, 1)
    from_state = jnp.where(restarted, EMPTY_M, m0 + jnp.sum(log_f, axis=1))  # (B, H)
    m = jnp.maximum(jnp.max(exponent, axis=1), from_state)
    kept = jnp.where(restarted, 0.0, jnp.exp(from_state - m))  # the initial state's share; none after a restart
    keys = k * jnp.exp(exponent - m[:, None])[..., None]  # (B, T, H, Dk)
    return (kept[..., None, None] * c0 + jnp.einsum("bthd,bthe->bhde", keys, v),
            kept[..., None] * n0 + jnp.sum(keys, axis=1), m)


_FORMS = {"naive": _naive, "parallel": _parallel, "assoc": _assoc}
