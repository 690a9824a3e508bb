"""The Pallas selective scan (Mamba-1) against the reference ``method="naive"`` (interpret mode on a CPU).

Outputs, final states and the gradients of every float input (u, Δ, A, B, C, D, z, Δ's bias and
the initial state; random cotangents on both outputs) must agree to 1e-5 norm-relative error, at
odd lengths (the last chunk padded), with channels and N that are not powers of two (padded in
the wrapper), shared and grouped B/C, and several channel blocks per group (the backward adds
the blocks' partial dB, dC). Lowering to Triton (GPU) and Mosaic (TPU) is checked by exporting
without the device; the comparison runs compiled when a GPU is present.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from op_checks import BF16_TOL, F32_TOL, assert_forms_agree, normal, rel_err, selective_fn, uniform, values_and_grads

from conftest import tiny_config
from lmzoo.model import LM
from lmzoo.ops import selective_scan
from lmzoo.ops.pallas.common import lower_for
from lmzoo.ops.pallas.selective_scan import selective_scan_pallas
from lmzoo.ops.selective_scan import _naive as reference_recurrence

BATCH, CHUNK = 2, 8


def inputs(length, channels, state, *, groups=2, softplus=True, seed=0):
    """Every float input of ``selective_scan``; ``groups=None``: B and C shared ``[B,T,N]``."""
    rng = np.random.default_rng(seed)
    bc_shape = (BATCH, length, state) if groups is None else (BATCH, length, groups, state)
    seq = (BATCH, length, channels)
    return {
        "u": normal(rng, seq),
        "delta": normal(rng, seq, 0.5, -1.0) if softplus else uniform(rng, seq, 0.02, 0.4),
        "A": -jnp.asarray(np.exp(0.5 * rng.standard_normal((channels, state))), jnp.float32),
        "B": normal(rng, bc_shape),
        "C": normal(rng, bc_shape),
        "D": normal(rng, (channels,)),
        "z": normal(rng, seq),
        "delta_bias": normal(rng, (channels,), 0.1),
        "initial_state": normal(rng, (BATCH, channels, state)),
    }


# (length, channels D, state N, groups, softplus): D = 24 pads each group's channels to a power of
# two, N = 5 pads the state, T = 1 is one padded chunk, 37 and 83 end in a partial chunk.
CASES = [(1, 16, 8, 2, True), (37, 24, 5, None, True), (83, 24, 4, 2, True), (37, 16, 8, 1, False)]


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("length, channels, state, groups, softplus", CASES)
def test_pallas_matches_naive_values_and_gradients(length, channels, state, groups, softplus):
    args = inputs(length, channels, state, groups=groups, softplus=softplus)
    names = list(args)
    fast = selective_fn(names, softplus=softplus, method="pallas", chunk_size=CHUNK)
    assert_forms_agree(fast, selective_fn(names, softplus=softplus, method="naive"), list(args.values()), names)


def test_several_channel_blocks_per_group():
    """Blocks of 4 channels: three per group of 12, so dB and dC add partial sums over blocks."""
    args = inputs(29, 24, 8, groups=2)
    prepared = (args["u"], jax.nn.softplus(args["delta"]), args["A"], args["B"], args["C"], args["initial_state"])
    names = ["u", "delta", "A", "B", "C", "h0"]
    fast = lambda *a: selective_scan_pallas(*a, chunk_size=CHUNK, block_channels=4)
    assert_forms_agree(fast, reference_recurrence, prepared, names)


def test_tpu_interpreter_matches_naive():
    """The kernels under Pallas' TPU interpreter (the TPU's grid order and memory spaces) on this CPU."""
    args = inputs(29, 24, 5, groups=2)
    prepared = (args["u"], jax.nn.softplus(args["delta"]), args["A"], args["B"], args["C"], args["initial_state"])
    fast = lambda *a: selective_scan_pallas(*a, chunk_size=CHUNK, platform="tpu_interpret")
    assert_forms_agree(fast, reference_recurrence, prepared, ["u", "delta", "A", "B", "C", "h0"])


def test_tpu_interpreter_with_document_starts_matches_naive():
    """The keep factors' block (one row per sequence) under the TPU interpreter: starts inside a chunk and on its
    edge."""
    args = inputs(29, 24, 5, groups=2)
    prepared = (args["u"], jax.nn.softplus(args["delta"]), args["A"], args["B"], args["C"], args["initial_state"])
    starts = jnp.zeros((BATCH, 29), bool).at[0, 11].set(True).at[1, 16].set(True)
    fast = lambda *a: selective_scan_pallas(*a, starts=starts, chunk_size=CHUNK, platform="tpu_interpret")
    reference = lambda *a: reference_recurrence(*a, keep=1.0 - starts.astype(jnp.float32))
    assert_forms_agree(fast, reference, prepared, ["u", "delta", "A", "B", "C", "h0"])


def test_bfloat16_inputs_close_to_float32_reference():
    args = inputs(37, 16, 8, groups=2)
    y_ref, h_ref = selective_scan(**args, delta_softplus=True, method="naive")
    low = {k: v.astype(jnp.bfloat16) for k, v in args.items()}
    y, h = jax.jit(lambda a: selective_scan(**a, delta_softplus=True, method="pallas", chunk_size=CHUNK))(low)
    assert y.dtype == jnp.bfloat16 and h.dtype == jnp.float32  # the state accumulates in float32
    assert rel_err(y.astype(jnp.float32), y_ref) <= BF16_TOL
    assert rel_err(h, h_ref) <= BF16_TOL


def test_chained_halves_equal_one_pass():
    args = inputs(37, 16, 8, groups=2)
    h0, A = args.pop("initial_state"), args.pop("A")

    @jax.jit
    def run(a, h):
        return selective_scan(**a, A=A, initial_state=h, delta_softplus=True, method="pallas", chunk_size=CHUNK)

    def steps(part):  # the per-step inputs' slice of time; D and delta_bias stay whole
        return {k: v[:, part] if v.ndim >= 3 else v for k, v in args.items()}

    whole_y, whole_h = run(args, h0)
    first, second = steps(slice(0, 20)), steps(slice(20, None))
    y1, h1 = run(first, h0)
    y2, h2 = run(second, h1)
    assert rel_err(jnp.concatenate([y1, y2], axis=1), whole_y) <= F32_TOL
    assert rel_err(h2, whole_h) <= F32_TOL


def test_block_channels_must_be_a_power_of_two():
    a = inputs(3, 16, 8)
    with pytest.raises(ValueError, match="power of two"):
        selective_scan_pallas(a["u"], a["delta"], a["A"], a["B"], a["C"], a["initial_state"], block_channels=24)


# ----------------------------------------------------------------------------- lowering and devices


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_kernels_lower_for_accelerators(platform, documents):
    """Forward and backward lower to Triton / Mosaic here, without the device (D = 24, N = 5: padded),
    also with document starts (the keep factors' extra input)."""
    b, t, d, g, n = 2, 100, 24, 2, 5
    struct = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    shapes = (struct(b, t, d), struct(b, t, d), struct(d, n), struct(b, t, g, n), struct(b, t, g, n), struct(b, d, n))
    starts = jnp.zeros((b, t), bool).at[:, 37].set(True) if documents else None
    forward = lambda *a: selective_scan_pallas(*a, starts=starts, chunk_size=16, platform=platform)
    backward = jax.grad(lambda *a: sum(jnp.sum(x * x) for x in forward(*a)), argnums=tuple(range(6)))
    assert "selective_scan_forward" in lower_for(platform, forward, *shapes)
    assert "selective_scan_backward" in lower_for(platform, backward, *shapes)


@pytest.mark.gpu
@pytest.mark.parametrize("length, channels, state, groups, softplus", CASES[1:3])
def test_compiled_on_gpu_matches_naive(length, channels, state, groups, softplus):
    args = inputs(length, channels, state, groups=groups, softplus=softplus)
    names, values = list(args), list(args.values())
    fast = selective_fn(names, softplus=softplus, method="pallas", chunk_size=CHUNK)
    (y, h), grads = values_and_grads(fast, values)
    (y_ref, h_ref), grads_ref = values_and_grads(selective_fn(names, softplus=softplus, method="naive"), values)
    for name, a, b in [("y", y, y_ref), ("state", h, h_ref), *zip(names, grads, grads_ref)]:
        assert rel_err(a, b) <= 1e-4, name  # the GPU's exp is not bit-identical to XLA's


@pytest.mark.gpu
def test_compiled_on_gpu_with_documents_matches_naive():
    args = inputs(37, 24, 5, groups=2)
    segment_ids = jnp.asarray(np.repeat([[0, 1, 2]], BATCH, axis=0).repeat([10, 6, 21], axis=1))  # starts at 10, 16

    def form(method):
        return lambda *a: selective_scan(**dict(zip(args, a)), delta_softplus=True, method=method, chunk_size=CHUNK,
                                         segment_ids=segment_ids)

    (y, h), grads = values_and_grads(form("pallas"), list(args.values()))
    (y_ref, h_ref), grads_ref = values_and_grads(form("naive"), list(args.values()))
    for name, a, b in [("y", y, y_ref), ("state", h, h_ref), *zip(args, grads, grads_ref)]:
        assert rel_err(a, b) <= 1e-4, name


# ----------------------------------------------------------------------------- in the model


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
def test_mamba_training_loss_and_gradients_match_scan():
    """``+attn=mamba attn.method=pallas``: one training step's objective and gradients equal method=scan's."""
    from lmzoo.run.steps import init_train_state, loss_and_extra

    tokens = jax.random.randint(jax.random.key(1), (2, 21), 0, 259)
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    objective_and_grads = jax.jit(jax.value_and_grad(loss_and_extra, has_aux=True), static_argnums=2)
    results = {}
    for method in ("pallas", "scan"):
        cfg = tiny_config("mamba", f"attn.method={method}", "attn.chunk_size=8")
        graphdef, state, _ = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))
        (objective, _), grads = objective_and_grads(state["params"], state["extra"], graphdef, batch)
        results[method] = objective, grads
    (objective, grads), (objective_ref, grads_ref) = results["pallas"], results["scan"]
    assert float(objective) == pytest.approx(float(objective_ref), rel=1e-6)
    for (path, g), (_, g_ref) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(grads_ref)):
        assert rel_err(g[...], g_ref[...]) <= F32_TOL, path
