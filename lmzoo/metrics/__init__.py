"""Measurements of attention: sparsity and entropy of each row, and probes that collect them."""

from lmzoo.metrics.sparsity import attention_entropy, l1_l2_sparsity

__all__ = ["attention_entropy", "l1_l2_sparsity"]
