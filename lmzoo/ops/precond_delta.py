"""The preconditioned delta rule (preconditioned Gated DeltaNet and KDA, arXiv 2604.21100): the delta rule
whose write is scaled, per key channel, by a preconditioner built from a running second moment of the keys.

Per key head, a diagonal second moment of the keys (the "ATK" state, ``[Dk]``) with its own per-head decay
and step size, squashed into a preconditioner between 1/x and x:

    A_t = exp(log_g_atk_t) A_{t-1} + beta_atk_t k_t^2                       (elementwise)
    r_t = log(A_t + eps) - center;   P_t = exp(-log(x) r_t / (1 + |r_t|))   (``squash`` = x, in [1/x, x])

and per value head the gated delta rule that erases under k_t and writes under ``w_t = P_t * k_t``:

    S'_t = diag(exp(log_g_t)) S_{t-1}
    S_t  = S'_t + beta_t w_t (v_t - S'_t^T k_t)^T
    o_t  = scale * S_t^T q_t

A channel the keys have used much (large A) is written more softly, a rare one more strongly. ``log_g``
is None, one per value head (preconditioned Gated DeltaNet) or one per key channel (preconditioned KDA);
grouped value heads (HV a multiple of H) share their key head's q, k and ATK state, as in
``lmzoo.ops.delta``. ``center`` is a number or one per key head [H]. The op neither normalises q, k nor
squashes the gates (the mixer does). States: ``(S [B,HV,Dk,Dv], A [B,H,Dk])``.

Forms (``method``):

- ``"naive"``:    both recurrences written out, one step at a time -- the reference;
- ``"chunk"``:    A by an associative scan (its recurrence is linear), then the delta rule's UT
  representation inside chunks of ``chunk_size`` steps with the written keys w in place of k where
  the state is written (``lmzoo.ops.ut``: ``(I + diag(beta) P_<(k, w)) U = diag(beta) (V - (K
  exp(b)) S_0)``, ``O = (Q exp(b)) S_0 + P_<=(q, w) U``, ``S_C = exp(b_C) S_0 + (W exp(b_C - b))^T U``);
- ``"parallel"``: the same with the whole sequence as one chunk;
- ``"jla"``, ``"auto"``: jax-linear-attention's ``rwkv7`` kind (``lmzoo.ops.kernels``) for S, once lmzoo has
  computed the written keys w from A (``jla_call``: given w, the step is the DPLR rule of ``lmzoo.ops.dplr``);
  ``auto`` runs jla's Hopper kernel where it takes the call and ``"chunk"`` otherwise (on a CPU: exactly
  ``"chunk"``).

From a zero state the weights on the values are ``scale * P_<=(q, w) (I + diag(beta) P_<(k, w))^{-1}
diag(beta)`` (``precond_delta_rule_weights``). Documents (``segment_ids``): both decays forget everything
at a document's first step (``RESET_LOG_DECAY``). Everything accumulates in float32; o has v's dtype.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (
    Forms, check_form, from_chunks, gates_float32, same_segment, state_float32, to_chunks,
)
from lmzoo.ops.delta import heads_first, value_heads
from lmzoo.ops.dplr import delta_as_dplr, dplr_jla_call
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.ut import decayed_pairs, invert_unit_lower, unit_lower, ut_chunks

METHODS = Forms("naive", "chunk", "parallel", *PROVIDER_FORMS)
BEST = "chunk"  # the form ``auto`` runs where jla's kernel does not (``lmzoo.ops.kernels``)
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def precond_delta_rule(q, k, v, beta, log_g, beta_atk, log_g_atk, *, squash=1.5, center=-0.2, eps=1e-6, scale=None,
                       initial_state=None, method="chunk", chunk_size=64, segment_ids=None):
    """q, k [B,T,H,Dk], v [B,T,HV,Dv], beta [B,T,HV], log_g None, [B,T,HV] or [B,T,HV,Dk]; beta_atk, log_g_atk
    [B,T,H]; ``center`` a number or [H]; initial_state None or (S [B,HV,Dk,Dv], A [B,H,Dk]).

    ``method="auto"`` runs jla's Hopper kernel (its ``rwkv7``, through ``jla_call``) where it takes the call and
    ``"chunk"`` otherwise. Returns (o [B,T,HV,Dv] in v's dtype, (S_T, A_T) float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if squash <= 1.0:
        raise ValueError(f"squash={squash} must exceed 1 (the preconditioner lies in [1/squash, squash])")
    value_heads(q, k, v.shape)  # checks the grouping
    if beta.shape != v.shape[:3]:
        raise ValueError(f"beta has shape {beta.shape}; expected {v.shape[:3]}")
    for name, x in (("beta_atk", beta_atk), ("log_g_atk", log_g_atk)):
        if x.shape != k.shape[:3]:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape[:3]}")
    center = jnp.broadcast_to(jnp.asarray(center, jnp.float32), (k.shape[2],))
    # (w, A) once, and only where a provider runs: its call writes under w, and A_T is the state's second half
    keys = functools.cache(lambda: provider_keys(k, beta_atk, log_g_atk, center, squash=squash, eps=eps,
                                                 initial_state=initial_state, segment_ids=segment_ids))
    form, mapped = kernels.resolve(
        "precond_delta_rule", method, BEST,
        lambda: jla_call(q, k, v, beta, log_g, keys()[0], scale, initial_state, segment_ids))
    if mapped is None:
        return _precond_delta_rule(q, k, v, beta, log_g, beta_atk, log_g_atk, center, squash=squash, eps=eps,
                                   scale=scale, initial_state=initial_state, method=form, chunk_size=chunk_size,
                                   segment_ids=segment_ids)
    out, state = kernels.run(mapped)
    return out.astype(v.dtype), (state, keys()[1][:, -1])


def jla_call(q, k, v, beta, log_g, written, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """The preconditioned delta rule's S as jla's ``rwkv7`` given the written keys w [B,T,H,Dk]: its step
    ``(I - beta w k^T) diag(exp(g)) S + beta w v^T`` is the DPLR rule with ``a = exp(g) * k`` (the decayed state's
    read), ``b = -beta w`` and ``k' = beta w`` (``delta_as_dplr``; k' in k's dtype, as jla's kernel takes it), q, k
    and w repeated to the value heads. jla zeroes S at a segment start, where lmzoo's decay forgets it."""
    q, k = value_heads(q, k, v.shape)
    written = value_heads(written, written, v.shape)[0]
    k_written, alpha, low_rank = delta_as_dplr(k, beta, log_g, written=written)
    s0 = None if initial_state is None else initial_state[0]
    return dplr_jla_call(q, k_written.astype(k.dtype), v, alpha, low_rank, log_g, scale, s0, segment_ids)


def provider_keys(k, beta_atk, log_g_atk, center, *, squash, eps, initial_state, segment_ids):
    """(w, A) [B,T,H,Dk] float32, as the chunk form computes them: the second moment A from A_0 (zeros without an
    initial state), forgetting at each segment start, and the written keys ``w = P(A) * k``."""
    a0 = state_float32(None if initial_state is None else initial_state[1], k.shape[:1] + k.shape[2:])
    gates = gates_float32(log_g_atk, segment_ids, k.shape)[..., 0]
    preconditioner = functools.partial(precondition, center=center, squash=squash, eps=eps)
    return written_keys(k.astype(jnp.float32), beta_atk.astype(jnp.float32), gates, a0, preconditioner)


@functools.partial(jax.jit, static_argnames=("squash", "eps", "scale", "method", "chunk_size"))
def _precond_delta_rule(q, k, v, beta, log_g, beta_atk, log_g_atk, center, *, squash, eps, scale, initial_state,
                        method, chunk_size, segment_ids):
    batch, _, heads, d_key = k.shape
    s0, a0 = (None, None) if initial_state is None else initial_state
    s0 = state_float32(s0, (batch, v.shape[2], d_key, v.shape[-1]))
    a0 = state_float32(a0, (batch, heads, d_key))
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    g32 = gates_float32(log_g, segment_ids, v.shape[:3] + (d_key,))
    atk = (beta_atk.astype(jnp.float32), gates_float32(log_g_atk, segment_ids, k.shape)[..., 0])
    preconditioner = functools.partial(precondition, center=center, squash=squash, eps=eps)
    out, states = _FORMS[method](q32 * scale, k32, v32, beta.astype(jnp.float32), g32, *atk, s0, a0,
                                 preconditioner, chunk_size)
    return out.astype(v.dtype), states


@functools.partial(jax.jit, static_argnames=("squash", "eps", "scale"))
def precond_delta_rule_weights(q, k, beta, log_g, beta_atk, log_g_atk, *, squash=1.5, center=-0.2, eps=1e-6,
                               scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, HV, T, S] float32 that ``precond_delta_rule`` applies to v from zero
    states: ``scale * P_<=(q, w) (I + diag(beta) P_<(k, w))^{-1} diag(beta)``; exactly 0 across segments."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    center = jnp.broadcast_to(jnp.asarray(center, jnp.float32), (k.shape[2],))
    k32 = k.astype(jnp.float32)
    atk_gates = gates_float32(log_g_atk, segment_ids, k.shape)[..., 0]
    preconditioner = functools.partial(precondition, center=center, squash=squash, eps=eps)
    written, _ = written_keys(k32, beta_atk.astype(jnp.float32), atk_gates, jnp.zeros_like(k32[:, 0]), preconditioner)
    q, k32 = value_heads(q.astype(jnp.float32), k32, beta.shape)
    written = value_heads(written, written, beta.shape)[0]
    log_g = gates_float32(log_g, segment_ids, k32.shape)
    log_g = None if log_g is None else heads_first(log_g)
    q, k32, written = (heads_first(a) for a in (q, k32, written))  # (B, HV, T, Dk)
    beta = beta.astype(jnp.float32).swapaxes(1, 2)  # (B, HV, T)
    reads = decayed_pairs(q * scale, written, log_g, diagonal=True)
    weights = reads @ (invert_unit_lower(unit_lower(k32, beta, log_g, written)) * beta[..., None, :])
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)


def precondition(second_moment, *, center, squash: float, eps: float) -> jax.Array:
    """The preconditioner P in [1/squash, squash] from A [B, (T,) H, Dk], ``center`` [H]: ``exp(-log(squash) s)``
    with ``s = r / (1 + |r|)`` and ``r = log(A + eps) - center``, a soft sign of how far A is from its centre."""
    r = jnp.log(second_moment + eps) - center[:, None]
    return jnp.exp(-math.log(squash) * r / (1.0 + jnp.abs(r)))


def written_keys(k, beta_atk, log_g_atk, a0, preconditioner) -> tuple[jax.Array, jax.Array]:
    """(w = P(A) * k, A) [B,T,H,Dk] from float32 k, the second moment's gates and A_0 (``atk_scan``)."""
    second_moment = atk_scan(k, beta_atk, log_g_atk, a0)
    return k * preconditioner(second_moment), second_moment


def atk_scan(k, beta_atk, log_g_atk, a0) -> jax.Array:
    """A_t [B,T,H,Dk] of ``A_t = exp(log_g_atk_t) A_{t-1} + beta_atk_t k_t^2`` from A_0 [B,H,Dk], by an associative
    scan over (log decay, value) pairs: ``(a, x) then (b, y) = (a + b, exp(b) x + y)``."""
    def combine(earlier, later):
        (decay_a, x), (decay_b, y) = earlier, later
        return decay_a + decay_b, jnp.exp(decay_b)[..., None] * x + y

    decays, added = lax.associative_scan(combine, (log_g_atk, beta_atk[..., None] * k * k), axis=1)
    return jnp.exp(decays)[..., None] * a0[:, None] + added


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,HV,Dv], beta [B,T,HV], log_g [B,T,HV,Dg] or None,
# beta_atk, log_g_atk [B,T,H], S0 [B,HV,Dk,Dv], A0 [B,H,Dk], the preconditioner, and returns (o, (S, A)).


def _naive(q, k, v, beta, log_g, beta_atk, log_g_atk, s0, a0, preconditioner, chunk_size):
    group = v.shape[2] // k.shape[2]

    def step(states, inputs):
        s, a = states  # (B, HV, Dk, Dv), (B, H, Dk)
        q_t, k_t, v_t, beta_t, ba_t, ga_t, *g_t = inputs  # (B, H, Dk) x2, (B, HV, Dv), (B, HV), (B, H) x2
        a = jnp.exp(ga_t)[..., None] * a + ba_t[..., None] * k_t * k_t
        written = jnp.repeat(k_t * preconditioner(a), group, axis=1)  # (B, HV, Dk)
        q_t, k_t = jnp.repeat(q_t, group, axis=1), jnp.repeat(k_t, group, axis=1)
        if g_t:
            s = jnp.exp(g_t[0])[..., None] * s
        error = v_t - jnp.einsum("bhd,bhde->bhe", k_t, s)  # v_t against what the decayed state recalls for k_t
        s = s + (beta_t[..., None] * written)[..., :, None] * error[..., None, :]
        return (s, a), jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = (q, k, v, beta, beta_atk, log_g_atk) + (() if log_g is None else (log_g,))
    final, out = lax.scan(step, (s0, a0), tuple(x.swapaxes(0, 1) for x in steps))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, beta, log_g, beta_atk, log_g_atk, s0, a0, preconditioner, chunk_size):
    written, second_moment = written_keys(k, beta_atk, log_g_atk, a0, preconditioner)  # (B, T, H, Dk) x2
    q, k = value_heads(q, k, v.shape)
    written = value_heads(written, written, v.shape)[0]
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    # (B, N, HV, C, *); padded steps have k = w = 0, beta = 0, log_g = 0: they neither write nor decay
    qc, kc, vc, wc = (heads_first(to_chunks(x, size)) for x in (q, k, v, written))
    beta_c = to_chunks(beta, size).swapaxes(2, 3)
    g_c = None if log_g is None else heads_first(to_chunks(log_g, size))
    out, final = ut_chunks(qc, kc, vc, beta_c, g_c, s0, written=wc)
    return from_chunks(heads_first(out), length), (final, second_moment[:, -1])


def _parallel(q, k, v, beta, log_g, beta_atk, log_g_atk, s0, a0, preconditioner, chunk_size):
    """The whole sequence as one chunk: the UT representation with no recurrence."""
    return _chunk(q, k, v, beta, log_g, beta_atk, log_g_atk, s0, a0, preconditioner, q.shape[1])


_FORMS = {"naive": _naive, "chunk": _chunk, "parallel": _parallel}
