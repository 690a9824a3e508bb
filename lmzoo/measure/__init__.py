"""Measuring trained runs: evaluation at many lengths, its memory plan and what it writes, comparison, decoding, and a
run opened in Python (lmzoo.load)."""
