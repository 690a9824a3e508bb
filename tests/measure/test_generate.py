"""Generating from a checkpoint: greedy decoding is the argmax of full forwards, sampling follows its
seed and filters, and bad settings are refused in one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo import generate as lmzoo_generate
from lmzoo.data import ByteTokenizer
from lmzoo.measure.decoding import Sampling, generate, sample
from lmzoo.model import LM
from lmzoo.record.opening import open_trained
from lmzoo.run.loop import train

from conftest import tiny_config

PROMPT = "def "


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config("softmax", "train.steps=2", "train.eval_every=2", "train.probe_batch=0", run_dir=run_dir))
    return run_dir


def run(run_dir, *args):
    return lmzoo_generate.main([f"run_dir={run_dir}", f"prompt={PROMPT}", *args])


def test_greedy_generation_is_the_argmax_of_full_forwards_on_the_growing_text():
    # a large init: the mixers' outputs, not just the last token's embedding, decide the argmax
    model = LM(tiny_config("softmax", "model.init_std=0.5"), ByteTokenizer.vocab_size, rngs=nnx.Rngs(0))
    prompt, new = ByteTokenizer().encode(PROMPT), 10
    text = jnp.zeros((1, len(prompt) + new), jnp.int32).at[0, : len(prompt)].set(prompt)
    forward = nnx.jit(lambda m, tokens: m(tokens))  # causal: the padding after position t leaves its logits as they are
    for t in range(len(prompt), len(prompt) + new):
        text = text.at[0, t].set(jnp.argmax(forward(model, text)[0, t - 1]))
    expected = np.asarray(text[:, len(prompt):])
    assert len(set(expected[0].tolist())) > 5
    generated = generate(model, prompt, Sampling(PROMPT, max_new_tokens=new, temperature=0))
    np.testing.assert_array_equal(generated, expected)


@pytest.mark.slow
def test_the_command_streams_the_greedy_text_of_the_run(trained_run, capsys):
    model = open_trained(trained_run).model
    expected = generate(model, ByteTokenizer().encode(PROMPT), Sampling(PROMPT, max_new_tokens=10, temperature=0))
    texts = run(trained_run, "temperature=0", "max_new_tokens=10")
    assert texts == [ByteTokenizer().decode(expected[0])]
    assert capsys.readouterr().out == PROMPT + texts[0] + "\n"  # streamed: the prompt, then its continuation


@pytest.mark.slow
def test_sampling_follows_the_seed_and_samples_differ(trained_run, capsys):
    first = run(trained_run, "seed=1", "temperature=1.0", "num_samples=3", "max_new_tokens=24")
    again = run(trained_run, "seed=1", "temperature=1.0", "num_samples=3", "max_new_tokens=24")
    other = run(trained_run, "seed=2", "temperature=1.0", "num_samples=3", "max_new_tokens=24")
    assert first == again
    assert first != other
    assert len(set(first)) == 3
    assert capsys.readouterr().out.count("--- sample") == 9


def test_top_k_one_and_a_tiny_top_p_are_greedy():
    model = LM(tiny_config("softmax", "model.init_std=0.5"), ByteTokenizer.vocab_size, rngs=nnx.Rngs(0))
    ids = ByteTokenizer().encode(PROMPT)
    greedy = generate(model, ids, Sampling(PROMPT, max_new_tokens=8, temperature=0))
    for filters in ({"top_k": 1}, {"top_p": 1e-6}):
        sampled = generate(model, ids, Sampling(PROMPT, max_new_tokens=8, temperature=1.0, seed=3, **filters))
        np.testing.assert_array_equal(sampled, greedy)


def test_top_k_and_top_p_keep_only_the_likeliest_tokens():
    logits = jnp.log(jnp.array([[0.1, 0.5, 0.05, 0.3, 0.05]]))
    draws = lambda **f: {int(sample(logits, jax.random.key(i), Sampling("x", temperature=1.0, **f))[0])
                         for i in range(200)}
    assert draws(top_k=2) == {1, 3}
    assert draws(top_p=0.75) == {1, 3}  # 0.5 < 0.75: the second likeliest is needed, the third is not
    assert draws(top_p=0.85) == {0, 1, 3}
    assert draws() == {0, 1, 2, 3, 4}


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["temperature=-0.5"], "temperature=-0.5 must be a finite number of at least 0"),
    (["temperature=nan"], "temperature=nan must be a finite number"),
    (["top_p=1.5"], "top_p=1.5 must lie in (0, 1]"),
    (["top_p=0"], "top_p=0.0 must lie in (0, 1]"),
    (["top_k=0"], "top_k=0 must be at least 1"),
    (["max_new_tokens=0"], "max_new_tokens=0 must be at least 1"),
    (["num_samples=0"], "num_samples=0 must be at least 1"),
    (["prompt="], "prompt is empty"),
    (["max_new_tokens=1000000000"], "max_new_tokens=1000000000: 4 prompt tokens plus max_new_tokens need a"),
    (["model.d_model=64"], "model.d_model cannot change"),
])
def test_bad_settings_are_refused_in_one_line(trained_run, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run(trained_run, *args)
    err = capsys.readouterr().err
    assert exit_info.value.code != 0
    assert err.startswith("lmzoo: error: ") and err.count("\n") == 1 and message in err, err


def test_a_run_dir_without_a_trained_run_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run(tmp_path)
    assert capsys.readouterr().err == (f"lmzoo: error: run_dir={str(tmp_path)!r} holds no trained run "
                                       "(no config.yaml and checkpoints)\n")
