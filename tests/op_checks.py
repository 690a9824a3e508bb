"""Helpers shared by the op tests: error measures, random inputs, and forms run against their reference.

Every form of an op is compared with its ``"naive"`` form (the recurrence written out step by step)
on outputs, final states and the gradients of every input, through ``jax.vjp`` with random
cotangents for both the output and the final state.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lmzoo import ops


def rel_err(a, b) -> float:
    """``||a - b|| / ||b||``, absolute where the reference is exactly zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (scale if scale > 0 else 1.0))


def compiled(fn, **jit_kwargs):
    """jit with XLA's backend optimisation off: it changes compile time, not results, and compiling
    dominates these tests on a CPU."""
    return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0}, **jit_kwargs)


def random_like(tree, seed: int):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), tree)


def packed_segment_ids(docs: tuple, length: int) -> jax.Array:
    """Segment ids ``[2, length]``: row 0 packs documents of the lengths ``docs``, row 1 is one document."""
    row = np.concatenate([np.full(n, i) for i, n in enumerate(docs)])
    return jnp.asarray(np.stack([row, np.zeros(length, int)]), jnp.int32)


def forms_against_naive(run, inputs):
    """``(pull_back, reference)`` for an op run as ``run(method, args, segment_ids=None)`` on ``inputs() -> (args,
    segment ids)``. ``pull_back(method, args, cotangent, ids)``: a form's outputs and the pull-back of ``cotangent``,
    compiled once a form. ``reference()``, made once: (args, ids, a random cotangent, the naive form's pull-back),
    what every fast form is held to."""
    @functools.partial(compiled, static_argnums=(0,))
    def pull_back(method, args, cotangent, segment_ids):
        out, vjp = jax.vjp(lambda a: run(method, a, segment_ids), args)
        return out, vjp(cotangent)[0]

    @functools.lru_cache(maxsize=None)
    def reference():
        args, ids = inputs()
        cotangent = random_like(jax.eval_shape(lambda a: run("naive", a), args), seed=7)
        return args, ids, cotangent, pull_back("naive", args, cotangent, ids)

    return pull_back, reference



def decoded_from_a_split(run, step, args: dict, streams: tuple, split: int, chunk: int):
    """``(chunk form over all, its final state)`` and ``(steps from split on, state after them)``: the chunk form run
    on the first ``split`` positions of the per-token ``streams``, its state stepped on token by token by
    ``step(*per-token inputs, weight, bias, state, ends_mini_batch)``, the way decoding continues a prompt."""
    whole, final = compiled(lambda a: run("chunk", a))(args)
    _, state = compiled(lambda a: run("chunk", {**a, **{n: a[n][:, :split] for n in streams}}))(args)

    @compiled
    def stepped(a, state):
        def one(state, t):
            o, state = step(*(a[n][:, t] for n in streams), a["weight"], a["bias"], state, t % chunk == chunk - 1)
            return state, o
        state, outs = jax.lax.scan(one, state, jnp.arange(split, a[streams[0]].shape[1]))
        return outs.swapaxes(0, 1), state

    return (whole[:, split:], final), stepped(args, state)

# ----------------------------------------------------------------------------- linear attention and GLA

CASES = ("linear", "linear_normalized", "gla", "gla_scalar")
B, H, DK, DV = 2, 2, 8, 16
CHUNK = 16
TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-2  # rounding q, k, v, gates to bf16 (8 mantissa bits) alone moves o and S by ~3e-3
VANISHING = 1e-4  # gradient norms below this are identically zero in exact arithmetic


def assert_trees_close(actual, expected, tol=TOLERANCE):
    """Leaf by leaf (outputs, states, gradients): finite, and within ``tol`` norm-relative error."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
        name = jax.tree_util.keystr(path)
        assert np.all(np.isfinite(np.asarray(a, np.float32))), name
        if np.linalg.norm(np.asarray(b, np.float64)) < VANISHING:
            assert np.linalg.norm(np.asarray(a, np.float64)) < VANISHING, name
            continue
        assert rel_err(a, b) <= tol, f"{name}: relative error {rel_err(a, b):.2e} > {tol}"


def make_args(case: str, length: int, *, with_state: bool, seed: int = 0) -> dict:
    """Random inputs for ``case``; normalised linear attention gets positive features and key sums."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    args = {"q": normal(B, length, H, DK), "k": normal(B, length, H, DK), "v": normal(B, length, H, DV)}
    if case == "linear_normalized":  # elu(x) + 1 features
        args["q"], args["k"] = (np.where(x > 0, x + 1, np.exp(x)) for x in (args["q"], args["k"]))
    if case.startswith("gla"):
        gates = normal(B, length, H, DK) if case == "gla" else normal(B, length, H)
        args["log_g"] = -np.log1p(np.exp(-(gates + 2.0)))  # log sigmoid: gates ~0.5 .. 1
    if with_state:
        args["state"] = normal(B, H, DK, DV)
        if case == "linear_normalized":  # a key sum from positive features is positive
            args["state"] = (args["state"], np.abs(normal(B, H, DK)) + 1.0)
    return jax.tree.map(jnp.asarray, args)


def run(case: str, method: str, args: dict, chunk_size: int = CHUNK):
    q, k, v, state = args["q"], args["k"], args["v"], args.get("state")
    if case.startswith("gla"):
        return ops.gla(q, k, v, args["log_g"], initial_state=state, method=method, chunk_size=chunk_size)
    normalize = case == "linear_normalized"
    return ops.linear_attention(q, k, v, normalize=normalize, initial_state=state, method=method, chunk_size=chunk_size)


run_fast = compiled(run, static_argnums=(0, 1, 3))


@functools.partial(compiled, static_argnums=(0, 1), static_argnames=("chunk_size",))
def outputs_and_grads(case, method, args, cotangent, chunk_size=CHUNK):
    """(o, final state) and the gradients of <(o, S), cotangent> w.r.t. every input."""
    out, vjp = jax.vjp(lambda a: run(case, method, a, chunk_size), args)
    return out, vjp(cotangent)[0]


@functools.lru_cache(maxsize=None)
def reference(case, length, with_state):
    """Inputs, a random cotangent, and outputs_and_grads of the "naive" form, shared by the forms.

    Without a state, the reference runs from a zero state (one compiled program serves both) and
    its gradient w.r.t. that state is dropped.
    """
    args = make_args(case, length, with_state=with_state)
    zero_state = jax.tree.map(jnp.zeros_like, make_args(case, length, with_state=True)["state"])
    full = args if with_state else {**args, "state": zero_state}
    cotangent = random_like(jax.eval_shape(lambda a: run(case, "naive", a), full), seed=7)
    out, grads = outputs_and_grads(case, "naive", full, cotangent)
    return args, cotangent, (out, {name: grads[name] for name in args})


@functools.partial(compiled, static_argnums=(0, 1))
def in_two_halves(case, method, args):
    """The first 29 steps, then the rest from the state they leave: (o, final state)."""
    first = {name: (x if name == "state" else x[:, :29]) for name, x in args.items()}
    out_a, state_a = run(case, method, first)
    second = {name: x[:, 29:] for name, x in args.items() if name != "state"}
    out_b, state_b = run(case, method, {**second, "state": state_a})
    return jnp.concatenate([out_a, out_b], axis=1), state_b


def strong_gates(length: int):
    """GLA inputs whose gates decay by ~7 nats a step, and a random cotangent for (o, S)."""
    args = make_args("gla", length, with_state=True, seed=21)
    args["log_g"] = -jnp.exp(random_like(args["log_g"], seed=22) + 1.5)
    cotangent = random_like(jax.eval_shape(lambda a: run("gla", "naive", a), args), seed=8)
    return args, cotangent


# ----------------------------------------------------------------------------- the delta rule


def delta_args(gate: str, length: int, *, with_state: bool, seed: int = 0) -> dict:
    """Random delta-rule inputs: unit keys, beta in (0, 1), gates (none, per head or per channel) ~0.5 .. 1."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    k = normal(B, length, H, DK)
    args = {
        "q": normal(B, length, H, DK),
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": normal(B, length, H, DV),
        "beta": 1 / (1 + np.exp(-normal(B, length, H))),
    }
    if gate != "none":
        logits = normal(B, length, H, *((DK,) if gate == "channel" else ()))
        args["log_g"] = -np.log1p(np.exp(-(logits + 2.0)))  # log sigmoid: gates ~0.5 .. 1
    if with_state:
        args["state"] = normal(B, H, DK, DV)
    return jax.tree.map(jnp.asarray, args)



# ----------------------------------------------------------------------------- state-space ops

F32_TOL = 1e-5
BF16_TOL = 2e-2  # norm-relative, bf16 inputs (8-bit mantissa, ~4e-3 per element) against the fp32 reference


# Inputs come from NumPy: eager jax.random calls would compile a program for every new shape.
def normal(rng, shape, scale=1.0, shift=0.0):
    return jnp.asarray(shift + scale * rng.standard_normal(shape), jnp.float32)


def uniform(rng, shape, low, high):
    return jnp.asarray(rng.uniform(low, high, shape), jnp.float32)


def values_and_grads(fn, args, seed=7):
    """fn(*args) -> (y, state), and the gradients of <y, gy> + <state, gs> for random gy, gs."""
    rng = np.random.default_rng(seed)
    cotangent = tuple(jnp.asarray(rng.standard_normal(o.shape), o.dtype) for o in jax.eval_shape(fn, *args))

    def pull_back(*a):
        out, pullback = jax.vjp(fn, *a)
        return out, pullback(cotangent)

    return jax.jit(pull_back)(*args)


def assert_forms_agree(fast, reference, args, names, expected=None):
    """``expected``: the reference's (values, grads) when already computed."""
    (y, h), grads = values_and_grads(fast, args)
    (y_ref, h_ref), grads_ref = expected or values_and_grads(reference, args)
    assert rel_err(y, y_ref) <= F32_TOL, "output"
    assert rel_err(h, h_ref) <= F32_TOL, "final state"
    for name, g, g_ref in zip(names, grads, grads_ref):
        assert rel_err(g, g_ref) <= F32_TOL, f"gradient w.r.t. {name}: {rel_err(g, g_ref):.2e}"


def selective_fn(names, *, softplus, method, chunk_size=16):
    """``selective_scan`` as a function of the arrays named ``names``, in that order."""

    def fn(*arrays):
        kw = dict(zip(names, arrays))
        u, delta, A, B, C = (kw.pop(n) for n in ("u", "delta", "A", "B", "C"))
        return ops.selective_scan(
            u, delta, A, B, C, delta_softplus=softplus, method=method, chunk_size=chunk_size, **kw
        )

    return fn
