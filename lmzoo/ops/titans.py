"""Titans' neural memory (Behrouz et al., 2025), linear memory: the test-time-trained linear model of TTT moved by
gradient descent with momentum and weight decay (forgetting).

The memory M [D, D] per head learns to reconstruct ``v - k`` from k through its layer norm (``lmzoo.ops.inner``;
the loss ``|LN(k M) w + c - (v - k)|^2``, whose gradient is twice the shared update u), with a momentum S:

    u_t = dloss/dh / 2 at h = k_t P,   P the memory at the start of t's mini-batch of ``chunk_size`` tokens
    S_t = eta_t S_{t-1} - theta_t k_t^T (2 u_t)          eta_t = exp(log_momentum_t): the momentum's decay
    M_t = a_t M_{t-1} + S_t                              a_t = exp(log_decay_t) = 1 - alpha_t: forgetting
    o_t = z_t + LN(z_t) w + c,   z_t = scale q_t M_t      (``normed_readout``; scale 1 by default)

Every token of a mini-batch takes its gradient at the memory of the mini-batch's start (the paper's chunked
training; mini-batches counted from the sequence's start), while momentum and forgetting act on every token.
The state is ``(M, S, P)``.

Forms (``method``):

- ``"naive"``: token by token (``titans_step``, also the form mixers decode with) -- the reference;
- ``"chunk"``: one mini-batch at a time: its gradients at once, then with ``A = [exp(sum_{i<m<=t} log a_m)]``,
  ``E = [exp(sum_{j<m<=i} log eta_m)]`` (lower triangular) every step's memory through
  ``C = A E diag(theta)``: ``M_t = a^t M_0 + f_t S_0 - sum_j C_tj k_j^T (2 u_j)``, ``f = A exp(cumsum log eta)``.

Documents (``segment_ids``): at a document's first step the memory, momentum and gradient point restart from the
initial state (exactly: the chunk form's sums stop at the document's start); as in ``lmzoo.ops.ttt``, a document
is mixed as if alone when it starts at a multiple of ``chunk_size``. ``titans_weights``: the weights of z on the
updates u (``z = A u`` from a zero state), 0 across documents. Everything runs in float32; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, check_form, from_chunks, one_document, same_segment, segment_starts, to_chunks
from lmzoo.ops.inner import normed_readout, reconstruction_gradient
from lmzoo.ops.ut import decay_matrix

METHODS = Forms("naive", "chunk")
STEP_FORM = "naive"  # ``titans_step`` is its step
EPS = 1e-6  # the inner layer norm's


def titans(q, k, v, theta, log_decay, log_momentum, weight, bias, *, scale=1.0, eps=EPS, initial_state=None,
           method="chunk", chunk_size=16, segment_ids=None):
    """q, k, v [B,T,H,D]; theta (step sizes), log_decay (log(1 - alpha) <= 0), log_momentum (log eta <= 0)
    [B,T,H]; weight and bias [H,D] (the inner norm's w and c); initial_state None (zeros) or (M, S) [B,H,D,D],
    the state at the sequence's start and at every document's; ``chunk_size`` the mini-batch.

    Returns (o [B,T,H,D] in v's dtype, (M, S, P) float32: the state after the last token).
    """
    method = check_form(method, METHODS, chunk_size)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v must have one shape (the memory maps D to D); got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    for name, x in (("theta", theta), ("log_decay", log_decay), ("log_momentum", log_momentum)):
        if x.shape != k.shape[:3]:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape[:3]}")
    for name, x in (("weight", weight), ("bias", bias)):
        if x.shape != k.shape[2:]:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape[2:]}")
    return _titans(q, k, v, theta, log_decay, log_momentum, weight, bias, initial_state, segment_ids, scale=scale,
                   eps=eps, method=method, chunk_size=chunk_size)


@functools.partial(jax.jit, static_argnames=("scale", "eps", "method", "chunk_size"))
def _titans(q, k, v, theta, log_decay, log_momentum, weight, bias, initial_state, segment_ids, *, scale, eps,
            method, chunk_size):
    batch, length, heads, dim = k.shape
    zero = jnp.zeros((batch, heads, dim, dim), jnp.float32)
    m_init, s_init = (zero, zero) if initial_state is None else (s.astype(jnp.float32) for s in initial_state)
    ids = one_document((batch, length)) if segment_ids is None else segment_ids
    inputs = (q, k, v, theta, log_decay, log_momentum, weight, bias)
    form = _naive if method == "naive" else _chunk
    out, state = form(*(a.astype(jnp.float32) for a in inputs), m_init, s_init, ids, scale, eps, chunk_size)
    return out.astype(v.dtype), state


def titans_step(q, k, v, theta, log_decay, log_momentum, weight, bias, state, ends, *, scale=1.0, eps=EPS):
    """One token: q, k, v [B,H,D], theta, log_decay, log_momentum [B,H], state (M, S, P); ``ends`` (bool, [B] or a
    scalar): the token closes its mini-batch, whose memory becomes the next gradient point. Returns
    (o [B,H,D] float32, state)."""
    q, k, v, theta, log_decay, log_momentum = (a.astype(jnp.float32) for a in
                                               (q, k, v, theta, log_decay, log_momentum))
    memory, momentum, point = state
    u = reconstruction_gradient(jnp.einsum("bhd,bhde->bhe", k, point), v - k, weight, bias, eps)  # (B, H, D)
    gate = lambda x: x[..., None, None]  # noqa: E731  (B, H) -> (B, H, 1, 1)
    momentum = gate(jnp.exp(log_momentum)) * momentum - gate(2 * theta) * k[..., :, None] * u[..., None, :]
    memory = gate(jnp.exp(log_decay)) * memory + momentum
    out = normed_readout(scale * jnp.einsum("bhd,bhde->bhe", q, memory), weight, bias, eps)
    point = jnp.where(jnp.reshape(jnp.asarray(ends), (-1, 1, 1, 1)), memory, point)
    return out, (memory, momentum, point)


# ----------------------------------------------------------------------------- forms
# Each takes float32 q, k, v [B,T,H,D], theta, log_decay, log_momentum [B,T,H], weight, bias [H,D], the initial
# (M, S) [B,H,D,D] and segment ids [B,T], and returns (o, (M, S, P)).


def _naive(q, k, v, theta, log_decay, log_momentum, weight, bias, m_init, s_init, ids, scale, eps, chunk_size):
    def step(state, inputs):
        *token, start_t, t = inputs  # (B, H, D) x3, (B, H) x3, (B,), ()
        restart = start_t[:, None, None, None]
        state = tuple(jnp.where(restart, fresh, s) for s, fresh in zip(state, (m_init, s_init, m_init)))
        return titans_step(*token, weight, bias, state, t % chunk_size == chunk_size - 1, scale=scale, eps=eps)[::-1]

    sequences = (q, k, v, theta, log_decay, log_momentum, segment_starts(ids))
    inputs = tuple(a.swapaxes(0, 1) for a in sequences) + (jnp.arange(q.shape[1]),)
    final, out = lax.scan(step, (m_init, s_init, m_init), inputs)
    return out.swapaxes(0, 1), final


def since_origin(log_g, origin) -> jax.Array:
    """``sum_{origin_t <= m <= t} log_g_m`` [..., C]: the log decay from each step's origin (``origin`` [..., C],
    the chunk's start or its document's) through the step itself."""
    total = jnp.cumsum(log_g, axis=-1)
    before = jnp.take_along_axis(total - log_g, origin, axis=-1)
    return total - before


def _chunk(q, k, v, theta, log_decay, log_momentum, weight, bias, m_init, s_init, ids, scale, eps, chunk_size):
    length, size = q.shape[1], chunk_size  # the mini-batch is the model's, never cut to the length
    n_chunks = -(-length // size)
    qc, kc, vc = (jnp.swapaxes(to_chunks(a, size), 2, 3) for a in (q, k, v))  # (B, N, H, C, D)
    theta, log_a, log_eta = (to_chunks(a, size).swapaxes(2, 3) for a in (theta, log_decay, log_momentum))  # (B,N,H,C)
    ids_c = to_chunks(ids, size)  # (B, N, C)
    starts = to_chunks(segment_starts(ids), size)
    origin = lax.cummax(jnp.where(starts, jnp.arange(size), 0), axis=2)  # each step's: its document's start or 0
    fresh = jnp.cumsum(starts, axis=-1) > 0  # a document began in the chunk by t: origin = the initial state
    same = same_segment(ids_c.reshape(-1, size)).reshape(*ids_c.shape, size)[:, :, None]  # (B, N, 1, C, C)
    valid = jnp.arange(n_chunks * size).reshape(n_chunks, size) < length  # (N, C): padding updates nothing
    ends = jnp.full((n_chunks,), size - 1).at[-1].set((length - 1) % size)  # each chunk's last real step
    complete = jnp.arange(n_chunks) < length // size

    def mini_batch(state, chunk):  # (M, S, P) at a mini-batch's start -> at the next one's
        memory, momentum, point = state
        q, k, v, theta, log_a, log_eta, origin, fresh, same, valid, end, complete = chunk
        org = origin[:, None]  # (B, 1, C)
        restarted = fresh[:, None, :, None]  # (B, 1, C, 1)
        pick = lambda init, carried, x: jnp.where(restarted, x @ init, x @ carried)  # noqa: E731
        u = reconstruction_gradient(pick(m_init, point, k), v - k, weight[:, None], bias[:, None], eps)
        written = 2 * u * valid[:, None] * theta[..., None]  # (B, H, C, D): theta_j 2 u_j
        decays = jnp.where(same, decay_matrix(log_a), 0.0)  # (B, H, C, C): A
        momenta = jnp.where(same, decay_matrix(log_eta), 0.0)  # E
        through = decays @ momenta  # C / theta
        reach = jnp.exp(since_origin(log_a, org))[..., None]  # (B, H, C, 1): a from the origin
        lift = decays @ jnp.exp(since_origin(log_eta, org))[..., None]  # f
        z = reach * pick(m_init, memory, q) + lift * pick(s_init, momentum, q) - (through * (q @ jnp.swapaxes(
            k, -1, -2))) @ written
        out = normed_readout(scale * z, weight[:, None], bias[:, None], eps)
        # the state after the chunk's last step, from its origin
        row = lambda x: lax.dynamic_index_in_dim(x, end, axis=-2, keepdims=False)  # noqa: E731  [..., C, *] at end
        kept = ~lax.dynamic_index_in_dim(fresh, end, axis=-1, keepdims=False)[:, None, None, None]  # (B, 1, 1, 1)
        m0, s0, p0 = (jnp.where(kept, s, init) for s, init in ((memory, m_init), (momentum, s_init), (point, m_init)))
        gathered = lambda w: jnp.swapaxes(k * w[..., None], -1, -2) @ written  # noqa: E731
        memory = row(reach)[..., None] * m0 + row(lift)[..., None] * s0 - gathered(row(through))
        momentum = jnp.exp(row(since_origin(log_eta, org)[..., None]))[..., None] * s0 - gathered(row(momenta))
        return (memory, momentum, jnp.where(complete, memory, p0)), out

    chunks = tuple(a.swapaxes(0, 1) for a in (qc, kc, vc, theta, log_a, log_eta, origin, fresh, same))
    final, out = lax.scan(mini_batch, (m_init, s_init, m_init), chunks + (valid, ends, complete))
    return from_chunks(jnp.swapaxes(out.swapaxes(0, 1), 2, 3), length), final


# ----------------------------------------------------------------------------- weights


@functools.partial(jax.jit, static_argnames=("scale",))
def titans_weights(q, k, theta, log_decay, log_momentum, *, scale=1.0, segment_ids=None) -> jax.Array:
    """[B, H, T, T] float32: the weights of the read-out z_t on every update u_j from a zero state,
    ``-2 scale theta_j (A E)_tj (q_t . k_j)``; 0 after t and across documents."""
    q, k, theta, log_decay, log_momentum = (a.astype(jnp.float32) for a in (q, k, theta, log_decay, log_momentum))
    per_head = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  (B, T, H) -> (B, H, T)
    through = decay_matrix(per_head(log_decay)) @ decay_matrix(per_head(log_momentum))
    weights = -2 * scale * through * per_head(theta)[..., None, :] * jnp.einsum("bthd,bshd->bhts", q, k)
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)
