"""Causal linear attention: the running sum ``S_t = S_{t-1} + k_t^T v_t`` read out as ``o_t = scale q_t S_t``.

Feature maps are the caller's business (the mixer applies them to q and k); this op is the causal
sum. ``o_t`` includes token t. The computation form is chosen explicitly with ``method``:

- ``"parallel"``: the masked [T, T] weights times the values -- the readable reference, O(T^2);
- ``"scan"``:     ``lax.scan`` over time carrying S -- T sequential [Dk, Dv] updates;
- ``"assoc"``:    ``lax.associative_scan`` of the updates ``k_t^T v_t`` (materialises all T states);
- ``"chunk"``:    chunks of ``chunk_size`` tokens: masked matmuls inside a chunk, the state summed
  across chunks. Any length works: the last chunk is padded with zero keys, which add nothing.
- ``"pallas"``:   the chunk form as Pallas kernels (``lmzoo.ops.pallas.gla`` with no decay):
  compiled on a GPU or TPU, interpret mode on a CPU.

State: ``S [B, H, Dk, Dv]`` float32. With ``normalize=True`` (Katharopoulos et al., 2020) the output
is ``scale q_t S_t / (scale q_t . z_t + eps)`` with ``z_t = sum_{s<=t} k_s`` the running key sum, and
the state is the pair ``(S [B, H, Dk, Dv], z [B, H, Dk])``; ``scale`` then cancels except against
``eps``. Every form computes the denominator as one more value column (a column of ones), so the
normalised forms share the unnormalised code. Sums accumulate in float32; ``o`` has v's dtype.
The op is jitted with its options static, so an eager call compiles once per shape.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lmzoo.ops.pallas.gla import gla_pallas

METHODS = ("parallel", "scan", "assoc", "chunk", "pallas")


def check_method(method: str, chunk_size: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not valid (choose from: {', '.join(METHODS)})")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be positive")


def causal(t: int) -> jax.Array:
    """[T, T] bool, True where query i may see key j (j <= i)."""
    return jnp.tril(jnp.ones((t, t), bool))


def to_chunks(x: jax.Array, size: int) -> jax.Array:
    """[B, T, ...] -> [B, N, size, ...], zero-padding T up to a multiple of ``size``."""
    pad = -x.shape[1] % size
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(x.shape[0], -1, size, *x.shape[2:])


def from_chunks(x: jax.Array, length: int) -> jax.Array:
    """[B, N, C, ...] -> [B, length, ...]: undo ``to_chunks``."""
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


@functools.partial(jax.jit, static_argnames=("scale", "normalize", "eps"))
def linear_attention_weights(q, k, *, scale=None, normalize=False, eps=1e-6) -> jax.Array:
    """The causal weights [B, H, T, S] float32 the op applies to v (no initial state).

    ``scale q_i . k_j`` for j <= i; normalised, each row divided by ``scale q_i . z_i + eps``.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32) * scale, k.astype(jnp.float32))
    weights = jnp.where(causal(q.shape[1]), scores, 0.0)
    if normalize:
        weights = weights / (weights.sum(-1, keepdims=True) + eps)
    return weights


@functools.partial(jax.jit, static_argnames=("scale", "normalize", "eps", "method", "chunk_size"))
def linear_attention(
    q, k, v, *, scale=None, normalize=False, eps=1e-6, initial_state=None, method="chunk", chunk_size=64
):
    """Causal linear attention. q, k [B, T, H, Dk], v [B, T, H, Dv] -> (o [B, T, H, Dv], final state).

    See the module docstring for the state layout and the forms ``method`` selects.
    """
    check_method(method, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    batch, _, heads, d_key = k.shape
    d_value = v.shape[-1]
    q32, k32, v32 = q.astype(jnp.float32) * scale, k.astype(jnp.float32), v.astype(jnp.float32)
    if initial_state is None:
        state = jnp.zeros((batch, heads, d_key, d_value), jnp.float32)
        key_sum = jnp.zeros((batch, heads, d_key), jnp.float32)
    elif normalize:
        state, key_sum = (s.astype(jnp.float32) for s in initial_state)
    else:
        state = initial_state.astype(jnp.float32)
    if normalize:  # carry the key sum as one more value column of ones
        v32 = jnp.concatenate([v32, jnp.ones_like(v32[..., :1])], axis=-1)  # (B, T, H, Dv + 1)
        state = jnp.concatenate([state, key_sum[..., None]], axis=-1)  # (B, H, Dk, Dv + 1)
    out, state = _FORMS[method](q32, k32, v32, state, chunk_size)
    if normalize:
        out = out[..., :d_value] / (out[..., d_value:] + eps)
        state = (state[..., :d_value], state[..., d_value])
    return out.astype(v.dtype), state


# ----------------------------------------------------------------------------- forms
# Each takes float32 q (already scaled), k, v [B, T, H, D] and S0 [B, H, Dk, Dv]; returns (o, S_T).


def _parallel(q, k, v, s0, chunk_size):
    scores = jnp.einsum("bthd,bshd->bhts", q, k)
    weights = jnp.where(causal(q.shape[1]), scores, 0.0)  # (B, H, T, T)
    out = jnp.einsum("bhts,bshe->bthe", weights, v) + jnp.einsum("bthd,bhde->bthe", q, s0)
    return out, s0 + jnp.einsum("bthd,bthe->bhde", k, v)


def _scan(q, k, v, s0, chunk_size):
    def step(s, qkv_t):
        q_t, k_t, v_t = qkv_t  # (B, H, D) each
        s = s + k_t[..., :, None] * v_t[..., None, :]
        return s, jnp.einsum("bhd,bhde->bhe", q_t, s)

    final, out = lax.scan(step, s0, tuple(a.swapaxes(0, 1) for a in (q, k, v)))
    return out.swapaxes(0, 1), final


def _assoc(q, k, v, s0, chunk_size):
    updates = jnp.einsum("bthd,bthe->tbhde", k, v).at[0].add(s0)  # (T, B, H, Dk, Dv)
    states = lax.associative_scan(jnp.add, updates)  # S_t for every t
    return jnp.einsum("bthd,tbhde->bthe", q, states), states[-1]


def _chunk(q, k, v, s0, chunk_size):
    length, size = q.shape[1], min(chunk_size, q.shape[1])
    qc, kc, vc = (to_chunks(a, size) for a in (q, k, v))  # (B, N, C, H, D)
    scores = jnp.einsum("bnihd,bnjhd->bnhij", qc, kc)
    within = jnp.einsum("bnhij,bnjhe->bnihe", jnp.where(causal(size), scores, 0.0), vc)
    added = jnp.einsum("bnchd,bnche->nbhde", kc, vc)  # what each chunk adds to S
    ends = s0 + jnp.cumsum(added, axis=0)  # S after each chunk
    starts = jnp.concatenate([s0[None], ends[:-1]], axis=0)  # (N, B, H, Dk, Dv) S before each chunk
    out = within + jnp.einsum("bnihd,nbhde->bnihe", qc, starts)
    return from_chunks(out, length), ends[-1]


def _pallas(q, k, v, s0, chunk_size):
    no_decay = jnp.zeros((*k.shape[:3], 1), jnp.float32)
    return gla_pallas(q, k, v, no_decay, s0, chunk_size=chunk_size)


_FORMS = {"parallel": _parallel, "scan": _scan, "assoc": _assoc, "chunk": _chunk, "pallas": _pallas}
