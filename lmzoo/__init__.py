"""lmzoo: small decoder-only language models in which one config switch picks the sequence mixer.

``lmzoo.load(run_dir)`` opens a trained run in Python (``lmzoo.measure.loaded``; docs/api.md).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use: ``import lmzoo.<command>`` stays free of the measuring side, and JAX is configured
    # (its compilation cache, by the commands) before anything imports it.
    if name in ("load", "LoadedRun", "TextScore"):
        from lmzoo.measure import loaded

        return getattr(loaded, name)
    raise AttributeError(f"module 'lmzoo' has no attribute {name!r}")
