"""Mamba-3's recurrence (Lahoti et al., 2026), single input single output: a trapezoidal
discretisation of a selective SSM whose complex state is carried as data-dependent rotations.

Per head (state ``h`` of shape [P, N]: P channels x N state entries), step t:

    alpha_t = exp(dt_t A_t)                    A_t < 0 (per step and head; a constant A_h broadcasts)
    beta_t  = (1 - lam_t) dt_t alpha_t         gamma_t = lam_t dt_t           lam_t in [0, 1]
    phi_t   = phi_{t-1} + dt_t theta_t         R angles per head; phi_{-1} from the initial state
    B~_t    = rot(phi_t) B_t,   C~_t = rot(phi_t) C_t
    h_t     = alpha_t h_{t-1} + beta_t x_{t-1} B~_{t-1}^T + gamma_t x_t B~_t^T
    y_t     = h_t C~_t + D x_t

``rot(phi)`` turns the pair of state entries (2i, 2i + 1) by the angle phi_i for i < R and leaves
the entries from 2R on as they are. A complex diagonal SSM with eigenvalues exp(dt (A + i theta))
is this real SSM with rotated B and C: the rotations accumulate in the state, and
``C~_t . B~_s = C_t . rot(phi_s - phi_t) B_s`` depends only on the phase travelled between s and t.
lam = 1 is Mamba-2's Euler step (``lmzoo.ops.ssd``); lam = 1/2 is the trapezoid rule, whose
``beta`` term reaches one token back (the reason Mamba-3 drops the short convolution). At t = 0
the previous token is the initial state's (``x`` and ``B``; zeros without one).

State (``initial_state`` and the returned final state): a dict of float32 arrays
``{"h": [B,H,P,N], "x": [B,H,P], "B": [B,H,N], "phase": [B,H,R]}`` -- the SSM state, the last
input and rotated key (the next step's ``beta`` term needs them), and the last phase (returned
modulo 2 pi, so that decoding keeps it small).

Forms (``method``):

- ``"naive"``: the recurrence above, one step at a time (the reference);
- ``"scan"``, ``"chunk"``: those forms of ``lmzoo.ops.gated.gla_form`` (one gate per head),
  through this identity. Write ``mu_t = (1 - lam_t) dt_t`` (so beta_t = alpha_t mu_t; mu_T = 0)
  and run the Euler-style SSM

      H_t = alpha_t H_{t-1} + w_t x_t B~_t^T,    w_t = gamma_t + mu_{t+1},
      H_{-1} = h_{-1} + mu_0 x_{-1} B~_{-1}^T.

  By induction ``H_t = h_t + mu_{t+1} x_t B~_t^T``: the trapezoid's look-back term is paid one step
  early, into the state that the next step decays by alpha_{t+1}. Hence ``H_{T-1} = h_{T-1}`` and,
  since ``h_t = alpha_t H_{t-1} + gamma_t x_t B~_t^T``,

      y_t = (alpha_t C~_t)^T H_{t-1} + gamma_t (C~_t . B~_t) x_t + D x_t:

  an SSD (GLA with k = B~, v = w x, log_g = dt A, scale 1) whose query at step t - 1 is the next
  step's ``alpha_t C~_t``, plus an elementwise diagonal term. Reading H_{t-1} keeps every output
  exactly causal: H_{t-1} holds mu_t, never a later step's (reading H_t and subtracting its
  mu_{t+1} term would cancel only up to rounding).
- ``"jla"``, ``"auto"``: jax-linear-attention's ``mamba3`` kind, the same trapezoid on the rotated
  B~ and C~ (``jla_call``: q = C~, k = B~, v = x in x's dtype, ``g = dt A``, ``beta = alpha mu``,
  ``gamma = lam dt``, its state ``h`` transposed; ``lmzoo.ops.kernels``); ``auto`` runs ``"chunk"``
  where jla's Hopper kernel does not take the call.

Documents (``segment_ids``): at a document's first step the decay forgets (``RESET_LOG_DECAY``),
the look-back term is dropped (mu = 0 there: the previous token is another document's) and the
phase restarts from 0. ``mamba3_attention`` gives the weights ``y = W x`` (before D):
``W_ts = (C~_t . B~_s) exp(sum_{s<m<=t} dt_m A_m) (gamma_s + [s < t] mu_{s+1})``.
Everything is computed in float32; y has x's dtype.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops import kernels
from lmzoo.ops.common import RESET_LOG_DECAY, Forms, check_form, segment_starts
from lmzoo.ops.gated import gla_form, gla_weights
from lmzoo.ops.kernels import PROVIDER_FORMS
from lmzoo.ops.ssd import per_head

METHODS = Forms("naive", "scan", "chunk", *PROVIDER_FORMS)
BEST = "chunk"  # the form ``auto`` runs where jla's kernel does not
STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): the trapezoid as written


def zero_state(batch: int, heads: int, head_dim: int, d_state: int, angles: int) -> dict:
    """The state before any token: nothing stored, no previous token, phase 0."""
    zeros = lambda *shape: jnp.zeros((batch, heads, *shape), jnp.float32)  # noqa: E731
    return {"h": zeros(head_dim, d_state), "x": zeros(head_dim), "B": zeros(d_state), "phase": zeros(angles)}


def mamba3(x, dt, A, B, C, lam, theta, *, D=None, initial_state=None, method="chunk", chunk_size=64, segment_ids=None):
    """x [B,T,H,P]; dt [B,T,H] (> 0); A [B,T,H] or [H] (< 0); B, C [B,T,G,N] (G divides H);
    lam [B,T,H] in [0, 1]; theta [B,T,H,R] (R <= N/2, rotation rates); D [H] or None.

    Returns ``(y [B,T,H,P] in x's dtype, final state)`` (the state dict described above).
    """
    method = check_form(method, METHODS, chunk_size)
    d_state, angles = B.shape[-1], theta.shape[-1]
    if 2 * angles > d_state or theta.shape[:3] != x.shape[:3]:
        raise ValueError(f"theta has shape {theta.shape}; expected {x.shape[:3]} + (R,) with R <= N/2 = {d_state // 2}")
    prepared = functools.cache(lambda: _prepare(x, dt, A, B, C, lam, theta, initial_state, segment_ids))
    form, mapped = kernels.resolve("mamba3", method, BEST, lambda: jla_call(prepared(), x, initial_state, segment_ids))
    if mapped is None:
        return _mamba3(x, dt, A, B, C, lam, theta, D=D, initial_state=initial_state, method=form, chunk_size=chunk_size,
                       segment_ids=segment_ids)
    return _from_jla(kernels.run(mapped), prepared(), x, D)


class Prepared(NamedTuple):
    """The recurrence's float32 inputs: x, log_a = dt A (without document resets), gamma = lam dt, the look-back
    weight mu = (1 - lam) dt (0 at document starts), the phases and the rotated b, c [B,T,H,N]; and the state."""

    x: jax.Array
    log_a: jax.Array
    gamma: jax.Array
    mu: jax.Array
    phase: jax.Array
    b: jax.Array
    c: jax.Array
    state: dict


def _prepare(x, dt, A, B, C, lam, theta, initial_state, segment_ids) -> Prepared:
    batch, _, heads, head_dim = x.shape
    state = zero_state(batch, heads, head_dim, B.shape[-1], theta.shape[-1]) if initial_state is None else initial_state
    state = jax.tree.map(lambda a: a.astype(jnp.float32), state)
    x32, dt, lam, theta = (a.astype(jnp.float32) for a in (x, dt, lam, theta))
    log_a = dt * jnp.broadcast_to(A.astype(jnp.float32), dt.shape)
    mu = (1.0 - lam) * dt  # the look-back weight, beta_t / alpha_t
    if segment_ids is not None:
        mu = jnp.where(segment_starts(segment_ids)[..., None], 0.0, mu)
    phase = phases(dt[..., None] * theta, state["phase"], segment_ids)  # (B, T, H, R)
    b, c = rotate(per_head(B, heads), phase), rotate(per_head(C, heads), phase)
    return Prepared(x32, log_a, lam * dt, mu, phase, b, c, state)


def _final_state(h, p: Prepared) -> dict:
    return {"h": h, "x": p.x[:, -1], "B": p.b[:, -1], "phase": jnp.mod(p.phase[:, -1], 2 * math.pi)}


@functools.partial(jax.jit, static_argnames=("method", "chunk_size"))
def _mamba3(x, dt, A, B, C, lam, theta, *, D, initial_state, method, chunk_size, segment_ids):
    """``mamba3`` in one of lmzoo's own forms."""
    p = _prepare(x, dt, A, B, C, lam, theta, initial_state, segment_ids)
    log_a = p.log_a
    if segment_ids is not None:  # forget the state where a document starts
        log_a = log_a + jnp.where(segment_starts(segment_ids)[..., None], RESET_LOG_DECAY, 0.0)
    if method == "naive":
        y, h = _naive(p.x, log_a, p.gamma, p.mu, p.b, p.c, p.state)
    else:
        y, h = _through_gla(p.x, log_a, p.gamma, p.mu, p.b, p.c, p.state, method, chunk_size)
    if D is not None:
        y = y + D.astype(jnp.float32)[:, None] * p.x
    return y.astype(x.dtype), _final_state(h, p)


def jla_call(p: Prepared, x, initial_state, segment_ids) -> kernels.JlaCall:
    """Mamba-3 as jla's ``mamba3`` (the same trapezoid, state [N, P] per head): q = C~, k = B~ (rotated here: jla
    leaves rotations to the layer) and v = x in x's dtype, ``g = dt A``, ``beta = exp(dt A) (1 - lam) dt``
    (alpha mu), ``gamma = lam dt``, scale 1; its state is (h^T, the last B~, the last x). jla zeroes the state
    and the previous token at every change of segment id, so g carries no reset."""
    s0 = None
    if initial_state is not None:
        state = p.state
        s0 = kernels.jla_ops().reference.Mamba3State(state["h"].swapaxes(-1, -2), state["B"], state["x"])
    gates = {"g": p.log_a, "beta": jnp.exp(p.log_a) * p.mu, "gamma": p.gamma}
    options = {"scale": 1.0, "initial_state": s0, "segment_ids": segment_ids}
    return kernels.JlaCall("mamba3", p.c.astype(x.dtype), p.b.astype(x.dtype), x, gates, options)


def _from_jla(result, p: Prepared, x, D):
    """``mamba3``'s (y, state) from jla's (o, Mamba3State): D added in float32, h transposed back to [P, N]; the
    last x and B~ are taken from the inputs in float32 (jla's copies are rounded to x's dtype)."""
    o, final = result
    y = o.astype(jnp.float32)
    if D is not None:
        y = y + D.astype(jnp.float32)[:, None] * p.x
    return y.astype(x.dtype), _final_state(final.ssm.swapaxes(-1, -2), p)


@jax.jit
def mamba3_attention(dt, A, B, C, lam, theta, *, segment_ids=None) -> jax.Array:
    """The causal weights [B,H,T,T] float32 with ``y_t = sum_s W_ts x_s`` per head (zero initial
    state, before the D skip); exactly 0 across segments."""
    heads = dt.shape[-1]
    dt, lam, theta = (a.astype(jnp.float32) for a in (dt, lam, theta))
    log_a = dt * jnp.broadcast_to(A.astype(jnp.float32), dt.shape)
    mu = (1.0 - lam) * dt
    if segment_ids is not None:
        mu = jnp.where(segment_starts(segment_ids)[..., None], 0.0, mu)
    phase = phases(dt[..., None] * theta, jnp.zeros(theta.shape[:1] + theta.shape[2:]), segment_ids)
    b, c = rotate(per_head(B, heads), phase), rotate(per_head(C, heads), phase)
    scores = gla_weights(c, b, log_a, scale=1.0, segment_ids=segment_ids)  # (B, H, T, S): C~_t . B~_s decayed
    earlier = jnp.tril(jnp.ones((dt.shape[1],) * 2, bool), -1)  # s < t: mu_{s+1} is known by step t
    look_back = jnp.where(earlier, scores * next_step(mu).swapaxes(1, 2)[:, :, None, :], 0.0)
    return scores * (lam * dt).swapaxes(1, 2)[:, :, None, :] + look_back


def next_step(a):
    """[B, T, ...] -> a_{t+1} along T, 0 after the last step."""
    return jnp.concatenate([a[:, 1:], jnp.zeros_like(a[:, :1])], axis=1)


def phases(advance, start, segment_ids):
    """phi_t = phi_{-1} + sum_{m<=t} advance_m, restarting from 0 at each segment start:
    advance [B,T,H,R], start [B,H,R] -> [B,T,H,R]."""
    if segment_ids is None:
        return start[:, None] + jnp.cumsum(advance, axis=1)
    restart = segment_starts(segment_ids)[..., None, None]  # (B, T, 1, 1)
    advance = advance.at[:, 0].add(start)  # the initial phase belongs to the first segment

    def combine(a, b):  # (restarted, sum) pairs: a later restart drops everything before it
        return a[0] | b[0], jnp.where(b[0], b[1], a[1] + b[1])

    _, total = lax.associative_scan(combine, (jnp.broadcast_to(restart, advance.shape), advance), axis=1)
    return total


def rotate(v, phase):
    """Turn the pairs (2i, 2i + 1) of v [B,T,H,N] by phase [B,T,H,R] (i < R); entries from 2R on stay."""
    pairs = 2 * phase.shape[-1]
    even, odd = v[..., :pairs:2], v[..., 1:pairs:2]
    cos, sin = jnp.cos(phase), jnp.sin(phase)
    turned = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1).reshape(*v.shape[:-1], pairs)
    return jnp.concatenate([turned, v[..., pairs:]], axis=-1)


# ----------------------------------------------------------------------------- forms
# float32 x [B,T,H,P], log_a = dt A, gamma = lam dt, mu = (1 - lam) dt [B,T,H], rotated b, c [B,T,H,N].


def _naive(x, log_a, gamma, mu, b, c, state):
    def step(carry, inputs):
        h, x_prev, b_prev = carry
        x_t, log_a_t, gamma_t, mu_t, b_t, c_t = inputs  # (B, H, P), (B, H) x3, (B, H, N) x2
        alpha = jnp.exp(log_a_t)[..., None, None]
        h = (alpha * h + (alpha * mu_t[..., None, None]) * x_prev[..., None] * b_prev[..., None, :]
             + gamma_t[..., None, None] * x_t[..., None] * b_t[..., None, :])  # (B, H, P, N)
        return (h, x_t, b_t), jnp.einsum("bhpn,bhn->bhp", h, c_t)

    carry = (state["h"], state["x"], state["B"])
    (h, _, _), y = lax.scan(step, carry, tuple(a.swapaxes(0, 1) for a in (x, log_a, gamma, mu, b, c)))
    return y.swapaxes(0, 1), h


def _through_gla(x, log_a, gamma, mu, b, c, state, method, chunk_size):
    h_before = state["h"] + mu[:, 0, :, None, None] * state["x"][..., None] * state["B"][..., None, :]  # H_{-1}
    v = (gamma + next_step(mu))[..., None] * x  # the input paid one step early
    reads = jnp.exp(log_a)[..., None] * c  # alpha_t C~_t, the query of step t - 1
    out, h = gla_form(next_step(reads), b, v, log_a, scale=1.0, initial_state=jnp.swapaxes(h_before, -1, -2),
                      method=method, chunk_size=chunk_size, segment_ids=None)  # GLA's state is [N, P]
    first = jnp.einsum("bhpn,bhn->bhp", h_before, reads[:, 0])  # step 0 reads H_{-1}
    previous = jnp.concatenate([first[:, None], out[:, :-1]], axis=1)  # (B, T, H, P): (alpha_t C~_t)^T H_{t-1}
    same_step = gamma * jnp.sum(c * b, axis=-1)  # (B, T, H)
    return previous + same_step[..., None] * x, jnp.swapaxes(h, -1, -2)
