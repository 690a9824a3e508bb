"""deltanet-tpu as ``auto``'s provider on a TPU (``lmzoo.ops.kernels``): which call it gets, and that every op mapped
onto it computes the op's reference form.

Selection is checked with the backend mocked (``jax.default_backend``) and a stand-in for the kernel, by tracing
alone, so it runs on every Python. Equality needs deltanet-tpu (Python >= 3.12, CI's second leg): off a TPU its
Pallas TPU kernels run in interpret mode on the CPU, at their own block shapes (K = V = 128, chunk 128) over
T = 300 (two whole chunks and a partial one), two documents (the second starting inside the second chunk) and a
random initial state, on outputs, final states and the gradients of every input under random cotangents.
Interpret mode compiles each kernel in seconds of XLA time but runs it in under one, so each test runs every op
through one compiled kernel (one jitted call serves every kind) and names the op in any failure.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, random_like

from lmzoo import ops
from lmzoo.ops import kernels

B, T, H, D = 1, 300, 1, kernels.TPU_WIDTH
SPLIT = 200  # the second document starts here, inside the second chunk
F32_TOLERANCE = 1e-4  # the kernels' float32 matmuls at full precision against lmzoo's float32 reference
BF16_TOLERANCE = 3e-2  # bf16 q, k, v (8 mantissa bits) in the kernels' bf16 matmuls against float32 on the same inputs


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _inputs(case: str, seed: int = 0, d: int = D) -> dict:
    """Random inputs of ``case`` (gates in their ranges: log decays ~ -0.05 .. -1, beta and gates in (0, 1))."""
    rng = np.random.default_rng(seed)
    n = lambda *shape: _normal(rng, *shape)  # noqa: E731
    log_g = lambda *shape: -np.log1p(np.exp(-(n(*shape) + 3.0)))  # noqa: E731
    state = n(B, H, d, d)
    if case == "ssd":  # Mamba-2 with P = N = 128
        return {"x": n(B, T, H, d), "dt": np.log1p(np.exp(n(B, T, H) - 2.0)), "A": -np.exp(n(H) * 0.5),
                "B": n(B, T, H, d) * 0.3, "C": n(B, T, H, d) * 0.3, "D": n(H), "state": state}
    if case == "delta_product":  # two sub-steps per token: the delta rule over T sub-steps
        return {"q": n(B, T // 2, H, d), "k": _unit(n(B, T // 2, H, 2, d)), "v": n(B, T // 2, H, 2, d),
                "beta": _sigmoid(n(B, T // 2, H, 2)), "log_g": log_g(B, T // 2, H), "state": state}
    args = {"q": n(B, T, H, d), "k": _unit(n(B, T, H, d)), "v": n(B, T, H, d), "state": state}
    if case.startswith("delta") or case == "gdn2":
        args["beta"] = _sigmoid(n(B, T, H))
    if case in ("gla_channel", "delta_channel", "gdn2"):
        args["log_g"] = log_g(B, T, H, d)
    if case in ("gla_head", "delta_head"):
        args["log_g"] = log_g(B, T, H)
    if case == "gdn2":
        args["erase"], args["write"] = _sigmoid(n(B, T, H, d)), _sigmoid(n(B, T, H, d))
        del args["beta"]
    return args


def _segments(length: int = T, split: int = SPLIT):
    return jnp.asarray(np.repeat([[0] * split + [1] * (length - split)], B, axis=0), jnp.int32)


def _call(case: str, method: str, args: dict, segment_ids):
    """The op of ``case`` in ``method``: (o, final state)."""
    state, chunk = args["state"], 64
    if case == "ssd":
        return ops.ssd(args["x"], args["dt"], args["A"], args["B"], args["C"], D=args["D"], initial_state=state,
                       method=method, chunk_size=chunk, segment_ids=segment_ids)
    if case == "gdn2":
        return ops.gdn2(args["q"], args["k"], args["v"], args["log_g"], args["erase"], args["write"],
                        initial_state=state, method=method, chunk_size=chunk, segment_ids=segment_ids)
    if case == "delta_product":
        ids = None if segment_ids is None else segment_ids[:, ::2]  # per token: the sub-steps repeat them
        return ops.delta_product(args["q"], args["k"], args["v"], args["beta"], args["log_g"], initial_state=state,
                                 method=method, chunk_size=chunk, segment_ids=ids)
    if case.startswith("delta"):
        return ops.delta_rule(args["q"], args["k"], args["v"], args["beta"], args.get("log_g"), initial_state=state,
                              method=method, chunk_size=chunk, segment_ids=segment_ids)
    if case == "linear":
        return ops.linear_attention(args["q"], args["k"], args["v"], initial_state=state, method=method,
                                    chunk_size=chunk, segment_ids=segment_ids)
    return ops.gla(args["q"], args["k"], args["v"], args.get("log_g"), initial_state=state, method=method,
                   chunk_size=chunk, segment_ids=segment_ids)


# case -> the kind of its mapping (each a case of GDN-2), and the op recording the choice
KINDS = {"gla_channel": "gla", "gla_head": "simple_gla", "gla_none": "simple_gla", "linear": "simple_gla",
         "ssd": "simple_gla", "delta_none": "deltanet", "delta_head": "gated_deltanet", "delta_channel": "kda",
         "delta_product": "gated_deltanet", "gdn2": "gdn2"}
OPS = {"ssd": "ssd", "gdn2": "gdn2", "delta_product": "delta_rule", "delta_none": "delta_rule",
       "delta_head": "delta_rule", "delta_channel": "delta_rule"}


def _op(case: str) -> str:
    return OPS.get(case, "gla")


# ----------------------------------------------------------------------------- which call deltanet-tpu gets


def _stand_in(q, k, v, g, b, w, *, initial_state, **options):
    """deltanet-tpu's ``chunk_gdn2`` as far as tracing sees it: (o, final state) of the right shapes."""
    return jnp.zeros(v.shape, v.dtype), jnp.zeros((*v.shape[:1], v.shape[2], k.shape[-1], v.shape[-1]), jnp.float32)


@pytest.fixture
def backend(monkeypatch):
    """Sets the backend ``auto`` sees (``"tpu"``, ``"gpu"``, ...) with deltanet-tpu stood in for; tracing only."""
    monkeypatch.setattr(kernels, "tpu_kernel", lambda: _stand_in)

    def set_to(platform: str):
        monkeypatch.setattr(jax, "default_backend", lambda: platform)
    return set_to


def _choices(case: str, args: dict, method: str = "auto") -> list:
    args = jax.tree.map(jnp.asarray, args)
    return kernels.traced_choices(lambda a: _call(case, method, a, _segments()), args)


@pytest.mark.parametrize("case", sorted(KINDS))
def test_auto_on_a_tpu_picks_deltanet_tpu(backend, case):
    backend("tpu")
    assert _choices(case, _inputs(case)) == [kernels.Choice(_op(case), f"deltanet_tpu:{KINDS[case]}")]


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_auto_elsewhere_never_picks_deltanet_tpu(backend, platform):
    backend(platform)
    for case in ("gla_channel", "delta_channel", "gdn2"):
        [choice] = _choices(case, _inputs(case))
        assert not choice.implementation.startswith("deltanet_tpu"), case


@pytest.mark.parametrize("case, changes, reason", [
    ("gla_channel", {"d": 64}, "take K = V = 128, not K = 64, V = 64"),
    ("delta_channel", {"dtype": np.float16}, "q, k, v in one of float32, bfloat16, not float16"),
])
def test_auto_on_a_tpu_falls_back_where_the_kernels_do_not_fit(backend, case, changes, reason):
    backend("tpu")
    args = _inputs(case, d=changes.get("d", D))
    if "dtype" in changes:
        args = {name: x.astype(changes["dtype"]) if name != "state" else x for name, x in args.items()}
    [choice] = _choices(case, args)
    assert choice.implementation == "lmzoo:chunk" and reason in choice.reason, choice


def test_auto_on_a_tpu_keeps_ops_it_has_no_kernel_for(backend):
    backend("tpu")
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(_normal(rng, B, 20, H, D)) for _ in range(3))
    with kernels.recording() as choices:
        ops.dplr(q, k, v, -k, k, None, method="auto", chunk_size=16)
    assert choices == [kernels.Choice("dplr", "lmzoo:chunk", "deltanet-tpu has no kernel for dplr")]


def test_auto_on_a_tpu_without_deltanet_tpu_says_so(backend, monkeypatch):
    backend("tpu")
    monkeypatch.setattr(kernels, "tpu_kernel", lambda: None)
    [choice] = _choices("gla_channel", _inputs("gla_channel"))
    assert choice.implementation == "lmzoo:chunk" and "deltanet-tpu is not installed" in choice.reason


def test_explicit_forms_on_a_tpu_are_lmzoos(backend):
    backend("tpu")
    assert _choices("gla_head", _inputs("gla_head"), "chunk") == [kernels.Choice("gla", "lmzoo:chunk")]


# ----------------------------------------------------------------------------- equal to the reference, interpreted

needs_deltanet_tpu = pytest.mark.skipif(kernels.tpu_kernel() is None,
                                        reason="deltanet-tpu is not installed (the tpu extra, Python >= 3.12)")


def _outputs_and_grads(case, method, args, cotangent, segment_ids):
    out, vjp = jax.vjp(lambda a: _call(case, method, a, segment_ids), args)
    return out, vjp(jax.tree.map(lambda c, o: c.astype(o.dtype), cotangent, out))[0]


def _compare(case: str, dtype, tol: float, *, with_state: bool, documents: bool):
    """The op of ``case`` through deltanet-tpu (``auto``, the TPU mocked) against its reference form ("naive")
    in float32 on the same inputs: outputs, final state and every input's gradient."""
    args = jax.tree.map(lambda x: jnp.asarray(x).astype(dtype), _inputs(case))
    args["state"] = args["state"].astype(jnp.float32) if with_state else None
    reference_args = jax.tree.map(lambda x: x.astype(jnp.float32), args)
    segment_ids = _segments() if documents else None
    cotangent = random_like(jax.eval_shape(lambda a: _call(case, "naive", a, segment_ids), reference_args), 7)
    expected = _outputs_and_grads(case, "naive", reference_args, cotangent, segment_ids)
    with kernels.recording() as choices:
        actual = _outputs_and_grads(case, "auto", args, cotangent, segment_ids)
    assert choices == [kernels.Choice(_op(case), f"deltanet_tpu:{KINDS[case]}")], (case, choices)
    assert actual[0][0].dtype == dtype and actual[0][1].dtype == jnp.float32, case  # o in v's dtype, S float32
    try:
        assert_trees_close(jax.tree.map(lambda x: x.astype(jnp.float32), actual), expected, tol)
    except AssertionError as error:
        raise AssertionError(f"{case} ({jnp.dtype(dtype).name}): {error}") from None


@pytest.fixture
def tpu_auto(monkeypatch):
    """``auto`` as on a TPU, while deltanet-tpu (which asks jax itself) interprets its kernels on the CPU."""
    monkeypatch.setattr(kernels, "on_tpu", lambda: True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "deltanet-tpu: running on non-TPU backend")
        yield


@pytest.mark.slow
@needs_deltanet_tpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_every_mapping_equals_the_reference_with_documents_and_a_state(tpu_auto, dtype):
    for case in sorted(KINDS):
        _compare(case, dtype, F32_TOLERANCE if dtype == jnp.float32 else BF16_TOLERANCE, with_state=True,
                 documents=True)


@pytest.mark.slow
@needs_deltanet_tpu
def test_mappings_from_no_state_in_one_document(tpu_auto):
    """As a training step calls them: no initial state (the kernels then read none), no documents."""
    for case in ("gla_channel", "delta_head", "gdn2"):
        _compare(case, jnp.float32, F32_TOLERANCE, with_state=False, documents=False)


def test_the_run_record_names_deltanet_tpu_or_why_not(backend):
    """What run_info.json keeps (``LM.mixer_kernels``) on a TPU: deltanet-tpu at heads of 128, the reason below."""
    from conftest import tiny_config
    from flax import nnx

    from lmzoo.model import LM

    backend("tpu")
    for width, expected in ((256, "deltanet_tpu:gated_deltanet"), (32, "lmzoo:chunk")):
        cfg = tiny_config("gated_deltanet", f"model.d_model={width}", "model.n_heads=2", "model.n_layers=1")
        [[choice]] = LM(cfg, 256, rngs=nnx.Rngs(0)).mixer_kernels(2, 40, documents=True)
        assert choice["implementation"] == expected, choice
        assert ("K = V = 128, not K = 16, V = 16" in choice["reason"]) if width == 32 else "reason" not in choice
