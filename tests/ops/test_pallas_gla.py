"""The Pallas kernels of the GLA family (and every kernel family in training) against the reference forms
(interpret mode on a CPU).

``method="pallas"`` must give the "naive" reference's outputs, final states and gradients
(random cotangents on both) to 1e-5 norm-relative error, at odd lengths, with and without an
initial state, for per-dimension and per-head gates and for plain and normalised linear
attention. Chunk 16 is one sub-block, chunk 32 two, so both the in-block and the cross-block
paths run. Lowering to Triton (GPU) and Mosaic (TPU) is checked by exporting without the device;
the same comparisons run compiled when a GPU is present.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import (
    BF16_TOLERANCE,
    assert_trees_close,
    in_two_halves,
    make_args,
    outputs_and_grads,
    reference,
    run_fast,
    strong_gates,
)

from conftest import tiny_config
from lmzoo import ops
from lmzoo.ops.pallas.common import lower_for
from lmzoo.ops.pallas.gla import gla_pallas
from lmzoo.run.loop import train

SETTINGS = [
    ("gla", 1, True), ("gla", 63, True), ("gla", 257, False),
    ("gla_scalar", 63, True), ("linear", 63, True), ("linear_normalized", 37, False), ("linear_normalized", 63, True),
]


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("case, length, with_state", SETTINGS, ids=[f"{c}-{n}-{s}" for c, n, s in SETTINGS])
def test_pallas_matches_naive(case, length, with_state):
    args, cotangent, expected = reference(case, length, with_state)
    assert_trees_close(outputs_and_grads(case, "pallas", args, cotangent), expected)


def test_two_sub_blocks_per_chunk_match_naive():
    args, cotangent, expected = reference("gla", 63, True)
    assert_trees_close(outputs_and_grads("gla", "pallas", args, cotangent, chunk_size=32), expected)


def test_two_halves_passing_the_state_equal_one_pass():
    args, _, (one_pass, _) = reference("gla", 63, True)
    assert_trees_close(in_two_halves("gla", "pallas", args), one_pass)


@pytest.mark.parametrize("case", ["gla", "linear_normalized"])
def test_bfloat16_inputs_close_to_float32_reference(case):
    args, _, (expected, _) = reference(case, 63, True)
    low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), args)
    out, state = run_fast(case, "pallas", low)
    assert out.dtype == jnp.bfloat16
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(state))
    assert_trees_close((out.astype(jnp.float32), state), expected, tol=BF16_TOLERANCE)


def test_strong_gates_stay_exact():
    """~220 nats of decay inside one 32-step chunk: no exponent the kernels take is positive."""
    args, cotangent = strong_gates(45)
    kernels = outputs_and_grads("gla", "pallas", args, cotangent, chunk_size=32)
    assert_trees_close(kernels, outputs_and_grads("gla", "naive", args, cotangent))


@pytest.mark.slow  # a Pallas kernel in interpret mode: minutes on a CPU
@pytest.mark.parametrize("case", ["gla", "gla_scalar"])
def test_tpu_interpreter_matches_naive(case):
    """The kernels under Pallas' TPU interpreter (the TPU's grid order and memory spaces) on this CPU."""
    args, cotangent, expected = reference(case, 37, True)

    def kernels(a):  # what gla(method="pallas") does around them: scale q, give per-head gates a width
        log_g = a["log_g"] if case == "gla" else a["log_g"][..., None]
        q = a["q"] * a["q"].shape[-1] ** -0.5
        return gla_pallas(q, a["k"], a["v"], log_g, a["state"], chunk_size=32, platform="tpu_interpret")

    out, pullback = jax.vjp(kernels, args)
    assert_trees_close((out, pullback(cotangent)[0]), expected)


@pytest.mark.parametrize("case", ["gla", "gla_scalar"])
def test_state_blocks_split_across_programs_match_naive(case):
    """block=16 with head dims 40 and 48 (padded to 64): every kernel splits the state over four
    programs per key or value block, as on a GPU, where blocks are 64 wide and D is 128."""
    rng = np.random.default_rng(3)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    b, t, h, dk, dv = 1, 37, 2, 40, 48
    args = {"q": normal(b, t, h, dk), "k": normal(b, t, h, dk), "v": normal(b, t, h, dv), "state": normal(b, h, dk, dv),
            "log_g": jax.nn.log_sigmoid(normal(b, t, h, dk if case == "gla" else 1) + 2.0)}
    cotangent = (normal(b, t, h, dv), normal(b, h, dk, dv))

    def kernels(a):
        return gla_pallas(a["q"] * dk**-0.5, a["k"], a["v"], a["log_g"], a["state"], chunk_size=32, block=16)

    def naive(a):
        log_g = a["log_g"] if case == "gla" else a["log_g"][..., 0]
        return ops.gla(a["q"], a["k"], a["v"], log_g, initial_state=a["state"], method="naive")

    results = []
    for fn in (kernels, naive):
        out, pullback = jax.vjp(fn, args)
        results.append((out, pullback(cotangent)[0]))
    assert_trees_close(*results)


def test_chunk_must_split_into_sub_blocks():
    args = make_args("gla", 5, with_state=True)
    with pytest.raises(ValueError, match="multiple of sub_size"):
        gla_pallas(args["q"], args["k"], args["v"], args["log_g"], args["state"], chunk_size=24, sub_size=16)


# ----------------------------------------------------------------------------- lowering and devices


def shapes(dtype, gate_width=48):
    b, t, h, dk, dv = 2, 100, 2, 48, 80  # head dims padded to 64 and 128 for Triton
    struct = jax.ShapeDtypeStruct
    return (struct((b, t, h, dk), dtype), struct((b, t, h, dk), dtype), struct((b, t, h, dv), dtype),
            struct((b, t, h, gate_width), jnp.float32), struct((b, h, dk, dv), jnp.float32))


@pytest.mark.parametrize("gate_width", [48, 1], ids=["per_dimension", "per_head"])
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_kernels_lower_for_accelerators(platform, gate_width):
    """Forward and backward lower to Triton / Mosaic here, without the device."""
    forward = lambda *a: gla_pallas(*a, chunk_size=64, platform=platform)
    loss = lambda *a: sum(jnp.sum(x) for x in forward(*a))
    backward = jax.grad(loss, argnums=(0, 1, 2, 3, 4))
    target = {"gpu": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}[platform]
    for fn, kernels in ((forward, ("gla_states", "gla_outputs")),
                        (backward, ("gla_state_grads", "gla_key_grads", "gla_value_grads"))):
        text = lower_for(platform, fn, *shapes(jnp.bfloat16, gate_width))
        assert target in text and all(f'name = "{kernel}"' in text for kernel in kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("case, length, with_state", SETTINGS[:4], ids=[f"{c}-{n}-{s}" for c, n, s in SETTINGS[:4]])
def test_compiled_on_gpu_matches_naive(case, length, with_state):
    args, cotangent, expected = reference(case, length, with_state)
    assert_trees_close(outputs_and_grads(case, "pallas", args, cotangent), expected, tol=1e-4)


# ----------------------------------------------------------------------------- in the model


def losses(tmp_path, variant, method):  # one layer: its kernel's gradients reach every parameter below the head
    cfg = tiny_config(variant, "model.n_layers=1", f"attn.method={method}", "attn.chunk_size=16", "train.steps=4",
                      "train.log_every=1", "train.eval_every=4", "train.probe_batch=0", run_dir=tmp_path / method)
    train(cfg)
    rows = [json.loads(line) for line in (tmp_path / method / "metrics.jsonl").read_text().splitlines()]
    return np.array([row[key] for row in rows for key in ("loss", "val_loss") if key in row])


# mamba2's kernel is the GLA kernel (ssd maps onto gla), so these cover every kernel family in a model
@pytest.mark.slow
@pytest.mark.parametrize("variant, reference_method",
                         [("gla", "chunk"), ("mamba", "scan"), ("gated_deltanet", "chunk")])
def test_trains_with_the_reference_loss_curve(tmp_path, variant, reference_method):
    """Four optimiser steps and a validation: the kernels' gradients drive the same training."""
    kernels, reference_losses = losses(tmp_path, variant, "pallas"), losses(tmp_path, variant, reference_method)
    assert len(kernels) == 5
    np.testing.assert_allclose(kernels, reference_losses, rtol=1e-5)
