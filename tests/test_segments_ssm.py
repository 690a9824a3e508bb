"""State-space mixers on packed documents (``segment_ids``): each document's outputs equal the
mixer's outputs on that document alone, and the attention matrix is zero between documents.

Three documents of 10, 14 and 13 steps: with chunks of 16 the second starts inside the first chunk
and runs across its edge, and so does the third across the next.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from op_checks import F32_TOL, rel_err
from test_ssm_mixers import inputs, mixer_of

DOCUMENTS = (10, 14, 13)
EDGES = np.cumsum((0, *DOCUMENTS))
SEGMENT_IDS = jnp.asarray(np.repeat([[0, 1, 2]], 2, axis=0).repeat(DOCUMENTS, axis=1))  # (B, 37)


@nnx.jit
def packed(mixer, x, segment_ids):
    return mixer(x, segment_ids=segment_ids), mixer.attention_matrix(x, segment_ids=segment_ids)


@nnx.jit
def alone(mixer, x):
    return mixer(x), mixer.attention_matrix(x)


@pytest.mark.parametrize(
    "variant, overrides",
    [
        ("mamba", ("attn.method=scan",)),
        ("mamba", ("attn.method=chunk", "attn.chunk_size=16")),
        ("mamba2", ("attn.method=chunk", "attn.chunk_size=16")),
        ("h3", ("attn.method=quadratic",)),
        ("h3", ("attn.method=fft",)),
        ("h3", ("attn.method=scan",)),
    ],
)
def test_packed_documents_equal_each_document_alone(variant, overrides):
    mixer, x = mixer_of(variant, *overrides), inputs(int(EDGES[-1]))
    y, weights = packed(mixer, x, SEGMENT_IDS)
    inside = np.zeros(weights.shape[-2:], bool)
    for start, end in zip(EDGES[:-1], EDGES[1:]):
        y_alone, weights_alone = alone(mixer, x[:, start:end])
        assert rel_err(y[:, start:end], y_alone) <= F32_TOL, (start, end)
        assert rel_err(weights[..., start:end, start:end], weights_alone) <= F32_TOL, (start, end)
        inside[start:end, start:end] = True
    assert np.all(np.asarray(weights)[..., ~inside] == 0)


@pytest.mark.parametrize("variant", ["mamba", "mamba2", "h3"])
def test_one_document_changes_nothing(variant):
    """segment_ids equal everywhere: the same numbers as without them."""
    mixer, x = mixer_of(variant), inputs(21)
    y, weights = packed(mixer, x, jnp.zeros((2, 21), jnp.int32))
    y_ref, weights_ref = alone(mixer, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weights, weights_ref, rtol=1e-6, atol=1e-7)
