"""Gated DeltaProduct (Siems et al., 2025): n_h delta-rule steps per token, one decay per token.

Per head and token t, with sub-steps j = 0 .. n_h - 1 (keys, values and step sizes of their own):

    S  <- exp(log_g_t) S_{t-1}                                       (once per token; none without gates)
    S  <- S + beta_{t,j} k_{t,j} (v_{t,j} - S^T k_{t,j})^T            for j = 0 .. n_h - 1, in order
    o_t = scale * S^T q_t                                            (read after the last sub-step)

S is ``[Dk, Dv]`` per head (key dimension first). With unit keys each sub-step multiplies the state
by the generalised Householder matrix ``I - beta k k^T``, whose eigenvalue along k is ``1 - beta``:
beta in (0, 1) keeps it in (0, 1), beta in (0, 2) lets it reach (-1, 1). A token's transition is a
product of n_h such matrices, so it can rotate and reflect the state (a single step with beta <= 1
cannot flip a sign: the reason the delta rule cannot track parity, and DeltaProduct with n_h >= 2
and beta in (0, 2) can). The op neither normalises q, k nor squashes beta: the mixer does.

Forms (``method``):

- ``"naive"``: the recurrence above written out, one token and sub-step at a time -- the reference
  (``"scan"`` in older runs, which lmzoo.record.migrate renames);
- ``"chunk"``, ``"parallel"``: the same forms of ``lmzoo.ops.delta_rule`` over the expanded
  sequence of T * n_h sub-steps. That expansion is exact: the gated delta rule on it, with
  token t's gate on its first sub-step (a zero log gate on the others) and token t's query on its
  last sub-step (zero queries elsewhere, whose outputs are dropped), performs exactly the updates
  above in the same order. ``chunk_size`` counts tokens, so a chunk holds ``chunk_size * n_h``
  sub-steps. Documents (``segment_ids``) expand with their tokens: a document's first token's first
  sub-step carries the reset, as the gate does.

``delta_product_weights`` gives the effective weights on every sub-step's value (zero initial
state): the delta rule's weights on the expanded sequence, read at each token's last sub-step.
Gates, decays and states are float32 whatever the input dtype; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, check_form, gate_layout, reset_gates
from lmzoo.ops.delta import delta_rule, delta_rule_weights
from lmzoo.ops.kernels import PROVIDER_FORMS

# auto, jla: the delta rule's, over the sub-steps
METHODS = Forms("naive", "chunk", "parallel", *PROVIDER_FORMS)

STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): its one token-by-token form


@functools.partial(jax.jit, static_argnames=("scale", "method", "chunk_size"))
def delta_product(q, k, v, beta, log_g=None, *, scale=None, initial_state=None, method="chunk", chunk_size=64,
                  segment_ids=None):
    """q [B,T,H,Dk], k [B,T,H,n_h,Dk], v [B,T,H,n_h,Dv], beta [B,T,H,n_h], log_g None, [B,T,H] or [B,T,H,Dk].

    ``segment_ids`` [B,T]: the state restarts at each segment start. Returns
    (o [B,T,H,Dv] in v's dtype, S_T [B,H,Dk,Dv] float32).
    """
    method = check_form(method, METHODS, chunk_size)
    check_shapes(q, k, v, beta)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    batch, _, heads, steps, d_key = k.shape
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, d_key, v.shape[-1]), jnp.float32)
    if method != "naive":
        qx, kx, vx, beta_x, g_x, ids_x = expand(q, k, v, beta, log_g, segment_ids)
        out, state = delta_rule(qx, kx, vx, beta_x, g_x, scale=scale, initial_state=initial_state, method=method,
                                chunk_size=chunk_size * steps, segment_ids=ids_x)
        return last_sub_steps(out, steps), state
    g32 = None if log_g is None else gate_layout(log_g, q.shape).astype(jnp.float32)
    if segment_ids is not None:
        g32 = reset_gates(log_g, segment_ids, q.shape)
    q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
    out, state = _naive(q32 * scale, k32, v32, beta.astype(jnp.float32), g32, initial_state.astype(jnp.float32))
    return out.astype(v.dtype), state


@functools.partial(jax.jit, static_argnames=("scale",))
def delta_product_weights(q, k, beta, log_g=None, *, scale=None, segment_ids=None) -> jax.Array:
    """The effective causal weights [B, H, T, S, n_h] float32 that ``delta_product`` applies to the
    values (zero initial state): ``o_t = sum_{s, j} W[t, s, j] v_{s, j}``; exactly 0 across segments."""
    steps = k.shape[3]
    qx, kx, _, beta_x, g_x, ids_x = expand(q, k, None, beta, log_g, segment_ids)
    weights = delta_rule_weights(qx, kx, beta_x, g_x, scale=q.shape[-1] ** -0.5 if scale is None else scale,
                                 segment_ids=ids_x)  # (B, H, T * n_h, T * n_h)
    batch, heads, length = weights.shape[0], weights.shape[1], q.shape[1]
    rows = weights.reshape(batch, heads, length, steps, length * steps)[:, :, :, -1]  # each token's last sub-step
    return rows.reshape(batch, heads, length, length, steps)


def check_shapes(q, k, v, beta) -> None:
    if k.ndim != 5 or k.shape[:3] != q.shape[:3] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has shape {k.shape}; expected {q.shape[:3]} + (n_h, {q.shape[-1]})")
    if v.shape[:4] != k.shape[:4]:
        raise ValueError(f"v has shape {v.shape}; expected {k.shape[:4]} + (Dv,)")
    if beta.shape != k.shape[:4]:
        raise ValueError(f"beta has shape {beta.shape}; expected {k.shape[:4]}")


def expand(q, k, v, beta, log_g, segment_ids):
    """The delta rule's inputs over the T * n_h sub-steps: q on each token's last sub-step, the gate
    on its first, zeros elsewhere; segment ids repeated per sub-step (v None stays None)."""
    batch, length, heads, steps, d_key = k.shape

    def flat(x):  # [B, T, H, n_h, ...] -> [B, T * n_h, H, ...]
        return jnp.moveaxis(x, 3, 2).reshape(batch, length * steps, heads, *x.shape[4:])

    def on_sub_step(x, j):  # [B, T, H, ...] placed on sub-step j of each token, zeros on the others
        placed = jnp.zeros(x.shape[:3] + (steps,) + x.shape[3:], x.dtype).at[:, :, :, j].set(x)
        return flat(placed)

    qx = on_sub_step(q, steps - 1)
    g_x = None if log_g is None else on_sub_step(gate_layout(log_g, q.shape).astype(jnp.float32), 0)
    ids_x = None if segment_ids is None else jnp.repeat(segment_ids, steps, axis=1)
    return qx, flat(k), None if v is None else flat(v), flat(beta[..., None])[..., 0], g_x, ids_x


def last_sub_steps(out, steps):
    """[B, T * n_h, H, Dv] -> [B, T, H, Dv]: the outputs read at each token's last sub-step."""
    batch, _, heads, d_value = out.shape
    return out.reshape(batch, -1, steps, heads, d_value)[:, :, -1]


def _naive(q, k, v, beta, log_g, s0):
    """float32 q (scaled) [B,T,H,Dk], k [B,T,H,n_h,Dk], v [B,T,H,n_h,Dv], beta [B,T,H,n_h], log_g [B,T,H,Dg] or None."""

    def token(s, inputs):
        q_t, k_t, v_t, beta_t, *g_t = inputs  # (B, H, Dk), (B, H, n_h, Dk), (B, H, n_h, Dv), (B, H, n_h)
        if g_t:
            s = jnp.exp(g_t[0])[..., None] * s
        for j in range(k_t.shape[2]):
            error = v_t[:, :, j] - jnp.einsum("bhd,bhde->bhe", k_t[:, :, j], s)
            s = s + (beta_t[:, :, j, None] * k_t[:, :, j])[..., :, None] * error[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    steps = (q, k, v, beta) if log_g is None else (q, k, v, beta, log_g)
    final, out = lax.scan(token, s0, tuple(a.swapaxes(0, 1) for a in steps))
    return out.swapaxes(0, 1), final
