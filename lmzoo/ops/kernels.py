"""Kernel providers: which implementation runs an op called with ``method="auto"`` or ``method="jla"``.

lmzoo's own forms run everywhere. jax-linear-attention (``jla``, the ``gpu`` extra; Python >= 3.12)
holds Pallas Mosaic GPU kernels for Hopper that compute several of lmzoo's recurrences exactly.
An op that maps onto one of jla's kinds offers two more forms:

- ``"jla"``:  always through ``jla.ops.linear_attention`` with jla's own choice of implementation
  (its Mosaic kernel where it accepts the call, its chunked JAX op elsewhere, e.g. on a CPU);
- ``"auto"``: jla's Mosaic kernel where jla is installed, the device is a Hopper GPU and the kernel
  accepts the call (dtype, head sizes, length), and the op's own best form otherwise. It is
  fail-closed: a call jla's kernel does not take runs lmzoo's reference-checked form, never jla's
  untested paths, so on a CPU ``auto`` computes exactly what the op's default form computes.

Every decision is a ``Choice`` (op, implementation, reason). While a ``recording()`` is open the
choices of the ops traced inside it are collected: ``lmzoo.model.LM.mixer_kernels`` traces each layer's
mixer once to name the implementation each layer runs, which the run's records keep.

An op's mapping onto jla is a ``JlaCall``: jla's kind, q, k, v, gates by jla's names and options
(scale, initial_state, segment_ids), built by the op so that jla computes the op's own contract
(scales, gate layouts, which state a read sees); ``tests/ops/test_kernels.py`` checks each mapping against
the op's reference form. A kind jla qualifies no GPU kernel for (``rwkv6``; ``mlstm``, whose Mosaic kernel jla
registers opt-in only) is mapped all the same: ``jla`` runs jla's chunked op, and ``auto`` runs the op's own form
with that reason, until a jla that qualifies a kernel for the kind gets the call.

On a TPU, ``auto`` runs deltanet-tpu (the ``tpu`` extra; Python >= 3.12) instead: Pallas TPU kernels of the
GDN-2 rule ``S' = diag(exp(g)) S;  S = S' + k (w * v - S'^T (b * k))^T;  o = scale S^T q``, of which GLA
(b = 0, w = 1), DeltaNet (g = 0, b = w = beta), Gated DeltaNet (g per head) and KDA (g per key channel) are
the cases. An op's jla mapping already states its algebra in one of these kinds (gla, simple_gla, deltanet,
gated_deltanet, kda, gdn2), so ``tpu_gates`` turns it into GDN-2's (g, b, w) and one jitted call runs every
kind. Its kernels take K = V = 128 (chunk 128, any length), q, k, v in float32 or bfloat16 and a concrete
scale; a call outside that runs the op's own best form, recorded with the reason, as for jla. The kernels'
matmuls follow the inputs' dtype (``"fp32"`` precision for float32, ``"bf16"`` for bfloat16) and their state
recurrence is float32 either way. Off a TPU its kernels run in Pallas interpret mode, which the tests use.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp

AUTO, JLA, TPU = "auto", "jla", "deltanet_tpu"
PROVIDER_FORMS = (AUTO, JLA)


@dataclass(frozen=True)
class Choice:
    """Which implementation an op ran: ``"jla.mosaic_gpu:<kind>"``, ``"jla.<impl>:<kind>"``,
    ``"deltanet_tpu:<kind>"`` or ``"lmzoo:<form>"``, and, for a fallback under ``auto``, why the provider's
    kernel did not run."""

    op: str
    implementation: str
    reason: str = ""

    def as_dict(self) -> dict:
        reason = {"reason": self.reason} if self.reason else {}
        return {"op": self.op, "implementation": self.implementation, **reason}


@dataclass
class JlaCall:
    """One call of ``jla.ops.linear_attention``: the kind, q, k, v, the gates by jla's names, options; and the
    provider that runs it (``JLA``, or ``TPU`` where ``resolve`` gives it to deltanet-tpu)."""

    kind: str
    q: jax.Array
    k: jax.Array
    v: jax.Array
    gates: dict
    options: dict = field(default_factory=dict)
    provider: str = JLA

    def describe(self) -> str:
        return f"{self.q.dtype} q {list(self.q.shape)}, v {list(self.v.shape)}"


_LOG: contextvars.ContextVar[list | None] = contextvars.ContextVar("lmzoo_kernel_choices", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Collect the ``Choice`` of every op traced inside the block, in call order."""
    choices: list = []
    token = _LOG.set(choices)
    try:
        yield choices
    finally:
        _LOG.reset(token)


def traced_choices(fn, *args) -> list:
    """The ``Choice`` of every op ``fn(*args)`` calls, from tracing it once (nothing runs). Nested jits are
    traced afresh (``disable_jit``), so a cached trace hides no op."""
    with recording() as choices, jax.disable_jit():
        jax.eval_shape(fn, *args)
    return choices


def _record(choice: Choice) -> None:
    log = _LOG.get()
    if log is not None:
        log.append(choice)


def record(op: str, implementation: str) -> None:
    """Record that ``op`` runs ``implementation`` (an op choosing among providers itself, e.g. attention)."""
    _record(Choice(op, implementation))


@functools.cache
def jla_ops():
    """``jla.ops`` with its Mosaic GPU kernels registered, or None where jla is not installed."""
    try:
        import jla.ops
    except ImportError:
        return None
    jla.ops.available("gla")  # loads and registers the Mosaic GPU kernels, where this jax has them
    return jla.ops


def hopper() -> bool:
    """True when the default device is a Hopper (sm_90) GPU, where jla's Mosaic kernels run."""
    device = jax.devices()[0]
    return device.platform == "gpu" and getattr(device, "compute_capability", None) == "9.0"


def _kernel_refusal(call: JlaCall) -> str:
    """Why jla's Mosaic kernel would not run ``call`` ("" when it would)."""
    ops = jla_ops()
    entry = getattr(ops, "_REGISTRY", {}).get("mosaic_gpu", {}).get(call.kind)
    if entry is None or not entry[2]:
        return f"jla has no GPU-tested Mosaic kernel for {call.kind}"
    _, supports, _ = entry
    names = ops.KINDS[call.kind][1]
    if not supports(call.q, call.k, call.v, *(call.gates[n] for n in names), **_options(call)):
        return f"jla's {call.kind} kernel does not take this call ({call.describe()})"
    return ""


@functools.cache
def jla_attention():
    """jla's causal softmax attention kernel for Hopper (``flash_attention``), or None where jla is not installed."""
    try:
        from jla.ops.mosaic_gpu.attention import flash_attention
    except ImportError:
        return None
    return flash_attention


def attention_refusal(q, k, v, *, causal: bool, bias) -> str:
    """Why jla's attention kernel would not run this softmax attention ("" when it would): it computes causal
    attention over one sequence (T = S) with grouped key/value heads, documents and a window, no additive bias."""
    refusal = _platform_refusal()
    if refusal:
        return refusal
    if bias is not None or not causal or q.shape[1] != k.shape[1]:
        return "jla's attention kernel takes no bias, only causal attention of T queries over T keys"
    from jla.ops.mosaic_gpu.attention import supported

    reason = supported(q, k, v)
    return f"jla's attention kernel does not take this call: {reason}" if reason else ""


def _options(call: JlaCall) -> dict:
    return {"output_final_state": True, **call.options}


def _platform_refusal() -> str:
    """Why no jla kernel runs here at all ("" on a Hopper GPU with jla installed)."""
    if jla_ops() is None:
        return "jax-linear-attention is not installed (the gpu extra, Python >= 3.12)"
    device = jax.devices()[0]
    return "" if hopper() else f"the device is {device.platform} ({device.device_kind}), not a Hopper GPU"


def resolve(op: str, method: str, best: str, call: Callable[[], JlaCall]) -> tuple[str, JlaCall | None]:
    """The form ``op`` runs for ``method`` (``"jla"``, ``"deltanet_tpu"`` or one of lmzoo's forms) and, for a
    provider, the op's mapping (None for lmzoo's forms); records the choice.

    ``best`` is the op's own form for ``auto`` when no provider's kernel runs; ``call`` builds the
    op's jla mapping, only where a provider could run it. Runs at trace time, so every trace records what it ran."""
    if method == JLA:
        if jla_ops() is None:
            raise ValueError(f"method='jla' needs jax-linear-attention: pip install -e '.[gpu]' (Python >= 3.12); "
                             f"method='auto' runs lmzoo's {best!r} form without it")
        mapped = call()
        impl = "chunked" if _platform_refusal() or _kernel_refusal(mapped) else "mosaic_gpu"
        _record(Choice(op, f"jla.{impl}:{mapped.kind}"))
        return JLA, mapped
    if method != AUTO:
        note(op, method)
        return method, None
    if on_tpu():
        return _resolve_tpu(op, best, call)
    refusal = _platform_refusal()
    mapped = None if refusal else call()
    refusal = refusal or _kernel_refusal(mapped)
    if refusal:
        note(op, best, refusal)
        return best, None
    _record(Choice(op, f"jla.mosaic_gpu:{mapped.kind}"))
    return JLA, mapped


def note(op: str, form: str, reason: str = "") -> None:
    """Record that ``op`` runs lmzoo's ``form`` (and why, where ``auto`` chose it)."""
    _record(Choice(op, f"lmzoo:{form}", reason))


def dispatch(op: str, method: str, best: str, call: Callable[[], JlaCall], own: Callable[[str], tuple], dtype):
    """(o, final state) of ``op``: through a provider where ``resolve`` says so (o in ``dtype``), else ``own(form)``."""
    form, mapped = resolve(op, method, best, call)
    if mapped is None:
        return own(form)
    out, state = run(mapped)
    return out.astype(dtype), state


def state_or_none(initial_state):
    """An initial state for jla in float32 (an array, or a tuple of them: mLSTM's (C, n, m)), or None: a kernel
    given no state skips reading one."""
    return None if initial_state is None else jax.tree.map(lambda s: s.astype(jnp.float32), initial_state)


def run(call: JlaCall):
    """(o, final_state) of ``call`` through its provider: deltanet-tpu's GDN-2 kernels, or jla with its own
    choice of implementation (Mosaic where its kernel takes the call, chunked JAX otherwise)."""
    if call.provider == TPU:
        return run_tpu(call)
    return jla_ops().linear_attention(call.kind, call.q, call.k, call.v, impl="auto", **call.gates, **_options(call))


# ----------------------------------------------------------------------------- deltanet-tpu (on a TPU)

# The ops whose jla kinds are cases of GDN-2 (linear_attention and delta_product run as gla and delta_rule); dplr,
# comba, precond_delta_rule, mamba3 and selective_scan map onto rwkv7, mamba3 and mamba1, whose updates GDN-2 cannot
# state (the preconditioned rule only by dividing by beta, which GDN-2's erase gate would then carry).
TPU_OPS = ("gla", "delta_rule", "gdn2", "ssd")
TPU_WIDTH = 128  # the kernels' K, V and chunk
TPU_DTYPES = ("float32", "bfloat16")


@functools.cache
def tpu_kernel():
    """deltanet-tpu's ``chunk_gdn2``, or None where deltanet-tpu is not installed."""
    try:
        from deltanet_tpu import chunk_gdn2
    except ImportError:
        return None
    return chunk_gdn2


def on_tpu() -> bool:
    """True when the default backend is a TPU, where ``auto`` offers calls to deltanet-tpu."""
    return jax.default_backend() == "tpu"


def _resolve_tpu(op: str, best: str, call: Callable[[], JlaCall]) -> tuple[str, JlaCall | None]:
    """``auto`` on a TPU: deltanet-tpu where it takes the op's mapping, else ``best``, recorded with the reason."""
    if tpu_kernel() is None:
        refusal = "deltanet-tpu is not installed (the tpu extra, Python >= 3.12)"
    elif op not in TPU_OPS:
        refusal = f"deltanet-tpu has no kernel for {op}"
    else:
        mapped = call()
        refusal = tpu_refusal(mapped)
    if refusal:
        note(op, best, refusal)
        return best, None
    _record(Choice(op, f"{TPU}:{mapped.kind}"))
    return TPU, replace(mapped, provider=TPU)


def tpu_refusal(call: JlaCall) -> str:
    """Why deltanet-tpu's kernels would not run ``call`` ("" when they would)."""
    if call.kind not in _TPU_GATES:
        return f"deltanet-tpu has no kernel for jla's {call.kind}"
    d_key, d_value = call.k.shape[-1], call.v.shape[-1]
    if (d_key, d_value) != (TPU_WIDTH, TPU_WIDTH):
        return f"deltanet-tpu's kernels take K = V = {TPU_WIDTH}, not K = {d_key}, V = {d_value}"
    dtypes = sorted({str(jnp.dtype(x.dtype)) for x in (call.q, call.k, call.v)})
    if len(dtypes) > 1 or dtypes[0] not in TPU_DTYPES:
        return f"deltanet-tpu's kernels take q, k, v in one of {', '.join(TPU_DTYPES)}, not {', '.join(dtypes)}"
    if not isinstance(call.options.get("scale"), numbers.Real):
        return "deltanet-tpu's kernels take a Python float scale, not a traced one"
    extra = sorted(name for name, value in call.options.items()
                   if name not in _TPU_OPTIONS and value is not None and value is not False)
    return f"deltanet-tpu's kernels take no {', '.join(extra)}" if extra else ""


_TPU_OPTIONS = ("scale", "initial_state", "segment_ids")  # use_qk_l2norm=False is taken too: it normalises nothing


def _per_channel(x, shape) -> jax.Array:
    """A gate (a number, [B,T,H], [B,T,H,1] or [B,T,H,D]) as [B,T,H,D] float32."""
    x = jnp.asarray(x, jnp.float32)
    return jnp.broadcast_to(x[..., None] if x.ndim == 3 else x, shape)


# jla kind -> GDN-2's (log decay g, erase gate b, write gate w): each kind is GDN-2 with these gates
_TPU_GATES = {
    "gla": lambda gates: (gates["g"], 0.0, 1.0),
    "simple_gla": lambda gates: (gates["g"], 0.0, 1.0),
    "deltanet": lambda gates: (0.0, gates["beta"], gates["beta"]),
    "gated_deltanet": lambda gates: (gates["g"], gates["beta"], gates["beta"]),
    "kda": lambda gates: (gates["g"], gates["beta"], gates["beta"]),
    "gdn2": lambda gates: (gates["g"], gates["b"], gates["w"]),
}


def tpu_gates(call: JlaCall) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GDN-2's (g, b, w) for ``call``'s kind: g and b [B,T,H,K], w [B,T,H,V], float32."""
    g, b, w = _TPU_GATES[call.kind](call.gates)
    return _per_channel(g, call.k.shape), _per_channel(b, call.k.shape), _per_channel(w, call.v.shape)


def run_tpu(call: JlaCall):
    """(o in v's dtype, final state [B,H,K,V] float32) of ``call`` through deltanet-tpu's ``chunk_gdn2``."""
    g, b, w = tpu_gates(call)
    precision = "fp32" if call.v.dtype == jnp.float32 else "bf16"
    return _chunk_gdn2(call.q, call.k, call.v, g, b, w, call.options.get("initial_state"),
                       call.options.get("segment_ids"), scale=float(call.options["scale"]), precision=precision)


@functools.partial(jax.jit, static_argnames=("scale", "precision"))
def _chunk_gdn2(q, k, v, g, b, w, initial_state, segment_ids, *, scale, precision):
    """One jitted call for every kind (a kind only changes the gates' values), so each shape compiles once.
    ``mask_lambda_by_doc`` keeps a strongly decayed document from costing the next one in its chunk precision
    (lmzoo's forms are exact however strong the gates); the state's matmuls stay float32 in bf16 precision."""
    return tpu_kernel()(q, k, v, g, b, w, initial_state=initial_state, segment_ids=segment_ids,
                        output_final_state=True, chunk_size=TPU_WIDTH, precision=precision, scale=scale,
                        mask_lambda_by_doc=segment_ids is not None, state_fp32_matmul=True)
