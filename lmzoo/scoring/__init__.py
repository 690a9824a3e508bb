"""Scoring a model, in JAX, shared by training and measuring: the scorer of every length (``lengths``), the
attention probes, and the catalog that defines each measurement once (its names in results, tables, figures, logs).

The statistics of what they measure (intervals, comparisons over seeds) are ``lmzoo.stats``.
"""

from lmzoo.scoring.sparsity import attention_entropy, first_key_share, l1_l2_sparsity

__all__ = ["attention_entropy", "first_key_share", "l1_l2_sparsity"]
