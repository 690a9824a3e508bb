"""The test-time-training family (TTT-Linear, Titans): mixers whose state is an inner linear model per head,
trained at test time by gradient steps of a layer-normed reconstruction loss (``lmzoo.ops.inner``).

    q, k, v = silu(causal_conv(x W_qkv));   q, k = q / |q|, k / |k|          per head, D = d_model / heads
    the op: the inner model learns v - k from k a mini-batch of ``attn.chunk_size`` tokens at a time and is
            read out at q through its norm (w, c [H, D] learnt, w from 1 and c from 0)
    y   = W_o (swish(x W_g) * headnorm(o))

The layer norm's gradient scales as 1 / std(k W): the variants start their inner model at std D^-1/2 (so k W, for
a unit key, has entries of about that size) and ``attn.base_lr`` caps the learning rates at 0.1, so the first
mini-batch's steps are of the order of the model itself (a start of std 0.02 with rates up to 1 left states of
hundreds after one mini-batch, where float32 rounding alone parts decoding from the forward).

A variant supplies its step sizes and gates (``rates``), its op (``mix``, ``mix_weights``, ``decode``) and the
state a sequence starts from (``initial_state``); everything else is here. Decoding carries the op's state, the
conv window and the token count: the mini-batches are counted from the sequence's start, so a decoded token
knows whether it closes one (``decode``'s ``ends``), and stepping equals the forward. ``attention_matrix`` is
the op's weights of its read-outs on the updates (before the norm; see the ops). The family has no ``carry``:
its state within a mini-batch depends on where the mini-batch began.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.mixers.base import Mixer, MixerContext, chunked_form, dense
from lmzoo.mixers.family.delta import l2_normalize
from lmzoo.mixers.family.linear import GatedHeadNorm
from lmzoo.mixers.family.ssm import CausalConv
from lmzoo.schema import MixerConfig, ModelConfig, positive
from lmzoo.sharding import param


@dataclass
class InnerModelConfig(MixerConfig):
    """Knobs every test-time-training spec has."""

    method: str = "chunk"  # naive | chunk (see the variant's op)
    chunk_size: int = 16  # the mini-batch: tokens whose gradients are taken at the model of its start
    conv_size: int = 4  # taps of the causal depthwise conv on q, k and v
    base_lr: float = 0.1  # the inner learning rate's ceiling: base_lr * sigmoid(x W_lr + b_lr)

    def check(self, model: ModelConfig) -> None:
        chunked_form(self.method, self.chunk_size, self.forms)
        positive("attn.conv_size", self.conv_size)
        positive("attn.base_lr", self.base_lr)


class InnerModelMixer(Mixer):
    """The family's mixer; a variant implements ``init_rates``, ``rates``, ``initial_state``, ``mix``,
    ``mix_weights`` and ``decode``."""

    def __init__(self, cfg: InnerModelConfig, ctx: MixerContext, *, rngs: nnx.Rngs):
        d = ctx.d_model
        self.n_heads, self.head_dim = ctx.n_heads, d // ctx.n_heads
        self.method, self.chunk_size, self.base_lr, self.dtype = cfg.method, cfg.chunk_size, cfg.base_lr, ctx.dtype
        self.qkv_proj = dense(ctx, d, 3 * d, rngs=rngs)  # [q | k | v], one head after another in each
        self.conv = CausalConv(3 * d, cfg.conv_size, bias=False, rngs=rngs, recompute=ctx.remat_light)
        self.lr_proj = dense(ctx, d, self.n_heads, rngs=rngs, bias=True)
        shape = (self.n_heads, self.head_dim)
        self.norm_weight = param(jnp.ones(shape, jnp.float32), None, None)  # the inner norm's w and c
        self.norm_bias = param(jnp.zeros(shape, jnp.float32), None, None)
        self.init_rates(cfg, ctx, rngs=rngs)
        self.out_gate = GatedHeadNorm(ctx, self.n_heads, self.head_dim, rngs=rngs)
        self.o_proj = dense(ctx, d, d, rngs=rngs, residual=True)

    # ------------------------------------------------------------------ what a variant supplies

    def init_rates(self, cfg, ctx: MixerContext, *, rngs: nnx.Rngs) -> None:
        """Parameters of the variant's gates and of the state it starts from (none by default)."""

    def rates(self, x) -> tuple:
        """The op's per-token step sizes and gates, float32 [B, T, H] each."""
        raise NotImplementedError

    def initial_state(self, batch_size: int):
        """The op's whole state (as its forms return it) at a sequence's start, float32: the learnt start of the
        inner model and zeros for the rest; the op restarts every document from it too."""
        raise NotImplementedError

    def mix(self, q, k, v, *rates, state, method=None, segment_ids=None):
        """The op: (o [B, T, H, D], its state after the last token)."""
        raise NotImplementedError

    def mix_weights(self, q, k, *rates, segment_ids=None) -> jax.Array:
        raise NotImplementedError

    def decode(self, q, k, v, *rates, state, ends):
        """The op's one-token step: q, k, v [B, H, D], rates [B, H] -> (o [B, H, D], state)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the rest

    def start_weights(self, rngs: nnx.Rngs) -> nnx.Param:
        """A learnt start of the inner model's weights, [H, D, D] ~ N(0, 1/D)."""
        shape = (self.n_heads, self.head_dim, self.head_dim)
        return param(self.head_dim ** -0.5 * jax.random.normal(rngs.params(), shape, jnp.float32), None, None, None)

    def learning_rate(self, x) -> jax.Array:
        """``base_lr * sigmoid(x W_lr + b_lr)`` [B, T, H] float32."""
        return self.base_lr * jax.nn.sigmoid(self.lr_proj(x).astype(jnp.float32))

    def inner_norm(self):
        """(w, c) [H, D] float32: the inner model's norm."""
        return self.norm_weight[...], self.norm_bias[...]

    def project(self, x, conv_state=None, segment_ids=None):
        """((q, k unit, v) [B, T, H, D], the rates), and the conv window."""
        b, t, d = x.shape
        mixed, conv_state = self.conv(self.qkv_proj(x), conv_state, segment_ids=segment_ids, activation=jax.nn.silu)
        q, k, v = (a.reshape(b, t, self.n_heads, self.head_dim) for a in jnp.split(mixed, 3, axis=-1))
        q, k = (l2_normalize(a).astype(v.dtype) for a in (q, k))
        return (q, k, v, *self.rates(x)), conv_state

    def output(self, x, o):
        return self.o_proj(self.out_gate(x, o))

    def __call__(self, x, *, positions=None, segment_ids=None):
        heads, _ = self.project(x, segment_ids=segment_ids)
        o, _ = self.mix(*heads, state=self.initial_state(x.shape[0]), segment_ids=segment_ids)
        return self.output(x, o)

    def prefill(self, x, max_len=None, *, positions=None):
        heads, conv = self.project(x)
        o, state = self.mix(*heads, state=self.initial_state(x.shape[0]))
        return self.output(x, o), {"S": state, "conv": conv, "t": jnp.full((), x.shape[1], jnp.int32)}

    def init_state(self, batch_size, max_len):
        conv = self.conv.init_state(batch_size, self.dtype or jnp.float32)
        return {"S": self.initial_state(batch_size), "conv": conv, "t": jnp.zeros((), jnp.int32)}

    def step(self, x_t, state):
        x = x_t[:, None]  # (B, 1, d_model)
        heads, conv = self.project(x, state["conv"])
        ends = state["t"] % self.chunk_size == self.chunk_size - 1
        o, s = self.decode(*(a[:, 0] for a in heads), state=state["S"], ends=ends)
        return self.output(x, o[:, None].astype(heads[2].dtype))[:, 0], {"S": s, "conv": conv, "t": state["t"] + 1}

    def attention_matrix(self, x, *, positions=None, segment_ids=None):
        (q, k, _, *rates), _ = self.project(x, segment_ids=segment_ids)
        return self.mix_weights(q, k, *rates, segment_ids=segment_ids)

    def state_size(self, max_len):
        state = jax.eval_shape(lambda: self.init_state(1, max_len))
        return sum(leaf.size for leaf in jax.tree.leaves((state["S"], state["conv"])))
