"""A training step of every variant lowers for a TPU on this CPU: the program a TPU would run, Pallas kernels (lmzoo's
own and deltanet-tpu's) through Mosaic, without the device.

``as_on_a_tpu`` makes tracing see a TPU: ``jax.default_backend()`` answers "tpu", so lmzoo's Pallas wrappers pick the
Mosaic path and ``attn.method=auto`` picks deltanet-tpu where it fits; an abstract mesh names the TPU generation
Mosaic lowers for (a v6e, as deltanet-tpu is tested on). ``lower(lowering_platforms=("tpu",))`` then lowers the
jitted step. It stops before the TPU compiler: what that alone rejects (VMEM limits at other shapes, say) shows
only on a TPU (``scripts/tpu_all.py``).
"""

from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import pytest
from conftest import VARIANTS, layers_to_check, tiny_config
from flax import nnx

from lmzoo.model import LM
from lmzoo.ops import kernels
from lmzoo.run.steps import init_train_state, train_step

TPU_KIND = "TPU v6 lite"  # jax's device kind of a TPU v6e


@contextlib.contextmanager
def as_on_a_tpu():
    """Tracing inside sees a TPU (see the module's docstring); nothing may run inside."""
    device = jax.sharding.AbstractDevice(device_kind=TPU_KIND, num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("data",), abstract_device=device)
    with pytest.MonkeyPatch.context() as patch, jax.sharding.use_abstract_mesh(mesh):
        patch.setattr(jax, "default_backend", lambda: "tpu")
        yield


def _config(variant: str, *overrides: str):
    """``variant`` in its Pallas form where it has one, else in its default form."""
    try:
        return tiny_config(variant, *layers_to_check(variant), "attn.method=pallas", *overrides)
    except SystemExit:  # the variant has no Pallas form
        return tiny_config(variant, *layers_to_check(variant), *overrides)


def lowered_step(cfg, length: int = 32, documents: bool = False) -> tuple[str, list]:
    """(the step's lowered text for a TPU, the implementation each layer runs there)."""
    model = LM(cfg, 256, rngs=nnx.Rngs(0))
    graphdef, state, tx = init_train_state(cfg, model)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    tokens = jax.ShapeDtypeStruct((2, length), jnp.int32)
    batch = {"inputs": tokens, "targets": tokens, **({"segment_ids": tokens} if documents else {})}
    with as_on_a_tpu():
        implementations = [op["implementation"] for ops in model.mixer_kernels(2, length, documents) for op in ops]
        lowered = jax.jit(partial(train_step, graphdef, tx)).trace(state, batch).lower(lowering_platforms=("tpu",))
    return lowered.as_text(), implementations


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_step_lowers_for_a_tpu(variant):
    cfg = _config(variant)
    text, implementations = lowered_step(cfg)
    assert "func.func public @main" in text
    if getattr(cfg.attn, "method", None) == "pallas":  # lmzoo's own kernels, through Mosaic
        assert "lmzoo:pallas" in implementations and "tpu_custom_call" in text, implementations


@pytest.mark.skipif(kernels.tpu_kernel() is None, reason="deltanet-tpu is not installed (the tpu extra)")
@pytest.mark.parametrize("variant, kind, keys", [("gla", "gla", ["attn.key_ratio=1.0"]),
                                                ("gated_deltanet", "gated_deltanet", []), ("gdn2", "gdn2", [])])
def test_training_step_through_deltanet_tpu_lowers_for_a_tpu(variant, kind, keys):
    """At head sizes 128 ``auto`` gives the mixers to deltanet-tpu, whose kernels lower with the step, documents too."""
    cfg = tiny_config(variant, "model.d_model=256", "model.n_heads=2", *keys, "model.n_layers=1")
    text, implementations = lowered_step(cfg, length=160, documents=True)
    assert implementations == [f"deltanet_tpu:{kind}"] and "tpu_custom_call" in text
