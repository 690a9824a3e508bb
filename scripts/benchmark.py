"""Time every op form: forward and forward+backward milliseconds, throughput and memory, next to softmax.

    python scripts/benchmark.py                                   # all cases, T = 512 .. 4096
    python scripts/benchmark.py --ops softmax --lengths 1024,2048 --batch 2 --heads 8 --dim 64
    python scripts/benchmark.py --dtype bfloat16 --json figures.json
    python scripts/benchmark.py --gpu                             # the accelerator shapes, bf16

Every row is measured in the same process on the same device, shapes and dtype, and shows its
ratio to ``softmax/xla`` at the same shape (the baseline). Memory is what XLA's compiled program
reserves (temporaries + outputs), which is comparable across CPU and GPU; on a GPU the run also
prints the device's peak allocation. Chunked and attention forms report achieved TFLOP/s (their
matmul FLOPs, below), scans achieved GB/s (bytes they must read and write) next to the device's
copy bandwidth measured in the same run; "compile s" is the time XLA took to compile the forward
and the forward+backward programs. ``--gpu`` runs the shapes (B, T, H, D) = (4, 2048, 16,
128) and (1, 8192, 16, 128) in bfloat16 for the linear family, softmax and the selective scan.

A case is a function ``(shape, dtype, key) -> (fn, args)``: ``fn(*args)`` returns the output (or
a tuple whose first element is the output); registered under "<op>/<form>" with ``@case``, with
optional FLOP or byte counts. Every op's every form has a case, its ``naive`` reference included.
A case that cannot run here (no GPU, or a form the installed ``lmzoo.ops`` lacks, when timing an
older tree for a before/after comparison) raises ``Unavailable`` and is skipped.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from jsonrows import JsonRows
from lmzoo import ops
from lmzoo.ops.attention import METHODS as SOFTMAX_FORMS
from lmzoo.ops.linear import METHODS as LINEAR_FAMILY_FORMS  # the forms of lmzoo.ops.gated too
from lmzoo.ops.lti import METHODS as LTI_FORMS
from lmzoo.ops.mamba3 import METHODS as MAMBA3_FORMS
from lmzoo.ops.selective_scan import METHODS as SELECTIVE_SCAN_FORMS
from lmzoo.ops.ssd import METHODS as SSD_FORMS
from lmzoo.ops.vq import METHODS as VQ_FORMS

try:
    from lmzoo.record.migrate import OP_METHODS_RENAMED
except ImportError:  # timing an older tree: its ops take the names of their day themselves
    OP_METHODS_RENAMED = {}


@dataclass(frozen=True)
class Shape:
    batch: int
    length: int
    heads: int
    dim: int


CASES: dict[str, Callable] = {}
FLOPS: dict[str, Callable] = {}  # name -> shape -> forward FLOPs (matmul work of the algorithm)
BYTES: dict[str, Callable] = {}  # name -> (shape, itemsize) -> (forward bytes, forward+backward bytes)
BASELINE = "softmax/xla"
BACKWARD_FLOPS = 2.0  # a backward pass does about twice the forward's matmul work


class Unavailable(Exception):
    """The case cannot run on this machine (no cuDNN, no GPU ...)."""


def offered(methods: tuple[str, ...], method: str, op: str | None = None) -> str:
    """The form the op runs for ``method``, else ``Unavailable``: a case labelled by a form's name of its day
    (``vq/blockwise``) runs it under today's name (``lmzoo.record.migrate``) where the installed ``op`` renamed it."""
    renamed = OP_METHODS_RENAMED.get(op, {})
    if method not in methods and renamed.get(method) in methods:
        method = renamed[method]
    if method not in methods:
        raise Unavailable(f"this lmzoo.ops has no form {method!r}")
    if method == "jla" and jla() is None:
        raise Unavailable("jax-linear-attention is not installed (pip install -e '.[kernels]', Python >= 3.12)")
    return method


def jla():
    """``jla.ops`` where jax-linear-attention is installed (lmzoo.ops.kernels), else None."""
    try:
        from lmzoo.ops.kernels import jla_ops
    except ImportError:  # timing an older tree
        return None
    return jla_ops()


def jla_own_case(kind: str, gate: str):
    """jax-linear-attention's own call (``impl="auto"``: its Hopper kernel where it takes the call): the time
    lmzoo's ``method="jla"`` and ``"auto"`` rows should match."""
    def build(shape, dtype, key):
        if jla() is None:
            raise Unavailable("jax-linear-attention is not installed")
        q, k, v = qkv(shape, dtype, key)
        gate_shape = q.shape if gate == "channel" else q.shape[:3]
        g = jax.nn.log_sigmoid(jax.random.normal(jax.random.fold_in(key, 7), gate_shape)) / 16
        gates = {"g": g}
        if kind in ("deltanet", "gated_deltanet", "kda"):
            k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(dtype)
            gates = {"beta": jax.nn.sigmoid(jax.random.normal(jax.random.fold_in(key, 5), k.shape[:3])),
                     **({} if kind == "deltanet" else gates)}
        names = tuple(gates)

        def fn(q, k, v, *values):
            return jla().linear_attention(kind, q, k, v, **dict(zip(names, values)))[0]

        return fn, (q, k, v, *gates.values())

    return build


def case(name: str, *, flops: Callable | None = None, bytes_moved: Callable | None = None):
    def wrap(builder):
        CASES[name] = builder
        if flops:
            FLOPS[name] = flops
        if bytes_moved:
            BYTES[name] = bytes_moved
        return builder

    return wrap


def attention_flops(shape: Shape) -> float:
    """Causal softmax attention: QK^T and PV over the lower triangle."""
    return 2 * 2 * shape.batch * shape.heads * shape.length**2 * shape.dim / 2


def chunked_flops(chunk: int):
    """The chunk algorithm's matmuls: state updates and readouts (2 T Dk Dv each) and the causal
    half of the in-chunk scores and values (T C D each)."""
    def flops(shape: Shape) -> float:
        per_head = 4 * shape.length * shape.dim**2 + 2 * shape.length * chunk * shape.dim
        return shape.batch * shape.heads * per_head

    return flops


def qkv(shape: Shape, dtype, key):
    ks = jax.random.split(key, 3)
    dims = (shape.batch, shape.length, shape.heads, shape.dim)
    return tuple(jax.random.normal(k, dims, dtype) for k in ks)


# ----------------------------------------------------------------------------- cases


@case("softmax/xla", flops=attention_flops)
def _softmax_xla(shape, dtype, key):
    return (lambda q, k, v: ops.softmax_attention(q, k, v, method="xla")), qkv(shape, dtype, key)


@case("softmax/naive")
def _softmax_naive(shape, dtype, key):
    method = offered(SOFTMAX_FORMS, "naive")
    return (lambda q, k, v: ops.softmax_attention(q, k, v, method=method)), qkv(shape, dtype, key)


@case("softmax/cudnn", flops=attention_flops)
def _softmax_cudnn(shape, dtype, key):
    """``jax.nn.dot_product_attention`` on cuDNN's fused kernel (GPU, half precision only)."""
    if jax.default_backend() != "gpu" or dtype == jnp.float32:
        raise Unavailable("cuDNN attention needs a GPU and bf16/fp16")
    def fn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    return fn, qkv(shape, dtype, key)


# (further families register their cases below this line)


@case("softmax/window256")
def _softmax_window(shape, dtype, key):
    return (lambda q, k, v: ops.softmax_attention(q, k, v, window=256, method="xla")), qkv(shape, dtype, key)


def vq_args(shape: Shape, dtype, key, n_codes: int = 128):
    """(q, quantised keys, codes, codebook, v) with random codes over a random codebook."""
    from lmzoo.ops.vq import gather_codewords

    q, _, v = qkv(shape, dtype, key)
    codebook = jax.random.normal(jax.random.fold_in(key, 1), (shape.heads, n_codes, shape.dim), dtype)
    codes = jax.random.randint(jax.random.fold_in(key, 2), (shape.batch, shape.length, shape.heads), 0, n_codes)
    return q, gather_codewords(codebook, codes), codes, codebook, v


def vq_case(method: str):
    def build(shape, dtype, key):
        form = offered(VQ_FORMS, method, "vq")
        fn = lambda q, k, z, c, v: ops.vq_attention(q, k, z, c, v, block_size=128, method=form)  # noqa: E731
        return fn, vq_args(shape, dtype, key)

    return build


case("vq/naive")(vq_case("naive"))
case("vq/blockwise")(vq_case("blockwise"))


# State-space family. The generic shape maps to: channels D = heads * dim (Mamba's d_inner) for
# selective_scan and the LTI SSM; heads H and head size P = dim for ssd; state size N = SSM_STATE
# (shared B/C, i.e. one group); the LTI SSM has SSM_STATE / 2 complex modes per channel.
SSM_STATE = 16


def selective_scan_args(shape: Shape, dtype, key):
    """(u, delta, A, B, C, z, D, delta_bias) with Mamba-like magnitudes."""
    ks = jax.random.split(key, 6)
    channels = shape.heads * shape.dim
    seq = (shape.batch, shape.length, channels)
    u, delta, z = (jax.random.normal(k, seq, dtype) for k in ks[:3])
    A = -jnp.tile(jnp.arange(1, SSM_STATE + 1, dtype=jnp.float32), (channels, 1))  # S4D-real
    B, C = (jax.random.normal(k, (shape.batch, shape.length, SSM_STATE), dtype) for k in ks[3:5])
    return u, delta, A, B, C, z, jnp.ones((channels,)), jnp.full((channels,), -4.0)


def selective_scan_case(method: str, chunk_size: int = 64):
    def build(shape, dtype, key):
        offered(SELECTIVE_SCAN_FORMS, method)

        def fn(u, delta, A, B, C, z, D, delta_bias):
            return ops.selective_scan(
                u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=True, method=method,
                chunk_size=chunk_size
            )

        return fn, selective_scan_args(shape, dtype, key)

    return build


def selective_scan_bytes(shape: Shape, itemsize: int) -> tuple[float, float]:
    """What any selective scan must move: u, delta, z in and y out (B T D each), B and C in (B T N);
    backward also reads dy and those inputs and writes their cotangents."""
    sequence = shape.batch * shape.length * shape.heads * shape.dim * itemsize
    state_inputs = 2 * shape.batch * shape.length * SSM_STATE * itemsize
    forward = 4 * sequence + state_inputs
    return forward, forward + 7 * sequence + 2 * state_inputs


for _method, _chunk in (("naive", 64), ("scan", 64), ("assoc", 64), ("chunk", 64), ("chunk", 16), ("pallas", 16)):
    _label = f"chunk{_chunk}" if _method == "chunk" else _method
    case(f"selective_scan/{_label}", bytes_moved=selective_scan_bytes)(selective_scan_case(_method, _chunk))


def ssd_args(shape: Shape, dtype, key):
    """(x, dt, A, B, C, D): heads of size dim, one group of B/C."""
    ks = jax.random.split(key, 4)
    x = jax.random.normal(ks[0], (shape.batch, shape.length, shape.heads, shape.dim), dtype)
    dt = jax.nn.softplus(jax.random.normal(ks[1], (shape.batch, shape.length, shape.heads)) - 4.0).astype(dtype)
    B, C = (jax.random.normal(k, (shape.batch, shape.length, 1, SSM_STATE), dtype) for k in ks[2:])
    return x, dt, -jnp.linspace(1.0, 16.0, shape.heads), B, C, jnp.ones((shape.heads,))


def ssd_case(method: str):
    def build(shape, dtype, key):
        offered(SSD_FORMS, method)
        return (lambda x, dt, A, B, C, D: ops.ssd(x, dt, A, B, C, D=D, method=method)), ssd_args(shape, dtype, key)

    return build


case("ssd/naive")(ssd_case("naive"))
case("ssd/scan")(ssd_case("scan"))
case("ssd/chunk64")(ssd_case("chunk"))
case("ssd/pallas")(ssd_case("pallas"))


MAMBA3_STATE = 64  # N: (K, V) = (64, D) is a size jla's Mamba-3 kernel takes for D = 64 and 128


def mamba3_args(shape: Shape, dtype, key):
    """(x, dt, A, B, C, lam, theta, D): heads of size dim, one group of B/C of MAMBA3_STATE entries, half of them
    turning (attn.rope_fraction=0.5)."""
    ks = jax.random.split(key, 6)
    heads = (shape.batch, shape.length, shape.heads)
    x = jax.random.normal(ks[0], (*heads, shape.dim), dtype)
    dt = jax.nn.softplus(jax.random.normal(ks[1], heads) - 4.0).astype(dtype)
    B, C = (jax.random.normal(k, (shape.batch, shape.length, 1, MAMBA3_STATE), dtype) for k in ks[2:4])
    lam = jax.nn.sigmoid(jax.random.normal(ks[4], heads)).astype(dtype)
    theta = jnp.pi * jnp.tanh(jax.random.normal(ks[5], (*heads, MAMBA3_STATE // 4))).astype(dtype)
    return x, dt, -jnp.linspace(1.0, 16.0, shape.heads), B, C, lam, theta, jnp.ones((shape.heads,))


def mamba3_case(method: str):
    def build(shape, dtype, key):
        offered(MAMBA3_FORMS, method)
        return (lambda x, dt, A, B, C, lam, theta, D: ops.mamba3(x, dt, A, B, C, lam, theta, D=D, method=method),
                mamba3_args(shape, dtype, key))

    return build


for _form in ("naive", "scan", "chunk", "jla", "auto"):
    case(f"mamba3/{_form}64" if _form == "chunk" else f"mamba3/{_form}")(mamba3_case(_form))


@case("jla_mamba3/own")
def _jla_mamba3_own(shape, dtype, key):
    """jax-linear-attention's own ``mamba3`` call on the gates lmzoo's mapping passes (q, k: rotated C, B per head)."""
    if jla() is None:
        raise Unavailable("jax-linear-attention is not installed")
    ks = jax.random.split(key, 5)
    heads = (shape.batch, shape.length, shape.heads)
    q, k = (jax.random.normal(kk, (*heads, MAMBA3_STATE), dtype) for kk in ks[:2])
    v = jax.random.normal(ks[2], (*heads, shape.dim), dtype)
    dt = jax.nn.softplus(jax.random.normal(ks[3], heads) - 4.0)
    lam = jax.nn.sigmoid(jax.random.normal(ks[4], heads))
    g = -dt * jnp.linspace(1.0, 16.0, shape.heads)

    def fn(q, k, v, g, beta, gamma):
        return jla().linear_attention("mamba3", q, k, v, g=g, beta=beta, gamma=gamma, scale=1.0)[0]

    return fn, (q, k, v, g, jnp.exp(g) * (1 - lam) * dt, lam * dt)


def lti_args(shape: Shape, dtype, key):
    """(u, log_dt, log(-Re A), Im A, Re C, Im C): an S4D-Lin SSM per channel, as real arrays."""
    channels, modes = shape.heads * shape.dim, SSM_STATE // 2
    u = jax.random.normal(key, (shape.batch, shape.length, channels), dtype)
    log_dt = jnp.linspace(jnp.log(1e-3), jnp.log(1e-1), channels)[:, None]
    a_imag = jnp.tile(jnp.pi * jnp.arange(modes, dtype=jnp.float32), (channels, 1))
    c = jax.random.normal(jax.random.fold_in(key, 1), (2, channels, modes))
    return u, log_dt, jnp.full((channels, modes), jnp.log(0.5)), a_imag, c[0], c[1]


def lti_case(method: str):
    def build(shape, dtype, key):
        form = offered(LTI_FORMS, method, "lti")

        def fn(u, log_dt, log_neg_a_real, a_imag, c_real, c_imag):  # y only: a long convolution discards the state
            dt, a = jnp.exp(log_dt), -jnp.exp(log_neg_a_real) + 1j * a_imag
            return ops.diagonal_ssm(u, dt * a, (jnp.exp(dt * a) - 1) / a, 2 * (c_real + 1j * c_imag), method=form)[0]

        return fn, lti_args(shape, dtype, key)

    return build


case("lti/naive")(lti_case("naive"))
case("lti/fft")(lti_case("fft"))
case("lti/scan")(lti_case("scan"))


# Linear-attention family (lmzoo.ops.linear / lmzoo.ops.gated): every form of the causal sum, of
# GLA with per-dimension gates and of simple GLA / RetNet with one gate per head.
LINEAR_FORMS = ("naive", "parallel", "scan", "assoc", "chunk", "pallas", "jla", "auto")


def gated_args(shape: Shape, dtype, key, *, per_dimension: bool):
    """(q, k, v, log_g) with GLA-like gates: logsigmoid(normal) / 16, float32."""
    q, k, v = qkv(shape, dtype, key)
    gate_shape = (shape.batch, shape.length, shape.heads) + ((shape.dim,) if per_dimension else ())
    log_g = jax.nn.log_sigmoid(jax.random.normal(jax.random.fold_in(key, 7), gate_shape)) / 16
    return q, k, v, log_g


def linear_attention_case(method: str):
    def build(shape, dtype, key):
        offered(LINEAR_FAMILY_FORMS, method)
        return (lambda q, k, v: ops.linear_attention(q, k, v, method=method)), qkv(shape, dtype, key)

    return build


def gla_case(method: str, *, per_dimension: bool):
    def build(shape, dtype, key):
        offered(LINEAR_FAMILY_FORMS, method)
        fn = lambda q, k, v, log_g: ops.gla(q, k, v, log_g, method=method)  # noqa: E731
        return fn, gated_args(shape, dtype, key, per_dimension=per_dimension)

    return build


for _form in LINEAR_FORMS:
    _chunked = _form in ("chunk", "pallas", "jla", "auto")
    _label = f"{_form}64" if _form == "chunk" else _form  # chunk_size is the ops' default, 64
    _flops = chunked_flops(64) if _chunked else None
    case(f"linear_attention/{_label}", flops=_flops)(linear_attention_case(_form))
    case(f"gla/{_label}", flops=_flops)(gla_case(_form, per_dimension=True))
    case(f"simple_gla/{_label}", flops=_flops)(gla_case(_form, per_dimension=False))


# The delta rule (lmzoo.ops.delta_rule): DeltaNet (no gate), Gated DeltaNet (one gate per head) and
# per-channel gates (KDA), each in every form, with the mixers' inputs: unit keys, beta in (0, 1).
DELTA_FORMS = ("scan", "parallel", "chunk", "pallas", "jla", "auto")


def delta_args(shape: Shape, dtype, key, *, gate: str):
    """(q, k, v, beta, log_g) with unit keys, sigmoid beta and Gated-DeltaNet-like gates (float32)."""
    q, k, v = qkv(shape, dtype, key)
    k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(dtype)
    beta = jax.nn.sigmoid(jax.random.normal(jax.random.fold_in(key, 5), k.shape[:3]))
    gate_shape = k.shape[:3] + ((shape.dim,) if gate == "channel" else ())
    log_g = jax.nn.log_sigmoid(jax.random.normal(jax.random.fold_in(key, 7), gate_shape)) / 16
    return q, k, v, beta, log_g


def delta_forms() -> tuple[str, ...]:
    try:
        from lmzoo.ops.delta import METHODS
    except ImportError:  # timing an older tree
        raise Unavailable("this lmzoo.ops has no delta_rule") from None
    return METHODS


def delta_rule_case(method: str, *, gate: str, chunk_size: int = 64):
    def build(shape, dtype, key):
        form = offered(delta_forms(), method, "delta")
        q, k, v, beta, log_g = delta_args(shape, dtype, key, gate=gate)
        if gate == "none":
            def fn(q, k, v, beta):
                return ops.delta_rule(q, k, v, beta, method=form, chunk_size=chunk_size)

            return fn, (q, k, v, beta)
        fn = lambda q, k, v, beta, log_g: ops.delta_rule(q, k, v, beta, log_g, method=form, chunk_size=chunk_size)  # noqa: E731
        return fn, (q, k, v, beta, log_g)

    return build


def delta_chunk_flops(chunk: int):
    """The UT form's matmuls per chunk: the pair matrices of k and q (C^2 D each), the triangular
    inverse (~C^3 / 3) and its product with [V, K] (C^2 (Dk + Dv)), the recurrence's W_k S and
    K^T U and the read-out Q S (2 C Dk Dv each), and P U (C^2 Dv)."""
    def flops(shape: Shape) -> float:
        c, d = min(chunk, shape.length), shape.dim
        per_chunk = 2 * (2 * c * c * d + c**3 / 3 + 2 * c * c * d + 3 * c * d * d + c * c * d)
        return shape.batch * shape.heads * per_chunk * shape.length / c

    return flops


for _gate, _op in (("none", "delta_rule"), ("head", "gated_delta_rule"), ("channel", "channel_delta_rule")):
    for _form in DELTA_FORMS:
        _chunked = _form in ("chunk", "pallas", "jla", "auto")
        _label = f"{_form}64" if _form == "chunk" else _form
        case(f"{_op}/{_label}", flops=delta_chunk_flops(64) if _chunked else None)(delta_rule_case(_form, gate=_gate))


for _kind, _gate in (("gla", "channel"), ("simple_gla", "head"), ("deltanet", "none"), ("gated_deltanet", "head"),
                     ("kda", "channel")):
    case(f"jla_{_kind}/own")(jla_own_case(_kind, _gate))


def tpu_own_case(function: str, gate: str):
    """deltanet-tpu's own call (``chunk_gla``, ``chunk_gdn``, ...; its Pallas TPU kernels, interpreted off a TPU),
    with the delta rule's inputs: the time lmzoo's ``method="auto"`` rows should match on a TPU."""
    def build(shape, dtype, key):
        try:
            import deltanet_tpu
        except ImportError:
            raise Unavailable("deltanet-tpu is not installed (pip install -e '.[tpu]', Python >= 3.12)") from None
        if shape.dim != 128:
            raise Unavailable("deltanet-tpu's kernels take D = 128")
        q, k, v, beta, log_g = delta_args(shape, dtype, key, gate=gate)
        precision = "fp32" if dtype == jnp.float32 else "bf16"
        run = getattr(deltanet_tpu, function)
        if function == "chunk_delta_rule":
            return (lambda q, k, v, beta: run(q, k, v, beta, precision=precision)), (q, k, v, beta)
        if function == "chunk_gla":
            return (lambda q, k, v, g: run(q, k, v, g, precision=precision)), (q, k, v, log_g)
        return (lambda q, k, v, g, beta: run(q, k, v, g, beta, precision=precision)), (q, k, v, log_g, beta)

    return build


for _function, _gate in (("chunk_gla", "channel"), ("chunk_gdn", "head"), ("chunk_delta_rule", "none"),
                         ("chunk_kda", "channel")):
    case(f"tpu_{_function}/own")(tpu_own_case(_function, _gate))


def fox_case(shape, dtype, key):
    """Softmax attention with FoX's forget-gate bias c_i - c_j (a [B, H, T, T] bias through the fused path)."""
    q, k, v = qkv(shape, dtype, key)
    logits = jax.random.normal(jax.random.fold_in(key, 9), (shape.batch, shape.length, shape.heads))
    log_f = jax.nn.log_sigmoid(logits + 3)

    def fn(q, k, v, log_f):
        c = jnp.cumsum(log_f, axis=1).swapaxes(1, 2)  # (B, H, T)
        return ops.softmax_attention(q, k, v, bias=c[..., :, None] - c[..., None, :], method="xla")

    return fn, (q, k, v, log_f)


case("fox/xla", flops=attention_flops)(fox_case)


# ----------------------------------------------------------------------------- measuring


def first_output(fn):
    def wrapped(*args):
        out = fn(*args)
        return out[0] if isinstance(out, tuple) else out

    return wrapped


def forward_backward(fn, args):
    """(function, arguments) computing the gradients of <output, random cotangent> w.r.t. the float args.

    The cotangent is an argument, not a constant of the program: XLA would otherwise fold the part
    of the backward pass that depends on it alone at compile time (for minutes at GPU shapes).
    """
    out_shape = jax.eval_shape(first_output(fn), *args)
    cotangent = jax.random.normal(jax.random.key(1), out_shape.shape, out_shape.dtype)
    float_args = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))

    def loss(*a):
        *inputs, cotangent = a
        return jnp.sum((first_output(fn)(*inputs) * cotangent).astype(jnp.float32))

    return jax.grad(loss, argnums=float_args), (*args, cotangent)


def milliseconds(compiled, args, repeats: int) -> float:
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def compiled_megabytes(compiled) -> float:
    stats = compiled.memory_analysis()
    if stats is None:
        return float("nan")
    return (stats.temp_size_in_bytes + stats.output_size_in_bytes) / 2**20


def measure(name: str, shape: Shape, dtype, repeats: int) -> dict:
    fn, args = CASES[name](shape, dtype, jax.random.key(0))
    row = {"op": name, "B": shape.batch, "T": shape.length, "H": shape.heads, "D": shape.dim}
    for label, (f, f_args) in (("fwd", (fn, args)), ("fwd_bwd", forward_backward(fn, args))):
        start = time.perf_counter()
        compiled = jax.jit(f).lower(*f_args).compile()
        row[f"{label}_compile_s"] = time.perf_counter() - start
        row[f"{label}_ms"] = milliseconds(compiled, f_args, repeats)
        row[f"{label}_mb"] = compiled_megabytes(compiled)
    if name in FLOPS:
        forward = FLOPS[name](shape)
        row["fwd_tflops"] = forward / row["fwd_ms"] / 1e9
        row["fwd_bwd_tflops"] = forward * (1 + BACKWARD_FLOPS) / row["fwd_bwd_ms"] / 1e9
    if name in BYTES:
        forward, both = BYTES[name](shape, jnp.dtype(dtype).itemsize)
        row["fwd_gbps"], row["fwd_bwd_gbps"] = forward / row["fwd_ms"] / 1e6, both / row["fwd_bwd_ms"] / 1e6
    return row


def copy_bandwidth(megabytes: int = 1024, repeats: int = 5) -> float:
    """GB/s of an elementwise pass that reads and writes ``megabytes`` (the device's copy speed)."""
    x = jnp.zeros((megabytes * 2**20 // 4,), jnp.float32)
    compiled = jax.jit(lambda a: a + 1.0).lower(x).compile()
    return 2 * x.nbytes / milliseconds(compiled, (x,), repeats) / 1e6


def rate(row: dict, label: str) -> str:
    if f"{label}_tflops" in row:
        return f"{row[f'{label}_tflops']:.3g} TF/s"
    if f"{label}_gbps" in row:
        return f"{row[f'{label}_gbps']:.3g} GB/s"
    return ""


def parse_shapes(text: str) -> list[Shape]:
    """"4x2048x16x128,1x8192x16x128" -> Shapes (B x T x H x D)."""
    return [Shape(*map(int, item.split("x"))) for item in text.split(",") if item]


GPU_SHAPES = "4x2048x16x128,1x8192x32x128,8x1024x16x64"
GPU_OPS = ("softmax/xla,softmax/cudnn,gla/chunk64,gla/pallas,simple_gla/chunk64,simple_gla/pallas,"
           "linear_attention/pallas,selective_scan/scan,selective_scan/pallas")


def chosen_cases(prefixes: list[str]) -> list[str]:
    """The cases named by ``--ops`` prefixes, in the order the prefixes are given (each prefix's cases in the order
    they are registered): a run stopped early has measured what was listed first."""
    if not prefixes:
        return list(CASES)
    return list(dict.fromkeys(n for p in prefixes for n in CASES if n.startswith(p)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated prefixes of case names, measured in this order "
                        "(default: all)")
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", default="", help="BxTxHxD list, e.g. 4x2048x16x128 (overrides the four above)")
    parser.add_argument("--gpu", action="store_true",
                        help=f"--shapes {GPU_SHAPES} --dtype bfloat16 and the GPU op list")
    parser.add_argument("--copy-mb", type=int,
                        help="array size for the copy-bandwidth pass (default: 2048, 256 on CPU)")
    parser.add_argument("--json", help="also write the rows to this JSON file (rewritten after every row)")
    args = parser.parse_args()
    if args.gpu:
        args.shapes, args.dtype, args.ops = GPU_SHAPES, "bfloat16", args.ops or GPU_OPS

    names = chosen_cases([p for p in args.ops.split(",") if p])
    if BASELINE not in names:
        names.insert(0, BASELINE)
    dtype = jnp.dtype(args.dtype)
    device = jax.devices()[0]
    shapes = parse_shapes(args.shapes) or [Shape(args.batch, int(t), args.heads, args.dim)
                                           for t in args.lengths.split(",")]
    bandwidth = copy_bandwidth(args.copy_mb or (256 if jax.default_backend() == "cpu" else 2048))
    print(f"device: {device.device_kind} ({jax.default_backend()}, {jax.device_count()} device(s)), "
          f"jax {jax.__version__}, {platform.processor() or platform.machine()}; copy bandwidth {bandwidth:.0f} GB/s")
    print(f"dtype={args.dtype}; ratios are to {BASELINE} at the same shape\n")
    rows = JsonRows(args.json, {"device": device.device_kind, "backend": jax.default_backend(),
                                "jax": jax.__version__, "dtype": args.dtype, "copy_gbps": bandwidth})
    header = (f"{'op':<28}{'B x T x H x D':>18}{'fwd ms':>10}{'x base':>8}{'fwd':>11}"
              f"{'fwd+bwd ms':>12}{'x base':>8}{'fwd+bwd':>11}{'fwd+bwd MB':>12}{'compile s':>11}")
    print(header)
    print("-" * len(header))
    for shape in shapes:
        base = measure(BASELINE, shape, dtype, args.repeats)
        for name in names:
            try:
                row = base if name == BASELINE else measure(name, shape, dtype, args.repeats)
            except Unavailable as why:
                print(f"{name:<28}  skipped: {why}")
                continue
            except Exception as error:  # out of memory, a kernel the compiler refuses: report it, time the rest
                print(f"{name:<28}  failed: {str(error).strip().splitlines()[0][:120]}", flush=True)
                continue
            row["fwd_ratio"] = row["fwd_ms"] / base["fwd_ms"]
            row["fwd_bwd_ratio"] = row["fwd_bwd_ms"] / base["fwd_bwd_ms"]
            rows.add(row)
            dims = f"{shape.batch}x{shape.length}x{shape.heads}x{shape.dim}"
            print(f"{name:<28}{dims:>18}{row['fwd_ms']:>10.2f}{row['fwd_ratio']:>8.2f}{rate(row, 'fwd'):>11}"
                  f"{row['fwd_bwd_ms']:>12.2f}{row['fwd_bwd_ratio']:>8.2f}{rate(row, 'fwd_bwd'):>11}"
                  f"{row['fwd_bwd_mb']:>12.1f}{row['fwd_compile_s'] + row['fwd_bwd_compile_s']:>11.1f}", flush=True)
    if jax.default_backend() == "gpu" and (stats := device.memory_stats()):
        print(f"\npeak device memory in this run: {stats.get('peak_bytes_in_use', 0) / 2**30:.2f} GiB")
    rows.close()


if __name__ == "__main__":
    main()
