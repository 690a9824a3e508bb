"""TTT-Linear (Sun et al., 2024): a linear inner model per head, trained at test time by one gradient step of
a layer-normed reconstruction loss per token, in mini-batches.

The state is the inner model ``f(x) = x + LN(x W + b)`` (``lmzoo.ops.inner``). The sequence runs in mini-batches
of ``chunk_size`` tokens from its first token on (the paper's b, 16 by default); every token of a mini-batch takes
its gradient at the model of the mini-batch's start (W0, b0), and token t of it reads out the model moved by its
own learning rate eta_t times the updates of the mini-batch so far (the paper's mini-batch TTT, one learning
rate per reading token):

    u_j = dloss/dh (k_j W0 + b0; v_j - k_j)                          [D]   (``reconstruction_gradient``)
    W_t = W0 - eta_t sum_{j<=t} k_j^T u_j,   b_t = b0 - eta_t sum_{j<=t} u_j    j, t in one mini-batch
    z_t = scale q_t W_t + b_t,   o_t = z_t + LN(z_t) w + c                      (``normed_readout``)

and the mini-batch's last token's model is the next mini-batch's start. The state between tokens is
``(W0, b0, dW, db)``: the model at the current mini-batch's start and its summed updates so far (zero at a
mini-batch's start), so that the model after step t is ``(W0 - eta_t dW, b0 - eta_t db)``.

Forms (``method``):

- ``"naive"``: token by token (``ttt_linear_step``, also the form mixers decode with) -- the reference;
- ``"chunk"``: one mini-batch at a time: every update of a mini-batch at once (its gradient point is known
  at its start), the read-outs as ``scale q W0 + b0 - eta_t [(scale q_t . k_j + 1)]_{j<=t} u``.

Documents (``segment_ids``): at a document's first step the inner model restarts from the initial state
(the learnt initial model, as at the sequence's start), and the rest of the mini-batch the document starts
in takes its gradient there. The mini-batches stay counted from the sequence's start, so a document is
mixed exactly as if alone when it starts at a multiple of ``chunk_size`` (a document starting inside a
mini-batch has a shorter first one). ``ttt_linear_weights``: the weights of z on the updates u
(``z = (scale q W_init + b_init) + A u``), 0 across documents. Everything runs in float32; o has v's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, check_form, from_chunks, one_document, same_segment, segment_starts, to_chunks
from lmzoo.ops.inner import normed_readout, reconstruction_gradient

METHODS = Forms("naive", "chunk")
STEP_FORM = "naive"  # ``ttt_linear_step`` is its step
EPS = 1e-6  # the inner layer norm's


def ttt_linear(q, k, v, eta, weight, bias, *, scale=None, eps=EPS, initial_state=None, method="chunk",
               chunk_size=16, segment_ids=None):
    """q, k, v [B,T,H,D], eta [B,T,H] (learning rates), weight and bias [H,D] (the inner norm's w and c);
    initial_state None (zeros) or (W [B,H,D,D], b [B,H,D]), the inner model at the first mini-batch's start and
    at every document's; ``chunk_size`` the mini-batch.

    Returns (o [B,T,H,D] in v's dtype, (W0, b0, dW, db) float32: the state after the last token).
    """
    method = check_form(method, METHODS, chunk_size)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v must have one shape (the inner model maps D to D); got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if eta.shape != k.shape[:3]:
        raise ValueError(f"eta has shape {eta.shape}; expected {k.shape[:3]}")
    for name, x in (("weight", weight), ("bias", bias)):
        if x.shape != k.shape[2:]:
            raise ValueError(f"{name} has shape {x.shape}; expected {k.shape[2:]}")
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    return _ttt_linear(q, k, v, eta, weight, bias, initial_state, segment_ids, scale=scale, eps=eps,
                       method=method, chunk_size=chunk_size)


@functools.partial(jax.jit, static_argnames=("scale", "eps", "method", "chunk_size"))
def _ttt_linear(q, k, v, eta, weight, bias, initial_state, segment_ids, *, scale, eps, method, chunk_size):
    batch, length, heads, dim = k.shape
    w_init, b_init = initial_model(initial_state, (batch, heads, dim))
    ids = one_document((batch, length)) if segment_ids is None else segment_ids
    q, k, v, eta, weight, bias = (a.astype(jnp.float32) for a in (q, k, v, eta, weight, bias))
    form = _naive if method == "naive" else _chunk
    out, state = form(q, k, v, eta, weight, bias, w_init, b_init, ids, scale, eps, chunk_size)
    return out.astype(v.dtype), state


def initial_model(initial_state, shape) -> tuple[jax.Array, jax.Array]:
    """(W [B,H,D,D], b [B,H,D]) float32 from an initial state (None: zeros); ``shape`` is (B, H, D)."""
    if initial_state is None:
        return jnp.zeros(shape + shape[-1:], jnp.float32), jnp.zeros(shape, jnp.float32)
    w, b = initial_state
    return w.astype(jnp.float32), b.astype(jnp.float32)


def ttt_linear_step(q, k, v, eta, weight, bias, state, ends, *, scale=None, eps=EPS):
    """One token: q, k, v [B,H,D], eta [B,H], state (W0, b0, dW, db); ``ends`` (bool, [B] or a scalar): the
    token closes its mini-batch, whose model becomes the next one's start. Returns (o [B,H,D] float32, state)."""
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, eta = (a.astype(jnp.float32) for a in (q, k, v, eta))
    w0, b0, dw, db = state
    u = reconstruction_gradient(jnp.einsum("bhd,bhde->bhe", k, w0) + b0, v - k, weight, bias, eps)  # (B, H, D)
    dw, db = dw + k[..., :, None] * u[..., None, :], db + u
    rate = eta[..., None]  # (B, H, 1)
    w_t, b_t = w0 - rate[..., None] * dw, b0 - rate * db
    out = normed_readout(scale * jnp.einsum("bhd,bhde->bhe", q, w_t) + b_t, weight, bias, eps)
    closes = jnp.reshape(jnp.asarray(ends), (-1, 1, 1))  # (B or 1, 1, 1)
    state = (jnp.where(closes[..., None], w_t, w0), jnp.where(closes, b_t, b0),
             jnp.where(closes[..., None], 0.0, dw), jnp.where(closes, 0.0, db))
    return out, state


# ----------------------------------------------------------------------------- forms
# Each takes float32 q, k, v [B,T,H,D], eta [B,T,H], weight, bias [H,D], the initial model (W [B,H,D,D],
# b [B,H,D]) and segment ids [B,T], and returns (o, (W0, b0, dW, db)).


def _naive(q, k, v, eta, weight, bias, w_init, b_init, ids, scale, eps, chunk_size):
    length = q.shape[1]
    zero = (jnp.zeros_like(w_init), jnp.zeros_like(b_init))

    def step(state, inputs):
        q_t, k_t, v_t, eta_t, start_t, t = inputs  # (B, H, D) x3, (B, H), (B,), ()
        restart = start_t[:, None, None]
        state = tuple(jnp.where(restart[..., None] if s.ndim == 4 else restart, fresh, s)
                      for s, fresh in zip(state, (w_init, b_init) + zero))  # a document's first step
        return ttt_linear_step(q_t, k_t, v_t, eta_t, weight, bias, state, t % chunk_size == chunk_size - 1,
                               scale=scale, eps=eps)[::-1]

    inputs = tuple(a.swapaxes(0, 1) for a in (q, k, v, eta, segment_starts(ids))) + (jnp.arange(length),)
    final, out = lax.scan(step, (w_init, b_init) + zero, inputs)
    return out.swapaxes(0, 1), final


def _chunk(q, k, v, eta, weight, bias, w_init, b_init, ids, scale, eps, chunk_size):
    length, size = q.shape[1], chunk_size  # the mini-batch is the model's, never cut to the length
    n_chunks, last = -(-length // size), (length - 1) % size
    qc, kc, vc = (jnp.swapaxes(to_chunks(a, size), 2, 3) for a in (q, k, v))  # (B, N, H, C, D)
    eta_c = to_chunks(eta, size).swapaxes(2, 3)  # (B, N, H, C)
    ids_c = to_chunks(ids, size)  # (B, N, C)
    fresh = jnp.cumsum(to_chunks(segment_starts(ids), size), axis=-1) > 0  # a document began in the chunk by t
    same = same_segment(ids_c.reshape(-1, size)).reshape(*ids_c.shape, size)  # (B, N, C, C)
    valid = jnp.arange(n_chunks * size).reshape(n_chunks, size) < length  # (N, C): padding updates nothing
    ends = jnp.full((n_chunks,), size - 1).at[-1].set(last)  # each chunk's last real step
    causal = jnp.tril(jnp.ones((size, size), bool))

    def mini_batch(model, chunk):  # the model at a mini-batch's start -> at the next one's
        w0, b0 = model
        q, k, v, eta, fresh, same, valid, end = chunk  # (B, H, C, D) x3, (B, H, C), (B, C), (B, C, C), (C,), ()
        restarted = fresh[:, None, :, None]  # (B, 1, C, 1): read and learn from the initial model
        h = jnp.where(restarted, k @ w_init + b_init[..., None, :], k @ w0 + b0[..., None, :])
        u = reconstruction_gradient(h, v - k, weight[:, None], bias[:, None], eps) * valid[:, None]  # (B, H, C, D)
        pairs = jnp.where(causal & same[:, None], scale * q @ jnp.swapaxes(k, -1, -2) + 1.0, 0.0)
        start = jnp.where(restarted, scale * q @ w_init + b_init[..., None, :], scale * q @ w0 + b0[..., None, :])
        out = normed_readout(start - eta[..., None] * (pairs @ u), weight[:, None], bias[:, None], eps)
        # the model after the chunk's last step: its document's updates, from the start it read
        mine = (lax.dynamic_index_in_dim(same, end, axis=1, keepdims=False) & causal[end])[:, None, :, None]
        dw, db = jnp.swapaxes(k * mine, -1, -2) @ u, jnp.sum(u * mine, axis=-2)
        kept = ~lax.dynamic_index_in_dim(fresh, end, axis=1, keepdims=False)[:, None]  # (B, 1)
        w0, b0 = jnp.where(kept[..., None, None], w0, w_init), jnp.where(kept[..., None], b0, b_init)
        rate = lax.dynamic_index_in_dim(eta, end, axis=2, keepdims=False)[..., None]  # (B, H, 1)
        return (w0 - rate[..., None] * dw, b0 - rate * db), (out, (w0, b0, dw, db))

    chunks = tuple(a.swapaxes(0, 1) for a in (qc, kc, vc, eta_c, fresh, same)) + (valid, ends)
    closed, (out, pending) = lax.scan(mini_batch, (w_init, b_init), chunks)
    out = from_chunks(jnp.swapaxes(out.swapaxes(0, 1), 2, 3), length)
    if length % size == 0:  # the last mini-batch is complete: its model starts the next
        return out, closed + (jnp.zeros_like(w_init), jnp.zeros_like(b_init))
    return out, tuple(x[-1] for x in pending)


# ----------------------------------------------------------------------------- weights


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size"))
def ttt_linear_weights(q, k, eta, *, scale=None, chunk_size=16, segment_ids=None) -> jax.Array:
    """[B, H, T, T] float32: the weights of the read-out z_t on every update u_j, ``-rate (scale q_t . k_j + 1)``,
    the rate eta_t within t's own mini-batch and that of the last step of j's before it; 0 after t and across
    documents."""
    length, dim = q.shape[1], q.shape[-1]
    scale = dim ** -0.5 if scale is None else scale
    q, k, eta = (a.astype(jnp.float32) for a in (q, k, eta))
    steps = jnp.arange(length)
    batch_of = steps // chunk_size
    closing = jnp.minimum((batch_of + 1) * chunk_size, length) - 1  # the last step of j's mini-batch
    own = batch_of[:, None] == batch_of[None, :]  # (T, T)
    rates = jnp.where(own, jnp.swapaxes(eta, 1, 2)[..., :, None], jnp.swapaxes(eta[:, closing], 1, 2)[..., None, :])
    pairs = scale * jnp.einsum("bthd,bshd->bhts", q, k) + 1.0
    weights = jnp.where(steps[:, None] >= steps[None, :], -rates * pairs, 0.0)
    return weights if segment_ids is None else jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)
