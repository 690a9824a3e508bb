"""Which kernel ran is part of a run's record: run_info.json names each layer's implementation, and a run
with ``attn.method=jla`` trains through jax-linear-attention (its chunked ops on a CPU)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from lmzoo.model import LM
from lmzoo.ops import kernels
from lmzoo.run.loop import train

needs_jla = pytest.mark.skipif(kernels.jla_ops() is None, reason="jax-linear-attention is not installed")


def test_mixer_kernels_name_each_layer_and_why():
    cfg = tiny_config("gla_softmax", "model.n_layers=4")
    model = LM(cfg, 256, rngs=nnx.Rngs(0))
    layers = model.mixer_kernels(2, 32, documents=True)
    assert [len(ops) for ops in layers] == [1, 1, 1, 1]
    recurrent = [ops[0] for ops in layers[:3]]
    assert all(op["op"] == "gla" for op in recurrent)
    if not kernels.hopper():  # fail-closed: lmzoo's own best form, and the reason
        assert all(op["implementation"] == "lmzoo:chunk" and op["reason"] for op in recurrent)
    assert layers[3] == [{"op": "softmax_attention", "implementation": "lmzoo:xla"}] or layers[3][0]["op"] != "gla"


@pytest.mark.slow
def test_run_info_records_the_kernels(tmp_path):
    train(tiny_config("gated_deltanet", "train.steps=1", run_dir=tmp_path))
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert len(info["kernels"]) == 2
    assert {op["op"] for layer in info["kernels"] for op in layer} == {"delta_rule"}


@pytest.mark.slow
@needs_jla
@pytest.mark.parametrize("variant", ["gla", "gated_deltanet", "mamba2"])
def test_training_through_jla(tmp_path, variant):
    """A smoke run on jla's path: finite losses, as the default form's, and the record says jla ran."""
    common = ("train.steps=2", "train.eval_every=2", "train.log_every=1", "model.dtype=float32")
    losses = {}
    for method in ("jla", "auto"):
        run_dir = tmp_path / method
        train(tiny_config(variant, *common, f"attn.method={method}", run_dir=run_dir))
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[method] = [row["loss"] for row in lines if "loss" in row]
        info = json.loads((run_dir / "run_info.json").read_text())
        implementations = {op["implementation"].split(":")[0] for layer in info["kernels"] for op in layer}
        assert implementations == ({"jla.chunked"} if method == "jla" and not kernels.hopper() else implementations)
    assert np.all(np.isfinite(losses["jla"]))
    np.testing.assert_allclose(losses["jla"], losses["auto"], rtol=1e-4)


@pytest.mark.parametrize("variant", ["gla", "mamba"])
def test_jla_form_needs_jla_at_config_time(capsys, variant):
    if kernels.jla_ops() is not None:
        pytest.skip("jax-linear-attention is installed")
    with pytest.raises(SystemExit):
        tiny_config(variant, "attn.method=jla")
    assert "attn.method=jla needs jax-linear-attention" in capsys.readouterr().err


def test_default_form_is_auto():
    for variant in ("gla", "retnet", "linear", "deltanet", "gated_deltanet", "kda", "deltaproduct", "mamba2", "gdn2",
                    "rwkv7", "rwkv6", "mlstm", "precond_gated_deltanet", "precond_kda", "mamba", "softmax", "gqa",
                    "swa"):
        assert tiny_config(variant).attn.method == "auto", variant
    assert jax.default_backend()  # the default device decides what auto runs
