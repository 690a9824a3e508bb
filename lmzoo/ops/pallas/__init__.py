"""Pallas kernels behind ``method="pallas"``: chunked gated linear attention (``gla``; its special
cases simple GLA / RetNet and plain linear attention) and Mamba's selective scan, forward and
backward. ``common`` holds the platform handling (Triton on GPU, Mosaic on TPU, interpret mode
on CPU) and the export check that the kernels lower for a device this machine lacks."""
