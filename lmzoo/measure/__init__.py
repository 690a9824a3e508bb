"""Measuring trained runs: evaluation at many lengths, its memory plan and what it writes, comparison, decoding."""
