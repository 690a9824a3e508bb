"""The frontier ops of issue 57 (part A: RWKV-6, HGRN2, Lightning attention, mLSTM) against flash-linear-attention
0.6.0's PyTorch references, loaded by path (``fla_reference``; skipped without torch or fla-core), and mLSTM, which
fla lacks, against jax-linear-attention's reference (skipped without jla).

Each check runs both sides in float32 at an odd length from an initial state where the reference takes one, and
compares the outputs, the final states and the gradients of every input for one random cotangent of (o, S)
(torch's autograd on the reference, ``jax.vjp`` on lmzoo's form).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fla_reference import fla_reference, to_numpy, to_torch
from op_checks import rel_err

TOL = 1e-5
B, T, H, DK, DV = 2, 19, 2, 8, 16


def random(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def lmzoo_pullback(fn, inputs, cotangents):
    """(o, S) of ``fn(*inputs)`` and the gradients of <(o, S), cotangents> w.r.t. every input."""
    out, vjp = jax.vjp(fn, *map(jnp.asarray, inputs))
    return out, vjp(tuple(map(jnp.asarray, cotangents)))


def torch_pullback(fn, inputs, cotangents):
    """The same through torch's autograd: ``inputs`` numpy arrays, ``fn`` on torch tensors -> (o, S)."""
    import torch

    tensors = [to_torch(x, requires_grad=True) for x in inputs]
    out = fn(*tensors)
    torch.autograd.backward(out, [to_torch(c) for c in cotangents])
    return [to_numpy(o) for o in out], [to_numpy(t.grad) for t in tensors]


def assert_equal_to_peer(ours, theirs, names):
    (out, state), grads = ours
    (out_ref, state_ref), grads_ref = theirs
    assert rel_err(out, out_ref) <= TOL, f"output: {rel_err(out, out_ref):.2e}"
    assert rel_err(state, state_ref) <= TOL, f"final state: {rel_err(state, state_ref):.2e}"
    for name, g, g_ref in zip(names, grads, grads_ref):
        assert rel_err(g, g_ref) <= TOL, f"gradient w.r.t. {name}: {rel_err(g, g_ref):.2e}"


def heads_first(t):
    """A torch tensor [B, T, H, D] as [B, H, T, D] (some references take heads first), and back."""
    return t.transpose(1, 2)


# ----------------------------------------------------------------------------- RWKV-6


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_rwkv6_equals_the_peer_recurrence(method):
    """fla's ``naive_recurrent_rwkv6`` (heads first; w a log decay per key channel; u [H, K]) and lmzoo's."""
    from lmzoo.ops.rwkv6 import rwkv6

    reference = fla_reference("rwkv6", "recurrent_naive.py")
    rng = np.random.default_rng(0)
    q, k = random(rng, B, T, H, DK), random(rng, B, T, H, DK)
    v, u, s0 = random(rng, B, T, H, DV), random(rng, H, DK), random(rng, B, H, DK, DV)
    log_w = -np.exp(random(rng, B, T, H, DK) - 1.0)
    cotangents = (random(rng, B, T, H, DV), random(rng, B, H, DK, DV))
    inputs, names = (q, k, v, log_w, u, s0), ("q", "k", "v", "log_w", "u", "state")

    def theirs(q, k, v, log_w, u, s0):
        o, s = reference.naive_recurrent_rwkv6(*map(heads_first, (q, k, v, log_w)), u, scale=0.7, initial_state=s0,
                                               output_final_state=True)
        return heads_first(o), s

    def ours(q, k, v, log_w, u, s0):
        return rwkv6(q, k, v, log_w, u, scale=0.7, initial_state=s0, method=method, chunk_size=8)

    assert_equal_to_peer(lmzoo_pullback(ours, inputs, cotangents), torch_pullback(theirs, inputs, cotangents), names)


# ----------------------------------------------------------------------------- HGRN2 (on lmzoo's GLA op)


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_hgrn2_equals_the_peer_gla_with_its_tied_gates(method):
    """HGRN2's layer on fla's ``naive_recurrent_gla``: q = swish(q'), log f = logsigmoid(z), k = 1 - f (scale
    K^-1/2); lmzoo's ``tied_gates`` and ``gla``. Gradients w.r.t. q', z, v and the state: the tie included."""
    from lmzoo.mixers.hgrn2 import tied_gates
    from lmzoo.ops.gated import gla

    reference = fla_reference("gla")  # skips without torch or fla-core: before torch is imported
    import torch
    rng = np.random.default_rng(1)
    inputs = (random(rng, B, T, H, DK), random(rng, B, T, H, DK) + 2.0, random(rng, B, T, H, DV),
              random(rng, B, H, DK, DV))
    cotangents = (random(rng, B, T, H, DV), random(rng, B, H, DK, DV))

    def theirs(q_raw, logits, v, s0):
        log_f = torch.nn.functional.logsigmoid(logits)
        return reference.naive_recurrent_gla(torch.nn.functional.silu(q_raw), 1 - log_f.exp(), v, log_f,
                                             initial_state=s0, output_final_state=True)

    def ours(q_raw, logits, v, s0):
        k, log_f = tied_gates(logits)
        return gla(jax.nn.silu(q_raw), k, v, log_f, initial_state=s0, method=method, chunk_size=8)

    assert_equal_to_peer(lmzoo_pullback(ours, inputs, cotangents), torch_pullback(theirs, inputs, cotangents),
                         ("q", "forget logits", "v", "state"))


# ----------------------------------------------------------------------------- Lightning attention (lmzoo's GLA op)


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_lightning_equals_the_peer_simple_gla_with_its_decays(method):
    """Lightning attention's recurrence (a constant log decay per head, MiniMax-01's schedule, scale 1) on fla's
    ``naive_chunk_simple_gla`` and on lmzoo's ``gla``, the decays an input too."""
    from lmzoo.mixers.lightning import lightning_log_decays
    from lmzoo.ops.gated import gla

    reference = fla_reference("simple_gla")
    rng = np.random.default_rng(2)
    decays = np.broadcast_to(np.asarray(lightning_log_decays(H, 1, 4)), (B, T, H)).copy()
    inputs = (random(rng, B, T, H, DK), random(rng, B, T, H, DK), random(rng, B, T, H, DV), decays,
              random(rng, B, H, DK, DV))
    cotangents = (random(rng, B, T, H, DV), random(rng, B, H, DK, DV))

    def theirs(q, k, v, g, s0):
        return reference.naive_chunk_simple_gla(q, k, v, g, initial_state=s0, output_final_state=True, chunk_size=8,
                                                scale=1.0)

    def ours(q, k, v, g, s0):
        return gla(q, k, v, g, scale=1.0, initial_state=s0, method=method, chunk_size=8)

    assert_equal_to_peer(lmzoo_pullback(ours, inputs, cotangents), torch_pullback(theirs, inputs, cotangents),
                         ("q", "k", "v", "log decays", "state"))


# ----------------------------------------------------------------------------- mLSTM (jax-linear-attention's reference)


# The normaliser's division amplifies float32 rounding in rows where |n . q| is small: two step-by-step recurrences
# that sum in another order already differ by ~1.5e-5 there.
MLSTM_TOL = 3e-5


@pytest.mark.parametrize("method", ["naive", "parallel", "assoc"])
@pytest.mark.parametrize("documents", [False, True])
def test_mlstm_equals_the_peer_reference(method, documents):
    """flash-linear-attention 0.6.0 has no mLSTM; jax-linear-attention's ``reference.mlstm`` (g = log f, i = log i~,
    the state (c, n, m) with the same empty-state stabiliser, its eps set to 0) is the peer: outputs, final states
    and every gradient, from an initial state, with and without packed documents. Skips without jla (Python 3.12)."""
    reference = pytest.importorskip("jla.ops.reference")
    from lmzoo.ops.mlstm import mlstm

    rng = np.random.default_rng(3)
    log_f = np.asarray(jax.nn.log_sigmoid(random(rng, B, T, H) + 2.0))
    inputs = (random(rng, B, T, H, DK), random(rng, B, T, H, DK), random(rng, B, T, H, DV), random(rng, B, T, H),
              log_f, (random(rng, B, H, DK, DV), random(rng, B, H, DK), random(rng, B, H)))
    ids = jnp.asarray(np.stack([np.repeat([0, 1, 2], [6, 5, 8]), np.zeros(T, int)])) if documents else None

    def theirs(q, k, v, log_i, log_f, state):
        out, final = reference.mlstm(q, k, v, log_f, log_i, scale=0.5, eps=0.0, output_final_state=True,
                                     initial_state=reference.MLSTMState(*state), segment_ids=ids)
        return out, tuple(final)

    def ours(q, k, v, log_i, log_f, state):
        return mlstm(q, k, v, log_i, log_f, scale=0.5, initial_state=state, method=method, segment_ids=ids)

    inputs = jax.tree.map(jnp.asarray, inputs)
    cotangent = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32),
                             jax.eval_shape(ours, *inputs))
    pulled = [jax.vjp(fn, *inputs) for fn in (ours, theirs)]
    (out, vjp), (out_ref, vjp_ref) = pulled
    for name, a, b in zip(("output", "C", "n", "m"), jax.tree.leaves(out), jax.tree.leaves(out_ref)):
        assert rel_err(a, b) <= MLSTM_TOL, f"{name}: {rel_err(a, b):.2e}"
    names = ("q", "k", "v", "log_i", "log_f", "C0", "n0", "m0")
    for name, g, g_ref in zip(names, jax.tree.leaves(vjp(cotangent)), jax.tree.leaves(vjp_ref(cotangent))):
        assert rel_err(g, g_ref) <= MLSTM_TOL, f"gradient w.r.t. {name}: {rel_err(g, g_ref):.2e}"
