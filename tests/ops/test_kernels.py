"""Kernel providers (``lmzoo.ops.kernels``): every op mapped onto jax-linear-attention equals the op's
reference form, and ``method="auto"`` is fail-closed and recorded.

The jla tests need jax-linear-attention (Python >= 3.12, CI's second leg); on a CPU its chunked JAX
ops run (they are its Mosaic kernels' reference), on a Hopper GPU its kernels (``gpu`` marker).
Each mapped op is compared with lmzoo's reference form on outputs, final states and the gradients of
every input (random cotangents for both), from a random initial state, over two documents and an odd
length, in float32 and in bfloat16.
"""

from __future__ import annotations

import functools

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import assert_trees_close, random_like

from lmzoo import ops
from lmzoo.ops import kernels

B, T, H, DK, DV = 2, 37, 2, 16, 16
SPLIT = 20  # the second document starts here
F32_TOLERANCE = 1e-4  # two exact float32 computations in different orders
BF16_TOLERANCE = 3e-2  # bf16 q, k, v (8 mantissa bits) in jla's matmuls against a float32 reference on the same inputs


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _log_sigmoid(x):
    return -np.log1p(np.exp(-(x + 2.0)))  # gates ~0.5 .. 1


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(case: str, seed: int = 0, *, H: int = H, DK: int = DK, DV: int = DV) -> dict:
    """Random inputs of ``case`` at these head sizes, every float one differentiated."""
    rng = np.random.default_rng(seed)
    n = lambda *shape: _normal(rng, *shape)  # noqa: E731
    if case == "ssd":  # Mamba-2: x, dt, A, B, C (2 groups over 4 heads), D
        heads, groups, p, d_state = 4, 2, DV, DK
        return {"x": n(B, T, heads, p), "dt": np.log1p(np.exp(n(B, T, heads) - 1.0)), "A": -np.exp(n(heads) * 0.5),
                "B": n(B, T, groups, d_state), "C": n(B, T, groups, d_state), "D": n(heads),
                "state": n(B, heads, p, d_state)}
    if case == "comba":  # a prediction key p of its own, read before the decay
        return {"q": n(B, T, H, DK), "k": _unit(n(B, T, H, DK)), "v": n(B, T, H, DV), "p": 0.5 * _unit(n(B, T, H, DK)),
                "beta": 1 / (1 + np.exp(-n(B, T, H))), "log_g": _log_sigmoid(n(B, T, H)), "state": n(B, H, DK, DV)}
    if case == "mamba3":  # x, dt, a per-step A, B, C (2 groups over 4 heads), lam, theta (4 of 8 pairs turn), D
        heads, groups, p, d_state, angles = 2 * H, H, DV, DK, DK // 4
        state = {"h": n(B, heads, p, d_state), "x": n(B, heads, p), "B": n(B, heads, d_state),
                 "phase": n(B, heads, angles)}
        return {"x": n(B, T, heads, p), "dt": np.log1p(np.exp(n(B, T, heads) - 1.0)),
                "A": -np.exp(n(B, T, heads) * 0.5),
                "B": n(B, T, groups, d_state), "C": n(B, T, groups, d_state), "lam": 1 / (1 + np.exp(-n(B, T, heads))),
                "theta": 3 * n(B, T, heads, angles), "D": n(heads), "state": state}
    if case == "gdn2":  # erase gates on the keys' channels, write gates on the values'
        return {"q": n(B, T, H, DK), "k": _unit(n(B, T, H, DK)), "v": n(B, T, H, DV),
                "log_g": _log_sigmoid(n(B, T, H, DK)),
                "erase": 1 / (1 + np.exp(-n(B, T, H, DK))), "write": 1 / (1 + np.exp(-n(B, T, H, DV))),
                "state": n(B, H, DK, DV)}
    if case == "selective_scan":  # Mamba-1: u, delta (before bias and softplus), A, B, C in 2 groups, D, z
        channels, d_state = 8, DK
        return {"u": n(B, T, channels), "delta": n(B, T, channels), "A": -np.exp(n(channels, d_state) * 0.5),
                "B": n(B, T, 2, d_state), "C": n(B, T, 2, d_state), "D": n(channels), "z": n(B, T, channels),
                "bias": n(channels) * 0.5, "state": n(B, channels, d_state)}
    if case == "dplr":  # RWKV-7's generalised delta rule: a = -kappa, b = kappa * a-gate
        kappa = _unit(n(B, T, H, DK))
        return {"q": n(B, T, H, DK), "k": n(B, T, H, DK) * 0.5, "v": n(B, T, H, DV), "alpha": -kappa,
                "beta": kappa / (1 + np.exp(-n(B, T, H, DK))), "log_g": _log_sigmoid(n(B, T, H, DK)),
                "state": n(B, H, DK, DV)}
    if case.startswith("delta_product"):
        steps = 2
        return {"q": n(B, T, H, DK), "k": _unit(n(B, T, H, steps, DK)), "v": n(B, T, H, steps, DV),
                "beta": 1 / (1 + np.exp(-n(B, T, H, steps))), "log_g": _log_sigmoid(n(B, T, H)),
               "state": n(B, H, DK, DV)}
    if case.startswith("delta"):
        value_heads = 2 * H if case == "delta_grouped" else H
        args = {"q": n(B, T, H, DK), "k": _unit(n(B, T, H, DK)), "v": n(B, T, value_heads, DV),
                "beta": 1 / (1 + np.exp(-n(B, T, value_heads))), "state": n(B, value_heads, DK, DV)}
        if case in ("delta_head", "delta_grouped"):
            args["log_g"] = _log_sigmoid(n(B, T, value_heads))
        if case == "delta_channel":
            args["log_g"] = _log_sigmoid(n(B, T, value_heads, DK))
        return args
    if case.startswith("precond"):  # two value heads per key head; a decay per value head (GDN) or key channel (KDA)
        value_heads = 2 * H
        gate_shape = (B, T, value_heads) if case == "precond_head" else (B, T, value_heads, DK)
        args = {"q": n(B, T, H, DK), "k": _unit(n(B, T, H, DK)), "v": n(B, T, value_heads, DV),
                "beta": 1 / (1 + np.exp(-n(B, T, value_heads))), "log_g": _log_sigmoid(n(*gate_shape)),
                "beta_atk": 1 / (1 + np.exp(-n(B, T, H))), "log_g_atk": _log_sigmoid(n(B, T, H)),
                "state": (n(B, value_heads, DK, DV), np.abs(n(B, H, DK)))}
        if case == "precond_channel":  # a centre per key head, differentiated too
            args["center"] = np.linspace(-0.2, 0.4, H).astype(np.float32)
        return args
    if case == "mlstm":  # input gates spread wide enough to need the stabiliser; a state with its own m
        return {"q": n(B, T, H, DK), "k": n(B, T, H, DK), "v": n(B, T, H, DV), "log_i": 2.0 * n(B, T, H),
                "log_f": _log_sigmoid(n(B, T, H)), "state": (n(B, H, DK, DV), n(B, H, DK), n(B, H))}
    if case == "rwkv6":  # decays per key channel (~0.3 .. 1 a step) and the bonus u
        return {"q": n(B, T, H, DK), "k": n(B, T, H, DK), "v": n(B, T, H, DV), "log_w": -np.exp(n(B, T, H, DK) - 1.5),
                "u": n(H, DK), "state": n(B, H, DK, DV)}
    args = {"q": n(B, T, H, DK), "k": n(B, T, H, DK), "v": n(B, T, H, DV), "state": n(B, H, DK, DV)}
    if case == "gla_channel":
        args["log_g"] = _log_sigmoid(n(B, T, H, DK))
    if case == "gla_head":
        args["log_g"] = _log_sigmoid(n(B, T, H))
    return args


def _call(case: str, method: str, args: dict, segment_ids):
    """The op of ``case`` in ``method``: (o, final state)."""
    state = args["state"]
    if case == "ssd":
        return ops.ssd(args["x"], args["dt"], args["A"], args["B"], args["C"], D=args["D"], initial_state=state,
                       method=method, chunk_size=16, segment_ids=segment_ids)
    if case == "comba":
        return ops.comba(args["q"], args["k"], args["v"], args["p"], args["beta"], args["log_g"], initial_state=state,
                         method=method, chunk_size=16, segment_ids=segment_ids)
    if case == "mamba3":
        return ops.mamba3(args["x"], args["dt"], args["A"], args["B"], args["C"], args["lam"], args["theta"],
                          D=args["D"], initial_state=state, method=method, chunk_size=16, segment_ids=segment_ids)
    if case == "selective_scan":
        return ops.selective_scan(args["u"], args["delta"], args["A"], args["B"], args["C"], D=args["D"], z=args["z"],
                                  delta_bias=args["bias"], delta_softplus=True, initial_state=state, method=method,
                                  chunk_size=16, segment_ids=segment_ids)
    if case == "dplr":
        return ops.dplr(args["q"], args["k"], args["v"], args["alpha"], args["beta"], args["log_g"], scale=1.0,
                        initial_state=state, method=method, chunk_size=16, segment_ids=segment_ids)
    if case.startswith("precond"):
        return ops.precond_delta_rule(args["q"], args["k"], args["v"], args["beta"], args["log_g"], args["beta_atk"],
                                      args["log_g_atk"], center=args.get("center", -0.2), initial_state=state,
                                      method=method, chunk_size=16, segment_ids=segment_ids)
    if case == "mlstm":
        return ops.mlstm(args["q"], args["k"], args["v"], args["log_i"], args["log_f"], initial_state=state,
                         method=method, segment_ids=segment_ids)
    if case == "rwkv6":  # RWKV's own scale, as its mixer calls it
        return ops.rwkv6(args["q"], args["k"], args["v"], args["log_w"], args["u"], scale=1.0, initial_state=state,
                         method=method, chunk_size=16, segment_ids=segment_ids)
    if case == "gdn2":
        return ops.gdn2(args["q"], args["k"], args["v"], args["log_g"], args["erase"], args["write"],
                        initial_state=state, method=method, chunk_size=16, segment_ids=segment_ids)
    if case.startswith("delta_product"):
        return ops.delta_product(args["q"], args["k"], args["v"], args["beta"], args["log_g"], initial_state=state,
                                 method=method, chunk_size=16, segment_ids=segment_ids)
    if case.startswith("delta"):
        return ops.delta_rule(args["q"], args["k"], args["v"], args["beta"], args.get("log_g"), initial_state=state,
                              method=method, chunk_size=16, segment_ids=segment_ids)
    if case == "linear":
        return ops.linear_attention(args["q"], args["k"], args["v"], initial_state=state, method=method, chunk_size=16,
                                    segment_ids=segment_ids)
    return ops.gla(args["q"], args["k"], args["v"], args.get("log_g"), initial_state=state, method=method,
                   chunk_size=16, segment_ids=segment_ids)


# case -> the op's reference form
CASES = {"gla_channel": "naive", "gla_head": "naive", "gla_none": "naive", "linear": "naive", "ssd": "naive",
         "delta_none": "naive", "delta_head": "naive", "delta_channel": "naive", "delta_grouped": "naive",
         "delta_product": "naive", "gdn2": "naive", "dplr": "naive", "selective_scan": "naive",
         "mamba3": "naive", "comba": "naive", "mlstm": "naive", "rwkv6": "naive", "precond_head": "naive",
         "precond_channel": "naive"}
# case -> the implementation method="jla" runs on a CPU
JLA_KINDS = {"gla_channel": "gla", "gla_head": "simple_gla", "gla_none": "simple_gla", "linear": "simple_gla",
             "ssd": "simple_gla", "delta_none": "deltanet", "delta_head": "gated_deltanet", "delta_channel": "kda",
             "delta_grouped": "gated_deltanet", "delta_product": "gated_deltanet", "gdn2": "gdn2", "dplr": "rwkv7",
             "selective_scan": "mamba1", "mamba3": "mamba3", "comba": "rwkv7", "mlstm": "mlstm", "rwkv6": "rwkv6",
             "precond_head": "rwkv7", "precond_channel": "rwkv7"}
F32_ONLY = {"precond_head": "bf16 goes through precond_channel's mapping, the same but for the decay's layout"}
CHUNKED_ONLY = ("mlstm", "rwkv6")  # jla has no GPU-qualified kernel for these: its chunked op runs on every device
BEST = {"selective_scan": "scan", "mlstm": "assoc"}  # the form auto runs off Hopper, where not "chunk"
OPS = {"ssd": "ssd", "delta_product": "delta_rule", "gdn2": "gdn2", "dplr": "dplr", "selective_scan": "selective_scan",
       "mamba3": "mamba3", "comba": "comba", "mlstm": "mlstm", "rwkv6": "rwkv6", "precond_head": "precond_delta_rule",
       "precond_channel": "precond_delta_rule"}  # the op whose choice is recorded, where not the case's family


def _segments():
    return jnp.asarray(np.repeat([[0] * SPLIT + [1] * (T - SPLIT)], B, axis=0), jnp.int32)


def _outputs_and_grads(case, method, args, cotangent):
    return _outputs_and_grads_jitted(case, method)(args, cotangent)


@functools.cache
def _outputs_and_grads_jitted(case, method):
    """Jitted: jla's chunked ops are plain JAX, which op by op compiles ~4x longer than as one program; and kept,
    so that the float32 reference the bf16 comparison runs reuses the f32 comparison's compiled one."""
    @jax.jit
    def both(args, cotangent):
        out, vjp = jax.vjp(lambda a: _call(case, method, a, _segments()), args)
        return out, vjp(jax.tree.map(lambda c, o: c.astype(o.dtype), cotangent, out))[0]
    return both


def _compare(case: str, dtype, tol: float, *, with_state: bool = True, **sizes):
    args = jax.tree.map(lambda x: jnp.asarray(x).astype(dtype), _inputs(case, **sizes))
    args["state"] = jax.tree.map(lambda s: s.astype(jnp.float32), args["state"]) if with_state else None  # float32
    reference_args = jax.tree.map(lambda x: x.astype(jnp.float32), args)
    cotangent = random_like(jax.eval_shape(lambda a: _call(case, CASES[case], a, _segments()), reference_args), 7)
    expected = _outputs_and_grads(case, CASES[case], reference_args, cotangent)
    actual = _outputs_and_grads(case, "jla", args, cotangent)
    assert actual[0][0].dtype == dtype  # o in the inputs' dtype, the state float32
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(actual[0][1]))
    assert_trees_close(jax.tree.map(lambda x: x.astype(jnp.float32), actual), expected, tol)


needs_jla = pytest.mark.skipif(kernels.jla_ops() is None, reason="jax-linear-attention is not installed")


@needs_jla
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_jla_equals_reference(case, dtype):
    if jax.default_backend() == "gpu" and not kernels.hopper():
        pytest.skip("jla's kernels run on Hopper; its chunked path is tested on the CPU")
    if dtype == jnp.bfloat16 and case in F32_ONLY:
        pytest.skip(F32_ONLY[case])
    _compare(case, dtype, F32_TOLERANCE if dtype == jnp.float32 else BF16_TOLERANCE)


@needs_jla
@pytest.mark.parametrize("case", ["gla_channel", "delta_head", "ssd", "dplr", "selective_scan", "mamba3", "comba",
                                  "mlstm"])  # mLSTM: jla's empty state (m = -1e30) for lmzoo's
def test_jla_from_no_state(case):
    """Without an initial state jla is given none (its kernels then read none)."""
    _compare(case, jnp.float32, F32_TOLERANCE, with_state=False)


@needs_jla
@pytest.mark.parametrize("case", sorted(CASES))
def test_jla_records_its_kind(case):
    args = jax.tree.map(jnp.asarray, _inputs(case))
    choices = kernels.traced_choices(lambda a: _call(case, "jla", a, _segments()), args)
    impl = "mosaic_gpu" if kernels.hopper() and case not in CHUNKED_ONLY else "chunked"
    op = OPS.get(case, "delta_rule" if case.startswith("delta") else "gla")
    assert kernels.Choice(op, f"jla.{impl}:{JLA_KINDS[case]}") in choices


@pytest.mark.gpu
@needs_jla
@pytest.mark.skipif(not kernels.hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("case", ["gla_channel", "gla_head", "delta_head", "delta_channel", "ssd", "gdn2", "dplr",
                                  "mamba3", "comba", "precond_head", "precond_channel"])
def test_mosaic_kernels_equal_reference(case):
    """On a Hopper GPU at shapes its kernels take (bf16, K = V = 64, H K a multiple of 128)."""
    _compare(case, jnp.bfloat16, BF16_TOLERANCE, H=2, DK=64, DV=64)


@pytest.mark.parametrize("case", ["gla_channel", "delta_head", "ssd", "delta_product", "gdn2", "dplr", "selective_scan",
                                  "mamba3", "comba", "mlstm", "rwkv6", "precond_head"])
def test_auto_off_hopper_is_the_best_form_bit_for_bit(case):
    """Fail-closed: where jla's kernel does not run (here: no Hopper GPU), ``auto`` is the op's own best form."""
    if kernels.hopper() or kernels.on_tpu():
        pytest.skip("on a Hopper GPU auto runs jla's kernels, on a TPU deltanet-tpu's (tests/ops/test_kernels_tpu.py)")
    args = jax.tree.map(jnp.asarray, _inputs(case))
    with kernels.recording() as choices:
        auto = _call(case, "auto", args, _segments())
    best = BEST.get(case, "chunk")
    for a, b in zip(jax.tree.leaves(auto), jax.tree.leaves(_call(case, best, args, _segments()))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(choices) == 1 and choices[0].implementation == f"lmzoo:{best}"  # the op's choice, not its inner calls
    assert "not installed" in choices[0].reason or "not a Hopper GPU" in choices[0].reason


def test_jla_form_without_jla_is_one_line():
    if kernels.jla_ops() is not None:
        pytest.skip("jax-linear-attention is installed")
    args = jax.tree.map(jnp.asarray, _inputs("gla_channel"))
    with pytest.raises(ValueError, match=r"method='jla' needs jax-linear-attention"):
        _call("gla_channel", "jla", args, None)


def test_explicit_forms_are_recorded_as_lmzoo():
    args = jax.tree.map(jnp.asarray, _inputs("gla_head"))
    with kernels.recording() as choices:
        _call("gla_head", "scan", args, None)
    assert choices == [kernels.Choice("gla", "lmzoo:scan")]


# ----------------------------------------------------------------------------- auto on a Hopper GPU, mocked
# Which call ``auto`` makes on a Hopper GPU for the ops jla runs only with its chunked op (mLSTM, RWKV-6), by tracing
# alone with jla stood in for: it runs on every Python.


class _StandInJla:
    """``jla.ops`` as ``lmzoo.ops.kernels`` reads it: the kinds' gate names, a Mosaic kernel for ``kernel``
    (GPU-qualified or not; taking every call or none) and ``linear_attention``, which keeps each call's kind and
    inputs and gives (o, final state) of the right shapes."""

    KINDS = {"mlstm": ("mlstm", ("g", "i")), "rwkv6": ("rwkv6", ("g", "u"))}

    def __init__(self, kernel: str | None = None, *, qualified: bool = True, takes: bool = True):
        registered = {} if kernel is None else {kernel: (None, lambda *args, **options: takes, qualified)}
        self._REGISTRY = {"mosaic_gpu": registered}
        self.calls = []

    def linear_attention(self, kind, q, k, v, *, impl, **inputs):
        self.calls.append((kind, inputs))
        (b, _, h, dk), dv = k.shape, v.shape[-1]
        if kind == "mlstm":
            return jnp.zeros(v.shape, q.dtype), (jnp.zeros((b, h, dk, dv)), jnp.zeros((b, h, dk)), jnp.zeros((b, h)))
        return jnp.zeros(v.shape, q.dtype), jnp.zeros((b, h, dk, dv))


@pytest.fixture
def hopper_with(monkeypatch):
    """Installs a stand-in for jla on a mocked Hopper GPU."""
    monkeypatch.setattr(kernels, "hopper", lambda: True)
    monkeypatch.setattr(kernels, "on_tpu", lambda: False)

    def install(stand_in: _StandInJla) -> _StandInJla:
        monkeypatch.setattr(kernels, "jla_ops", lambda: stand_in)
        return stand_in
    return install


def _traced(case: str, method: str) -> list:
    args = jax.tree.map(jnp.asarray, _inputs(case))
    return kernels.traced_choices(lambda a: _call(case, method, a, _segments()), args)


@pytest.mark.parametrize("case", CHUNKED_ONLY)
def test_auto_on_hopper_keeps_lmzoos_form_without_a_qualified_jla_kernel(hopper_with, case):
    """As jla ships them: mLSTM's Mosaic kernel registered opt-in only, none for RWKV-6. ``auto`` runs the op's
    best form and says why; ``jla`` runs jla's chunked op."""
    stand_in = hopper_with(_StandInJla("mlstm", qualified=False))
    reason = f"jla has no GPU-tested Mosaic kernel for {case}"
    assert _traced(case, "auto") == [kernels.Choice(case, f"lmzoo:{BEST.get(case, 'chunk')}", reason)]
    assert stand_in.calls == []
    assert _traced(case, "jla") == [kernels.Choice(case, f"jla.chunked:{case}")]
    assert [kind for kind, _ in stand_in.calls] == [case]


def test_auto_on_hopper_hands_mlstm_to_a_qualified_kernel_as_lmzoos_contract(hopper_with):
    """Were jla to qualify its mLSTM kernel, ``auto`` would give it the call: lmzoo's scale, no eps, log gates
    [B,T,H] in float32, the state (C, n, m) in float32 and the documents."""
    stand_in = hopper_with(_StandInJla("mlstm"))
    assert _traced("mlstm", "auto") == [kernels.Choice("mlstm", "jla.mosaic_gpu:mlstm")]
    [(kind, inputs)] = stand_in.calls
    assert kind == "mlstm" and inputs["scale"] == DK**-0.5 and inputs["eps"] == 0.0
    assert all(inputs[gate].shape == (B, T, H) and inputs[gate].dtype == jnp.float32 for gate in ("g", "i"))
    assert [s.shape for s in inputs["initial_state"]] == [(B, H, DK, DV), (B, H, DK), (B, H)]
    assert all(s.dtype == jnp.float32 for s in inputs["initial_state"]) and inputs["segment_ids"].shape == (B, T)


def test_auto_on_hopper_hands_rwkv6_to_a_kernel_only_where_it_takes_the_call(hopper_with):
    stand_in = hopper_with(_StandInJla("rwkv6"))
    assert _traced("rwkv6", "auto") == [kernels.Choice("rwkv6", "jla.mosaic_gpu:rwkv6")]
    [(_, inputs)] = stand_in.calls
    assert inputs["scale"] == 1.0 and inputs["g"].shape == (B, T, H, DK) and inputs["u"].shape == (H, DK)
    hopper_with(_StandInJla("rwkv6", takes=False))
    [choice] = _traced("rwkv6", "auto")
    assert choice.implementation == "lmzoo:chunk" and "jla's rwkv6 kernel does not take this call" in choice.reason


@needs_jla
@pytest.mark.parametrize("kind", CHUNKED_ONLY)
def test_jla_has_no_gpu_qualified_kernel_for(kind):
    """What the docs say ``auto`` runs for mLSTM and RWKV-6 (lmzoo's own form on every device) holds for the jla
    installed: a jla that qualifies a kernel for one of them fails this, and the docs' rows change."""
    entry = kernels.jla_ops()._REGISTRY.get("mosaic_gpu", {}).get(kind)
    assert entry is None or not entry[2]


# ----------------------------------------------------------------------------- nothing constant to fold


def _const_reductions(jaxpr, consts_in=()) -> list:
    """Cumulative sums / reduce-windows in ``jaxpr`` (and the jaxprs inside it) whose operand depends on no input
    (or only on empty arrays): XLA constant-folds those, in its slow evaluator, at their full size."""
    const = set(consts_in)
    found = []
    for eqn in jaxpr.eqns:
        inputs = [v for v in eqn.invars if not isinstance(v, jex_core.Literal)]
        is_const = all(v in const or v.aval.size == 0 for v in inputs)  # an empty array is a constant too
        if eqn.primitive.name in ("cumsum", "cumlogsumexp", "reduce_window_sum", "reduce_window") and is_const:
            found.append(f"{eqn.primitive.name} {[v.aval.str_short() for v in eqn.invars]}")
        for sub in jex_core.jaxprs_in_params(eqn.params):
            sub = getattr(sub, "jaxpr", sub)
            aligned = len(sub.invars) == len(eqn.invars)  # calls and scans; other bodies count nothing as constant
            inner = [w for v, w in zip(eqn.invars, sub.invars)
                     if aligned and not isinstance(v, jex_core.Literal) and v in const]
            found += _const_reductions(sub, inner)
        if is_const:
            const.update(eqn.outvars)
    return found


@pytest.mark.parametrize("case", ["gla_channel", "gla_head", "delta_channel", "delta_head"])
def test_chunk_gradients_fold_no_constant_reduction(case):
    """The chunk form's gradient holds no cumulative sum over a constant (GLA's train step took minutes to
    compile on a GPU while XLA folded one, from the one-step blocks of its per-channel halving)."""
    args = jax.tree.map(jnp.asarray, _inputs(case))
    loss = lambda a: sum(jnp.sum(x * x) for x in jax.tree.leaves(_call(case, "chunk", a, _segments())))  # noqa: E731
    closed = jax.make_jaxpr(jax.grad(loss))(args)
    assert _const_reductions(closed.jaxpr) == []


# ----------------------------------------------------------------------------- softmax attention


def _attention_inputs(dtype=jnp.float32, *, d: int = DK):
    """q with 4 heads over 2 key/value heads, two documents, T = 37."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(_normal(rng, B, T, heads, d), dtype) for heads in (4, 2, 2))
    return (q, k, v), jnp.asarray(_segments())


def _attention_with_grads(method: str, args, segment_ids, window):
    run = lambda *a: ops.softmax_attention(*a, window=window, segment_ids=segment_ids, method=method)  # noqa: E731
    out, vjp = jax.vjp(run, *args)
    return out, vjp(random_like(out, seed=5))


def test_attention_auto_off_the_gpu_is_xla_and_says_why():
    args, segments = _attention_inputs()
    with kernels.recording() as choices:
        auto = ops.softmax_attention(*args, window=5, segment_ids=segments, method="auto")
    np.testing.assert_array_equal(np.asarray(auto), np.asarray(
        ops.softmax_attention(*args, window=5, segment_ids=segments, method="xla")))
    [choice] = choices
    if jax.default_backend() != "gpu":
        assert choice.implementation == "lmzoo:xla" and "not an NVIDIA GPU" in choice.reason


class _FakeGpu:
    platform = "gpu"


def test_cudnn_is_not_given_calls_it_gets_wrong(monkeypatch):
    """Odd lengths (its backward rejects them) and more than 2**31 query elements (wrong gradients, no error)."""
    from lmzoo.ops import attention

    monkeypatch.setattr(attention.jax, "devices", lambda: [_FakeGpu()])
    even = jax.ShapeDtypeStruct((2, 64, 4, 64), jnp.bfloat16)
    assert attention.cudnn_refusal(even, even, None, None) == ""
    odd = jax.ShapeDtypeStruct((2, 63, 4, 64), jnp.bfloat16)
    assert "odd length 63" in attention.cudnn_refusal(odd, odd, None, None)
    huge = jax.ShapeDtypeStruct((1, 2**20 + 2, 16, 128), jnp.bfloat16)  # just past 2**31 elements
    assert "cuDNN's gradients are wrong" in attention.cudnn_refusal(huge, huge, None, None)


@needs_jla
@pytest.mark.parametrize("window", [None, 5])
def test_attention_maps_onto_jlas_kernel_semantics(monkeypatch, window):
    """Where ``auto`` gives softmax attention to jla's Hopper kernel, the call it makes (scale, window, documents,
    grouped heads) computes lmzoo's attention: checked on a CPU with jla's own XLA statement of the kernel's
    semantics (``jla.layers.attention.attention``) standing in for the kernel."""
    jla_layers = pytest.importorskip("jla.layers.attention")
    import jla.ops.mosaic_gpu.attention as jla_kernel

    monkeypatch.setattr(kernels, "_platform_refusal", lambda: "")
    monkeypatch.setattr(jla_kernel, "supported", lambda q, k, v: None)
    stand_in = lambda q, k, v, **options: jla_layers.attention(q, k, v, implementation="xla", **options)  # noqa: E731
    monkeypatch.setattr(kernels, "jla_attention", lambda: stand_in)
    args, segments = _attention_inputs()
    with kernels.recording() as choices:
        actual = _attention_with_grads("auto", args, segments, window)
    assert choices[0] == kernels.Choice("softmax_attention", "jla.mosaic_gpu:attention")
    assert_trees_close(actual, _attention_with_grads("naive", args, segments, window), F32_TOLERANCE)


@pytest.mark.gpu
@needs_jla
@pytest.mark.skipif(not kernels.hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("window", [None, 5])
def test_attention_kernel_with_documents_equals_reference(window):
    args, segments = _attention_inputs(jnp.bfloat16, d=64)
    with kernels.recording() as choices:
        actual = _attention_with_grads("auto", args, segments, window)
    assert choices[0].implementation == "jla.mosaic_gpu:attention"
    reference = _attention_with_grads("naive", tuple(a.astype(jnp.float32) for a in args), segments, window)
    assert_trees_close(jax.tree.map(lambda x: x.astype(jnp.float32), actual), reference, BF16_TOLERANCE)
