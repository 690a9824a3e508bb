"""Sequence mixers, one module per variant; importing this package registers them all.

Every module in this package is imported here, so a new mixer module registers itself just by
existing: nothing else needs editing. What a family's variants share lives in ``family/``
(``attention``, ``linear``, ``ssm``); a variant module never imports from a sibling variant.
"""

import importlib
import pkgutil

from lmzoo.mixers.base import Mixer, MixerContext

__all__ = ["Mixer", "MixerContext", "build_mixer"]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def build_mixer(cfg, ctx: MixerContext, *, rngs) -> Mixer:
    """The mixer of layer ``ctx.layer``, built by the spec its pattern gives that layer."""
    return cfg.for_layer(ctx.layer, ctx.n_layers).build(ctx, rngs=rngs)
