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
the op's reference form.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

AUTO, JLA = "auto", "jla"
PROVIDER_FORMS = (AUTO, JLA)


@dataclass(frozen=True)
class Choice:
    """Which implementation an op ran: ``"jla.mosaic_gpu:<kind>"``, ``"jla.<impl>:<kind>"`` or
    ``"lmzoo:<form>"``, and, for a fallback under ``auto``, why jla's kernel did not run."""

    op: str
    implementation: str
    reason: str = ""

    def as_dict(self) -> dict:
        reason = {"reason": self.reason} if self.reason else {}
        return {"op": self.op, "implementation": self.implementation, **reason}


@dataclass
class JlaCall:
    """One call of ``jla.ops.linear_attention``: the kind, q, k, v, the gates by jla's names, options."""

    kind: str
    q: jax.Array
    k: jax.Array
    v: jax.Array
    gates: dict
    options: dict = field(default_factory=dict)

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
    """The form ``op`` runs for ``method`` (``"jla"`` or one of lmzoo's forms) and, for ``"jla"``, the op's jla
    mapping; records the choice.

    ``best`` is the op's own form for ``auto`` when jla's kernel does not run; ``call`` builds the
    op's jla mapping, only where jla could run it. Runs at trace time, so every trace records what it ran."""
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
    """(o, final state) of ``op``: through jla where ``resolve`` says so (o in ``dtype``), else ``own(form)``."""
    form, mapped = resolve(op, method, best, call)
    if form != JLA:
        return own(form)
    out, state = run(mapped)
    return out.astype(dtype), state


def state_or_none(initial_state):
    """An initial state for jla in float32, or None: a kernel given no state skips reading one."""
    return None if initial_state is None else initial_state.astype(jnp.float32)


def run(call: JlaCall):
    """(o, final_state) of ``call`` through jla, its implementation chosen by jla (Mosaic where its kernel
    takes the call, chunked JAX otherwise)."""
    return jla_ops().linear_attention(call.kind, call.q, call.k, call.v, impl="auto", **call.gates, **_options(call))
