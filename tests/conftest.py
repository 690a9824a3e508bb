"""Shared helpers: tiny configs that compile and run in seconds on a CPU."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tensorboardX.proto.event_pb2 import Event


def share_compiled_programs() -> None:
    """One persistent XLA compilation cache for the test session: its workers and the training
    processes they start. Dozens of tests compile the same tiny model's programs, and compiling
    dominates the suite's time. Set before JAX is first imported, so the environment configures it;
    made by the first process (the xdist controller, whose environment the workers inherit)."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    cache = tempfile.mkdtemp(prefix="lmzoo-test-xla-cache-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


share_compiled_programs()


@pytest.fixture(autouse=True, scope="session")
def programs_compiled_in_a_test_process_not_written():
    """The test processes themselves read and write no persistent cache; the training processes they start do.
    Writing an executable (``serialize``) segfaulted a worker in a full run of CI's script (jax 0.10.2, torch
    loaded beside it), and CI's own run lost a worker without a word in another test; a training process that
    crashed so would fail one test, not take a worker and its queue down. The test processes' own programs gain
    nothing from it: tests/mixers' and tests/run's quick subsets take the same time without it (326 s, 103 s)."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    yield


@pytest.fixture(autouse=True, scope="module")
def compiled_programs_freed_after_each_module():
    """Each test module's compiled programs are dropped when it ends. A worker runs hundreds of modules, and the
    executables JAX's caches keep grew a worker by about 0.2 GiB a minute of a full run, toward the 24 GiB two
    workers share on CI (where one crashed). A program another module compiles again comes back from the
    persistent cache above."""
    yield
    import jax  # imported by then: every module that compiled anything imported it

    jax.clear_caches()
    gc.collect()


LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def xla_accepts(flag: str) -> bool:
    """Whether this jaxlib's XLA knows ``flag``: it aborts the process on an unknown one, so a child tries it."""
    probe = "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def compile_quickly() -> None:
    """LLVM's cheapest optimisation level for every program the tests compile, here and in the processes
    they start (which inherit the environment). Compiling, not running, is what tiny test programs spend
    their time on (two tiny training runs: 194 s at the default level, 112 s at 0, on a loaded 2-core CPU).
    Where this XLA still has them, the CPU's elemental emitters instead of its fusion emitters: they compile
    a model's gradient in about half the time and run these tiny programs as fast. One setting everywhere,
    so bit-for-bit comparisons inside the suite (resumes, layouts) compare like with like. Set by the first
    process (the xdist controller), whose environment the workers inherit."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_backend_optimization_level=0" in flags:
        return
    quick = ["--xla_backend_optimization_level=0"] + ([LEGACY_EMITTERS] if xla_accepts(LEGACY_EMITTERS) else [])
    os.environ["XLA_FLAGS"] = " ".join([flags, *quick]).strip()


compile_quickly()

from lmzoo.cli import compose_and_validate  # noqa: E402  (after the cache is configured)
from lmzoo.config import variant_names  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VARIANTS = variant_names()


QUICK_VARIANTS = ("softmax", "gla", "mamba")  # the default run's three families


def variant_case(item) -> str | None:
    """The variant a parametrized test case is for, when its parameters name one (``comba``, ``softmax
    attn.window=4``, a config whose id is a variant's name); None for other tests."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    words = [v.split()[0] for v in callspec.params.values() if isinstance(v, str) and v.strip()]
    return next((w for w in [*words, *callspec.id.split("-")] if w in VARIANTS), None)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers added here
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` / ``tpu`` run only where JAX's default backend is that device. A test run for
    every variant is marked ``slow`` for all but the default run's three families, so the quick subset
    (``-m "not slow"``) checks each protocol on softmax, gla and mamba and the full suite on every variant.
    Tests marked ``slow`` (a minute or two each) go first: xdist hands tests out in this order, so they
    start at once on every worker instead of running alone at the end while the other workers idle."""
    from lmzoo.ops.pallas.common import current_platform

    here = current_platform()
    for item in items:
        for device in ("gpu", "tpu"):
            if item.get_closest_marker(device) and here != device:
                item.add_marker(pytest.mark.skip(reason=f"needs a {device.upper()}; JAX runs on {here}"))
        if (variant := variant_case(item)) is not None and variant not in QUICK_VARIANTS:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the rest keep their order

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=4",
    "data.seq_len=32",
    "train.batch_size=8",
    "train.eval_tokens=512",
    "train.progress=false",
]


def tiny_config(variant: str = "softmax", *overrides: str, run_dir: str | os.PathLike = "."):
    """A validated Config for ``variant`` at test size."""
    return compose_and_validate([f"+attn={variant}", *TINY, f"run_dir={run_dir}", *overrides])


def run_lmzoo(*args: str, env: dict | None = None, timeout: float = 300,
              check: bool = False) -> subprocess.CompletedProcess:
    """``python -m lmzoo.train <args>`` in a fresh interpreter (its exit code and output are the test)."""
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@functools.cache
def covering_layers(variant: str) -> int:
    """The fewest layers (at least the tiny model's 2) at which ``variant``'s model builds every
    distinct layer spec it can: a hybrid's pattern may need more layers to reach its every sub-config."""
    attn = tiny_config(variant).attn

    def kinds(n: int) -> set[str]:
        return {repr(attn.for_layer(i, n)) for i in range(n)}

    candidates = range(2, 9)
    most = max(len(kinds(n)) for n in candidates)
    return next(n for n in candidates if len(kinds(n)) == most)


def layer_kinds(attn, n: int) -> set[str]:
    """The distinct layer specs a model of ``n`` layers builds from ``attn``."""
    return {repr(attn.for_layer(i, n)) for i in range(n)}


@functools.cache
def fewest_layers(variant: str, at_least: int = 2) -> tuple[str, ...]:
    """Overrides that build every distinct layer spec of ``variant``'s model in the fewest layers (at least
    ``at_least``): a hybrid's pattern that repeats a kind (gla, gla, gla, softmax) shortened to one layer of
    each kind (gla, softmax), in order. Compiling a model takes time in proportion to its layers; a check
    made of every layer kind needs each kind once."""
    attn = tiny_config(variant).attn
    every = layer_kinds(attn, covering_layers(variant))
    pattern = getattr(attn, "pattern", None)
    if pattern and len(set(pattern)) < len(pattern):
        once = list(dict.fromkeys(pattern))
        overrides = (f"attn.pattern=[{','.join(once)}]", f"model.n_layers={max(at_least, len(once))}")
        shortened = tiny_config(variant, *overrides)
        if layer_kinds(shortened.attn, shortened.model.n_layers) == every:
            return overrides
    n = next(n for n in range(at_least, 9) if layer_kinds(attn, n) == every)
    return (f"model.n_layers={n}",)


def layers_to_check(variant: str) -> tuple[str, ...]:
    """``fewest_layers`` for a check made for every variant: two layers at least for the default run's three
    families, whose cases check what the shared model code hands each layer above the first; one of each kind
    for every other variant, whose case adds its own layers' mixing."""
    return fewest_layers(variant, 2 if variant in QUICK_VARIANTS else 1)


def layer_specs(variant: str) -> list:
    """The spec of every layer of ``variant``'s model at ``covering_layers``, bottom first."""
    n = covering_layers(variant)
    attn = tiny_config(variant).attn
    return [attn.for_layer(i, n) for i in range(n)]


@pytest.fixture
def tiny():
    return tiny_config


def read_events(path: Path):
    """The events of one TFRecord file; a record cut short by a kill ends it."""
    data = path.read_bytes()
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        end = offset + 12 + length + 4
        if end > len(data):
            return
        yield Event.FromString(data[offset + 12:offset + 12 + length])
        offset = end
