"""H3 (Fu et al., 2022): two linear time-invariant SSMs arranged to mimic q/k/v attention.

    k' = shift_SSM(k)                    a short causal filter: k'_t mixes k_t .. k_{t-S+1}
    kv_t = k'_t v_t^T                    per head, [P, P]
    s = diag_SSM(kv) + D kv              one S4D SSM per head, shared by the head's P x P entries
    y_t = q_t^T s_t                      then out_proj over the concatenated heads

The diagonal SSM has N/2 complex modes per head, initialised as S4D-Lin (``A_n = -1/2 + iπn``,
B = 1, C complex normal, Δ log-uniform in [dt_min, dt_max]) and discretised with zero-order hold;
each conjugate pair is counted once, hence ``c = 2 C``.

The layer is exactly a causal linear attention: ``y_i = Σ_j (K_{i-j} + D δ_ij) (q_i · k'_j) v_j``
with K the SSM's impulse response (closed form, Vandermonde), and ``attention_matrix`` gives
those weights per head. Three forms compute it (``method``; the names older runs saved, "quadratic" and
"scan", are renamed by ``lmzoo.record.migrate``):
- "naive": the recurrence itself, one step at a time (the reference; decoding always uses it);
- "parallel": that attention matrix times v, O(T^2) like softmax attention but exactly causal
  in floating point (future tokens meet exact zeros): the default at training lengths;
- "fft": the long convolution of k'v^T with K by FFT, O(T log T) but P^2 channels per head; its
  outputs carry ~1e-7 of rounding from every position, future ones included.

With ``segment_ids [B,T]`` (packed documents) the shift SSM's taps stay inside a document and the
weights between documents are zero (for "fft", ``ops.diagonal_ssm`` then convolves by a masked
matrix, O(T^2) like "parallel"; for "naive", the state restarts at each document start).

``carry`` continues from a given shift window and SSM state h0: "fft" and "naive" hand h0 to the op;
"parallel" adds what h0 contributes in closed form, ``q_t^T Re Σ_n c_n a_n^(t+1) h0`` to the first
document's outputs and ``a^T h0`` to the final state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, dense
from lmzoo.mixers.family.ssm import CausalConv, check_dt_range
from lmzoo.ops.common import Forms, same_segment, segment_starts
from lmzoo.ops.lti import STEP_FORM, causal_toeplitz, diagonal_ssm, diagonal_ssm_kernel, vandermonde
from lmzoo.registry import register
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, one_of, positive
from lmzoo.sharding import param

METHODS = Forms("naive", "parallel", "fft")


@register("h3")
@dataclass
class H3Config(MixerConfig):
    carries_state = True  # continues from a given shift window and SSM state (``H3.carry``)
    forms = METHODS  # the forms attn.method may name; a class attribute, not a config key

    d_state: int = 16  # N: state size of the diagonal SSM per kv entry (N/2 complex-conjugate pairs)
    shift_size: int = 4  # taps of the shift SSM on k (its state holds shift_size - 1 past keys)
    dt_min: float = 0.001  # Δ of each head's SSM is initialised log-uniformly in [dt_min, dt_max]
    dt_max: float = 0.1
    # parallel (exactly causal, O(T^2)) | fft (long convolution, Vandermonde kernel) | naive (the recurrence); see the
    # module docstring
    method: str = "parallel"

    def check(self, model: ModelConfig) -> None:
        one_of("attn.method", self.method, self.forms)
        positive("attn.d_state", self.d_state)
        positive("attn.shift_size", self.shift_size)
        if self.d_state % 2:
            raise ConfigError(f"attn.d_state={self.d_state} must be even (modes come in complex-conjugate pairs)")
        check_dt_range(self.dt_min, self.dt_max)

    def build(self, ctx, *, rngs):
        return H3(self, ctx, rngs=rngs)


def document_mask(segment_ids, *, last: bool) -> jax.Array:
    """[B, T] bool: the steps of the last document of each row (``last``), or of its first."""
    opened = jnp.cumsum(segment_starts(segment_ids), axis=1)  # documents begun after the first
    return opened == opened[:, -1:] if last else opened == 0


class H3(Mixer):
    def __init__(self, cfg: H3Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        self.n_heads, self.head_dim, self.method = ctx.n_heads, ctx.d_model // ctx.n_heads, cfg.method
        self.modes, self.dtype = cfg.d_state // 2, ctx.dtype
        d, h, m = ctx.d_model, ctx.n_heads, self.modes
        self.q_proj = dense(ctx, d, d, rngs=rngs)
        self.k_proj = dense(ctx, d, d, rngs=rngs)
        self.v_proj = dense(ctx, d, d, rngs=rngs)
        self.shift = CausalConv(d, cfg.shift_size, bias=False, rngs=rngs, recompute=ctx.remat_light)
        # S4D-Lin. A and Δ are vectors so that the optimiser leaves them out of weight decay, as S4 does.
        log_dt = jax.random.uniform(rngs.params(), (h,), jnp.float32, math.log(cfg.dt_min), math.log(cfg.dt_max))
        self.log_dt = param(log_dt, None)  # (H,)
        self.log_neg_a_real = param(jnp.full((h * m,), math.log(0.5), jnp.float32), None)  # Re A = -1/2
        self.a_imag = param(jnp.tile(math.pi * jnp.arange(m, dtype=jnp.float32), h), None)  # Im A = πn
        # the last axis: (re, im)
        self.C = param(jax.random.normal(rngs.params(), (h, m, 2), jnp.float32) * math.sqrt(0.5), None, None, None)
        self.D = param(jnp.ones((h,), jnp.float32), None)
        self.out_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    def ssm_params(self):
        """Discretised (log_a, b, c), each [H, N/2] complex64."""
        h, m = self.n_heads, self.modes
        a = -jnp.exp(self.log_neg_a_real[...]) + 1j * self.a_imag[...]
        a = a.reshape(h, m)
        dt = jnp.exp(self.log_dt[...])[:, None]
        b = (jnp.exp(dt * a) - 1) / a  # zero-order hold with B = 1
        c = 2 * (self.C[..., 0] + 1j * self.C[..., 1])
        return dt * a, b, c

    def project(self, x, shift_state=None, segment_ids=None):
        """q, shifted k, v as [B,T,H,P], and the shift SSM's window."""
        batch, length, _ = x.shape
        k, shift_state = self.shift(self.k_proj(x), shift_state, segment_ids=segment_ids)
        heads = (batch, length, self.n_heads, self.head_dim)
        return self.q_proj(x).reshape(heads), k.reshape(heads), self.v_proj(x).reshape(heads), shift_state

    def mix(self, q, k, v, ssm_state, method, segment_ids=None):
        """y [B,T,H,P] through the SSM on k'v^T ("fft" or "naive"), and its final state."""
        kv = k[..., :, None] * v[..., None, :]  # (B, T, H, P, P)
        per_head = tuple(p[:, None, None, :] for p in self.ssm_params())  # (H, 1, 1, N/2): shared by P x P entries
        s, ssm_state = diagonal_ssm(kv, *per_head, initial_state=ssm_state, method=method, segment_ids=segment_ids)
        s = s + self.D[...].astype(kv.dtype)[:, None, None] * kv
        return jnp.einsum("bthp,bthpq->bthq", q, s), ssm_state

    def __call__(self, x, *, positions=None, segment_ids=None):  # the shift SSM gives order: positions are unused
        return self.forward(x, segment_ids)[0]

    def forward(self, x, segment_ids=None):
        """y [B,T,d_model] in the configured form, the shifted keys and values [B,T,H,P], the shift window."""
        batch, length, _ = x.shape
        q, k, v, shift = self.project(x, segment_ids=segment_ids)
        if self.method == "parallel":
            y = jnp.einsum("bhij,bjhp->bihp", self.weights(q, k, segment_ids).astype(v.dtype), v)
        else:
            y, _ = self.mix(q, k, v, None, self.method, segment_ids)
        return self.out_proj(y.reshape(batch, length, -1)), k, v, shift

    def prefill(self, x, max_len=None, *, positions=None):
        y, k, v, shift = self.forward(x)
        return y, {"shift": shift, "ssm": self.final_ssm_state(k, v)}

    def carry(self, x, state, *, positions=None, segment_ids=None):  # the shift SSM gives order: positions are unused
        """(y, {"shift", "ssm"} after x) from ``state`` (None: zeros), in the configured form."""
        state = state or {}
        batch, length, _ = x.shape
        q, k, v, shift = self.project(x, state.get("shift"), segment_ids)
        if self.method != "parallel":
            y, ssm = self.mix(q, k, v, state.get("ssm"), self.method, segment_ids)
        else:
            y = jnp.einsum("bhij,bjhp->bihp", self.weights(q, k, segment_ids).astype(v.dtype), v)
            ssm = self.final_ssm_state(k, v, segment_ids)
            if "ssm" in state:
                read, kept = self.from_state(q, state["ssm"], segment_ids)
                y, ssm = y + read.astype(y.dtype), ssm + kept
        return self.out_proj(y.reshape(batch, length, -1)), {"shift": shift, "ssm": ssm}

    def final_ssm_state(self, k, v, segment_ids=None):
        """The diagonal SSM's state after k'v^T [B,T,H,P,P] from zero, in closed form without forming k'v^T:
        h_T = b Σ_t a^(T-1-t) k'_t v_t^T over the last document's steps, [B,H,P,P,N/2] complex64."""
        log_a, b, _ = self.ssm_params()
        weights = b * jnp.flip(vandermonde(log_a, k.shape[1]), axis=0)  # (T, H, N/2): a^(T-1-t) b
        k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
        if segment_ids is not None:
            k32 = jnp.where(document_mask(segment_ids, last=True)[..., None, None], k32, 0.0)
        return jnp.einsum("thn,bthp,bthq->bhpqn", weights, k32, v32).astype(jnp.complex64)

    def from_state(self, q, h0, segment_ids=None):
        """What an initial SSM state h0 [B,H,P,P,N/2] adds, in closed form: to the outputs of x's first
        document, q_t^T Re Σ_n c_n a_n^(t+1) h0 [B,T,H,P] float32, and to the final state, a^T h0 when x
        is one document."""
        log_a, _, c = self.ssm_params()
        decayed = jnp.exp(log_a) * vandermonde(log_a, q.shape[1])  # (T, H, N/2): a^(t+1)
        read = jnp.real(jnp.einsum("bthp,thn,bhpqn->bthq", q.astype(jnp.complex64), c * decayed, h0))
        kept = decayed[-1][:, None, None] * h0
        if segment_ids is None:
            return read, kept
        first = document_mask(segment_ids, last=False)  # (B, T)
        return jnp.where(first[..., None, None], read, 0.0), jnp.where(first[:, -1, None, None, None, None], kept, 0)

    def init_state(self, batch_size, max_len):
        p = self.head_dim
        return {
            "shift": self.shift.init_state(batch_size, self.dtype),
            "ssm": jnp.zeros((batch_size, self.n_heads, p, p, self.modes), jnp.complex64),
        }

    def step(self, x_t, state):
        q, k, v, shift = self.project(x_t[:, None], state["shift"])
        y, ssm = self.mix(q, k, v, state["ssm"], STEP_FORM)
        return self.out_proj(y.reshape(x_t.shape[0], -1)), {"shift": shift, "ssm": ssm}

    def weights(self, q, k, segment_ids=None):
        """(K_{i-j} + D δ_ij) (q_i · k'_j): [B,H,T,T] float32, zero between documents."""
        length = q.shape[1]
        kernel = diagonal_ssm_kernel(*self.ssm_params(), length)  # (T, H): the SSM's impulse response
        toeplitz = causal_toeplitz(kernel) + jnp.eye(length) * self.D[...][:, None, None]  # (H, T, T)
        weights = jnp.einsum("bihp,bjhp->bhij", q, k, preferred_element_type=jnp.float32) * toeplitz
        if segment_ids is not None:
            weights = jnp.where(same_segment(segment_ids)[:, None], weights, 0.0)
        return weights

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        q, k, _, _ = self.project(x, segment_ids=segment_ids)
        return self.weights(q, k, segment_ids)

    def state_size(self, max_len):
        complex_entries = self.n_heads * self.head_dim**2 * self.modes
        return (self.shift.width - 1) * self.n_heads * self.head_dim + 2 * complex_entries
