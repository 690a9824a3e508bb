"""The decoder: embed -> blocks (RMSNorm, mixer, residual; RMSNorm, SwiGLU, residual) -> norm -> head.

The model never names a variant: each block's mixer comes from the registry via ``build_mixer``,
configured by ``cfg.attn.for_layer(layer, n_layers)`` (per-layer patterns such as hybrids).
``model.mlp=false`` drops the SwiGLU half of every block (mixers with their own gating, e.g. GAU).
``model.remat=block|mixer`` recomputes each block's (or only each mixer's) activations in the
backward pass instead of keeping them: the same gradients for less memory and more compute;
``light`` only the mixers' short convs and float32 gated norms (no matmul runs again; gradients
equal to float32 rounding, as XLA fuses the recomputed pieces differently).
With ``segment_ids [B, T]`` (documents packed into one window) every mixer keeps the documents
apart, and positions restart at each document unless given.

A task whose targets are its own inputs (``DataConfig.readout() == "last_state"``: MAD's compression) decodes every
position from the last position's state alone (``LastStateReadout``) instead of each position's own.

``LM.carry`` is the forward of a window that continues earlier windows from their final recurrent
state (``train.state_passing``): each mixer's ``carry`` and a per-row position counter, so that
running a sequence window by window equals running it whole (for mixers that have ``carry``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.config import Config
from lmzoo.schema import LAST_STATE, ConfigError
from lmzoo.mixers import MixerContext, build_mixer
from lmzoo.mixers.base import dense
from lmzoo.ops.common import segment_starts
from lmzoo.ops.kernels import traced_choices
from lmzoo.positions import Positions, default_positions, segment_positions
from lmzoo.sharding import EMBED, MLP, VOCAB, constrain_rows, partitioned


def ff_size(d_model: int) -> int:
    """SwiGLU width ~8/3 d_model (same parameters as a 4x GELU MLP), rounded up to 64."""
    return -(-int(8 * d_model / 3) // 64) * 64


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32 whatever the activations' dtype, returned in that dtype."""

    def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs):
        self.norm = nnx.RMSNorm(dim, epsilon=eps, dtype=jnp.float32,
                                scale_init=partitioned(nnx.initializers.ones, EMBED), rngs=rngs)

    def __call__(self, x):
        return self.norm(x.astype(jnp.float32)).astype(x.dtype)


class SwiGLU(nnx.Module):
    def __init__(self, ctx: MixerContext, d_ff: int, *, rngs: nnx.Rngs):
        self.up = dense(ctx, ctx.d_model, 2 * d_ff, rngs=rngs, axes=(EMBED, MLP))
        self.down = dense(ctx, d_ff, ctx.d_model, rngs=rngs, residual=True, axes=(MLP, EMBED))

    def __call__(self, x):
        gate, value = jnp.split(self.up(x), 2, axis=-1)
        return self.down(jax.nn.silu(gate) * value)


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
    """Fixed position codes [length, dim]: sines then cosines of the positions at dim / 2 geometric frequencies."""
    frequencies = 10000.0 ** (-jnp.arange(dim // 2, dtype=jnp.float32) / max(dim // 2, 1))
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * frequencies
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class LastStateReadout(nnx.Module):
    """Every position decoded from the last position's state alone (``DataConfig.readout() == last_state``; MAD's
    compression: the sequence must pass through one vector): that state plus fixed position codes, through two
    normalised GELU layers of the model's width, one row per position, then the model's own norm and head."""

    def __init__(self, ctx: MixerContext, eps: float, *, rngs: nnx.Rngs):
        if ctx.d_model % 2:
            raise ConfigError(f"model.d_model={ctx.d_model} must be even for the last-state readout's position codes")
        self.norms = nnx.List([RMSNorm(ctx.d_model, eps=eps, rngs=rngs) for _ in range(2)])
        self.layers = nnx.List([dense(ctx, ctx.d_model, ctx.d_model, rngs=rngs, bias=True, axes=(EMBED, MLP))
                                for _ in range(2)])

    def __call__(self, h):
        x = h[:, -1:] + sinusoidal_positions(h.shape[1], h.shape[2]).astype(h.dtype)  # (B, T, d_model)
        for norm, layer in zip(self.norms, self.layers):
            x = jax.nn.gelu(layer(norm(x)))
        return x


def _call(module, x, positions, segment_ids):
    return module(x, positions=positions, segment_ids=segment_ids)


def _carry(module, x, state, positions, segment_ids):
    return module.carry(x, state, positions=positions, segment_ids=segment_ids)


class Block(nnx.Module):
    def __init__(self, cfg: Config, ctx: MixerContext, *, rngs: nnx.Rngs):
        eps = cfg.model.norm_eps
        self.remat_mixer = cfg.model.remat == "mixer"
        self.mixer_norm = RMSNorm(ctx.d_model, eps=eps, rngs=rngs)
        self.mixer = build_mixer(cfg.attn, ctx, rngs=rngs)
        self.mlp_norm = RMSNorm(ctx.d_model, eps=eps, rngs=rngs) if cfg.model.mlp else None
        self.mlp = SwiGLU(ctx, cfg.model.d_ff or ff_size(ctx.d_model), rngs=rngs) if cfg.model.mlp else None

    def feed_forward(self, x):
        return x if self.mlp is None else x + self.mlp(self.mlp_norm(x))

    def __call__(self, x, positions=None, segment_ids=None):
        mix = nnx.remat(_call) if self.remat_mixer else _call
        return self.feed_forward(x + mix(self.mixer, self.mixer_norm(x), positions, segment_ids))

    def carry(self, x, state, *, positions=None, segment_ids=None):
        """The block on x continuing from its mixer's carried ``state`` (None: a fresh start), and the state after x."""
        mix = nnx.remat(_carry) if self.remat_mixer else _carry
        y, state = mix(self.mixer, self.mixer_norm(x), state, positions, segment_ids)
        return self.feed_forward(x + y), state

    def step(self, x_t, state):
        y_t, state = self.mixer.step(self.mixer_norm(x_t), state)
        return self.feed_forward(x_t + y_t), state

    def prefill(self, x, max_len=None, positions=None):
        y, state = self.mixer.prefill(self.mixer_norm(x), max_len, positions=positions)
        return self.feed_forward(x + y), state


class LM(nnx.Module):
    """Decoder-only language model over token ids [B, T] -> float32 logits [B, T, vocab]."""

    def __init__(self, cfg: Config, vocab_size: int, *, rngs: nnx.Rngs):
        m = cfg.model
        self.dtype = jnp.dtype(m.dtype)
        self.embed = nnx.Embed(
            vocab_size, m.d_model, dtype=self.dtype,
            embedding_init=partitioned(nnx.initializers.normal(m.init_std), VOCAB, EMBED), rngs=rngs,
        )
        train_len = cfg.data.seq_len  # evaluation at other lengths keeps the training config's seq_len
        pos = Positions.from_config(cfg.pos, train_len=train_len)
        context = lambda i: MixerContext(m.d_model, m.n_heads, i, m.n_layers, self.dtype, pos, m.init_std, train_len,
                                         remat_light=m.remat == "light")
        self.blocks = nnx.List([Block(cfg, context(i), rngs=rngs) for i in range(m.n_layers)])
        self.remat_blocks = m.remat == "block"
        self.norm = RMSNorm(m.d_model, eps=m.norm_eps, rngs=rngs)
        self.head = None if m.tie_embeddings else nnx.Linear(
            m.d_model, vocab_size, use_bias=False, dtype=self.dtype,
            kernel_init=partitioned(nnx.initializers.normal(m.init_std), EMBED, VOCAB), rngs=rngs,
        )
        self.readout = LastStateReadout(context(m.n_layers), m.norm_eps, rngs=rngs) \
            if cfg.data.readout() == LAST_STATE else None  # built last: the other weights draw as without it

    def logits(self, h):
        h = self.norm(h)
        out = self.embed.attend(h) if self.head is None else self.head(h)
        return out.astype(jnp.float32)

    def __call__(self, tokens, positions=None, segment_ids=None):
        h = constrain_rows(self.embed(tokens))  # (B, T, d_model), split by rows on a mesh
        positions = document_positions(positions, segment_ids)
        run = nnx.remat(_call) if self.remat_blocks else _call  # remat: keep only each block's input
        for block in self.blocks:
            h = constrain_rows(run(block, h, positions, segment_ids))
        return self.logits(h if self.readout is None else self.readout(h))

    def refuse_recurrence(self, call: str) -> None:
        """ConfigError in one line where ``call`` would read positions one by one: the last-state readout needs
        the whole sequence first."""
        if self.readout is not None:
            raise ConfigError(f"{call} continues a sequence position by position, and this model decodes every "
                              "position from the last one's state (a task trained with the last-state readout, e.g. "
                              "data.task=compression): it has no next-token logits to carry or decode")

    def carry(self, tokens, state=None, *, segment_ids=None, continues=None):
        """(logits [B, T, vocab], state after them) for tokens [B, T] that continue the rows of ``state``.

        ``state`` is what an earlier ``carry`` returned (None: every row starts afresh): ``{"layers": each
        mixer's carried state, "position": [B] int32, tokens of each row's current document so far}``, every
        leaf with the batch first. ``continues`` [B] bool: False starts that row afresh (its state zeroed),
        e.g. where its tokens open a new document. Positions count on from ``position`` until the first
        document start in ``segment_ids``; later documents start at 0 as in ``__call__``.
        """
        self.refuse_recurrence("carry (train.state_passing)")
        if state is not None and continues is not None:
            state = restart_rows(state, continues)
        offset = jnp.zeros(tokens.shape[:1], jnp.int32) if state is None else state["position"]
        positions = continued_positions(offset, tokens.shape[1], segment_ids)
        layers = [None] * len(self.blocks) if state is None else state["layers"]
        h, carried = constrain_rows(self.embed(tokens)), []
        run = nnx.remat(_carry) if self.remat_blocks else _carry
        for block, s in zip(self.blocks, layers):
            h, s = run(block, h, s, positions, segment_ids)
            h = constrain_rows(h)
            carried.append(s)
        return self.logits(h), {"layers": carried, "position": positions[:, -1] + 1}

    def carry_start(self, batch_size: int, length: int):
        """The all-zero state ``carry`` continues from: rows that start afresh, shaped as ``carry`` returns them
        after windows of ``length`` tokens."""
        graphdef, variables = nnx.split(self)  # traced as a pure function: the module itself stays untouched
        tokens = jax.ShapeDtypeStruct((batch_size, length), jnp.int32)
        shapes = jax.eval_shape(lambda v, t: nnx.merge(graphdef, v).carry(t)[1], variables, tokens)
        return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

    def mixer_inputs(self, tokens, positions=None, segment_ids=None) -> list[jax.Array]:
        """What each layer's mixer sees on this input (the block's normalised stream), bottom layer first."""
        h, inputs = self.embed(tokens), []
        positions = document_positions(positions, segment_ids)
        for block in self.blocks:
            inputs.append(block.mixer_norm(h))
            h = block(h, positions, segment_ids)
        return inputs

    def attention_matrices(self, tokens, positions=None, segment_ids=None) -> list[jax.Array]:
        """Each layer's effective causal weights [B, H, T, T] on this input, bottom layer first."""
        positions = document_positions(positions, segment_ids)
        return [block.mixer.attention_matrix(x, positions=positions, segment_ids=segment_ids)
                for block, x in zip(self.blocks, self.mixer_inputs(tokens, positions, segment_ids))]

    def init_state(self, batch_size: int, max_len: int) -> list:
        return [block.mixer.init_state(batch_size, max_len) for block in self.blocks]

    def prefill(self, tokens, max_len: int | None = None, positions=None):
        """The forward on tokens [B, T] that also returns the decoding state after them, sized for
        ``max_len`` tokens in all (None: T): (logits [B, T, vocab], state), ready for ``step`` at position T."""
        self.refuse_recurrence("prefill (decoding)")
        h, state = self.embed(tokens), []
        for block in self.blocks:
            h, s = block.prefill(h, max_len, positions)
            state.append(s)
        return self.logits(h), state

    def step(self, token, state):
        """One decoding step: token [B] -> logits [B, vocab] and the next state."""
        self.refuse_recurrence("step (decoding)")
        h, new_state = self.embed(token), []
        for block, s in zip(self.blocks, state):
            h, s = block.step(h, s)
            new_state.append(s)
        return self.logits(h), new_state

    def mixer_kernels(self, batch_size: int, length: int, documents: bool = False) -> list[list[dict]]:
        """Per layer, the implementation each op of its mixer runs on [batch_size, length] inputs (and why
        a fallback happened): ``lmzoo.ops.kernels.Choice``, found by tracing each mixer once."""
        x = jax.ShapeDtypeStruct((batch_size, length, self.embed.features), self.dtype)
        ids = jax.ShapeDtypeStruct((batch_size, length), jnp.int32) if documents else None
        return [[choice.as_dict() for choice in traced_choices(lambda x, ids: block.mixer(x, segment_ids=ids), x, ids)]
                for block in self.blocks]

    def state_size(self, max_len: int) -> int:
        return sum(block.mixer.state_size(max_len) for block in self.blocks)


def document_positions(positions, segment_ids):
    """The positions given, else with segments each document's own (restarting at 0), else None."""
    return segment_positions(segment_ids) if positions is None and segment_ids is not None else positions


def continued_positions(offset, length: int, segment_ids=None) -> jax.Array:
    """[B, T] int32: ``offset`` [B], offset + 1, ... until the first document start in ``segment_ids``, then
    each document's own positions from 0."""
    if segment_ids is None:
        return default_positions(offset.shape[0], length) + offset[:, None]
    first = jnp.cumsum(segment_starts(segment_ids), axis=1) == 0  # (B, T) steps of the document carried in
    return segment_positions(segment_ids) + jnp.where(first, offset[:, None], 0)


def restart_rows(state, continues):
    """``state`` (leaves [B, ...]) with the rows where ``continues`` ([B], or one bool for every row) is False
    zeroed: started afresh."""
    def keep(a):
        return jnp.where(continues.reshape(-1, *([1] * (a.ndim - 1))), a, jnp.zeros((), a.dtype))
    return jax.tree.map(keep, state)


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
