"""The delta rule (DeltaNet; Gated DeltaNet; per-channel gates as in Kimi Delta Attention).

Per value head and step, with a log-space decay ``log_g`` (none, one per head, or one per key channel):

    S'_t = diag(exp(log_g_t)) S_{t-1}                  (S'_t = S_{t-1} without gates)
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T       (write v_t where k_t points, by beta_t)
    o_t  = scale * S_t^T q_t

S is ``[Dk, Dv]`` per value head (key dimension first). Grouped value heads: with HV value heads
over H query/key heads (HV a multiple of H, as Qwen3-Next and Kimi Linear's GVA use them), value
head hv uses key head ``hv // (HV / H)``; every form runs on q, k repeated to HV heads, since the
pair products depend on each value head's own beta and gates anyway. The op neither normalises q, k nor squashes
beta: the mixer does (unit keys and beta in [0, 1] keep every step a contraction).

Forms (``method``):

- ``"naive"``:    the recurrence written out, one step at a time -- the reference (``"scan"`` in
  older runs, which lmzoo.record.migrate renames);
- ``"chunk"``:    the WY / UT representation inside chunks of ``chunk_size`` steps, a short
  recurrence across them (derived below);
- ``"chunk_recompute"``: the chunk form keeping only its inputs for the backward pass, which
  recomputes the rest: ~15x less held per layer in training, one more forward pass of the op; its
  gradients equal the chunk form's to float32 rounding, not bit for bit;
- ``"parallel"``: the same representation over the whole sequence as one chunk: quadratic in T,
  no recurrence at all; it is also how ``delta_rule_weights`` gets the effective attention matrix.
- ``"pallas"``:   the chunk form with its sequential pass across chunks and its outputs as Pallas
  kernels with their own backward (``lmzoo.ops.pallas.delta``): compiled on a GPU or TPU,
  interpret mode on a CPU.

Gradients of the other forms are JAX's own (autodiff through the scan, the matmuls and the inverse).

The UT representation. Inside a chunk that starts from state S_0, let b_t = sum_{m<=t} log_g_m
(per channel, from the chunk's start) and ``u_t = beta_t (v_t - S'_t^T k_t)`` the value actually
written at step t, so that ``S_t = S'_t + k_t u_t^T``. Unrolled,

    S_t = exp(b_t) * S_0 + sum_{j<=t} (exp(b_t - b_j) * k_j) u_j^T,

and putting this into u_t's definition gives, with ``P(x, y)_tj = sum_d x_td y_jd exp(b_td - b_jd)``,

    u_t + beta_t sum_{j<t} P(k, k)_tj u_j = beta_t (v_t - S_0^T (exp(b_t) * k_t)),

a unit lower-triangular system ``(I + diag(beta) P_<(k, k)) U = diag(beta) (V - (K exp(b)) S_0)``.
One triangular inverse turns the chunk's C sequential rank-one updates into matmuls:
``U = W_v - W_k S_0`` with ``[W_v, W_k] = (I + diag(beta) P_<)^{-1} diag(beta) [V, K exp(b)]``, then

    O   = scale * ((Q exp(b)) S_0 + P_<=(q, k) U)
    S_C = exp(b_C) * S_0 + (K exp(b_C - b))^T U.

Across chunks only ``U = W_v - W_k S`` and ``S_C`` are sequential (two matmuls per chunk).
From a zero state the layer's effective weights on the values follow directly (``o = A v``):
``A = scale * P_<=(q, k) (I + diag(beta) P_<(k, k))^{-1} diag(beta)`` (``delta_rule_weights``).

Numerics. Every decay is an exponent <= 0 taken from sums over nearby steps only:
``exp(b_t)`` and ``exp(b_C - b_t)`` from the chunk's edges, and the pair decays ``exp(b_i - b_j)``
inside ``P`` by halving (``decayed_pairs``), never as ``exp(b_i) exp(-b_j)``, which overflows once a
chunk decays by more than ~88 nats. So any chunk size is exact however strong the gates. Gates,
decays, states and every product accumulate in float32 whatever the input dtype; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import (
    Forms, check_form, from_chunks, gate_layout, gates_float32, in_float32, recompute_in_backward, reset_gates,
    same_segment, state_float32, to_chunks,
)
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.pallas.delta import delta_rule_pallas
from lmzoo.ops.ut import decayed_pairs, invert_unit_lower, unit_lower, ut_chunks

METHODS = Forms("naive", "parallel", "chunk", "chunk_recompute", "pallas", *PROVIDER_FORMS)
BEST = "chunk"  # the form ``auto`` runs where jla's kernel does not (``lmzoo.ops.kernels``)
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


def delta_rule(q, k, v, beta, log_g=None, *, scale=None, initial_state=None, method="chunk", chunk_size=64,
               segment_ids=None):
    """q, k [B,T,H,Dk], v [B,T,HV,Dv], beta [B,T,HV], log_g None, [B,T,HV] (per head) or [B,T,HV,Dk].

    Grouped value heads: HV a multiple of H, value head hv reads and writes with key head
    ``hv // (HV / H)``; each value head has its own state, beta and gates.
    ``segment_ids`` [B,T]: the state restarts at each segment start, as a forget gate of zero
    (``RESET_LOG_DECAY``), which every form already runs exactly however strong.
    ``method="auto"`` runs jla's Hopper kernel, or deltanet-tpu's on a TPU, where it takes the call and ``"chunk"``
    otherwise.

    Returns (o [B, T, HV, Dv] in v's dtype, S_T [B, HV, Dk, Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = value_heads(q, k, v.shape)
    if beta.shape != k.shape[:3]:
        raise ValueError(f"beta has shape {beta.shape}; expected {k.shape[:3]}")
    return kernels.dispatch(
        "delta_rule", method, BEST, lambda: jla_call(q, k, v, beta, log_g, scale, initial_state, segment_ids),
        lambda form: _delta_rule(q, k, v, beta, log_g, scale=scale, initial_state=initial_state, method=form,
                                 chunk_size=chunk_size, segment_ids=segment_ids), v.dtype)


def jla_call(q, k, v, beta, log_g, scale, initial_state, segment_ids) -> kernels.JlaCall:
    """``delta_rule`` (q, k already per value head) as jla's ``deltanet`` (no gate), ``gated_deltanet``
    (one per head) or ``kda`` (one per key channel); jla normalises neither q nor k, as here."""
    s0 = kernels.state_or_none(initial_state)
    options = {"scale": scale, "initial_state": s0, "segment_ids": segment_ids, "use_qk_l2norm": False}
    gates = {"beta": beta}
    if log_g is None:
        return kernels.JlaCall("deltanet", q, k, v, gates, options)
    g = gate_layout(log_g, k.shape).astype(jnp.float32)
    if g.shape[-1] == 1:
        return kernels.JlaCall("gated_deltanet", q, k, v, {"g": g[..., 0], **gates}, options)
    return kernels.JlaCall("kda", q, k, v, {"g": g, **gates}, options)


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def _delta_rule(q, k, v, beta, log_g, *, scale, initial_state, method, chunk_size, segment_ids):
    """``delta_rule`` in one of lmzoo's own forms (q, k already per value head)."""
    batch, _, heads, d_key = k.shape
    s0 = state_float32(initial_state, (batch, heads, d_key, v.shape[-1]))
    g32 = gates_float32(log_g, segment_ids, k.shape)
    form = functools.partial(in_float32(_FORMS[method]), scale=scale, chunk_size=chunk_size)
    if method == "chunk_recompute":  # kept as autodiff saves them, the chunk form's intermediates (pair matrices,
        form = recompute_in_backward(form)  # their triangular inverse, decayed copies) are ~15x its inputs' size
    out, state = form(q, k, v, beta.astype(jnp.float32), g32, s0)
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def delta_rule_weights(q, k, beta, log_g=None, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, HV, T, S] float32 that ``delta_rule`` applies to v (zero
    initial state): ``scale * P_<=(q, k) (I + diag(beta) P_<(k, k))^{-1} diag(beta)``; exactly 0
    across segments. beta [B, T, HV] names the value heads (HV a multiple of q and k's H)."""
    q, k = value_heads(q, k, beta.shape)
    if segment_ids is not None:
        weights = delta_rule_weights(q, k, beta, reset_gates(log_g, segment_ids, k.shape), scale=scale)
        return jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    log_g = None if log_g is None else heads_first(gate_layout(log_g, k.shape).astype(jnp.float32))
    q, k = (heads_first(a.astype(jnp.float32)) for a in (q, k))  # (B, HV, T, Dk)
    beta = beta.astype(jnp.float32).swapaxes(1, 2)  # (B, HV, T)
    reads = decayed_pairs(q * scale, k, log_g, diagonal=True)
    return reads @ (invert_unit_lower(unit_lower(k, beta, log_g)) * beta[..., None, :])


def value_heads(q, k, value_shape):
    """q, k [B,T,H,Dk] repeated to the HV = ``value_shape[2]`` value heads (each key head serves
    HV / H consecutive value heads); their gradients sum back over the copies."""
    heads, value_heads_ = k.shape[2], value_shape[2]
    if q.shape[2] != heads or value_heads_ % heads:
        raise ValueError(f"value heads {value_heads_} must be a multiple of the {heads} key heads "
                         f"(q has {q.shape[2]} heads, k {heads})")
    group = value_heads_ // heads
    return (q, k) if group == 1 else (jnp.repeat(q, group, axis=2), jnp.repeat(k, group, axis=2))


def heads_first(x):
    """[B, T, H, D] -> [B, H, T, D] (and [B, N, C, H, D] -> [B, N, H, C, D]): time next to features."""
    return jnp.swapaxes(x, -3, -2)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k [B,T,H,Dk], v [B,T,H,Dv], beta [B,T,H], log_g [B,T,H,Dg] or None, S0.


def _naive(q, k, v, beta, log_g, s0, chunk_size):
    def step(s, inputs):
        q_t, k_t, v_t, beta_t, *g_t = inputs  # (B, H, Dk), (B, H, Dk), (B, H, Dv), (B, H); g_t [(B, H, Dg)] or []
        if g_t:
            s = jnp.exp(g_t[0])[..., None] * s
        error = v_t - jnp.einsum("bhd,bhde->bhe", k_t, s)  # v_t against what the state recalls for k_t
        s = s + (beta_t[..., None] * k_t)[..., :, None] * error[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = (q, k, v, beta) if log_g is None else (q, k, v, beta, log_g)
    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in steps))
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, beta, log_g, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    # (B, N, H, C, *); padded steps have k = 0, beta = 0, log_g = 0: they neither write nor decay
    qc, kc, vc = (heads_first(to_chunks(a, size)) for a in (q, k, v))
    beta_c = to_chunks(beta, size).swapaxes(2, 3)  # (B, N, H, C)
    g_c = None if log_g is None else heads_first(to_chunks(log_g, size))
    out, final = ut_chunks(qc, kc, vc, beta_c, g_c, s0)
    return from_chunks(heads_first(out), length), final


def _parallel(q, k, v, beta, log_g, s0, chunk_size):
    """The whole sequence as one chunk: the UT representation with no recurrence."""
    return _chunk(q, k, v, beta, log_g, s0, q.shape[1])


def _pallas(q, k, v, beta, log_g, s0, chunk_size):
    """The chunk form with its sequential pass and outputs as Pallas kernels (``lmzoo.ops.pallas.delta``)."""
    return delta_rule_pallas(q, k, v, beta, log_g, s0, chunk_size=chunk_size)


_FORMS = {"naive": _naive, "parallel": _parallel, "chunk": _chunk, "chunk_recompute": _chunk, "pallas": _pallas}
