"""Name -> mixer lookup, so configs and checkpoints select variants without naming code.

A mixer module registers itself with ``@register("name", config=SomeConfig)``; the config class
is the schema its ``configs/attn/*.yaml`` files are validated against. Nothing outside a mixer
module ever names a variant.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

_MIXERS: dict[str, tuple[type, type]] = {}


def register(name: str, *, config: type) -> Callable[[type], type]:
    """Class decorator: make ``cls`` selectable as ``attn.mixer=<name>`` with schema ``config``."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config for mixer {name!r} must be a dataclass")

    def wrap(cls: type) -> type:
        if name in _MIXERS and _MIXERS[name][0] is not cls:
            raise ValueError(f"mixer {name!r} is already registered to {_MIXERS[name][0].__name__}")
        _MIXERS[name] = (cls, config)
        return cls

    return wrap


def _load_builtin_mixers() -> None:
    import lmzoo.mixers  # noqa: F401  (importing the package registers every built-in mixer)


def names() -> list[str]:
    _load_builtin_mixers()
    return sorted(_MIXERS)


def lookup(name: str) -> tuple[type, type]:
    """(module class, config class) registered under ``name``; KeyError lists the valid names."""
    _load_builtin_mixers()
    if name not in _MIXERS:
        raise KeyError(f"unknown mixer {name!r} (registered: {', '.join(names())})")
    return _MIXERS[name]
