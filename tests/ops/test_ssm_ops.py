"""State-space ops: every form against its reference on outputs, gradients and final states.

Each reference (``method="naive"``, the recurrence written out step by step) is first pinned to a
plain float64 loop written from the definition; the other forms ("scan", "assoc", "chunk", "fft")
are then compared with it at lengths 1, 63 and 257 through ``jax.vjp`` with random cotangents for
both the output and the final state. Float32 tolerance: norm-relative error ``||a - b|| / ||b|| <=
1e-5`` (absolute where the reference is exactly zero, e.g. dL/dA at T = 1 from a zero state).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_checks import (
    BF16_TOL, F32_TOL, assert_forms_agree, assert_trees_close, normal, rel_err, selective_fn, uniform, values_and_grads,
)

from lmzoo import ops
from lmzoo.ops import diagonal_ssm
from lmzoo.ops.lti import causal_toeplitz, diagonal_ssm_kernel
from lmzoo.ops.selective_scan import effective_delta

selective_scan, selective_attention, ssd, ssd_attention = (
    ops.selective_scan, ops.selective_attention, ops.ssd, ops.ssd_attention
)
causal_conv1d = jax.jit(ops.causal_conv1d)  # the one op not jitted itself: it has no options


# ----------------------------------------------------------------------------- selective scan (Mamba-1)

BATCH, CHANNELS, STATE = 2, 16, 8


def selective_inputs(length, *, groups=None, softplus=True, extras=True, seed=0):
    """Named float inputs; ``extras`` adds D, z, delta_bias and an initial state."""
    rng = np.random.default_rng(seed)
    bc_shape = (BATCH, length, STATE) if groups is None else (BATCH, length, groups, STATE)
    if softplus:
        delta = normal(rng, (BATCH, length, CHANNELS), 0.5, -1.0)  # softplus -> Δ around 0.3
    else:
        delta = uniform(rng, (BATCH, length, CHANNELS), 0.02, 0.4)
    inputs = {
        "u": normal(rng, (BATCH, length, CHANNELS)),
        "delta": delta,
        "A": -jnp.asarray(np.exp(0.5 * rng.standard_normal((CHANNELS, STATE))), jnp.float32),
        "B": normal(rng, bc_shape),
        "C": normal(rng, bc_shape),
    }
    if extras:
        inputs |= {
            "D": normal(rng, (CHANNELS,)),
            "z": normal(rng, (BATCH, length, CHANNELS)),
            "delta_bias": normal(rng, (CHANNELS,), 0.1),
            "initial_state": normal(rng, (BATCH, CHANNELS, STATE)),
        }
    return inputs


def naive_selective_scan(u, delta, A, B, C, *, D=None, z=None, delta_bias=None, softplus=False, initial_state=None,
                         signed=False):
    """The definition as a float64 loop over time (``signed``: the transition 2 exp(Δ A) - 1)."""
    u, delta, A, B, C = (np.asarray(a, np.float64) for a in (u, delta, A, B, C))
    batch, length, channels = u.shape
    if B.ndim == 3:
        B, C = B[:, :, None], C[:, :, None]
    group = np.arange(channels) // (channels // B.shape[2])  # the group each channel reads
    delta = delta + (0 if delta_bias is None else np.asarray(delta_bias, np.float64))
    delta = np.log1p(np.exp(delta)) if softplus else delta
    h = np.zeros((batch, channels, A.shape[1])) if initial_state is None else np.asarray(initial_state, np.float64)
    y = np.zeros(u.shape)
    for t in range(length):
        dt = delta[:, t, :, None]  # (B, D, 1)
        decay = np.exp(dt * A)
        h = (2 * decay - 1 if signed else decay) * h + dt * B[:, t, group] * u[:, t, :, None]
        y[:, t] = np.sum(C[:, t, group] * h, axis=-1)
    if D is not None:
        y = y + np.asarray(D, np.float64) * u
    if z is not None:
        z = np.asarray(z, np.float64)
        y = y * z / (1 + np.exp(-z))
    return y, h


@pytest.mark.parametrize("method", ["naive", "scan"])
@pytest.mark.parametrize("groups", [None, 4])
def test_selective_scan_matches_definition(groups, method):
    inputs = selective_inputs(11, groups=groups)
    y, h = selective_scan(**inputs, delta_softplus=True, method=method)
    y_ref, h_ref = naive_selective_scan(**inputs, softplus=True)
    assert rel_err(y, y_ref) <= F32_TOL and rel_err(h, h_ref) <= F32_TOL


# (length, groups, softplus, extras, chunk_size): every option is on in some case and off in another
# (extras = D, z, delta_bias and an initial state), rather than the full product, to keep the file fast.
SELECTIVE_CASES = [(1, 4, True, True, 16), (63, None, True, True, 16), (257, 2, False, False, 64)]


@functools.lru_cache
def selective_reference(length, groups, softplus, extras):
    inputs = selective_inputs(length, groups=groups, softplus=softplus, extras=extras)
    reference = selective_fn(list(inputs), softplus=softplus, method="naive")
    return inputs, values_and_grads(reference, list(inputs.values()))


@pytest.mark.parametrize("method", ["scan", "assoc", "chunk"])
@pytest.mark.parametrize("length, groups, softplus, extras, chunk_size", SELECTIVE_CASES)
def test_selective_scan_forms_match_reference(method, length, groups, softplus, extras, chunk_size):
    inputs, expected = selective_reference(length, groups, softplus, extras)
    names = list(inputs)
    fast = selective_fn(names, softplus=softplus, method=method, chunk_size=chunk_size)
    assert_forms_agree(fast, None, list(inputs.values()), names, expected)


@pytest.mark.parametrize("method", ["naive", "scan", "assoc", "chunk"])
def test_selective_scan_chained_halves_equal_one_pass(method):
    inputs = selective_inputs(63, groups=2)
    h0 = inputs.pop("initial_state")
    whole_y, whole_h = selective_scan(**inputs, initial_state=h0, delta_softplus=True, method=method, chunk_size=16)
    first = {k: v[:, :30] if v.ndim >= 3 else v for k, v in inputs.items() if k != "A"}
    second = {k: v[:, 30:] if v.ndim >= 3 else v for k, v in inputs.items() if k != "A"}
    y1, h1 = selective_scan(**first, A=inputs["A"], initial_state=h0, delta_softplus=True, method=method, chunk_size=16)
    y2, h2 = selective_scan(**second, A=inputs["A"], initial_state=h1, delta_softplus=True, method=method,
                            chunk_size=16)
    assert rel_err(jnp.concatenate([y1, y2], axis=1), whole_y) <= F32_TOL
    assert rel_err(h2, whole_h) <= F32_TOL


@pytest.mark.parametrize("method", ["scan", "assoc", "chunk"])
def test_selective_scan_bfloat16_inputs_close_to_float32(method):
    inputs = selective_inputs(63, groups=4)
    y_ref, h_ref = selective_scan(**inputs, delta_softplus=True, method="naive")
    low = {k: v.astype(jnp.bfloat16) for k, v in inputs.items()}
    y, h = selective_scan(**low, delta_softplus=True, method=method, chunk_size=16)
    assert y.dtype == jnp.bfloat16 and h.dtype == jnp.float32  # the state accumulates in float32
    assert rel_err(y.astype(jnp.float32), y_ref) <= BF16_TOL
    assert rel_err(h, h_ref) <= BF16_TOL


@pytest.mark.parametrize("groups, block_size", [(None, 64), (4, 8)])  # one block; three blocks, padded
def test_hidden_attention_reproduces_the_scan(groups, block_size):
    inputs = selective_inputs(23, groups=groups, extras=False)
    bias = normal(np.random.default_rng(3), (CHANNELS,), 0.1)
    y, _ = selective_scan(**inputs, delta_bias=bias, delta_softplus=True, method="naive")
    delta = effective_delta(inputs["delta"], bias, True)
    alpha = selective_attention(delta, inputs["A"], inputs["B"], inputs["C"], block_size=block_size)  # (B, D, T, T)
    assert np.all(np.asarray(alpha)[..., np.triu(np.ones((23, 23), bool), 1)] == 0)
    mixed = jnp.einsum("bdij,bjd->bid", alpha, inputs["u"])
    assert rel_err(mixed, y) <= F32_TOL
    # 4 channels each
    heads = selective_attention(delta, inputs["A"], inputs["B"], inputs["C"], heads=4, block_size=block_size)
    np.testing.assert_allclose(heads, alpha.reshape(BATCH, 4, 4, 23, 23).mean(axis=2), rtol=1e-5, atol=1e-6)


# Negative eigenvalues: the transition 2 exp(Δ A) - 1. A scaled up so that about half the transitions are negative.


def signed_inputs(length, **kwargs):
    inputs = selective_inputs(length, **kwargs)
    return inputs | {"A": 3.0 * inputs["A"]}


def _signed(names, method, *arrays):
    """``selective_scan`` with negative eigenvalues as a function of the arrays named ``names``."""
    kw = dict(zip(names, arrays))
    u, delta, A, B, C = (kw.pop(n) for n in ("u", "delta", "A", "B", "C"))
    return selective_scan(u, delta, A, B, C, delta_softplus=True, method=method, negative_eigenvalues=True, **kw)


@pytest.mark.parametrize("method", ["naive", "scan", "assoc"])
def test_negative_eigenvalues_match_the_definition(method):
    inputs = signed_inputs(11, groups=4)
    transitions = 2 * np.exp(np.asarray(effective_delta(inputs["delta"], inputs["delta_bias"], True))[..., None]
                             * np.asarray(inputs["A"])) - 1
    assert 0.3 < (transitions < 0).mean() < 0.7  # the switch is exercised
    y, h = selective_scan(**inputs, delta_softplus=True, method=method, negative_eigenvalues=True)
    y_ref, h_ref = naive_selective_scan(**inputs, softplus=True, signed=True)
    assert rel_err(y, y_ref) <= F32_TOL and rel_err(h, h_ref) <= F32_TOL
    unsigned, _ = naive_selective_scan(**inputs, softplus=True)
    assert rel_err(unsigned, y_ref) > 0.1  # not the unsigned scan


@pytest.mark.parametrize("method", ["scan", "assoc"])
def test_negative_eigenvalues_forms_match_the_naive_form_in_values_gradients_and_state(method):
    inputs = signed_inputs(33, groups=2)
    names = list(inputs)
    expected = values_and_grads(functools.partial(_signed, names, "naive"), list(inputs.values()))
    assert_forms_agree(functools.partial(_signed, names, method), None, list(inputs.values()), names, expected)


def test_negative_eigenvalues_in_packed_documents_equal_each_document_alone():
    inputs = signed_inputs(21, groups=2, extras=False)
    segment_ids = jnp.asarray(np.repeat([[0] * 8 + [1] * 13], BATCH, axis=0))
    y, _ = selective_scan(**inputs, delta_softplus=True, method="assoc", segment_ids=segment_ids,
                          negative_eigenvalues=True)
    for part in (slice(0, 8), slice(8, 21)):
        alone = {k: v[:, part] if k != "A" else v for k, v in inputs.items()}
        y_alone, _ = selective_scan(**alone, delta_softplus=True, method="naive", negative_eigenvalues=True)
        assert rel_err(y[:, part], y_alone) <= F32_TOL


@pytest.mark.parametrize("method", ["chunk", "pallas", "jla"])
def test_negative_eigenvalues_are_refused_in_one_line_by_the_log_space_forms(method):
    inputs = signed_inputs(5, extras=False)
    with pytest.raises(ValueError, match=rf"^negative_eigenvalues=true needs method in auto, naive, scan, assoc "
                                         rf"\(the forms that multiply transitions\); method='{method}' works"):
        selective_scan(**inputs, delta_softplus=True, method=method, negative_eigenvalues=True)


def test_negative_eigenvalues_hidden_attention_reproduces_the_scan():
    inputs = signed_inputs(13, groups=4, extras=False)
    y, _ = selective_scan(**inputs, delta_softplus=True, method="naive", negative_eigenvalues=True)
    delta = effective_delta(inputs["delta"], None, True)
    alpha = selective_attention(delta, inputs["A"], inputs["B"], inputs["C"], negative_eigenvalues=True)
    assert np.all(np.asarray(alpha)[..., np.triu(np.ones((13, 13), bool), 1)] == 0) and (np.asarray(alpha) < 0).any()
    assert rel_err(jnp.einsum("bdij,bjd->bid", alpha, inputs["u"]), y) <= F32_TOL
    heads = selective_attention(delta, inputs["A"], inputs["B"], inputs["C"], heads=4, negative_eigenvalues=True)
    np.testing.assert_allclose(heads, alpha.reshape(BATCH, 4, 4, 13, 13).mean(axis=2), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- SSD (Mamba-2)

HEADS, HEAD_DIM = 4, 4


def ssd_inputs(length, *, groups=1, extras=True, seed=0):
    rng = np.random.default_rng(seed)
    inputs = {
        "x": normal(rng, (BATCH, length, HEADS, HEAD_DIM)),
        "dt": jnp.asarray(np.logaddexp(0, 0.5 * rng.standard_normal((BATCH, length, HEADS)) - 1), jnp.float32),
        "A": -uniform(rng, (HEADS,), 0.5, 4.0),
        "B": normal(rng, (BATCH, length, groups, STATE)),
        "C": normal(rng, (BATCH, length, groups, STATE)),
    }
    if extras:
        inputs |= {"D": normal(rng, (HEADS,)), "initial_state": normal(rng, (BATCH, HEADS, HEAD_DIM, STATE))}
    return inputs


def ssd_fn(names, *, method, chunk_size=16):
    def fn(*arrays):
        kw = dict(zip(names, arrays))
        x, dt, A, B, C = (kw.pop(n) for n in ("x", "dt", "A", "B", "C"))
        return ssd(x, dt, A, B, C, method=method, chunk_size=chunk_size, **kw)

    return fn


def naive_ssd(x, dt, A, B, C, *, D=None, initial_state=None):
    x, dt, A, B, C = (np.asarray(a, np.float64) for a in (x, dt, A, B, C))
    batch, length, heads, p = x.shape
    group = np.arange(heads) // (heads // B.shape[2])
    h = np.zeros((batch, heads, p, B.shape[-1])) if initial_state is None else np.asarray(initial_state, np.float64)
    y = np.zeros(x.shape)
    for t in range(length):
        decay = np.exp(dt[:, t] * A)[:, :, None, None]
        h = decay * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, group][:, :, None, :]
        y[:, t] = np.einsum("bhpn,bhn->bhp", h, C[:, t, group])
    if D is not None:
        y = y + np.asarray(D, np.float64)[:, None] * x
    return y, h


@pytest.mark.parametrize("method", ["naive", "scan"])
def test_ssd_matches_definition(method):
    inputs = ssd_inputs(11, groups=2)
    y, h = ssd(**inputs, method=method)
    y_ref, h_ref = naive_ssd(**inputs)
    assert rel_err(y, y_ref) <= F32_TOL and rel_err(h, h_ref) <= F32_TOL


@pytest.mark.parametrize(
    "length, groups, extras, chunk_size",
    [(1, 2, True, 16), (63, 1, True, 16), (257, 4, False, 64)],
)
@pytest.mark.parametrize("method", ["scan", "chunk", "pallas"])
def test_ssd_forms_match_reference(method, length, groups, extras, chunk_size):
    inputs = ssd_inputs(length, groups=groups, extras=extras)
    names = list(inputs)
    fast, reference = ssd_fn(names, method=method, chunk_size=chunk_size), ssd_fn(names, method="naive")
    assert_forms_agree(fast, reference, list(inputs.values()), names)


@pytest.mark.parametrize("method", ["naive", "scan", "chunk", "pallas"])
def test_ssd_chained_halves_equal_one_pass(method):
    inputs = ssd_inputs(63, groups=2)
    h0, D, A = inputs.pop("initial_state"), inputs.pop("D"), inputs.pop("A")
    whole_y, whole_h = ssd(**inputs, A=A, D=D, initial_state=h0, method=method, chunk_size=16)
    first = {k: v[:, :37] for k, v in inputs.items()}
    second = {k: v[:, 37:] for k, v in inputs.items()}
    y1, h1 = ssd(**first, A=A, D=D, initial_state=h0, method=method, chunk_size=16)
    y2, h2 = ssd(**second, A=A, D=D, initial_state=h1, method=method, chunk_size=16)
    assert rel_err(jnp.concatenate([y1, y2], axis=1), whole_y) <= F32_TOL
    assert rel_err(h2, whole_h) <= F32_TOL


def test_ssd_bfloat16_inputs_close_to_float32():
    inputs = ssd_inputs(63, groups=2)
    y_ref, h_ref = ssd(**inputs, method="naive")
    y, h = ssd(**{k: v.astype(jnp.bfloat16) for k, v in inputs.items()}, method="chunk", chunk_size=16)
    assert y.dtype == jnp.bfloat16 and h.dtype == jnp.float32
    assert rel_err(y.astype(jnp.float32), y_ref) <= BF16_TOL and rel_err(h, h_ref) <= BF16_TOL


def test_ssd_attention_reproduces_the_scan():
    inputs = ssd_inputs(19, groups=2, extras=False)
    y, _ = ssd(**inputs, method="naive")
    alpha = ssd_attention(inputs["dt"], inputs["A"], inputs["B"], inputs["C"])  # (B, H, T, T)
    assert np.all(np.asarray(alpha)[..., np.triu(np.ones((19, 19), bool), 1)] == 0)
    assert rel_err(jnp.einsum("bhij,bjhp->bihp", alpha, inputs["x"]), y) <= F32_TOL


# ----------------------------------------------------------------------------- LTI: Vandermonde kernel, FFT, short conv

LTI_CHANNELS, MODES = 6, 4


def lti_inputs(length, *, seed=0):
    """Real arrays that define an S4D-Lin-like complex diagonal SSM (so gradients are real)."""
    rng = np.random.default_rng(seed)
    shape = (LTI_CHANNELS, MODES)
    return {
        "u": normal(rng, (BATCH, length, LTI_CHANNELS)),
        "log_dt": uniform(rng, (LTI_CHANNELS, 1), math.log(0.01), math.log(0.2)),
        "a_real": normal(rng, shape, 0.3, -0.7),  # Re A = -exp(a_real)
        "a_imag": normal(rng, shape, 0.1) + math.pi * np.arange(MODES, dtype=np.float32),
        "c_real": normal(rng, shape),
        "c_imag": normal(rng, shape),
        "h0_real": normal(rng, (BATCH, LTI_CHANNELS, MODES)),
        "h0_imag": normal(rng, (BATCH, LTI_CHANNELS, MODES)),
    }


def lti_params(log_dt, a_real, a_imag, c_real, c_imag):
    dt, a = jnp.exp(log_dt), -jnp.exp(a_real) + 1j * a_imag
    return dt * a, (jnp.exp(dt * a) - 1) / a, c_real + 1j * c_imag  # zero-order hold, B = 1


def lti_fn(method):
    def fn(u, log_dt, a_real, a_imag, c_real, c_imag, h0_real, h0_imag):
        log_a, b, c = lti_params(log_dt, a_real, a_imag, c_real, c_imag)
        y, h = diagonal_ssm(u, log_a, b, c, initial_state=h0_real + 1j * h0_imag, method=method)
        return y, jnp.stack([h.real, h.imag])

    return jax.jit(fn)


@pytest.mark.parametrize("method", ["naive", "fft"])
def test_diagonal_ssm_matches_definition(method):
    inputs = lti_inputs(9)
    y, h = lti_fn(method)(*inputs.values())
    log_a, b, c = (np.asarray(p, np.complex128) for p in lti_params(*list(inputs.values())[1:6]))
    state = np.asarray(inputs["h0_real"], np.complex128) + 1j * np.asarray(inputs["h0_imag"])
    u, outputs = np.asarray(inputs["u"], np.float64), []
    for t in range(u.shape[1]):
        state = np.exp(log_a) * state + b * u[:, t, :, None]
        outputs.append(np.real(np.sum(c * state, axis=-1)))
    assert rel_err(y, np.stack(outputs, axis=1)) <= F32_TOL
    assert rel_err(h, np.stack([state.real, state.imag])) <= F32_TOL


@pytest.mark.parametrize("length", [1, 63, 257])
def test_fft_convolution_matches_naive(length):
    """Against the naive recurrence run in float64: over 257 steps of complex products the float32
    recurrence drifts by up to ~5e-6 itself (the FFT by less), so two float32 forms can differ by 1e-5."""
    inputs = lti_inputs(length)
    with jax.enable_x64(True):
        expected = values_and_grads(lti_fn("naive"), [v.astype(jnp.float64) for v in inputs.values()])
    assert_forms_agree(lti_fn("fft"), None, list(inputs.values()), list(inputs), expected)
    assert_forms_agree(lti_fn("naive"), None, list(inputs.values()), list(inputs), expected)


def test_real_diagonal_ssm_fft_matches_naive():
    rng = np.random.default_rng(4)
    u = normal(rng, (BATCH, 63, 3, 5))  # two channel axes; one SSM per first-axis entry
    log_a = -uniform(rng, (3, 1, 8), 0.01, 0.5)
    b, c = normal(rng, (3, 1, 8)), normal(rng, (3, 1, 8))
    y, h = diagonal_ssm(u, log_a, b, c, method="fft")
    y_ref, h_ref = diagonal_ssm(u, log_a, b, c, method="naive")
    assert h.dtype == jnp.float32 and h.shape == (BATCH, 3, 5, 8)
    assert rel_err(y, y_ref) <= F32_TOL and rel_err(h, h_ref) <= F32_TOL


@pytest.mark.parametrize("method", ["naive", "fft"])
def test_diagonal_ssm_chained_halves_equal_one_pass(method):
    fn = lti_fn(method)
    inputs = lti_inputs(63)
    params = [inputs[k] for k in ("log_dt", "a_real", "a_imag", "c_real", "c_imag")]
    u, h0 = inputs["u"], (inputs["h0_real"], inputs["h0_imag"])
    whole_y, whole_h = fn(u, *params, *h0)
    y1, h1 = fn(u[:, :20], *params, *h0)
    y2, h2 = fn(u[:, 20:], *params, h1[0], h1[1])
    assert rel_err(jnp.concatenate([y1, y2], axis=1), whole_y) <= F32_TOL
    assert rel_err(h2, whole_h) <= F32_TOL


def test_diagonal_ssm_bfloat16_input_close_to_float32():
    inputs = lti_inputs(63)
    y_ref, _ = lti_fn("naive")(*inputs.values())
    u16 = inputs["u"].astype(jnp.bfloat16)
    y, _ = lti_fn("fft")(u16, *list(inputs.values())[1:])
    assert y.dtype == jnp.bfloat16 and rel_err(y.astype(jnp.float32), y_ref) <= BF16_TOL


def test_toeplitz_matrix_is_the_convolution():
    @jax.jit
    def both(u, *params):
        kernel = diagonal_ssm_kernel(*lti_params(*params), u.shape[1])  # (T, D)
        return jnp.einsum("dij,bjd->bid", causal_toeplitz(kernel), u), ops.fft_conv(u, kernel)

    by_matrix, by_fft = both(normal(np.random.default_rng(5), (BATCH, 40, LTI_CHANNELS)),
                             *list(lti_inputs(1).values())[1:6])
    assert rel_err(by_matrix, by_fft) <= F32_TOL


def test_causal_conv1d_matches_definition_and_chains():
    rng = np.random.default_rng(6)
    x, weight, bias = normal(rng, (BATCH, 17, 5)), normal(rng, (4, 5)), normal(rng, (5,))
    y, state = causal_conv1d(x, weight, bias)
    padded = np.concatenate([np.zeros((BATCH, 3, 5)), np.asarray(x)], axis=1)
    expected = sum(np.asarray(weight)[i] * padded[:, i : i + 17] for i in range(4)) + np.asarray(bias)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, -3:])
    y1, s1 = causal_conv1d(x[:, :6], weight, bias)
    y2, s2 = causal_conv1d(x[:, 6:], weight, bias, initial_state=s1)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], axis=1), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s2, state)


# ----------------------------------------------------------------------------- documents (segment ids)
# Five documents packed in 37 steps. With chunks of 16 (8 for Pallas) one starts inside a chunk,
# one on a chunk's edge, two run across an edge, and the last is shorter than the conv's window.
# On the packed batch every form must give what the reference gives on each document alone (the
# first from the initial state, the others from zero): outputs, the final state (the last
# document's), and the gradients of every input for one random cotangent.

DOCUMENTS = (10, 6, 13, 6, 2)
SEGMENT_IDS = jnp.asarray(np.repeat([[3, 4, 6, 7, 9]], BATCH, axis=0).repeat(DOCUMENTS, axis=1))  # (B, 37)


def document_runs(fn, inputs, steps, states):
    """``fn(inputs, segment_ids) -> (y [B,T,...], final state)``: its cotangent, then (values, grads) on the
    packed documents and the same assembled from runs on each document alone (``segment_ids=None``).

    ``steps`` name the inputs with a time axis (1), ``states`` those that start the first document only;
    the rest are shared, their gradients summed over the documents."""
    rng = np.random.default_rng(7)
    shapes = jax.eval_shape(lambda a: fn(a, SEGMENT_IDS), inputs)
    dy, dh = (jnp.asarray(rng.standard_normal(o.shape), o.dtype) for o in shapes)

    @jax.jit
    def pull_back(args, segment_ids, cotangent):
        out, vjp = jax.vjp(lambda a: fn(a, segment_ids), args)
        return out, vjp(cotangent)[0]

    edges = np.cumsum((0, *DOCUMENTS))
    outputs, grads = [], []
    for i, (start, end) in enumerate(zip(edges[:-1], edges[1:])):
        doc = {k: v[:, start:end] if k in steps else (jnp.zeros_like(v) if i and k in states else v)
               for k, v in inputs.items()}
        last = end == edges[-1]
        (y, h), g = pull_back(doc, None, (dy[:, start:end], dh if last else jnp.zeros_like(dh)))
        outputs.append(y)
        grads.append(g)

    def assembled(name):
        if name in steps:
            return jnp.concatenate([g[name] for g in grads], axis=1)
        return grads[0][name] if name in states else sum(g[name] for g in grads)

    alone = ((jnp.concatenate(outputs, axis=1), h), {name: assembled(name) for name in inputs})
    return (dy, dh), alone


def assert_documents_independent(fn, inputs, steps, states, alone):
    """``alone``: document_runs' (cotangent, values and grads) of the reference."""
    cotangent, expected = alone
    out, vjp = jax.vjp(lambda a: fn(a, SEGMENT_IDS), inputs)
    assert_trees_close((out, vjp(cotangent)[0]), expected, tol=F32_TOL)


def selective_segments_fn(method):
    chunk = 8 if method == "pallas" else 16
    return lambda a, segment_ids: selective_scan(
        **a, delta_softplus=True, method=method, chunk_size=chunk, segment_ids=segment_ids
    )


SELECTIVE_STEPS, SSD_STEPS, STATES = ("u", "delta", "B", "C", "z"), ("x", "dt", "B", "C"), ("initial_state",)


@functools.lru_cache
def selective_alone():
    inputs = selective_inputs(37, groups=2)
    return inputs, document_runs(selective_segments_fn("naive"), inputs, SELECTIVE_STEPS, STATES)


@pytest.mark.parametrize("method", ["naive", "scan", "assoc", "chunk", "pallas"])
def test_selective_scan_documents_are_independent(method):
    inputs, alone = selective_alone()
    assert_documents_independent(selective_segments_fn(method), inputs, SELECTIVE_STEPS, STATES, alone)


@functools.lru_cache
def ssd_alone():
    inputs = ssd_inputs(37, groups=2)
    return inputs, document_runs(ssd_segments_fn("naive"), inputs, SSD_STEPS, STATES)


def ssd_segments_fn(method):
    return lambda a, segment_ids: ssd(**a, method=method, chunk_size=16, segment_ids=segment_ids)


@pytest.mark.parametrize("method", ["naive", "scan", "chunk", "pallas"])
def test_ssd_documents_are_independent(method):
    inputs, alone = ssd_alone()
    assert_documents_independent(ssd_segments_fn(method), inputs, SSD_STEPS, STATES, alone)


def lti_segments_fn(method):
    def fn(a, segment_ids):
        log_a, b, c = lti_params(*(a[k] for k in ("log_dt", "a_real", "a_imag", "c_real", "c_imag")))
        h0 = a["h0_real"] + 1j * a["h0_imag"]
        y, h = diagonal_ssm(a["u"], log_a, b, c, initial_state=h0, method=method, segment_ids=segment_ids)
        return y, jnp.stack([h.real, h.imag])

    return fn


@functools.lru_cache
def lti_alone():
    inputs = lti_inputs(37)
    return inputs, document_runs(lti_segments_fn("naive"), inputs, ("u",), ("h0_real", "h0_imag"))


@pytest.mark.parametrize("method", ["naive", "fft"])
def test_diagonal_ssm_documents_are_independent(method):
    inputs, alone = lti_alone()
    assert_documents_independent(lti_segments_fn(method), inputs, ("u",), ("h0_real", "h0_imag"), alone)


def test_causal_conv1d_documents_are_independent():
    """Width 4: the last document (2 steps) leaves a final window of one zero and its two inputs."""
    rng = np.random.default_rng(6)
    inputs = {"x": normal(rng, (BATCH, 37, 5)), "weight": normal(rng, (4, 5)), "bias": normal(rng, (5,)),
              "initial_state": normal(rng, (BATCH, 3, 5))}

    def fn(a, segment_ids):
        return ops.causal_conv1d(a["x"], a["weight"], a["bias"], initial_state=a["initial_state"],
                                 segment_ids=segment_ids)

    alone = document_runs(fn, inputs, ("x",), STATES)
    assert_documents_independent(fn, inputs, ("x",), STATES, alone)
    _, final = causal_conv1d(inputs["x"], inputs["weight"], inputs["bias"], segment_ids=SEGMENT_IDS)
    np.testing.assert_array_equal(final[:, 0], 0.0)
    np.testing.assert_array_equal(final[:, 1:], inputs["x"][:, -2:])


def document_blocks(alpha, alone_alphas):
    """alpha [B,H,T,T] is zero between documents and, on each document's block, its own matrix."""
    edges = np.cumsum((0, *DOCUMENTS))
    inside = np.zeros((37, 37), bool)
    for (start, end), alone in zip(zip(edges[:-1], edges[1:]), alone_alphas):
        inside[start:end, start:end] = True
        assert rel_err(alpha[..., start:end, start:end], alone) <= F32_TOL
    assert np.all(np.asarray(alpha)[..., ~inside] == 0)


def test_hidden_attention_of_documents():
    inputs = selective_inputs(37, groups=2, extras=False)
    delta = jax.nn.softplus(inputs["delta"])
    alpha = selective_attention(delta, inputs["A"], inputs["B"], inputs["C"], heads=4, block_size=16,
                                segment_ids=SEGMENT_IDS)
    edges = np.cumsum((0, *DOCUMENTS))
    alone = [
        selective_attention(delta[:, a:b], inputs["A"], inputs["B"][:, a:b], inputs["C"][:, a:b], heads=4,
                            block_size=16)
        for a, b in zip(edges[:-1], edges[1:])
    ]
    document_blocks(alpha, alone)


def test_ssd_attention_of_documents():
    inputs = ssd_inputs(37, groups=2, extras=False)
    dt, A, B, C = (inputs[k] for k in ("dt", "A", "B", "C"))
    alpha = ssd_attention(dt, A, B, C, segment_ids=SEGMENT_IDS)
    edges = np.cumsum((0, *DOCUMENTS))
    document_blocks(alpha, [ssd_attention(dt[:, a:b], A, B[:, a:b], C[:, a:b]) for a, b in zip(edges[:-1], edges[1:])])


# ----------------------------------------------------------------------------- argument errors


def test_unknown_methods_name_the_valid_ones():
    s = selective_inputs(4, extras=False)
    with pytest.raises(ValueError, match="naive, scan, assoc, chunk, pallas"):
        selective_scan(**s, method="parallel")
    d = ssd_inputs(4, extras=False)
    with pytest.raises(ValueError, match="naive, scan, chunk, chunk_recompute, pallas"):
        ssd(**d, method="assoc")
    with pytest.raises(ValueError, match=r"naive, fft\)"):
        diagonal_ssm(s["u"], -jnp.ones((CHANNELS, 2)), jnp.ones((CHANNELS, 2)), jnp.ones((CHANNELS, 2)), method="chunk")
