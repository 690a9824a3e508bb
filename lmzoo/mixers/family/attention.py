"""The softmax family's shared parts: its knobs, how a layer scores queries against keys, its cache.

``HeadOptions`` are two refinements of a layer's heads that a spec opts into (``head_options``):
``qk_norm`` (RMSNorm of every query and key head over its dims with a learned gain shared by the
heads, as in OLMo-2 and Qwen3, applied before any position method, so the cache holds normalised
keys) and ``output_gate`` (``o <- o * sigmoid(x W_gate)`` on each head's output channels before the
output projection, as in Qwen3-Next). ``AttentionConfig`` holds the knobs every softmax-family spec
shares (softmax, MLA and GAU extend it; a spec names its own ``forms`` and the knobs it cannot
apply, ``unsupported``) and counts the family's FLOPs; ``Scoring`` applies the knobs identically in
the parallel forward, the decoding step and the probes: position method, logit scale, log-n factor,
window. Decoding caches keys *before* any position method, together with each slot's position, so
every method reads the same cache (ReRoPE rotates each key two ways); with a window the cache is a
ring buffer of ``window`` slots. ``CacheMixer`` is the family's base: a layer's ``forward`` returns
its output together with what the cache keeps of every token, so ``__call__`` and ``prefill`` share
one computation, and its state size is counted from ``init_state``. ``KVHeadsMixer`` adds the usual
heads: query heads over grouped key/value heads projected from x, and a cache of a key and a value
per kv head and token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from lmzoo.mixers.base import Mixer, MixerContext, dense
from lmzoo.ops import causal_mask
from lmzoo.ops.common import same_segment
from lmzoo.ops.attention import METHODS, logn_scale, repeat_kv, softmax_attention
from lmzoo.positions import Positions, default_positions
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, one_of, positive
from lmzoo.sharding import partitioned

HEAD_OPTIONS = ("output_gate", "qk_norm")


@dataclass
class HeadOptions(MixerConfig):
    """Refinements of an attention layer's heads; a spec lists in ``head_options`` those its mixer applies."""

    head_options: ClassVar[tuple[str, ...]] = ()  # of HEAD_OPTIONS; a class attribute, not a config key
    output_gate: bool = False  # o <- o * sigmoid(x W_gate) per head channel before the output projection
    qk_norm: bool = False  # RMSNorm (learned gain) on each query and key head, before positions

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        for option in HEAD_OPTIONS:
            if getattr(self, option) and option not in self.head_options:
                raise ConfigError(f"attn.{option}=true is not available for attn.mixer={self.mixer} "
                                  f"(it has: {', '.join(self.head_options) or 'none'})")


@dataclass
class AttentionConfig(HeadOptions):
    """Knobs shared by the softmax family; each can also be switched when evaluating a checkpoint."""

    forms: ClassVar[tuple[str, ...]] = METHODS  # the forms attn.method may name (a mixer with its own ops: those)
    unsupported: ClassVar[tuple[str, ...]] = ()  # knobs below that the mixer cannot apply: setting one is an error
    method: str = "auto"  # a form in lmzoo.ops.attention.METHODS; ReRoPE kinds always compute the readable one
    window: Optional[int] = None  # sliding window: a query sees itself and the window - 1 keys before it; None: all
    scale: Optional[float] = None  # logit scale; None: head_dim ** -0.5 (1 with key_norm)
    logn: bool = False  # multiply each query's logits by log(n) / log(logn_base), n = the keys it sees
    logn_base: Optional[int] = None  # None: the training length (data.seq_len)
    logn_clamp: bool = False  # factor max(1, .): unchanged inside the training length
    nope: bool = False  # true: this layer ignores the model's position method (NoPE)

    def check(self, model: ModelConfig) -> None:
        super().check(model)
        one_of("attn.method", self.method, self.forms)
        if self.window is not None:
            positive("attn.window", self.window)
        if self.scale is not None:
            positive("attn.scale", self.scale)
        if self.logn_base is not None and self.logn_base < 2:
            raise ConfigError(f"attn.logn_base={self.logn_base} must be at least 2")
        for knob in self.unsupported:
            value = getattr(self, knob)
            if value:
                shown, fix = ("true", "set it to false") if value is True else (value, "leave it unset")
                raise ConfigError(f"attn.{knob}={shown} is not supported by attn.mixer={self.mixer} ({fix})")

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """Query-key scores and weighted values over the keys a query sees on average, forward and
        backward: 3 passes x 2 FLOPs per multiply-add."""
        score_width, value_width = self.head_widths(model)
        return 6 * mean_keys_seen(seq_len, self.window) * (score_width + value_width)

    def head_widths(self, model: ModelConfig) -> tuple[int, int]:
        """Summed over query heads: the width of a query-key dot product and of the values mixed."""
        return model.d_model, model.d_model


def check_kv_heads(n_kv_heads: Optional[int], model: ModelConfig) -> None:
    """Grouped-query heads: ``attn.n_kv_heads`` (None: one per query head) must divide ``model.n_heads``."""
    kv = n_kv_heads or model.n_heads
    positive("attn.n_kv_heads", kv)
    if model.n_heads % kv:
        raise ConfigError(f"model.n_heads={model.n_heads} is not divisible by attn.n_kv_heads={kv}")


PAIRWISE_POSITIONS = ("alibi", "rerope", "leaky_rerope")  # act on each query-key score, not on q and k


def check_rotary_positions(ctx: MixerContext, mixer: str) -> None:
    """Refuse position methods that act on each query-key pair (ALiBi, ReRoPE): a layer that chooses
    keys apart from the pair's score (block means, an indexer) can take positions only as rotations."""
    if ctx.pos.kind in PAIRWISE_POSITIONS:
        raise ConfigError(f"pos.kind={ctx.pos.kind} is not supported by attn.mixer={mixer} "
                          "(choose a rotary kind or none)")


def mean_keys_seen(seq_len: int, window: Optional[int]) -> float:
    """Keys per query averaged over a causal sequence, as the area of its mask over its length:
    ``seq_len / 2`` without a window; with a window w, w less w^2 / (2 seq_len) for the first w
    queries, which see fewer."""
    span = seq_len if window is None else min(window, seq_len)
    return span - span * span / (2 * seq_len)


class Scoring:
    """How one layer turns queries and keys into attention logits and weights.

    ``rotary_dim``: only the trailing ``rotary_dim`` dims of q and k see positions, the rest are
    position-free (MLA's decoupled RoPE); None: all of them.
    """

    def __init__(self, cfg: AttentionConfig, ctx: MixerContext, *, head_dim: int, rotary_dim=None, key_norm=False):
        self.pos = Positions.none() if cfg.nope else ctx.pos
        default_scale = 1.0 if key_norm else head_dim**-0.5  # unit keys: the query's length is the temperature
        self.scale = (default_scale if cfg.scale is None else cfg.scale) * self.pos.logit_scale
        self.window, self.method, self.rotary_dim = cfg.window, cfg.method, rotary_dim
        self.logn_base = (cfg.logn_base or ctx.train_len) if cfg.logn else None
        self.logn_clamp = cfg.logn_clamp

    def cache_size(self, max_len: int) -> int:
        return max_len if self.window is None else min(self.window, max_len)

    def keys_seen(self, query_index: jax.Array) -> jax.Array:
        """How many keys the query at 0-based ``query_index`` attends to."""
        n = query_index + 1
        return n if self.window is None else jnp.minimum(n, self.window)

    def logn_factor(self, n_keys: jax.Array) -> Optional[jax.Array]:
        """Log-n factor per query [T] (n_keys: [T]), or None when log-n scaling is off."""
        return None if self.logn_base is None else logn_scale(n_keys, self.logn_base, clamp=self.logn_clamp)

    def scale_queries(self, q: jax.Array, n_keys: jax.Array) -> jax.Array:
        """Log-n scaling as a per-query factor on q [B,T,H,D] (n_keys [T] or [B, T]): it multiplies
        every dot product of the query."""
        factor = self.logn_factor(n_keys)
        if factor is None:
            return q
        return (q.astype(jnp.float32) * factor[..., None, None]).astype(q.dtype)

    def queries_keys_seen(self, positions: jax.Array, segment_ids) -> jax.Array:
        """Keys each query sees: [T] by its index, or [B, T] by its position in its own document."""
        return self.keys_seen(jnp.arange(positions.shape[1]) if segment_ids is None else positions)

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        r = self.rotary_dim
        if r is None:
            return self.pos.rotate(x, positions)
        return jnp.concatenate([x[..., :-r], self.pos.rotate(x[..., -r:], positions)], axis=-1)

    def logits(self, q, k, q_pos, k_pos, *, free=None, bias=None) -> jax.Array:
        """Scaled and biased logits [B,H,T,S] float32 of q [B,T,H,D], k [B,S,H,D] (one key head per
        query head); ``free`` adds precomputed position-free dot products (MLA's absorbed latent part),
        ``bias`` (broadcasting to [B,H,T,S]) a term after scaling, e.g. FoX's log forget gates."""
        r = self.rotary_dim
        if r is not None and r < q.shape[-1]:
            content = jnp.einsum("bthd,bshd->bhts", q[..., :-r], k[..., :-r], preferred_element_type=jnp.float32)
            free = content if free is None else free + content
            q, k = q[..., -r:], k[..., -r:]
        scores = self.pos.scores(q, k, q_pos, k_pos)
        if free is not None:
            scores = scores + free
        scores = scores * self.scale
        return add_bias(scores, self.pos.bias(q_pos, k_pos, q.shape[2]), bias)

    def weights(self, q, k, q_pos, k_pos, mask, *, free=None, bias=None) -> jax.Array:
        """Softmax probabilities [B,H,T,S] float32; k may have fewer heads than q (GQA)."""
        k = repeat_kv(k, q.shape[2] // k.shape[2])
        logits = self.logits(q, k, q_pos, k_pos, free=free, bias=bias)
        return jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)

    def scored_vectors(self, q, k, positions):
        """(q, k float32, scale): q [B,T,H,D] and k (one head per query head) as the logits see them,
        log-n scaled and rotated, so that their dot products times ``scale`` are the logits before
        masks and biases (for position methods that rotate; see ``Mixer.scored_vectors``)."""
        q = self.scale_queries(q, self.queries_keys_seen(positions, None))
        k = repeat_kv(k, q.shape[2] // k.shape[2])
        rotate = lambda a: self.rotate(a, positions).astype(jnp.float32)  # noqa: E731
        return rotate(q), rotate(k), self.scale

    def matrix(self, q, k, positions, *, bias=None, segment_ids=None) -> jax.Array:
        """Causal weights [B,H,T,T] of a whole sequence (the probes' view of ``parallel``); with
        ``segment_ids`` [B,T] each query sees its own document only, at ``positions`` within it."""
        t = q.shape[1]
        q = self.scale_queries(q, self.queries_keys_seen(positions, segment_ids))
        mask = causal_mask(t, t, window=self.window)
        if segment_ids is not None:
            mask = mask & same_segment(segment_ids)[:, None]
        return self.weights(q, k, positions, positions, mask, bias=bias)

    def parallel(self, q, k, v, positions, *, bias=None, segment_ids=None) -> jax.Array:
        """Causal attention: q [B,T,H,D], k [B,T,K,D], v [B,T,K,Dv] -> [B,T,H,Dv] in v's dtype;
        ``bias`` [B,H,T,T] (or broadcasting to it) is added to the scaled logits; ``segment_ids``
        [B,T]: no query sees another document's keys."""
        if self.pos.clips_distance:  # two score matrices per pair: no fused kernel computes this
            weights = self.matrix(q, k, positions, bias=bias, segment_ids=segment_ids)
            return jnp.einsum("bhts,bshd->bthd", weights.astype(v.dtype), repeat_kv(v, q.shape[2] // v.shape[2]))
        q = self.scale_queries(q, self.queries_keys_seen(positions, segment_ids))
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        bias = add_bias(None, self.pos.bias(positions, positions, q.shape[2]), bias)
        d_v = v.shape[-1]
        q, k, v = pad_to_one_head_dim(q, k, v)
        y = softmax_attention(q, k, v, scale=self.scale, window=self.window, bias=bias, method=self.method,
                              segment_ids=segment_ids)
        return y[..., :d_v]

    def cache_logits(self, q, keys, slot_pos, t, *, free=None, bias=None):
        """Logits [B,H,1,S] of one query per sequence at position ``t`` against a cache of raw keys
        [B,S,H,D] whose slots hold positions ``slot_pos`` [S] (-1: empty), and the mask of visible slots.
        ``free``: position-free dot products of the same (unscaled) query, added to the logits;
        ``bias`` [B,H,1,S]: added after scaling."""
        b, size = q.shape[0], keys.shape[1]
        factor = self.logn_factor(self.keys_seen(t)[None])
        if factor is not None:
            q = self.scale_queries(q, self.keys_seen(t)[None])
            free = None if free is None else free * factor
        q_pos = jnp.full((b, 1), t, jnp.int32)
        k_pos = jnp.broadcast_to(slot_pos, (b, size))
        visible = slot_pos >= 0
        if self.window is not None:
            visible &= slot_pos > t - self.window
        return self.logits(q, keys, q_pos, k_pos, free=free, bias=bias), visible[None, None, None, :]

    def cache_weights(self, q, keys, slot_pos, t, *, free=None, bias=None) -> jax.Array:
        keys = repeat_kv(keys, q.shape[2] // keys.shape[2])
        logits, visible = self.cache_logits(q, keys, slot_pos, t, free=free, bias=bias)
        return jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)


def add_bias(scores, *biases):
    """``scores`` (None: nothing yet) plus every bias that is not None; None if nothing was added."""
    for bias in biases:
        if bias is not None:
            scores = bias if scores is None else scores + bias
    return scores


def pad_to_one_head_dim(q, k, v):
    """Zero-pad q/k or v so all share one head dim (fused kernels need it); dot products are unchanged."""
    d, d_v = q.shape[-1], v.shape[-1]
    pad = lambda x, n: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n)])
    if d_v < d:
        return q, k, pad(v, d - d_v)
    if d_v > d:
        return pad(q, d_v - d), pad(k, d_v - d), v
    return q, k, v


# ----------------------------------------------------------------------------- decoding cache


def init_cache(batch: int, size: int, **fields) -> dict:
    """A cache of ``size`` slots per sequence; ``fields``: name=(per-slot shape, dtype)."""
    cache = {name: jnp.zeros((batch, size, *shape), dtype) for name, (shape, dtype) in fields.items()}
    return {**cache, "pos": jnp.full((size,), -1, jnp.int32), "t": jnp.zeros((), jnp.int32)}


def cache_append(cache: dict, **entries) -> dict:
    """Write one step's entries [B, ...] into slot t mod size (a ring buffer when size < length)."""
    t, size = cache["t"], cache["pos"].shape[0]
    slot = t % size
    written = {
        name: lax.dynamic_update_slice_in_dim(cache[name], value[:, None].astype(cache[name].dtype), slot, axis=1)
        for name, value in entries.items()
    }
    return {**cache, **written, "pos": cache["pos"].at[slot].set(t), "t": t + 1}


def cache_fill(cache: dict, **entries) -> dict:
    """An empty cache after appending every token of ``entries`` [B, T, ...] in order: the last ``size``
    tokens, token t in slot t mod size, exactly as ``cache_append`` leaves them."""
    length, size = next(iter(entries.values())).shape[1], cache["pos"].shape[0]
    kept = np.arange(max(length - size, 0), length)  # static: the prompt's length is known when tracing
    slots = kept % size
    written = {name: cache[name].at[:, slots].set(value[:, kept].astype(cache[name].dtype))
               for name, value in entries.items()}
    return {**cache, **written, "pos": cache["pos"].at[slots].set(kept), "t": jnp.full((), length, jnp.int32)}


class QKNorm(nnx.Module):
    """RMSNorm of query and key heads [..., D] over their D dims, one learned gain per dim for the
    queries and one for the keys, shared by the heads (Qwen3; OLMo-2 normalises all heads at once)."""

    def __init__(self, ctx: MixerContext, head_dim: int, *, rngs: nnx.Rngs, eps: float = 1e-6):
        norm = lambda: nnx.RMSNorm(head_dim, epsilon=eps, dtype=ctx.dtype,  # noqa: E731
                                   scale_init=partitioned(nnx.initializers.ones, None), rngs=rngs)
        self.q_norm, self.k_norm = norm(), norm()

    def __call__(self, q, k):
        return self.q_norm(q), self.k_norm(k)


class OutputGate(nnx.Module):
    """``o * sigmoid(x W_gate)``: one gate per channel of every head's output (Qwen3-Next's elementwise
    gate), computed from the layer's input; sigmoid in float32."""

    def __init__(self, ctx: MixerContext, width: int, *, rngs: nnx.Rngs):
        self.proj = dense(ctx, ctx.d_model, width, rngs=rngs)

    def __call__(self, o, x):
        gate = jax.nn.sigmoid(self.proj(x).astype(jnp.float32))
        return (o.astype(jnp.float32) * gate).astype(o.dtype)


class CacheMixer(Mixer):
    """Base of the softmax family's mixers: ``forward(x, positions, segment_ids) -> (y, entries)`` gives
    the output and the per-token entries [B, T, ...] its cache holds (named as in ``init_state``); the
    base makes ``__call__`` and ``prefill`` of it. A mixer whose spec has ``HeadOptions`` builds them
    with ``init_head_options`` and applies them with ``normalize_qk`` and ``output``."""

    qk_norm: Optional[QKNorm] = None
    output_gate: Optional[OutputGate] = None

    def init_head_options(self, cfg: HeadOptions, ctx: MixerContext, *, head_dim: int, width: int, rngs) -> None:
        """QK-norm over ``head_dim`` and an output gate over the ``width`` channels of all heads, as set."""
        self.qk_norm = QKNorm(ctx, head_dim, rngs=rngs) if cfg.qk_norm else None
        self.output_gate = OutputGate(ctx, width, rngs=rngs) if cfg.output_gate else None

    def normalize_qk(self, q, k):
        return (q, k) if self.qk_norm is None else self.qk_norm(q, k)

    def output(self, o, x):
        """The layer's output from its heads' o [B,T,H,Dv] and its input x [B,T,d]: gated, then projected."""
        o = o.reshape(*o.shape[:2], -1)
        if self.output_gate is not None:
            o = self.output_gate(o, x)
        return self.o_proj(o)

    def forward(self, x, positions, segment_ids=None) -> tuple[jax.Array, dict]:
        raise NotImplementedError

    def __call__(self, x, *, positions=None, segment_ids=None):
        return self.forward(x, positions, segment_ids)[0]

    def prefill(self, x, max_len=None, *, positions=None):
        y, entries = self.forward(x, positions)
        return y, cache_fill(self.init_state(x.shape[0], max_len or x.shape[1]), **entries)

    def state_size(self, max_len):
        """Floats of one sequence's decoding state: the floating arrays ``init_state`` allocates."""
        state = jax.eval_shape(lambda: self.init_state(1, max_len))
        return sum(leaf.size for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating))


class KVHeadsMixer(CacheMixer):
    """A ``CacheMixer`` with ``n_heads`` query heads over ``n_kv_heads`` key/value heads (GQA), all of
    ``head_dim`` dims, projected from x, whose cache holds one key and one value per kv head and token.
    ``init_heads`` makes the q/k/v projections, ``init_output`` the output projection and the head
    options; parameters draw their initial values in the order they are made."""

    def init_heads(self, ctx: MixerContext, n_kv_heads: Optional[int], *, rngs) -> None:
        d = ctx.d_model
        self.n_heads, self.n_kv_heads = ctx.n_heads, n_kv_heads or ctx.n_heads
        self.head_dim = hd = d // ctx.n_heads
        self.q_proj = dense(ctx, d, self.n_heads * hd, rngs=rngs)
        self.k_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)
        self.v_proj = dense(ctx, d, self.n_kv_heads * hd, rngs=rngs)

    def init_output(self, cfg: HeadOptions, ctx: MixerContext, *, rngs) -> None:
        width = self.n_heads * self.head_dim
        self.o_proj = dense(ctx, width, ctx.d_model, rngs=rngs, residual=True)
        self.init_head_options(cfg, ctx, head_dim=self.head_dim, width=width, rngs=rngs)

    def heads(self, x):
        """q [B,T,H,D], k and v [B,T,K,D] of x [B,T,d]; q and k normalised when qk_norm is set."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        return *self.normalize_qk(q, k), v

    def rotated_heads(self, x, positions=None):
        """``heads`` with q and k rotated by ``self.scoring``'s position method at ``positions`` [B,T]
        (None: 0 .. T-1), for a layer whose ops and cache take rotated keys."""
        positions = default_positions(*x.shape[:2]) if positions is None else positions
        q, k, v = self.heads(x)
        return self.scoring.rotate(q, positions), self.scoring.rotate(k, positions), v

    def init_kv_cache(self, batch_size: int, size: int, *, key_dtype=None, **fields) -> dict:
        """``size`` slots of a key (in ``key_dtype``; None: the projections' dtype) and a value per kv
        head, and ``fields`` as in ``init_cache``."""
        dtype = self.v_proj.dtype or jnp.float32
        shape = (self.n_kv_heads, self.head_dim)
        return init_cache(batch_size, size, k=(shape, key_dtype or dtype), v=(shape, dtype), **fields)
