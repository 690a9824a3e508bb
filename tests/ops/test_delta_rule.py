"""The delta rule: every form against the "naive" reference, and that against a float64 loop.

Outputs, final states and the gradients of every input (q, k, v, beta, log_g, initial state;
``jax.vjp`` with random cotangents on both outputs) must agree to a norm-relative error of 1e-5 in
float32, at lengths 1 and 37 (two chunks of 16 and a remainder), with and without an
initial state, without gates, with one gate per head and with one per key channel. Inputs are what
the mixers feed the op: unit keys, beta in (0, 1), gates between ~0.5 and 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, compiled, delta_args as make_args, random_like, rel_err

from lmzoo.ops import delta_rule, delta_rule_weights
from lmzoo.ops.pallas.common import lower_for
from lmzoo.ops.pallas.delta import delta_rule_pallas

B, H, DK, DV = 2, 2, 8, 16
CHUNK = 16
ODD = 37  # two whole chunks and a partial one
TOLERANCE = 1e-5
PALLAS_STRONG_TOLERANCE = 3e-5  # see test_strong_decay_in_one_long_chunk_stays_exact
BF16_TOLERANCE = 2e-2  # bf16 inputs (8-bit mantissa) against the float32 reference, norm-relative
GATES = ("none", "head", "channel")
FORMS = ("chunk", "chunk_recompute", "parallel")


def run(method: str, args: dict, chunk_size: int = CHUNK):
    return delta_rule(args["q"], args["k"], args["v"], args["beta"], args.get("log_g"),
                      initial_state=args.get("state"), method=method, chunk_size=chunk_size)


run_fast = compiled(run, static_argnums=(0, 2))


@functools.partial(compiled, static_argnums=(0,), static_argnames=("chunk_size",))
def outputs_and_grads(method, args, cotangent, chunk_size=CHUNK):
    """(o, final state) and the gradients of <(o, S), cotangent> w.r.t. every input."""
    out, vjp = jax.vjp(lambda a: run(method, a, chunk_size), args)
    return out, vjp(cotangent)[0]


@functools.lru_cache(maxsize=None)
def reference(gate, length, with_state):
    """Inputs, a random cotangent, and the "naive" form's outputs and gradients, shared by the forms."""
    args = make_args(gate, length, with_state=with_state)
    full = args if with_state else {**args, "state": jnp.zeros((B, H, DK, DV))}  # one compiled reference
    cotangent = random_like(jax.eval_shape(lambda a: run("naive", a), full), seed=7)
    out, grads = outputs_and_grads("naive", full, cotangent)
    return args, cotangent, (out, {name: grads[name] for name in args})


SETTINGS = [(gate, length, with_state) for gate in GATES for length in (1, ODD) for with_state in (False, True)]
IDS = [f"{gate}-{length}-{'state' if with_state else 'no_state'}" for gate, length, with_state in SETTINGS]


@pytest.mark.parametrize("gate, length, with_state", SETTINGS, ids=IDS)
@pytest.mark.parametrize("method", FORMS)
def test_form_matches_naive(method, gate, length, with_state):
    args, cotangent, expected = reference(gate, length, with_state)
    assert_trees_close(outputs_and_grads(method, args, cotangent), expected)


@functools.partial(compiled, static_argnums=(0,))
def in_two_halves(method, args):
    """The first 29 steps, then the rest from the state they leave: (o, final state)."""
    first = {name: (x if name == "state" else x[:, :29]) for name, x in args.items()}
    out_a, state_a = run(method, first)
    second = {name: x[:, 29:] for name, x in args.items() if name != "state"}
    out_b, state_b = run(method, {**second, "state": state_a})
    return jnp.concatenate([out_a, out_b], axis=1), state_b


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("method", ("naive",) + FORMS)
def test_two_halves_passing_the_state_equal_one_pass(method, gate):
    args, _, (one_pass, _) = reference(gate, ODD, True)
    assert_trees_close(in_two_halves(method, args), one_pass)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("method", ("naive", "chunk"))
def test_bfloat16_inputs_close_to_float32_reference(method, gate):
    args, _, (expected, _) = reference(gate, ODD, True)
    low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), args)
    out, state = run_fast(method, low)
    assert out.dtype == jnp.bfloat16 and state.dtype == jnp.float32  # the state accumulates in float32
    assert_trees_close((out.astype(jnp.float32), state), expected, tol=BF16_TOLERANCE)


# ----------------------------------------------------------------------------- the reference itself


def loop_delta_rule(args, scale):
    """The recurrence in float64, one head and step at a time."""
    q, k, v, beta, s = (np.asarray(args[n], np.float64) for n in ("q", "k", "v", "beta", "state"))
    gates = np.exp(np.asarray(args["log_g"], np.float64)) if "log_g" in args else np.ones(q.shape[:3])
    gates = np.broadcast_to(gates if gates.ndim == 4 else gates[..., None], q.shape)
    out = np.zeros(v.shape)
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            state = s[b, h].copy()
            for t in range(q.shape[1]):
                state = gates[b, t, h][:, None] * state
                kt = k[b, t, h]
                state = state + beta[b, t, h] * np.outer(kt, v[b, t, h] - state.T @ kt)
                out[b, t, h] = scale * state.T @ q[b, t, h]
            s[b, h] = state
    return out, s


@pytest.mark.parametrize("gate", GATES)
def test_naive_matches_the_recurrence_in_float64(gate):
    args = make_args(gate, 20, with_state=True, seed=11)
    out, state = compiled(lambda a: delta_rule(a["q"], a["k"], a["v"], a["beta"], a.get("log_g"), scale=0.3,
                                               initial_state=a["state"], method="naive"))(args)
    expected_out, expected_state = loop_delta_rule(args, 0.3)
    assert rel_err(out, expected_out) < TOLERANCE and rel_err(state, expected_state) < TOLERANCE


@pytest.mark.parametrize("gate", GATES)
def test_weights_reproduce_the_outputs(gate):
    args = make_args(gate, 30, with_state=False, seed=13)

    @compiled
    def mixed_and_out(a):
        w = delta_rule_weights(a["q"], a["k"], a["beta"], a.get("log_g"))
        return w, jnp.einsum("bhts,bshd->bthd", w, a["v"]), run("naive", a)[0]

    w, mixed, out = mixed_and_out(args)
    assert rel_err(mixed, out) < TOLERANCE
    assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0


# ----------------------------------------------------------------------------- numerics and semantics


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("gate", ("head", "channel"))
def test_strong_decay_in_one_long_chunk_stays_exact(gate):
    """Hundreds of nats of decay inside one chunk: exp(b_i) exp(-b_j) would overflow."""
    args = make_args(gate, 48, with_state=True, seed=21)
    args["log_g"] = -jnp.exp(random_like(args["log_g"], seed=22) + 2.0)  # ~12 nats a step
    assert float(jnp.sum(args["log_g"], axis=1).max()) < -300
    cotangent = random_like(jax.eval_shape(lambda a: run("naive", a), args), seed=8)
    expected = outputs_and_grads("naive", args, cotangent)
    assert_trees_close(outputs_and_grads("chunk", args, cotangent, chunk_size=48), expected)
    assert_trees_close(outputs_and_grads("parallel", args, cotangent), expected)
    # The kernels take pair decays as differences of sums from the chunk's start, as GLA's kernels
    # do: rounding of ~1e-7 of the chunk's log decay (here ~570 nats), hence a looser bound.
    assert_trees_close(outputs_and_grads("pallas", args, cotangent, chunk_size=48), expected,
                       tol=PALLAS_STRONG_TOLERANCE)


@pytest.mark.parametrize("method", ("naive", "pallas") + FORMS)
def test_zero_beta_leaves_the_state_unchanged(method):
    args = make_args("none", 21, with_state=True, seed=31)
    args["beta"] = jnp.zeros_like(args["beta"])
    out, state = run_fast(method, args)
    np.testing.assert_allclose(state, args["state"], rtol=1e-6, atol=1e-6)
    read_out = jnp.einsum("bthd,bhde->bthe", args["q"], args["state"]) * DK**-0.5
    np.testing.assert_allclose(out, read_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ("naive", "pallas") + FORMS)
def test_full_beta_overwrites_the_stored_association(method):
    """beta = 1, unit key: afterwards the state recalls exactly v for that key, and nothing changes
    for directions orthogonal to it."""
    args = make_args("none", 1, with_state=True, seed=32)
    args["beta"] = jnp.ones_like(args["beta"])
    _, state = run_fast(method, args)
    key = args["k"][:, 0]  # (B, H, Dk), unit
    np.testing.assert_allclose(jnp.einsum("bhd,bhde->bhe", key, state), args["v"][:, 0], rtol=1e-5, atol=1e-5)
    other = random_like(key, seed=33)
    other = other - jnp.sum(other * key, -1, keepdims=True) * key  # orthogonal to the key
    recall = lambda s: jnp.einsum("bhd,bhde->bhe", other, s)  # noqa: E731
    np.testing.assert_allclose(recall(state), recall(args["state"]), rtol=1e-5, atol=1e-5)


def test_unknown_method_and_bad_shapes_fail_clearly():
    args = make_args("channel", 5, with_state=False)
    with pytest.raises(ValueError, match="naive, parallel, chunk, chunk_recompute, pallas"):
        run("fused", args)
    with pytest.raises(ValueError, match="beta"):
        delta_rule(args["q"], args["k"], args["v"], args["beta"][..., None])
    with pytest.raises(ValueError, match="log_g"):
        delta_rule(args["q"], args["k"], args["v"], args["beta"], args["log_g"][..., :3])


# ----------------------------------------------------------------------------- the Pallas kernels
# Interpret mode on a CPU. Chunk 16 is one sub-block of GLA's output kernels, chunk 32 two.

PALLAS_SETTINGS = [("none", ODD, True), ("head", ODD, True), ("channel", ODD, True), ("channel", ODD, False),
                   ("head", 1, False), ("channel", 1, True)]


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("gate, length, with_state", PALLAS_SETTINGS,
                         ids=[f"{g}-{n}-{'state' if s else 'no_state'}" for g, n, s in PALLAS_SETTINGS])
def test_pallas_matches_naive(gate, length, with_state):
    args, cotangent, expected = reference(gate, length, with_state)
    assert_trees_close(outputs_and_grads("pallas", args, cotangent), expected)


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("gate", ("head", "channel"))
def test_pallas_with_two_sub_blocks_per_chunk_matches_naive(gate):
    args, cotangent, expected = reference(gate, ODD, True)
    assert_trees_close(outputs_and_grads("pallas", args, cotangent, chunk_size=32), expected)


def test_pallas_two_halves_passing_the_state_equal_one_pass():
    args, _, (one_pass, _) = reference("channel", ODD, True)
    assert_trees_close(in_two_halves("pallas", args), one_pass)


def test_pallas_bfloat16_inputs_close_to_float32_reference():
    args, _, (expected, _) = reference("channel", ODD, True)
    out, state = run_fast("pallas", jax.tree.map(lambda x: x.astype(jnp.bfloat16), args))
    assert out.dtype == jnp.bfloat16 and state.dtype == jnp.float32
    assert_trees_close((out.astype(jnp.float32), state), expected, tol=BF16_TOLERANCE)


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("platform, options", [("tpu_interpret", {}), ("cpu", {"block": 8})],
                         ids=["tpu_interpreter", "two_value_blocks"])
def test_pallas_on_the_tpu_interpreter_and_in_value_blocks_matches_naive(platform, options):
    """Mosaic's execution model (grid order, memory spaces), and the state split into two programs
    of 8 value columns each."""
    args, cotangent, expected = reference("channel", ODD, True)

    @compiled
    def kernels(a):  # what delta_rule(method="pallas") does around them: scale q
        fn = lambda a: delta_rule_pallas(a["q"] * DK**-0.5, a["k"], a["v"], a["beta"], a["log_g"], a["state"],  # noqa: E731
                                         chunk_size=CHUNK, platform=platform, **options)
        out, vjp = jax.vjp(fn, a)
        return out, vjp(cotangent)[0]

    assert_trees_close(kernels(args), expected)


def pallas_shapes(gate_width):
    b, t, h, dk, dv = 2, 100, 2, 48, 80  # head dims padded to 64 and 128 for Triton
    struct = jax.ShapeDtypeStruct
    gates = None if gate_width is None else struct((b, t, h, gate_width), jnp.float32)
    return (struct((b, t, h, dk), jnp.float32), struct((b, t, h, dk), jnp.float32), struct((b, t, h, dv), jnp.float32),
            struct((b, t, h), jnp.float32), gates, struct((b, h, dk, dv), jnp.float32))


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("gate_width", [48, 1, None], ids=["per_channel", "per_head", "none"])
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_pallas_kernels_lower_for_accelerators(platform, gate_width):
    """Forward and backward lower to Triton / Mosaic here, without the device."""
    forward = lambda *a: delta_rule_pallas(*a, chunk_size=64, platform=platform)  # noqa: E731
    inputs = (0, 1, 2, 3, 5) if gate_width is None else (0, 1, 2, 3, 4, 5)  # every input that is an array
    backward = jax.grad(lambda *a: sum(jnp.sum(x) for x in forward(*a)), argnums=inputs)
    target = {"gpu": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}[platform]
    for fn, kernels in ((forward, ("delta_states", "gla_outputs")),
                        (backward, ("delta_state_grads", "gla_key_grads", "gla_value_grads"))):
        text = lower_for(platform, fn, *pallas_shapes(gate_width))
        assert target in text and all(f'name = "{kernel}"' in text for kernel in kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("gate", GATES)
def test_pallas_compiled_on_gpu_matches_naive(gate):
    args, cotangent, expected = reference(gate, ODD, True)
    assert_trees_close(outputs_and_grads("pallas", args, cotangent), expected, tol=1e-4)


# ----------------------------------------------------------------------------- grouped value heads


def grouped_args(length, seed=41):
    """Two value heads per key head (HV = 2H): v, beta, per-channel gates and state per value head."""
    args = make_args("channel", length, with_state=True, seed=seed)
    wide = make_args("channel", length, with_state=True, seed=seed + 1)
    return {**args, **{n: jnp.concatenate([args[n], wide[n]], axis=2 if n != "state" else 1)
                       for n in ("v", "beta", "log_g", "state")}}


def test_grouped_value_heads_naive_matches_the_recurrence_in_float64():
    """Value head hv uses key head hv // (HV / H) (repeat-interleave), never hv % H."""
    args = grouped_args(12)
    out, state = compiled(lambda a: run("naive", a))(args)
    wide = {n: (jnp.repeat(x, 2, axis=2) if n in ("q", "k") else x) for n, x in args.items()}
    expected_out, expected_state = loop_delta_rule(wide, DK**-0.5)
    assert rel_err(out, expected_out) < TOLERANCE and rel_err(state, expected_state) < TOLERANCE


def test_grouped_value_heads_every_form_matches_naive():
    """Values, final state and gradients (summed over a key head's value heads) for the chunk form;
    values and state for the parallel form. Every form, the Pallas kernels too, runs on the keys
    repeated to the value heads before it starts (``value_heads``), so the grouping is one path."""
    args = grouped_args(ODD)
    cotangent = random_like(jax.eval_shape(lambda a: run("naive", a), args), seed=7)
    expected = outputs_and_grads("naive", args, cotangent)
    assert_trees_close(outputs_and_grads("chunk", args, cotangent), expected)
    assert_trees_close(run_fast("parallel", args), expected[0])
