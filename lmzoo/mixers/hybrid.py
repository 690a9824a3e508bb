"""Per-layer patterns of mixers: a model whose layers use different variants, set up in YAML alone.

A ``hybrid`` attn config names sub-configs (each a complete mixer config, validated against its own
mixer's schema) and says which layer uses which:

    layers: {window: {mixer: softmax, window: 64}, full: {mixer: softmax, nope: true, logn: true}}
    pattern: [window]     # cycled from the bottom layer up
    top: [full]           # the top len(top) layers, replacing the pattern there

``HybridConfig.for_layer`` resolves a layer to its sub-config; the model asks every attn config
``for_layer`` before building, so the decoder never knows a hybrid exists. Evaluation overrides
reach a sub-config by its name, e.g. ``attn.layers.full.logn_clamp=true``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from lmzoo import registry
from lmzoo.mixers.base import MixerContext
from lmzoo.schema import ConfigError, MixerConfig, ModelConfig, to_dataclass


@registry.register("hybrid")
@dataclass
class HybridConfig(MixerConfig):
    complete_by_default = False  # its layers and pattern are named in a configs/attn file (hwfa.yaml ...)
    layers: dict[str, Any] = field(default_factory=dict)  # name -> a mixer config ({mixer: ..., knobs})
    pattern: list[str] = field(default_factory=list)  # names from `layers`, cycled from the bottom layer up
    top: list[str] = field(default_factory=list)  # names for the top layers, replacing the pattern there

    def layer_names(self, n_layers: int) -> list[str]:
        """The sub-config name of every layer, bottom first."""
        below = n_layers - len(self.top)
        return [self.pattern[i % len(self.pattern)] for i in range(below)] + list(self.top)

    def for_layer(self, layer: int, n_layers: int) -> MixerConfig:
        return self.sub_config(self.layer_names(n_layers)[layer])

    def sub_config(self, name: str) -> MixerConfig:
        """The typed config of ``layers[name]``; ConfigError (one line, keys under attn.layers.<name>.)."""
        prefix = f"attn.layers.{name}."
        raw = dict(self.layers[name])
        raw.setdefault("name", f"{self.name}.{name}")
        mixer = raw.get("mixer")
        if mixer is None:
            raise ConfigError(f"{prefix}mixer is missing: each sub-config names its registered mixer")
        if mixer not in registry.names():
            raise ConfigError(f"{prefix}mixer={mixer!r} is not a registered mixer "
                              f"(registered: {', '.join(registry.names())})")
        spec = registry.lookup(mixer)
        if issubclass(spec, HybridConfig):
            raise ConfigError(f"{prefix}mixer={mixer!r}: hybrids do not nest")
        return to_dataclass(spec, OmegaConf.create(raw), prefix=prefix)

    def build(self, ctx: MixerContext, *, rngs):
        """Not a mixer itself: the sub-mixer this layer's pattern entry names."""
        return self.for_layer(ctx.layer, ctx.n_layers).build(ctx, rngs=rngs)

    def flops_per_token(self, model: ModelConfig, seq_len: int) -> float:
        """The mean over layers: each layer counts its own sub-mixer's cost."""
        layers = range(model.n_layers)
        return sum(self.for_layer(i, model.n_layers).flops_per_token(model, seq_len) for i in layers) / model.n_layers

    def check(self, model: ModelConfig) -> None:
        if not self.layers:
            raise ConfigError("attn.layers is empty: name at least one sub-config ({name: {mixer: ..., ...}})")
        if not self.pattern:
            raise ConfigError("attn.pattern is empty: list the sub-configs to cycle through "
                              f"(defined: {', '.join(self.layers)})")
        for key, names in (("pattern", self.pattern), ("top", self.top)):
            for name in names:
                if name not in self.layers:
                    raise ConfigError(f"attn.{key}: {name!r} is not in attn.layers (defined: {', '.join(self.layers)})")
        if len(self.top) > model.n_layers:
            raise ConfigError(f"attn.top names {len(self.top)} layers but model.n_layers={model.n_layers}")
        for name in self.layers:
            sub = self.sub_config(name)
            try:
                sub.check(model)
            except ConfigError as e:  # the sub-config's own check names attn.<key>: point below attn.layers
                raise ConfigError(str(e).replace("attn.", f"attn.layers.{name}.")) from None



def check_layers_used(attn: MixerConfig, n_layers: int) -> None:
    """ConfigError when a hybrid's pattern names a sub-config that no layer of ``n_layers`` gets (say, the
    softmax layer of ``[gla, gla, gla, softmax]`` in a 2-layer model): the run would silently lack it.
    Checked where a run starts, not in every config check: tests build hybrids smaller than their pattern."""
    if not isinstance(attn, HybridConfig):
        return
    used = attn.layer_names(n_layers)
    for name in dict.fromkeys(attn.pattern):
        if name not in used:
            needed = attn.pattern.index(name) + 1 + len(attn.top)
            raise ConfigError(f"model.n_layers={n_layers} leaves out the {name!r} layers of attn.pattern "
                              f"[{', '.join(attn.pattern)}] (layers: {', '.join(used)}); use model.n_layers>={needed} "
                              "or another attn.pattern")
