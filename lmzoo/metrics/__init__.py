"""Measurements shared by training and measuring: the scorer, attention probes, intervals, statistics over seeds."""

from lmzoo.metrics.sparsity import attention_entropy, first_key_share, l1_l2_sparsity

__all__ = ["attention_entropy", "first_key_share", "l1_l2_sparsity"]
