"""A trained softmax-family run exported as a Hugging Face Llama folder gives transformers lmzoo's log-probabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_config

from lmzoo import export
from lmzoo.config import ConfigError
from lmzoo.interop import llama
from lmzoo.record.opening import open_trained
from lmzoo.run.loop import train

TEXTS = ["def main():\n    return 0\n", "import os, sys  # é ü", "x"]


def train_tiny(run_dir, variant, *overrides):
    train(tiny_config(variant, "train.steps=4", "train.eval_every=4", "train.checkpoint_every=4", *overrides,
                      run_dir=run_dir))
    return run_dir


def lmzoo_log_probs(trained, ids):
    logits = np.asarray(trained.model(np.asarray(ids, np.int32)[None]))[0]
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def hf_log_probs(model, ids):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([list(ids)])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("variant, overrides", [("gqa", ()), ("softmax", ("model.tie_embeddings=false", "pos=ntk",
                                                                           "pos.factor=4", "model.norm_eps=1e-5"))])
def test_an_exported_run_loads_in_transformers_with_the_same_log_probs(tmp_path, variant, overrides):
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    run = train_tiny(tmp_path / "run", variant, *overrides)
    out = export.main([f"run_dir={run}", f"out={tmp_path / 'hf'}"])
    trained = open_trained(run)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == trained.data.tokenizer.encode(text).tolist()  # the byte-level file tokenises as lmzoo does
        assert tokenizer.decode(ids) == text
        np.testing.assert_allclose(hf_log_probs(model, ids), lmzoo_log_probs(trained, ids), atol=1e-4)
    assert tokenizer.eos_token_id == trained.data.tokenizer.eos_id
    assert json.loads((out / "lmzoo.json").read_text())["step"] == 4


@pytest.mark.parametrize("variant, overrides, named", [
    ("softmax", ("attn.window=8", "attn.qk_norm=true"), ("attn.window=8", "attn.qk_norm=true")),
    ("gla", (), ("attn.mixer=gla",)),
    ("softmax", ("pos=alibi", "model.mlp=false"), ("pos.kind=alibi", "model.mlp=false")),
    ("logn", (), ("attn.logn=true",)),
])
def test_settings_llama_lacks_are_refused_in_one_line_naming_each(variant, overrides, named):
    with pytest.raises(ConfigError) as error:
        llama.check_exportable(tiny_config(variant, *overrides))
    message = str(error.value)
    assert "\n" not in message and all(name in message for name in named), message


def test_the_softmax_family_llama_computes_is_accepted():
    for variant, overrides in [("softmax", ()), ("gqa", ()), ("mqa", ()), ("softmax", ("pos=pi", "pos.factor=2"))]:
        assert llama.refusals(tiny_config(variant, *overrides)) == []


def test_a_bpe_run_ships_its_own_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from lmzoo.data.tokenizers import HFTokenizer, train_bpe
    from lmzoo.interop.hf import write_tokenizer

    train_bpe([b"def main():\n    return 0\n" * 20, b"import os\nimport sys\n" * 20], 300, tmp_path / "bpe.json")
    ours = HFTokenizer(str(tmp_path / "bpe.json"))
    write_tokenizer(ours, tmp_path, max_length=64)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.encode(text).tolist()
    assert theirs.eos_token == "<|endoftext|>" and theirs.eos_token_id == ours.eos_id == theirs.pad_token_id
