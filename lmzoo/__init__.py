"""lmzoo: small decoder-only language models in which one config switch picks the sequence mixer."""

__version__ = "0.1.0"
