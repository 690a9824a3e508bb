"""Pure array functions (no parameters) for every sequence-mixing computation.

Axis legend used across ``lmzoo.ops``: B batch, T query time, S key time, H query heads,
K key/value heads, D head dim. Per-head tensors are laid out ``[B, T, H, D]``.
"""

from lmzoo.ops.attention import attention_weights, causal_mask, softmax_attention

__all__ = ["attention_weights", "causal_mask", "softmax_attention"]
