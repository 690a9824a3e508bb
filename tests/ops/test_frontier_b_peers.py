"""The momentum delta rule, the preconditioned delta rule (Gated DeltaNet's and KDA's), MesaNet, DeltaFormer and
gated slot attention checked against the peer: flash-linear-attention 0.6.0's PyTorch references
(``fla/ops/<op>/naive.py``, loaded by path through ``tests/fla_reference.py``; skipped without torch or fla-core).

Each check runs both on the same float32 inputs at an odd length (19) from an initial state and compares the
outputs, the final states and the gradients of every input (initial states included) under one random
cotangent on the outputs and states: jax.vjp on lmzoo's side, torch autograd on the peer's. lmzoo's fastest own
form ("chunk", chunks of 8 over 19 steps) and its reference ("naive") are both compared.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmzoo.ops.deltaformer import deltaformer
from lmzoo.ops.gsa import gsa
from lmzoo.ops.mesa import mesa_net
from lmzoo.ops.momentum_delta import momentum_delta_rule
from lmzoo.ops.precond_delta import precond_delta_rule

from fla_reference import fla_reference, to_numpy, to_torch
from op_checks import compiled, rel_err

B, T, H, DK, DV = 2, 19, 2, 8, 6
CHUNK = 8
TOLERANCE = 2e-5  # norm-relative, float32 on both sides


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def assert_agree_with_peer(ours, peer, inputs, seed=7):
    """``ours(inputs) -> tree`` (JAX) and ``peer(inputs) -> the same tree`` (torch) agree on values and, under one
    random cotangent, on the gradient of every input."""
    rng = np.random.default_rng(seed)
    values = ours(jax.tree.map(jnp.asarray, inputs))
    cotangent = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), values)

    @compiled
    def pull_back(a, c):
        return jax.vjp(ours, a)[1](c)[0]

    grads = pull_back(jax.tree.map(jnp.asarray, inputs), jax.tree.map(jnp.asarray, cotangent))
    torch_inputs = {name: to_torch(x, requires_grad=True) for name, x in inputs.items()}
    peer_values = peer(torch_inputs)
    flat_values, flat_peer = jax.tree.leaves(values), jax.tree.leaves(peer_values)
    assert len(flat_values) == len(flat_peer)
    for i, (got, want) in enumerate(zip(flat_values, flat_peer)):
        assert rel_err(got, to_numpy(want)) < TOLERANCE, f"output {i}: {rel_err(got, to_numpy(want)):.2e}"
    import torch

    total = sum((to_torch(c) * v).sum() for c, v in zip(jax.tree.leaves(cotangent), flat_peer))
    torch.autograd.backward(total)
    for name, x in torch_inputs.items():
        want = np.zeros(x.shape, np.float32) if x.grad is None else to_numpy(x.grad)
        err = rel_err(grads[name], want)
        assert err < TOLERANCE, f"gradient w.r.t. {name}: {err:.2e}"


# ----------------------------------------------------------------------------- the momentum delta rule


def momentum_inputs(seed=0):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    k = unit(n(B, T, H, DK))
    return {"q": n(B, T, H, DK), "k": k, "v": n(B, T, H, DV), "p": 0.7 * k + 0.3 * unit(n(B, T, H, DK)),
            "beta": sigmoid(n(B, T, H)), "eta": sigmoid(n(B, T, H)), "log_alpha": np.log(sigmoid(n(B, T, H) + 2)),
            "log_mu": np.log(sigmoid(n(B, T, H))), "S": n(B, H, DK, DV), "M": n(B, H, DK, DV)}


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_momentum_delta_rule_equals_the_peer(method):
    peer = fla_reference("momentum_delta_rule")

    def ours(a):
        o, (s, m) = momentum_delta_rule(a["q"], a["k"], a["v"], a["p"], a["beta"], a["eta"], a["log_alpha"],
                                        a["log_mu"], initial_state=(a["S"], a["M"]), method=method, chunk_size=CHUNK)
        return o, s, m

    def theirs(a):
        o, final = peer.recurrent_momentum_delta_rule_ref(
            a["q"], a["k"], a["v"], a["log_alpha"], a["log_mu"], a["p"], a["beta"], a["eta"],
            initial_S=a["S"], initial_M=a["M"], output_final_state=True)
        return o, final[0], final[1]

    assert_agree_with_peer(ours, theirs, momentum_inputs())


# ----------------------------------------------------------------------------- the preconditioned delta rule


def precond_inputs(value_heads, gate_shape, seed=1):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return {"q": n(B, T, H, DK), "k": n(B, T, H, DK), "v": n(B, T, value_heads, DV),
            "beta": sigmoid(n(B, T, value_heads)), "g": np.log(sigmoid(n(B, T, value_heads, *gate_shape) + 2)),
            "beta_atk": sigmoid(n(B, T, H)),
            "g_atk": np.log(sigmoid(n(B, T, H) + 2)), "S": n(B, value_heads, DK, DV), "A": np.abs(n(B, H, DK))}


def l2_normalized(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_precond_gated_delta_rule_equals_the_peer(method):
    """Gated DeltaNet's decay (one per value head) over grouped value heads (two per key head); the peer normalises
    q and k inside its op, lmzoo's mixer before it: here lmzoo's op runs on q, k normalised the same way."""
    peer = fla_reference("precond_gated_delta_rule")

    def ours(a):
        o, (s, second) = precond_delta_rule(l2_normalized(a["q"]), l2_normalized(a["k"]), a["v"], a["beta"], a["g"],
                                            a["beta_atk"], a["g_atk"], initial_state=(a["S"], a["A"]), method=method,
                                            chunk_size=CHUNK)
        return o, s, second

    def theirs(a):
        return peer.naive_recurrent_precond_gated_delta_rule(
            a["q"], a["k"], a["v"], a["g_atk"], a["g"], a["beta_atk"], a["beta"], initial_state=a["S"],
            initial_A_state=a["A"], output_final_state=True)

    assert_agree_with_peer(ours, theirs, precond_inputs(2 * H, ()))


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_precond_kda_equals_the_peer(method):
    """KDA's decay (one per key channel), with a centre of its own per head."""
    peer = fla_reference("precond_kda")
    center = np.array([-0.2, 0.4], np.float32)

    def ours(a):
        q, k = l2_normalized(a["q"]), l2_normalized(a["k"])
        o, (s, second) = precond_delta_rule(q, k, a["v"], a["beta"], a["g"], a["beta_atk"], a["g_atk"],
                                            center=jnp.asarray(center), initial_state=(a["S"], a["A"]),
                                            method=method, chunk_size=CHUNK)
        return o, s, second

    def theirs(a):
        import torch

        q, k = (torch.nn.functional.normalize(a[n], dim=-1) for n in ("q", "k"))
        return peer.naive_recurrent_precond_kda(
            q, k, a["v"], a["g"], a["g_atk"], a["beta_atk"], a["beta"], initial_state=a["S"], initial_A_state=a["A"],
            output_final_state=True, log_atk_scale=to_torch(center))

    assert_agree_with_peer(ours, theirs, precond_inputs(H, (DK,)))


# ----------------------------------------------------------------------------- MesaNet


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_mesa_net_equals_the_peer(method):
    """The peer's conjugate-gradient reference (``naive_mesa_net_CG``, 30 steps from x = 0), run as one chunk of the
    odd length (its chunking needs a multiple of the chunk; its value width equals the key width)."""
    peer = fla_reference("mesa_net")
    rng = np.random.default_rng(2)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    past = unit(n(B, 4, H, DK))
    inputs = {"q": unit(n(B, T, H, DK)), "k": unit(n(B, T, H, DK)), "v": n(B, T, H, DK), "beta": sigmoid(n(B, T, H)),
              "g": np.log(sigmoid(n(B, T, H) + 2)), "lamb": 0.5 + np.abs(n(H, DK)),
              "H": np.einsum("bthd,bthe->bhde", past, past), "G": n(B, H, DK, DK)}

    def ours(a):
        o, (h, g) = mesa_net(a["q"], a["k"], a["v"], a["beta"], a["g"], a["lamb"], cg_steps=30,
                             initial_state=(a["H"], a["G"]), method=method, chunk_size=CHUNK)
        return o, h, g

    def theirs(a):
        return peer.naive_mesa_net_CG(a["q"], a["k"], a["v"], a["g"], a["lamb"], a["beta"], chunk_size=T,
                                      max_CG_iteration=30, h_kk_init=a["H"], h_kv_init=a["G"])

    assert_agree_with_peer(ours, theirs, inputs)


# ----------------------------------------------------------------------------- DeltaFormer


@pytest.mark.parametrize("method", ["naive", "chunk"])
def test_deltaformer_equals_the_peer(method):
    """The peer's reference (``naive_deltaformer_attn``) writes with the queries (lmzoo's ``w=q``) and reads with
    them; it takes no state, and its values have the keys' width."""
    peer = fla_reference("deltaformer")
    rng = np.random.default_rng(3)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"q": n(B, T, H, DK), "k": n(B, T, H, DK), "v": n(B, T, H, DK), "beta": sigmoid(n(B, T, H))}

    def ours(a):
        return deltaformer(a["q"], a["k"], a["v"], a["beta"], w=a["q"], method=method, chunk_size=CHUNK)[0]

    assert_agree_with_peer(ours, lambda a: peer.naive_deltaformer_attn(a["q"], a["k"], a["v"], a["beta"]), inputs)


# ----------------------------------------------------------------------------- gated slot attention


def test_gsa_equals_the_peer():
    """The peer's two-pass recurrence (``naive_recurrent_gsa``) with a gate per slot and both initial states, against
    lmzoo's reference (its chunk form is checked against that reference in tests/ops/test_gsa.py)."""
    peer = fla_reference("gsa")
    rng = np.random.default_rng(3)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    slots = 5
    log_g = np.log(sigmoid(n(B, T, H, slots) + 2))
    inputs = {"q": n(B, T, H, DK), "k": n(B, T, H, DK), "v": n(B, T, H, DV), "s": 1 - np.exp(log_g), "g": log_g,
              "K": n(B, H, DK, slots), "V": n(B, H, slots, DV)}

    def ours(a):
        o, (keys, values) = gsa(a["q"], a["k"], a["v"], a["s"], a["g"], initial_state=(a["K"], a["V"]),
                                method="naive")
        return o, keys, values

    def theirs(a):
        o, (keys, values) = peer.naive_recurrent_gsa(a["q"], a["k"], a["v"], a["s"], a["g"],
                                                     initial_state=(a["K"], a["V"]), output_final_state=True)
        return o, keys, values

    assert_agree_with_peer(ours, theirs, inputs)
