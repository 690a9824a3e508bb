"""TTT-Linear and Titans' neural memory checked against the peer: flash-linear-attention 0.6.0's PyTorch references
(``fla/ops/ttt/naive.py``, ``fla/ops/titans/naive.py``, loaded by path through ``tests/fla_reference.py``; skipped
without torch or fla-core), on values, final states and the gradients of every input under one random cotangent
(``assert_agree_with_peer``), both of lmzoo's forms.

The peer pads a length that is not a multiple of its mini-batch and lets the padded steps move its final state
(TTT's bias, Titans' memory), so the lengths here are odd multiples of the mini-batch: 15 = 3 x 5 for TTT, 9 for
Titans.

Titans' reference imports a sibling file by fla's package path (``fla.ops.titans.log_impl``, pure PyTorch, whose
package would import Triton); ``fla_reference`` loads that file by its path in its place. Both of the peer's Titans
forms write the layer norm's backward as ``D * grad - grad.sum(-1) / (rstd * D) - ...``, where operator precedence
divides only the sum by ``rstd * D`` (its TTT, and the line left commented above it, divide all three terms: the
layer norm's derivative, lmzoo's). The two agree where ``rstd = sqrt(var(k M) + eps) = 1 / D``, so the Titans check
runs one mini-batch whose keys make every ``k_t M_0`` have exactly that variance, and compares the values, the
final memory and the gradients of every input but k and M_0 (whose gradients pass through ``rstd``, where the
peer's formula parts from the derivative). The rest of Titans' op is checked against lmzoo's own reference and a
float64 recurrence (``tests/ops/test_titans.py``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops.titans import titans
from lmzoo.ops.ttt import ttt_linear

from fla_reference import fla_reference, to_torch
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


def keys_read_at_unit_spread(memory, rng, eps=1e-6):
    """Keys k [B, T, H, D] with ``var(k_t M) = 1 / D^2 - eps`` for every step and head (M [B, H, D, D] invertible):
    rows of that variance mapped back through M^-1."""
    rows = rng.standard_normal((B, 9, H, D))
    rows -= rows.mean(-1, keepdims=True)
    rows *= np.sqrt(1 / D**2 - eps) / rows.std(-1, keepdims=True)
    return np.einsum("bthe,bhed->bthd", rows, np.linalg.inv(memory.astype(np.float64))).astype(np.float32)


@pytest.mark.parametrize("method, peer_form", [("naive", "recurrent"), ("chunk", "chunk")])
def test_titans_equals_the_peer(method, peer_form):
    """lmzoo's reference against the peer's token-by-token form, its chunk form against the peer's."""
    peer = fla_reference("titans", siblings=("log_impl.py",))
    length = 9
    rng = np.random.default_rng(5)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    memory = (np.eye(D) + 0.3 * n(B, H, D, D)).astype(np.float32)
    k = keys_read_at_unit_spread(memory, rng)
    inputs = {"q": unit(n(B, length, H, D)), "v": 0.1 * n(B, length, H, D), "theta": 0.3 * sigmoid(n(B, length, H)),
              "alpha": 0.2 * sigmoid(n(B, length, H)), "eta": sigmoid(n(B, length, H) + 1), "w": 1 + 0.3 * n(H, D),
              "b": 0.3 * n(H, D)}

    def ours(a):
        o, (m, _, _) = titans(a["q"], jnp.asarray(k), a["v"], a["theta"], jnp.log1p(-a["alpha"]), jnp.log(a["eta"]),
                              a["w"], a["b"], initial_state=(jnp.asarray(memory), jnp.zeros_like(memory)),
                              method=method, chunk_size=length)
        return o, m

    def theirs(a):
        gates = (a[name][..., None] for name in ("theta", "alpha", "eta"))
        return peer.chunk_titans_linear_ref(a["q"], to_torch(k), a["v"], a["w"], a["b"], *gates, eps=1e-6,
                                            chunk_size=length, initial_state=to_torch(memory),
                                            output_final_state=True, use_chunk=peer_form == "chunk")

    assert_agree_with_peer(ours, theirs, inputs)
