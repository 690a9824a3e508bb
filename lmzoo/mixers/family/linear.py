"""The linear-attention family: mixers whose token mixing is one recurrence over a matrix state per
head, ``S_t = decay_t S_{t-1} + k_t^T v_t`` read out as ``o_t = q_t S_t`` (linear attention, RetNet,
GLA; the delta rule changes only the update).

A family mixer declares three parts,

    heads(x, positions, segment_ids) -> (q, k, v, *gates)    per-token inputs of its op, v third
    mix(*heads, state=None, method=None, segment_ids=None)   the op in any of its forms, from any
        -> (o, S)                                            state, restarting at segment starts
    output(x, o) -> y                                         per-head o [.., H, Dv] to [.., d_model]

plus ``mix_weights(*heads, segment_ids=None)``, the [B, H, T, T] weights the op applies to v, and the
base does the rest: the forward is ``output(x, mix(*heads(x, positions))[0])``, ``prefill`` keeps the op's
final state from the same computation and ``carry`` starts ``mix`` from a given one; decoding (``step``)
runs the same ``mix`` in the op's ``STEP_FORM`` (the mixer's ``step_form``) one token at a time from a state
of ``recurrent_state``'s shape, and ``state_size`` counts that state.

A family mixer whose inputs pass through a short causal conv over past tokens (the delta rule's,
``family.delta``) keeps that conv's window as decoding state beside S: it extends ``prefill``, ``carry``,
``init_state``, ``step`` and ``state_size`` with the window.

Mamba-2 runs on the same core (``lmzoo.ops.ssd`` is ``lmzoo.ops.gated.gla`` with one gate per head,
q = C, k = B, v = dt x) and carries a conv window like the delta rule, yet it is not a family mixer:
its op takes SSD's inputs (x, dt, A, B, C and the skip D; state [H, P, N]) and its output gate z
comes from the same projection as the op's inputs, so it writes its own ``prefill``/``step``/
``state_size`` around ``ssd``. H3's recurrence is a fixed (time-invariant) diagonal SSM, outside both.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.ops.common import recompute_in_backward
from lmzoo.ops.gated import METHODS, STEP_FORM, gla, gla_weights
from lmzoo.positions import default_positions
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig
from lmzoo.sharding import partitioned


@dataclass
class LinearFamilyConfig(MixerConfig):
    """Knobs every linear-family spec has: the form of its op and the chunk length.

    ``flops_per_token`` counts the chunked computation as the chunked kernels run it
    (``chunked_mixing_flops``), so a recurrent mixer's MFU compares with softmax attention's.
    ``head_widths`` gives the heads and their key and value widths it counts over.
    """

    delta = False  # the delta rule reads its state before each write: one more state-sized product per token

    forms = METHODS  # the op's forms; a class attribute, not a config key
    carries_state = True  # every family mixer continues from a given state (``LinearFamilyMixer.carry``)

    method: str = "auto"  # auto | jla | naive | parallel | scan | assoc | chunk | pallas (see the family's op)
    chunk_size: int = 64  # tokens per chunk for method=chunk|pallas

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, self.forms)

    def head_widths(self, model: ModelConfig) -> tuple[int, int, int]:
        """(heads, Dk, Dv) of the recurrence: one head per model head, d_model / heads wide, unless a variant says."""
        return model.n_heads, model.d_model // model.n_heads, model.d_model // model.n_heads

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        return chunked_mixing_flops(*self.head_widths(model), self.chunk_size, seq_len, delta=self.delta)


def check_key_ratio(key_ratio: float, model: ModelConfig) -> None:
    """Keys ``key_ratio * model.d_model`` wide must split evenly over the heads (GLA's and RWKV-6's narrow keys)."""
    width = key_ratio * model.d_model
    if width != int(width) or int(width) % model.n_heads:
        raise ConfigError(
            f"attn.key_ratio={key_ratio} gives a key width of {width} = key_ratio * model.d_model, "
            f"which must be a whole multiple of model.n_heads={model.n_heads}"
        )


def key_ratio_head_widths(key_ratio: float, model: ModelConfig) -> tuple[int, int, int]:
    """(heads, key width, value width) per head when keys are ``key_ratio`` of the model's width."""
    return model.n_heads, int(key_ratio * model.d_model) // model.n_heads, model.d_model // model.n_heads


def chunked_mixing_flops(heads: int, d_key: int, d_value: int, chunk: int, seq_len: int, *,
                         delta: bool = False) -> float:
    """Training FLOPs per token of a chunked linear recurrence, counted as its kernels compute it: per head the
    state's update and read-out (2 Dk Dv multiply-adds; the delta rule's read before a write, Dk Dv more) and the
    causal half of each chunk's q k^T and scores times values ((Dk + Dv) C / 2); forward and backward are 3 passes
    of 2 FLOPs per multiply-add. The count does not grow with the length: that is what these mixers buy."""
    state = d_key * d_value
    per_head = 4.0 * state + (2.0 * state if delta else 0.0) + (d_key + d_value) * min(chunk, seq_len)
    return 3.0 * heads * per_head


class LinearFamilyMixer(Mixer):
    """Base of the family's mixers; subclasses set ``n_heads``, ``key_dim``, ``value_dim``,
    ``method`` and ``chunk_size`` and implement ``heads``, ``mix``, ``mix_weights`` and ``output``."""

    n_heads: int
    key_dim: int
    value_dim: int
    # The effective weights (attention_matrix) act on the values ``heads`` returns, so matrix times v
    # is the mixing. False where they act on other values (gated or per-sub-step): the variant's own
    # tests check its weights in its own terms.
    matrix_acts_on_values: bool = True
    step_form = STEP_FORM  # the form ``step`` runs ``mix`` in; a mixer on another op names its op's

    def heads(self, x, positions, segment_ids=None) -> tuple:
        """The op's inputs for x [B, T, d_model] at ``positions`` [B, T]: q, k, v, then any gates
        (``segment_ids`` for inputs that mix nearby tokens, e.g. a short convolution)."""
        raise NotImplementedError

    def mix(self, *heads, state=None, method=None, segment_ids=None):
        """The op on ``heads``: per-head output [B, T, H, Dv] and the final state."""
        raise NotImplementedError

    def mix_weights(self, *heads, segment_ids=None) -> jax.Array:
        """[B, H, T, T] float32: the causal weights ``mix`` applies to v from a zero state."""
        raise NotImplementedError

    def output(self, x, o):
        """y [..., d_model] from x [..., d_model] and the per-head mixing o [..., H, Dv]."""
        raise NotImplementedError

    def recurrent_state(self, batch_size: int):
        """The op's state at the start of a sequence: S [B, H, Dk, Dv] float32."""
        return jnp.zeros((batch_size, self.n_heads, self.key_dim, self.value_dim), jnp.float32)

    def forward(self, x, positions=None, segment_ids=None):
        """(y, the op's final state): the op returns its state whatever its form."""
        positions = default_positions(*x.shape[:2]) if positions is None else positions
        o, s = self.mix(*self.heads(x, positions, segment_ids), segment_ids=segment_ids)
        return self.output(x, o), s

    def __call__(self, x, *, positions=None, segment_ids=None):
        return self.forward(x, positions, segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        y, s = self.forward(x, positions)
        return y, {"S": s, "t": jnp.full((), x.shape[1], jnp.int32)}

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """(y, {"S": the op's state after x}) from ``state`` (None: zeros); positions count on from the state's."""
        positions = default_positions(*x.shape[:2]) if positions is None else positions
        heads = self.heads(x, positions, segment_ids)
        o, s = self.mix(*heads, state=None if state is None else state["S"], segment_ids=segment_ids)
        return self.output(x, o), {"S": s}

    def init_state(self, batch_size, max_len):
        return {"S": self.recurrent_state(batch_size), "t": jnp.zeros((), jnp.int32)}

    def step(self, x_t, state):
        x = x_t[:, None]  # (B, 1, d_model)
        positions = jnp.full((x.shape[0], 1), state["t"], jnp.int32)
        o, s = self.mix(*self.heads(x, positions), state=state["S"], method=self.step_form)
        return self.output(x, o)[:, 0], {"S": s, "t": state["t"] + 1}

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        positions = default_positions(*x.shape[:2]) if positions is None else positions
        return self.mix_weights(*self.heads(x, positions, segment_ids), segment_ids=segment_ids)

    def state_size(self, max_len):
        return sum(leaf.size for leaf in jax.tree.leaves(jax.eval_shape(lambda: self.recurrent_state(1))))


class GatedHeadNorm(nnx.Module):
    """``swish(x W_g) * headnorm(o)``: each head's output RMS-normalised in float32, then gated by x."""

    def __init__(self, ctx: MixerContext, heads: int, head_dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.gate = dense(ctx, ctx.d_model, heads * head_dim, rngs=rngs)
        self.norm = nnx.RMSNorm(head_dim, epsilon=eps, dtype=jnp.float32,
                                scale_init=partitioned(nnx.initializers.ones, None), rngs=rngs)
        self.recompute = ctx.remat_light

    def __call__(self, x, o):
        """x [..., d_model], o [..., H, Dv] -> [..., H * Dv] in x's dtype."""
        return gated_head_norm(self.norm, o, self.gate(x), jax.nn.silu, x.dtype, recompute=self.recompute)


def gated_head_norm(norm: nnx.RMSNorm, o, gate, activation, dtype, *, recompute: bool = False):
    """``activation(gate) * norm(o)``: o [..., H, Dv] normalised per head, gate [..., H * Dv], in float32,
    returned in ``dtype``. Autodiff keeps eight [..., H * Dv] float32 copies; ``recompute`` (``model.remat=light``)
    keeps only o, the gate and the norm's scale and makes them again in the backward pass
    (``recompute_in_backward``)."""
    graphdef, weights = nnx.split(norm)

    def form(weights, o, gate):
        normed = nnx.merge(graphdef, weights)(o.astype(jnp.float32)).reshape(*o.shape[:-2], -1)  # (..., H * Dv)
        return (normed * activation(gate.astype(jnp.float32))).astype(dtype)

    return (recompute_in_backward(form) if recompute else form)(weights, o, gate)


class GatedMixer(LinearFamilyMixer):
    """A family mixer on ``lmzoo.ops.gla`` (heads give q, k, v and log gates, per key dim or per
    head) whose output is ``W_o (swish(x W_g) * headnorm(o))``, as in RetNet and GLA (a variant with another output,
    HGRN2's or Lightning attention's, writes its own ``output`` and skips ``init_output``)."""

    def init_output(self, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """The output gate, norm and projection; made after the heads' projections, as the
        parameters' draw order (and so every seeded initialisation) has always been."""
        self.out_gate = GatedHeadNorm(ctx, self.n_heads, self.value_dim, rngs=rngs)
        self.o_proj = dense(ctx, self.n_heads * self.value_dim, ctx.d_model, rngs=rngs, residual=True)

    scale = None  # the op's scale on q; None: Dk^-1/2

    def mix(self, q, k, v, log_g, state=None, method=None, segment_ids=None):
        return gla(q, k, v, log_g, scale=self.scale, initial_state=state, method=method or self.method,
                   chunk_size=self.chunk_size, segment_ids=segment_ids)

    def mix_weights(self, q, k, v, log_g, segment_ids=None):
        return gla_weights(q, k, log_g, scale=self.scale, segment_ids=segment_ids)  # scale * (q_i * decay) . k_j

    def output(self, x, o):
        return self.o_proj(self.out_gate(x, o))
