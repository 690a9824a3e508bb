"""Pallas kernels behind ``method="pallas"``: chunked gated linear attention (``gla``; its special
cases simple GLA / RetNet and plain linear attention), the delta rule's pass across chunks
(``delta``, its outputs on GLA's kernels) and Mamba's selective scan, forward and backward.
``common`` holds the platform handling (Triton on GPU, Mosaic on TPU, interpret mode on CPU) and
the export check that the kernels lower for a device this machine lacks."""

# The GLA-family kernels work in sub-blocks of this many rows (the smallest GPU matmul), so their
# chunk size must be a multiple of it; configs check this before a run starts.
CHUNK_MULTIPLE = 16
