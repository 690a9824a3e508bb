"""A trained GLA run exported for flash-linear-attention gives fla's GLAForCausalLM lmzoo's log-probabilities.

fla runs its layers through Triton kernels; on a machine without a GPU they run under Triton's
interpreter (``TRITON_INTERPRET=1``, set before fla is imported), with each autotuned kernel taking
its first configuration (the interpreter has nothing to time). Tests needing fla skip where it or
triton is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import tiny_config
from test_export import TEXTS, lmzoo_log_probs, train_tiny

from lmzoo import export
from lmzoo.config import ConfigError
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.interop import fla, fla_deltanet, fla_gated_deltanet, fla_gla, fla_kda, fla_mamba2, fla_retnet, llama
from lmzoo.interop.hf import export_hf, parameters
from lmzoo.model import LM
from lmzoo.record.opening import Trained, open_trained

# Over 64 tokens fla's GLA runs its chunked kernel (up to 64 its recurrent one), whose loops Triton's interpreter
# cannot run (``range`` gives the kernel a Python int): on a CPU only the recurrent kernel is checked.
LONG = "for i in range(10):\n    print(i, i * i)\n" * 3
EXACT = ("model.norm_eps=1e-5",)  # fla's one norm_eps is lmzoo's GLA head-norm epsilon only at this setting


# Run in a fresh interpreter: TRITON_INTERPRET is read as kernels are defined, and this process may have
# imported triton (through torch) before. Prints fla's class name, then writes ids and log-probs per text.
FLA_SCRIPT = """
import json, sys
import numpy as np
import torch
if not torch.cuda.is_available():
    import triton.runtime.autotuner as autotuner
    every = autotuner.Autotuner.prune_configs
    autotuner.Autotuner.prune_configs = lambda self, kwargs: every(self, kwargs)[:1]  # nothing to time
import fla  # registers fla's model classes with transformers
import transformers
folder, texts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
device = "cuda" if torch.cuda.is_available() else "cpu"
model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval().to(device)
tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
arrays = {}
for i, text in enumerate(texts):
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=device)).logits[0].double()
    arrays[f"ids{i}"], arrays[f"log_probs{i}"] = np.asarray(ids), torch.log_softmax(logits, -1).cpu().numpy()
np.savez(out, **arrays)
print(type(model).__name__)
"""


def fla_log_probs(folder, texts, tmp_path):
    """fla's class name, and per text its token ids and next-token log-probabilities, from a fresh interpreter
    (on a CPU with fla's kernels run by Triton's interpreter, each autotuned kernel at its first configuration)."""
    torch = pytest.importorskip("torch")
    for name in ("transformers", "triton", "fla"):
        pytest.importorskip(name)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    out = tmp_path / "fla_log_probs.npz"
    proc = subprocess.run([sys.executable, "-c", FLA_SCRIPT, str(folder), json.dumps(texts), str(out)], env=env,
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arrays = np.load(out)
    return proc.stdout.split()[-1], [(arrays[f"ids{i}"].tolist(), arrays[f"log_probs{i}"]) for i in range(len(texts))]


def assert_refused_in_one_line(module, cfg, named) -> None:
    """``module.check_exportable(cfg)`` raises one line naming each setting in ``named``."""
    with pytest.raises(ConfigError) as error:
        module.check_exportable(cfg)
    message = str(error.value)
    assert "\n" not in message and all(name in message for name in named), message


@pytest.mark.parametrize("variant, overrides, named", [
    ("gla", (), ("model.norm_eps=1e-06",)),
    ("gla", ("attn.gate_rank=8", "attn.gate_temperature=4", "model.mlp=false"),
     ("attn.gate_rank=8", "attn.gate_temperature=4.0", "model.mlp=false")),
    ("softmax", EXACT, ("attn.mixer=softmax",)),
    ("gla_softmax", (*EXACT, "model.n_layers=4"), ("attn.mixer=softmax",)),  # its 4th layer
])
def test_settings_fla_gla_lacks_are_refused_in_one_line_naming_each(variant, overrides, named):
    assert_refused_in_one_line(fla_gla, tiny_config(variant, *overrides), named)


def test_gla_at_the_head_norm_epsilon_maps_exactly():
    assert fla_gla.refusals(tiny_config("gla", *EXACT)) == []
    assert fla_gla.refusals(tiny_config("gla", *EXACT, "attn.key_ratio=1.0", "model.tie_embeddings=false")) == []


@pytest.mark.slow  # importing fla (and transformers) takes 20-50 s on a busy CPU
@pytest.mark.parametrize("tied", [True, False])
def test_the_weight_table_round_trips_and_fills_every_fla_tensor(tied):
    from flax import nnx

    cfg = tiny_config("gla", *EXACT, f"model.tie_embeddings={str(tied).lower()}")
    params = parameters(LM(cfg, 259, rngs=nnx.Rngs(0)))
    table = fla_gla.tensors(cfg.model.n_layers, tied)
    weights = llama.to_hf(params, cfg.model.n_layers, tied, table)
    back = llama.from_hf(weights, cfg.model.n_layers, tied, table)
    assert back.keys() == params.keys()
    for path, value in params.items():
        np.testing.assert_array_equal(back[path], value)
    torch, fla_models = pytest.importorskip("torch"), pytest.importorskip("fla.models")  # no forward: no kernel runs
    hf = fla_gla.hf_config(cfg, 259, bos_id=256, eos_id=257, pad_id=258)
    config = fla_models.GLAConfig(**{k: v for k, v in hf.items()
                                     if k not in ("architectures", "model_type", "torch_dtype")})
    model = fla_models.GLAForCausalLM(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()
                if not (tied and name == "lm_head.weight")}
    assert {name: a.shape for name, a in weights.items()} == expected
    model.load_state_dict({name: torch.tensor(a) for name, a in weights.items()}, strict=not tied)


def export_and_compare(tmp_path, texts, overrides, atol, variant="gla", architecture="GLAForCausalLM"):
    """Train a tiny run of ``variant``, export it for fla, and compare fla's next-token log-probabilities with
    lmzoo's; the largest difference."""
    run = train_tiny(tmp_path / "run", variant, *EXACT, *overrides)
    out = export.main([f"run_dir={run}", f"out={tmp_path / 'fla'}", "format=fla"])
    trained = open_trained(run)
    name, results = fla_log_probs(out, texts, tmp_path)
    assert name == architecture
    worst = 0.0
    for text, (ids, log_probs) in zip(texts, results):
        assert ids == trained.data.tokenizer.encode(text).tolist()  # the byte-level file tokenises as lmzoo does
        ours = lmzoo_log_probs(trained, ids)
        np.testing.assert_allclose(log_probs, ours, atol=atol)
        worst = max(worst, float(np.abs(log_probs - ours).max()))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [(), ("model.tie_embeddings=false", "attn.key_ratio=1.0")])
def test_an_exported_gla_run_loads_in_fla_with_the_same_log_probs(tmp_path, overrides):
    export_and_compare(tmp_path, TEXTS, overrides, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
def test_fla_chunked_gla_kernel_gives_the_same_log_probs_on_a_gpu(tmp_path):
    # 1e-3, not 1e-4: on a GPU both sides' float32 matrix products may run in TF32 (fla's tl.dot, XLA's default).
    export_and_compare(tmp_path, [*TEXTS, LONG], ("model.tie_embeddings=false",), atol=1e-3)


def test_export_to_fla_refuses_before_writing_anything(tmp_path):
    from flax import nnx

    cfg = tiny_config("gla")  # model.norm_eps=1e-6: the head norm's 1e-5 would differ in fla
    trained = Trained(cfg, SimpleNamespace(tokenizer=ByteTokenizer()), LM(cfg, 259, rngs=nnx.Rngs(0)), 0)
    with pytest.raises(ConfigError, match="model.norm_eps=1e-06"):
        export_hf(trained, tmp_path / "fla", target=fla_gla)
    assert list(tmp_path.iterdir()) == []


def test_format_fla_is_a_choice_of_export():
    assert export.parse_args(["run_dir=r", "out=o", "format=fla"]).format == "fla"
    with pytest.raises(ConfigError, match="hf, fla"):
        export.parse_args(["run_dir=r", "out=o", "format=gla"])


def test_an_fla_gla_config_lmzoo_lacks_is_refused_in_one_line_naming_each():
    hf = {"model_type": "gla", "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "intermediate_size": 96}
    with pytest.raises(ConfigError) as error:
        fla_gla.lmzoo_settings({**hf, "use_short_conv": True})  # and fla's default norm_eps, 1e-6
    message = str(error.value)
    assert "\n" not in message and "use_short_conv=true" in message and "norm_eps=1e-06" in message, message
    settings = fla_gla.lmzoo_settings({**hf, "norm_eps": 1e-5, "expand_k": 1.0})
    assert settings["attn"] == {"name": "gla", "mixer": "gla", "key_ratio": 1.0}
    assert settings["model"]["d_ff"] == 96 and settings["model"]["norm_eps"] == 1e-5


@pytest.mark.slow
def test_a_random_fla_gla_opens_in_lmzoo_with_the_same_log_probs(tmp_path):
    torch, fla_models = pytest.importorskip("torch"), pytest.importorskip("fla.models")  # no forward in this process
    from lmzoo.interop.hf import open_hf, write_tokenizer

    torch.manual_seed(0)
    config = fla_models.GLAConfig(hidden_size=32, num_hidden_layers=2, num_heads=4, vocab_size=259, norm_eps=1e-5,
                                  hidden_ratio=2, bos_token_id=256, eos_token_id=257, pad_token_id=258)
    model = fla_models.GLAForCausalLM(config)
    with torch.no_grad():  # far from the initialisation, so that every weight shows in the log-probabilities
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    folder = tmp_path / "fla"
    model.save_pretrained(folder)
    write_tokenizer(ByteTokenizer(), folder, max_length=64)
    trained = open_hf(folder)
    assert trained.cfg.attn.mixer == "gla" and trained.cfg.model.d_ff == 256  # GatedMLP's width from hidden_ratio
    name, results = fla_log_probs(folder, TEXTS, tmp_path)
    assert name == "GLAForCausalLM"
    for ids, log_probs in results:
        np.testing.assert_allclose(log_probs, lmzoo_log_probs(trained, ids), atol=1e-4)


# ----------------------------------------------------------------------------- the delta-rule classes

QK = ("attn.qk_norm_eps=1e-6",)  # fla's q/k L2 norm: x / sqrt(|x|^2 + 1e-6)
DELTA = [("gated_deltanet", fla_gated_deltanet, "GatedDeltaNetForCausalLM", "GatedDeltaNetConfig"),
         ("deltanet", fla_deltanet, "DeltaNetForCausalLM", "DeltaNetConfig")]


@pytest.mark.parametrize("variant, module", [("gla", fla_gla), ("gated_deltanet", fla_gated_deltanet),
                                             ("deltanet", fla_deltanet), ("gla_softmax", fla_gla)])
def test_format_fla_picks_the_model_class_of_the_runs_mixer(variant, module):
    assert fla.for_run(tiny_config(variant)) is module
    assert fla.for_checkpoint({"model_type": module.MODEL_TYPE}) is module


def test_a_mixer_no_fla_class_has_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"attn.mixer=rwkv7 has no flash-linear-attention model class \(format=fla "
                                          r"maps: GLA, GatedDeltaNet, DeltaNet"):
        fla.for_run(tiny_config("rwkv7"))
    assert fla.for_checkpoint({"model_type": "llama"}) is None


@pytest.mark.parametrize("variant, module, overrides, named", [
    ("gated_deltanet", fla_gated_deltanet, ("attn.gate=channel", "model.mlp=false"),
     ("attn.gate=channel", "model.mlp=false", "model.norm_eps=1e-06", "attn.qk_norm_eps=null")),
    ("gated_deltanet_softmax", fla_gated_deltanet, (*EXACT, "+attn.layers.gated_deltanet.qk_norm_eps=1e-6",
                                                   "model.n_layers=4"),
     ("attn.mixer=softmax",)),
    ("deltanet", fla_deltanet, ("model.mlp=false", "attn.qk_norm_eps=1e-5"),
     ("model.mlp=false", "model.norm_eps=1e-06", "attn.qk_norm_eps=1e-05")),
    ("kda", fla_deltanet, (*EXACT, *QK), ("attn.mixer=kda",)),
])
def test_settings_fla_delta_classes_lack_are_refused_in_one_line_naming_each(variant, module, overrides, named):
    assert_refused_in_one_line(module, tiny_config(variant, *overrides), named)


@pytest.mark.parametrize("variant, module, architecture, config_class", DELTA)
def test_delta_runs_at_the_head_norm_epsilon_map_exactly(variant, module, architecture, config_class):
    assert module.refusals(tiny_config(variant, *EXACT, *QK)) == []
    assert module.refusals(tiny_config(variant, *EXACT, *QK, "attn.conv_size=2", "model.tie_embeddings=false")) == []


def test_fla_delta_configs_lmzoo_lacks_are_refused_in_one_line_naming_each():
    hf = {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "intermediate_size": 96, "norm_eps": 1e-5}
    with pytest.raises(ConfigError) as error:  # fla's defaults: values twice the keys' width, heads of 256
        fla_gated_deltanet.lmzoo_settings({**hf, "model_type": "gated_deltanet", "allow_neg_eigval": True})
    message = str(error.value)
    assert "\n" not in message and all(name in message for name in ("expand_v=2.0", "head_dim=256",
                                                                       "allow_neg_eigval=true")), message
    gdn = fla_gated_deltanet.lmzoo_settings({**hf, "expand_v": 1, "head_dim": 8, "conv_size": 3,
                                             "output_gate_activation": "silu"})
    assert gdn["attn"] == {"name": "gated_deltanet", "mixer": "gated_deltanet", "gate": "head", "conv_size": 3,
                           "qk_norm_eps": 1e-6}
    with pytest.raises(ConfigError, match="use_gate=false"):  # DeltaNetConfig's default: no output gate
        fla_deltanet.lmzoo_settings(hf)
    assert fla_deltanet.lmzoo_settings({**hf, "use_gate": True})["attn"]["mixer"] == "deltanet"


@pytest.mark.slow  # importing fla (and transformers) takes 20-50 s on a busy CPU
@pytest.mark.parametrize("variant, module, architecture, config_class", DELTA)
def test_the_delta_weight_tables_round_trip_and_fill_every_fla_tensor(variant, module, architecture, config_class):
    from flax import nnx

    cfg = tiny_config(variant, *EXACT, *QK, "model.tie_embeddings=false", "attn.conv_size=3")
    params = parameters(LM(cfg, 259, rngs=nnx.Rngs(0)))
    table = module.tensors(cfg.model.n_layers, False)
    weights = llama.to_hf(params, cfg.model.n_layers, False, table)
    back = llama.from_hf(weights, cfg.model.n_layers, False, table)
    assert back.keys() == params.keys()
    for path, value in params.items():
        np.testing.assert_array_equal(back[path], value)
    torch, fla_models = pytest.importorskip("torch"), pytest.importorskip("fla.models")  # no forward: no kernel runs
    settings = module.hf_config(cfg, 259, bos_id=256, eos_id=257, pad_id=258)
    config = getattr(fla_models, config_class)(**{k: v for k, v in settings.items()
                                                  if k not in ("architectures", "model_type", "torch_dtype")})
    model = getattr(fla_models, architecture)(config)
    assert ({name: a.shape for name, a in weights.items()}
            == {name: tuple(t.shape) for name, t in model.state_dict().items()})
    model.load_state_dict({name: torch.tensor(a) for name, a in weights.items()}, strict=True)


@pytest.mark.slow
@pytest.mark.parametrize("variant, module, architecture, config_class", DELTA)
def test_an_exported_delta_run_loads_in_fla_with_the_same_log_probs(tmp_path, variant, module, architecture,
                                                                    config_class):
    worst = export_and_compare(tmp_path, TEXTS, (*QK, "model.tie_embeddings=false"), 1e-4, variant, architecture)
    print(f"{architecture}: largest log-prob difference {worst:.2g}")


def open_random_fla(tmp_path, architecture, config_class, **settings):
    """(the folder, lmzoo's ``Trained``) of an fla model with weights drawn far from its initialisation, so that
    every weight shows in the log-probs, saved with a byte tokenizer and opened by ``open_hf``."""
    fla_models = pytest.importorskip("fla.models")  # no forward in this process
    import torch

    from lmzoo.interop.hf import open_hf, write_tokenizer

    torch.manual_seed(0)
    config = getattr(fla_models, config_class)(hidden_size=32, num_hidden_layers=2, num_heads=4, vocab_size=259,
                                               norm_eps=1e-5, hidden_ratio=2, bos_token_id=256, eos_token_id=257,
                                               pad_token_id=258, **settings)
    model = getattr(fla_models, architecture)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    folder = tmp_path / "fla"
    model.save_pretrained(folder)
    write_tokenizer(ByteTokenizer(), folder, max_length=64)
    return folder, open_hf(folder)


@pytest.mark.slow
@pytest.mark.parametrize("variant, module, architecture, config_class, settings", [
    (*DELTA[0], {"expand_v": 1, "head_dim": 8, "conv_size": 3}),
    (*DELTA[1], {"use_gate": True}),
])
def test_a_random_fla_delta_model_opens_in_lmzoo_with_the_same_log_probs(tmp_path, variant, module, architecture,
                                                                        config_class, settings):
    folder, trained = open_random_fla(tmp_path, architecture, config_class, **settings)
    assert trained.cfg.attn.mixer == variant and trained.cfg.attn.qk_norm_eps == 1e-6 and trained.cfg.model.d_ff == 256
    name, results = fla_log_probs(folder, TEXTS, tmp_path)
    assert name == architecture
    worst = max(float(np.abs(log_probs - lmzoo_log_probs(trained, ids)).max()) for ids, log_probs in results)
    print(f"{architecture}: largest log-prob difference {worst:.2g}")
    assert worst < 1e-4


# ----------------------------------------------------------------------------- RetNet and Mamba-2

NO_MLP = ("model.mlp=false",)  # fla's Mamba-2 blocks have none
OTHERS = [("retnet", fla_retnet, "RetNetForCausalLM", "RetNetConfig", ()),
          ("mamba2", fla_mamba2, "Mamba2ForCausalLM", "Mamba2Config", NO_MLP)]


@pytest.mark.parametrize("variant, module, overrides, named", [
    ("retnet", fla_retnet, ("pos=none",), ("pos.kind=none", "model.norm_eps=1e-06")),
    ("retnet", fla_retnet, (*EXACT, "pos.base=500000"), ("pos.base=500000.0",)),
    ("mamba2", fla_mamba2, ("attn.n_groups=2",), ("model.mlp=true", "model.norm_eps=1e-06", "attn.n_groups=2")),
    ("mamba", fla_mamba2, (*EXACT, *NO_MLP), ("attn.mixer=mamba",)),
])
def test_settings_fla_retnet_and_mamba2_lack_are_refused_in_one_line_naming_each(variant, module, overrides, named):
    assert_refused_in_one_line(module, tiny_config(variant, *overrides), named)


@pytest.mark.parametrize("variant, module, architecture, config_class, overrides", OTHERS)
def test_retnet_and_mamba2_runs_that_fla_expresses_map_exactly(variant, module, architecture, config_class, overrides):
    assert fla.for_run(tiny_config(variant)) is module
    assert module.refusals(tiny_config(variant, *EXACT, *overrides)) == []


def test_fla_retnet_and_mamba2_configs_lmzoo_lacks_are_refused_in_one_line_naming_each():
    hf = {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "norm_eps": 1e-5}
    with pytest.raises(ConfigError) as error:  # RetNetConfig's default: values twice the keys' width
        fla_retnet.lmzoo_settings({**hf, "use_short_conv": True})
    assert all(name in str(error.value) for name in ("expand_v=2.0", "use_short_conv=true")), str(error.value)
    retnet = fla_retnet.lmzoo_settings({**hf, "expand_v": 1})
    assert retnet["pos"] == {"kind": "rope", "base": 10000.0} and retnet["model"]["d_ff"] == 256  # hidden_ratio 2
    with pytest.raises(ConfigError) as error:
        fla_mamba2.lmzoo_settings({**hf, "norm_before_gate": True, "dt_limit": [0.0, 10.0], "norm_eps": 1e-6,
                                   "n_groups": 2})
    assert all(name in str(error.value) for name in ("norm_before_gate=true", "dt_limit=", "norm_eps=1e-06",
                                                      "n_groups=2")), str(error.value)
    mamba2 = fla_mamba2.lmzoo_settings({**hf, "head_dim": 16, "state_size": 8, "expand": 2,
                                        "dt_limit": [0.0, {"__float__": "Infinity"}]})  # as transformers writes inf
    assert mamba2["attn"] == {"name": "mamba2", "mixer": "mamba2", "d_state": 8, "expand": 2, "head_dim": 16,
                              "d_conv": 4}
    assert mamba2["model"]["mlp"] is False and mamba2["model"]["n_heads"] == 4


@pytest.mark.slow  # importing fla (and transformers) takes 20-50 s on a busy CPU
@pytest.mark.parametrize("variant, module, architecture, config_class, overrides", OTHERS)
def test_the_retnet_and_mamba2_weight_tables_fill_every_fla_tensor(tmp_path, variant, module, architecture,
                                                                   config_class, overrides):
    from flax import nnx

    cfg = tiny_config(variant, *EXACT, *overrides, "model.tie_embeddings=false")
    params = parameters(LM(cfg, 259, rngs=nnx.Rngs(0)))
    table = module.tensors(cfg.model.n_layers, False)
    weights = llama.to_hf(params, cfg.model.n_layers, False, table)
    back = llama.from_hf(weights, cfg.model.n_layers, False, table)
    assert back.keys() == params.keys() and all(np.array_equal(back[p], v) for p, v in params.items())
    torch, fla_models = pytest.importorskip("torch"), pytest.importorskip("fla.models")  # no forward: no kernel runs
    (tmp_path / "config.json").write_text(json.dumps(module.hf_config(cfg, 259, bos_id=256, eos_id=257, pad_id=258)))
    config = getattr(fla_models, config_class).from_json_file(tmp_path / "config.json")
    model = getattr(fla_models, architecture)(config)
    assert ({name: a.shape for name, a in weights.items()}
            == {name: tuple(t.shape) for name, t in model.state_dict().items()})
    model.load_state_dict({name: torch.tensor(a) for name, a in weights.items()}, strict=True)


@pytest.mark.slow
@pytest.mark.parametrize("variant, module, architecture, config_class, overrides", OTHERS)
def test_an_exported_retnet_or_mamba2_run_loads_in_fla_with_the_same_log_probs(tmp_path, variant, module, architecture,
                                                                              config_class, overrides):
    worst = export_and_compare(tmp_path, TEXTS, (*overrides, "model.tie_embeddings=false"), 1e-4, variant, architecture)
    print(f"{architecture}: largest log-prob difference {worst:.2g}")


@pytest.mark.slow
@pytest.mark.parametrize("variant, module, architecture, config_class, settings", [
    ("retnet", fla_retnet, "RetNetForCausalLM", "RetNetConfig", {"expand_v": 1}),
    ("mamba2", fla_mamba2, "Mamba2ForCausalLM", "Mamba2Config", {"head_dim": 16, "state_size": 8, "conv_kernel": 3}),
])
def test_a_random_fla_retnet_or_mamba2_opens_in_lmzoo_with_the_same_log_probs(tmp_path, variant, module, architecture,
                                                                             config_class, settings):
    folder, trained = open_random_fla(tmp_path, architecture, config_class, **settings)
    assert trained.cfg.attn.mixer == variant
    name, results = fla_log_probs(folder, TEXTS, tmp_path)
    assert name == architecture
    worst = max(float(np.abs(log_probs - lmzoo_log_probs(trained, ids)).max()) for ids, log_probs in results)
    print(f"{architecture}: largest log-prob difference {worst:.2g}")
    assert worst < 1e-4


# ----------------------------------------------------------------------------- KDA

KDA = ("kda", fla_kda, "KDAForCausalLM", "KDAConfig")


def test_settings_fla_kda_lacks_are_refused_in_one_line_naming_each():
    assert fla.for_run(tiny_config("kda")) is fla_kda and fla.for_checkpoint({"model_type": "kda"}) is fla_kda
    assert fla_kda.refusals(tiny_config("kda", *EXACT, *QK)) == []
    assert fla_kda.refusals(tiny_config("kda", *EXACT, *QK, "attn.gate_rank=8", "attn.value_heads=4")) == []  # as fla's
    assert_refused_in_one_line(fla_kda,
                               tiny_config("kda", "attn.gate_rank=4", "attn.out_gate_rank=2", "attn.value_heads=8"),
                               ("attn.gate_rank=4", "attn.out_gate_rank=2", "attn.value_heads=8",
                                "model.norm_eps=1e-06", "attn.qk_norm_eps=null"))
    hf = {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "intermediate_size": 96, "norm_eps": 1e-5}
    with pytest.raises(ConfigError) as error:  # KDAConfig's default heads are 128 wide
        fla_kda.lmzoo_settings({**hf, "num_v_heads": 8, "safe_gate": True})
    assert all(name in str(error.value)
               for name in ("head_dim=128", "num_v_heads=8", "safe_gate=true")), str(error.value)
    assert fla_kda.lmzoo_settings({**hf, "head_dim": 8, "num_v_heads": 4})["attn"]["mixer"] == "kda"


@pytest.mark.slow  # importing fla (and transformers) takes 20-50 s on a busy CPU
def test_the_kda_weight_table_round_trips_and_fills_every_fla_tensor():
    test_the_delta_weight_tables_round_trip_and_fill_every_fla_tensor(*KDA)


@pytest.mark.slow
def test_an_exported_kda_run_loads_in_fla_with_the_same_log_probs(tmp_path):
    worst = export_and_compare(tmp_path, TEXTS, (*QK, "model.tie_embeddings=false"), 1e-4, KDA[0], KDA[2])
    print(f"{KDA[2]}: largest log-prob difference {worst:.2g}")


@pytest.mark.slow
def test_a_random_fla_kda_opens_in_lmzoo_with_the_same_log_probs(tmp_path):
    test_a_random_fla_delta_model_opens_in_lmzoo_with_the_same_log_probs(tmp_path, *KDA, {"head_dim": 8})


def test_attn_qk_norm_eps_is_flas_l2_norm_and_null_keeps_lmzoos_floor():
    from lmzoo.mixers.family.delta import l2_normalize

    x = np.array([[3e-4, -4e-4], [3.0, 4.0]], np.float32)  # |x|^2 = 2.5e-7 and 25
    floored = x / np.sqrt(np.maximum((x * x).sum(-1, keepdims=True), 1e-12))
    np.testing.assert_allclose(np.asarray(l2_normalize(x)), floored, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(l2_normalize(x, added=1e-6)),
                               x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6), rtol=1e-6)
    assert abs(float(np.linalg.norm(np.asarray(l2_normalize(x, added=1e-6))[0])) - 0.447) < 1e-3  # far from unit there
    assert tiny_config("gated_deltanet").attn.qk_norm_eps is None
