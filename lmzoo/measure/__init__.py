"""Measuring trained runs: evaluation at many lengths and what it writes, comparison between runs, decoding."""
