"""A local Hugging Face Llama opens as an lmzoo model with the log-probabilities transformers gives it."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.interop import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def random_llama(folder, **settings):
    """A randomly initialised LlamaForCausalLM (float32) saved to ``folder`` with a byte-level tokenizer."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{
        "vocab_size": 300, "hidden_size": 32, "intermediate_size": 80, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 500.0, "tie_word_embeddings": False, "initializer_range": 0.2, **settings})
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms' gains away from 1, so a swapped norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    hf.byte_tokenizer_json(folder / hf.TOKENIZER)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{}, {"tie_word_embeddings": True, "num_key_value_heads": 4,
                                       "rope_scaling": {"rope_type": "linear", "factor": 2.0}}])
def test_a_random_llama_opens_with_the_same_log_probs(tmp_path, settings):
    model = random_llama(tmp_path, **settings)
    trained = hf.open_hf(tmp_path, ["data.seq_len=32"])
    ids = np.random.default_rng(0).integers(0, 300, (2, 40))
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor(ids)).logits.double(), -1).numpy()
    logits = np.asarray(trained.model(ids.astype(np.int32)), np.float64)
    np.testing.assert_allclose(logits - np.logaddexp.reduce(logits, -1, keepdims=True), expected, atol=1e-4)
    assert (trained.cfg.data.seq_len, trained.data.tokenizer.eos_id, trained.step) == (32, 257, 0)


def test_what_lmzoo_lacks_is_named(tmp_path):
    random_llama(tmp_path, attention_bias=True, hidden_act="gelu")
    with pytest.raises(ConfigError, match="attention_bias=True, hidden_act=gelu"):
        hf.open_hf(tmp_path)
    with pytest.raises(ConfigError, match="holds no config.json"):
        hf.open_hf(tmp_path / "nothing")


@pytest.mark.slow
def test_lmzoo_eval_measures_a_hugging_face_folder(tmp_path):
    from lmzoo import eval as lmzoo_eval

    random_llama(tmp_path)
    results = lmzoo_eval.main([f"hf={tmp_path}", "data.seq_len=32", "eval.lengths=[32,64]", "eval.tokens=1024",
                               "eval.position_buckets=4", "eval.progress=false"])
    assert (tmp_path / "eval" / "data.seq_len=32" / "results.json").is_file()
    assert results["variant"] == "llama" and set(results["lengths"]) == {"32", "64"}
    assert all(r["tokens"] == 1024 and r["loss"] > 0 for r in results["lengths"].values())
