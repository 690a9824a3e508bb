"""Linear time-invariant SSMs: fixed (A, B, C) make the layer a causal convolution.

A diagonal SSM ``h_t = a h_t-1 + b u_t, y_t = Re(c · h_t)`` (``a = exp(log_a)``, one mode per
entry of the last axis) has the impulse response ``K_k = Re Σ_n c_n b_n a_n^k``: a Vandermonde
product computed in closed form for all lags at once. ``diagonal_ssm`` applies it
- "fft":  as a long convolution with an FFT (O(T log T)); the initial and final states come
  from the same Vandermonde powers, so the op still returns the state;
- "naive": as the recurrence itself, one step at a time (the reference; "scan" in older runs,
  which lmzoo.record.migrate renames).

A short FIR filter is the other LTI layer here: ``causal_conv1d`` is the depthwise causal
convolution of Mamba's blocks, and also H3's shift SSM (a state that holds the last K-1 inputs).

Documents: with ``segment_ids [B,T]`` (equal within a document) both ops treat every document as
if it ran alone, the initial state (window) feeding only the first. The recurrence forgets its
state where a document starts (its decay times 0 there); the convolution drops every tap whose input
lies in another document. A long convolution cannot be restarted inside an FFT, so "fft" with
documents applies the impulse response as a materialised [T, T] matrix masked to each document:
exact, but O(T^2) per kernel channel like H3's "parallel" form.

Axes: B batch, T time, then any channel axes ``...``; N modes. Parameters broadcast against
the channel axes (e.g. one SSM per head ``[H, 1, 1, N]`` for inputs ``[B, T, H, P, P]``).
Parameters may be complex (S4D modes); inputs and outputs are real, computed in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.common import Forms, causal_mask, check_form, recompute_in_backward, same_segment, segment_starts

METHODS = Forms("naive", "fft")

STEP_FORM = "naive"  # the form mixers decode one token with (their ``step``): the FFT convolves whole sequences


def causal_conv1d(x, weight, bias=None, *, initial_state=None, segment_ids=None, activation=None, recompute=False):
    """Depthwise causal convolution: x ``[B,T,C]``, weight ``[K,C]``, bias ``[C]``.

    ``y_t = Σ_k weight[k] x_{t-K+1+k} (+ bias)``, then ``activation(y)`` if given (e.g. ``jax.nn.silu``);
    ``initial_state`` holds the K-1 inputs before ``x`` (zeros if None). Returns ``(y [B,T,C], final_state
    [B,K-1,C])``: the last K-1 inputs, so that feeding a sequence in pieces equals feeding it whole.
    Computed in ``x``'s dtype. With ``segment_ids [B,T]`` an input counts only for outputs of its own
    document (the initial state belongs to the first), and the final state holds the last document's
    inputs only.

    Autodiff keeps each of the K shifted views of x for its multiply, and the activation's own
    intermediates (two more copies for silu). ``recompute=True`` keeps only the inputs between the
    passes and makes the rest again from x in the backward pass (``recompute_in_backward``): the same
    gradients to float32 rounding (XLA fuses the two differently), so it is asked for (``model.remat=light``).
    """
    form = functools.partial(_conv, activation=activation)
    if recompute:
        form = recompute_in_backward(form)
    return form(x, weight, bias, initial_state, segment_ids)


def _conv(x, weight, bias, initial_state, segment_ids, *, activation):
    width, length = weight.shape[0], x.shape[1]
    if initial_state is None:
        initial_state = jnp.zeros((x.shape[0], width - 1, x.shape[2]), x.dtype)
    window = jnp.concatenate([initial_state.astype(x.dtype), x], axis=1)  # (B, K-1+T, C)
    if segment_ids is None:
        taps = [window[:, k : k + length] for k in range(width)]
        final = window[:, window.shape[1] - (width - 1) :]
    else:
        taps, final = _taps_within_documents(window, segment_ids, width)
    weight = weight.astype(x.dtype)
    y = sum(weight[k] * taps[k] for k in range(width))
    if bias is not None:
        y = y + bias.astype(x.dtype)
    return (y if activation is None else activation(y)), final


def _taps_within_documents(window, segment_ids, width: int):
    """The K shifted views of ``window`` [B, K-1+T, C], each zero where its input lies in another document
    than the output it feeds, and the last K-1 inputs, zero where not in the last document."""
    length = segment_ids.shape[1]
    first = jnp.repeat(segment_ids[:, :1], width - 1, axis=1)  # the initial window: the first document's
    window_ids = jnp.concatenate([first, segment_ids], axis=1)  # (B, K-1+T)

    def within(x, ids, owner):  # x where ids == owner (ids and owner [B, S]), else 0
        return jnp.where((ids == owner)[..., None], x, jnp.zeros((), x.dtype))

    taps = [within(window[:, k : k + length], window_ids[:, k : k + length], segment_ids) for k in range(width)]
    rest = window.shape[1] - (width - 1)
    final = within(window[:, rest:], window_ids[:, rest:], segment_ids[:, -1:])
    return taps, final


def vandermonde(log_a, length: int) -> jax.Array:
    """``a^k = exp(k log_a)`` for every lag k < length: ``[length, ..., N]``."""
    lags = jnp.arange(length, dtype=jnp.float32).reshape(-1, *([1] * log_a.ndim))
    return jnp.exp(lags * log_a)


def diagonal_ssm_kernel(log_a, b, c, length: int, *, powers=None) -> jax.Array:
    """The impulse response ``K [length, ...]`` (real float32), ``K_k = Re Σ_n c_n b_n a_n^k``."""
    powers = vandermonde(log_a, length) if powers is None else powers
    return jnp.real(jnp.sum(c * b * powers, axis=-1)).astype(jnp.float32)


def causal_toeplitz(kernel) -> jax.Array:
    """The convolution as a matrix: kernel ``[T, ...]`` -> ``[..., T, T]``, ``M[i, j] = kernel[i - j]`` for j ≤ i,
    else 0."""
    length = kernel.shape[0]
    lag = jnp.arange(length)[:, None] - jnp.arange(length)[None, :]
    causal = causal_mask(length).reshape(length, length, *([1] * (kernel.ndim - 1)))
    matrix = jnp.where(causal, kernel[jnp.maximum(lag, 0)], 0)
    return jnp.moveaxis(matrix, (0, 1), (-2, -1))


def fft_conv(u, kernel) -> jax.Array:
    """Causal convolution ``y_t = Σ_{k≤t} kernel_k u_{t-k}``: u ``[B,T,...]``, kernel ``[T,...]`` (broadcasting).

    Both are zero-padded to a power of two ≥ 2T so that the FFT's circular convolution does not
    wrap around. Float32.
    """
    length = u.shape[1]
    n = 1 << (2 * length - 1).bit_length()
    spectrum = jnp.fft.rfft(u.astype(jnp.float32), n=n, axis=1) * jnp.fft.rfft(kernel.astype(jnp.float32), n=n, axis=0)
    return jnp.fft.irfft(spectrum, n=n, axis=1)[:, :length]


@functools.partial(jax.jit, static_argnames=("method",))
def diagonal_ssm(u, log_a, b, c, *, initial_state=None, method="fft", segment_ids=None):
    """u ``[B,T,...]`` real; log_a, b, c ``[..., N]`` (real or complex, broadcasting against u's channels).

    ``h_t = exp(log_a) h_t-1 + b u_t``, ``y_t = Re Σ_n c_n h_t[n]``. Returns ``(y [B,T,...] in u's
    dtype, final_state [B,...,N])``, the state complex when the parameters are. ``segment_ids
    [B,T]`` (int) restart the state at every document start ("fft" then convolves by matrix).
    """
    method = check_form(method, METHODS)
    state_dtype = jnp.result_type(log_a, b, c, jnp.float32)
    h0 = None if initial_state is None else initial_state.astype(state_dtype)
    u32 = u.astype(jnp.float32)
    if segment_ids is None:
        form = _fft if method == "fft" else _recurrence
        y, h = form(u32, log_a, b, c, h0)
    elif method == "fft":
        y, h = _by_document(u32, log_a, b, c, h0, segment_ids)
    else:
        y, h = _recurrence(u32, log_a, b, c, h0, keep=1.0 - segment_starts(segment_ids).astype(jnp.float32))
    return y.astype(u.dtype), h.astype(state_dtype)


def _recurrence(u, log_a, b, c, h0, keep=None):
    """``keep`` [B,T]: 0 where a document starts (its decay forgets the state), else 1; None: one document."""
    decay = jnp.exp(log_a)
    if h0 is None:
        state_shape = (u.shape[0], *jnp.broadcast_shapes(u.shape[2:], log_a.shape[:-1]), log_a.shape[-1])
        h0 = jnp.zeros(state_shape, jnp.result_type(log_a, b, c, jnp.float32))

    def step(h, inputs):
        u_t, *keep_t = inputs
        forget = decay if not keep_t else decay * keep_t[0].reshape(-1, *([1] * (h.ndim - 1)))
        h = forget * h + b * u_t[..., None]
        return h, jnp.real(jnp.sum(c * h, axis=-1))

    steps = (u,) if keep is None else (u, keep)
    h, y = lax.scan(step, h0, tuple(a.swapaxes(0, 1) for a in steps))
    return y.swapaxes(0, 1), h


def _fft(u, log_a, b, c, h0):
    powers = vandermonde(log_a, u.shape[1])  # (T, ..., N), shared by the output and both states
    y = fft_conv(u, diagonal_ssm_kernel(log_a, b, c, u.shape[1], powers=powers))  # (B, T, ...)
    h = b * jnp.sum(powers * jnp.flip(u, axis=1)[..., None], axis=1)  # h_T = Σ_k a^k b u_{T-1-k}
    if h0 is not None:  # the initial state reaches step t decayed t + 1 times
        decayed = jnp.exp(log_a) * powers * h0[:, None]  # (B, T, ..., N)
        y = y + jnp.real(jnp.sum(c * decayed, axis=-1))
        h = h + decayed[:, -1]
    return y, h


def _by_document(u, log_a, b, c, h0, segment_ids):
    """The "fft" form's impulse-response products, restarted at document starts: the convolution as a
    [T, T] matrix masked to each document, the initial state reaching the first document only and
    the final state summing the last one's inputs only."""
    length = u.shape[1]
    powers = vandermonde(log_a, length)  # (T, ..., N)
    kernel = diagonal_ssm_kernel(log_a, b, c, length, powers=powers)  # (T, ...)
    u = jnp.broadcast_to(u, (*u.shape[:2], *jnp.broadcast_shapes(u.shape[2:], kernel.shape[1:])))  # y's channels
    y = _masked_convolution(u, kernel, same_segment(segment_ids))
    opened = jnp.cumsum(segment_starts(segment_ids), axis=1)  # (B, T) documents begun after the first
    in_last = (opened == opened[:, -1:]).reshape(*opened.shape, *([1] * (u.ndim - 2)))
    h = b * jnp.sum(powers * jnp.flip(jnp.where(in_last, u, 0.0), axis=1)[..., None], axis=1)
    if h0 is not None:
        in_first = (opened == 0).reshape(in_last.shape)
        decayed = jnp.exp(log_a) * powers * h0[:, None]  # (B, T, ..., N)
        y = y + jnp.where(in_first, jnp.real(jnp.sum(c * decayed, axis=-1)), 0.0)
        h = h + jnp.where(in_first[:, -1, ..., None], decayed[:, -1], 0.0)
    return y, h


def _masked_convolution(u, kernel, same):
    """``y_i = Σ_{j≤i, same[i, j]} kernel_{i-j} u_j``: u ``[B,T,...]``, kernel ``[T,...]`` (broadcasting),
    same ``[B,T,T]`` bool; u has every channel axis of the output. Kernel channels of size 1 stay out of
    the [T, T] matrices (H3's P x P entries share one per head): its other channels and the batch are
    the matmul's batch axes."""
    length, channels = u.shape[1], u.shape[2:]
    kernel = kernel.reshape(length, *([1] * (len(channels) - kernel.ndim + 1)), *kernel.shape[1:])
    varying = [axis for axis, size in enumerate(kernel.shape[1:]) if size > 1]
    matrix = causal_toeplitz(kernel.reshape(length, *(kernel.shape[1 + axis] for axis in varying)))  # (*varying, T, T)
    matrix = jnp.where(same.reshape(same.shape[0], *([1] * len(varying)), length, length), matrix[None], 0.0)
    letters = "klmnopqrsuvwxyz"[: len(channels)]
    kept = "".join(letters[axis] for axis in varying)
    return jnp.einsum(f"b{kept}ij,bj{letters}->bi{letters}", matrix, u)
