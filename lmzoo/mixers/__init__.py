"""Sequence mixers, one module per family; importing this package registers them all."""

from lmzoo.mixers import softmax  # noqa: F401
from lmzoo.mixers.base import Mixer, MixerContext

__all__ = ["Mixer", "MixerContext", "build_mixer"]


def build_mixer(cfg, ctx: MixerContext, *, rngs) -> Mixer:
    """Instantiate the mixer registered under ``cfg.mixer``."""
    from lmzoo import registry

    mixer_cls, _ = registry.lookup(cfg.mixer)
    return mixer_cls(cfg, ctx, rngs=rngs)
