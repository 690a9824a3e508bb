"""Name -> spec lookup, so configs and checkpoints select variants and data without naming code.

A mixer module registers its spec (a ``lmzoo.schema.MixerConfig`` subclass that knows how to
``build`` its module) with ``@register("name")``; the spec is also the schema its
``configs/attn/*.yaml`` files are validated against, and ``+attn=<name>`` itself where no file of that
name sets more (``lmzoo.config.options_made``). Data sources and synthetic tasks do the same
with ``@SOURCES.register("name")`` on a ``lmzoo.schema.DataConfig`` subclass (``data=<name>``).
Nothing outside a mixer or data module ever names a variant or a source.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from lmzoo.schema import ConfigError


class Registry:
    """Specs of one kind of component, by name; ``package`` is imported (registering the built-in
    ones) the first time the registry is read."""

    def __init__(self, kind: str, package: str):
        self.kind, self.package = kind, package
        self._specs: dict[str, type] = {}

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator on a spec dataclass: make it selectable under ``name``."""

        def wrap(spec: type) -> type:
            if not dataclasses.is_dataclass(spec):
                raise TypeError(f"the spec of {self.kind} {name!r} must be a dataclass")
            if self._specs.get(name, spec) is not spec:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._specs[name].__name__}")
            self._specs[name] = spec
            return spec

        return wrap

    def names(self) -> list[str]:
        importlib.import_module(self.package)
        return sorted(self._specs)

    def lookup(self, name: str) -> type:
        """The spec registered under ``name``; KeyError lists the valid names."""
        if name not in self.names():
            raise KeyError(f"unknown {self.kind} {name!r} (registered: {', '.join(self.names())})")
        return self._specs[name]

    def choose(self, key: str, name: str) -> type:
        """The spec the setting ``key=name`` selects; a one-line ConfigError lists the registered names."""
        if name not in self.names():
            raise ConfigError(f"{key}={name!r} is not a registered {self.kind} (registered: {', '.join(self.names())})")
        return self._specs[name]


MIXERS = Registry("mixer", "lmzoo.mixers")
SOURCES = Registry("data source", "lmzoo.data")
register, names, lookup = MIXERS.register, MIXERS.names, MIXERS.lookup
