"""Measurements of attention: sparsity, entropy and first-key share of each row, and probes that collect them."""

from lmzoo.metrics.sparsity import attention_entropy, first_key_share, l1_l2_sparsity

__all__ = ["attention_entropy", "first_key_share", "l1_l2_sparsity"]
