"""TTT-Linear and Titans' neural memory checked against the peer: flash-linear-attention 0.6.0's PyTorch references
(``fla/ops/ttt/naive.py``, ``fla/ops/titans/naive.py``, loaded by path through ``tests/fla_reference.py``; skipped
without torch or fla-core), on values, final states and the gradients of every input under one random cotangent
(``assert_agree_with_peer``), both of lmzoo's forms.

The peer pads a length that is not a multiple of its mini-batch and lets the padded steps move its final state
(TTT's bias, Titans' memory), so the lengths here are odd multiples of the mini-batch: 15 = 3 x 5 for TTT.
"""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.ops.ttt import ttt_linear

from fla_reference import fla_reference
from test_frontier_b_peers import assert_agree_with_peer, sigmoid, unit

B, H, D = 2, 2, 6


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_ttt_linear_equals_the_peer(method):
    """The peer's ``chunk_ttt_linear_ref`` over three mini-batches of 5 from an initial model; its final state is the
    model after the last step, ``(W0 - eta_T dW, b0 - eta_T db)`` of lmzoo's."""
    peer = fla_reference("ttt")
    length, mini_batch = 15, 5
    rng = np.random.default_rng(4)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"q": unit(n(B, length, H, D)), "k": unit(n(B, length, H, D)), "v": n(B, length, H, D),
              "eta": 0.5 * sigmoid(n(B, length, H)), "w": 1 + 0.3 * n(H, D), "b": 0.3 * n(H, D),
              "W": 0.5 * n(B, H, D, D), "bias": 0.3 * n(B, H, D)}

    def ours(a):
        o, (w0, b0, dw, db) = ttt_linear(a["q"], a["k"], a["v"], a["eta"], a["w"], a["b"],
                                         initial_state=(a["W"], a["bias"]), method=method, chunk_size=mini_batch)
        rate = a["eta"][:, -1, :, None]
        return o, w0 - rate[..., None] * dw, b0 - rate * db

    def theirs(a):
        o, w, b = peer.chunk_ttt_linear_ref(a["q"] * 1.0, a["k"], a["v"], a["w"], a["b"], a["eta"][..., None],
                                            scale=D ** -0.5, eps=1e-6, mini_batch_size=mini_batch,
                                            initial_state=a["W"], initial_state_bias=a["bias"][:, :, None],
                                            output_final_state=True)  # (q * 1.0: the peer scales q in place)
        return o, w, b[:, :, 0]

    assert_agree_with_peer(ours, theirs, inputs)
