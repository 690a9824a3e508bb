"""Prompts that used to end in a traceback: bytes that are not UTF-8, and a prompt so long that reading it in
(the prefill) needs more memory than there is. One line each; a long prompt is echoed by its end only."""

from __future__ import annotations

import pytest

from lmzoo import generate as lmzoo_generate
from lmzoo.faults import EXIT_CONFIG
from lmzoo.run.loop import train

from conftest import tiny_config


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config("softmax", "model.n_layers=1", "train.steps=2", "train.eval_every=2", "train.probe_batch=0",
                      run_dir=run_dir))
    return run_dir


def refused(capsys, run_dir, *args) -> str:
    with pytest.raises(SystemExit) as stop:
        lmzoo_generate.main([f"run_dir={run_dir}", *args])
    err = capsys.readouterr().err
    assert stop.value.code == EXIT_CONFIG and err.startswith("lmzoo: error: ") and err.count("\n") == 1, err
    return err


def test_a_prompt_that_is_not_utf8_is_one_line(trained_run, capsys):
    undecodable = b"caf\xff".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    assert "prompt is not UTF-8 text (byte ff at character 3)" in refused(capsys, trained_run, f"prompt={undecodable}")


def test_a_prompt_whose_prefill_does_not_fit_is_one_line_and_not_echoed(trained_run, capsys, monkeypatch):
    monkeypatch.setattr(lmzoo_generate, "device_memory", lambda: 64 * 2**20)
    err = refused(capsys, trained_run, "prompt=" + "x" * 5000, "max_new_tokens=2")
    assert "prompt: its 5000 tokens need about" in err and "over the 0.1 GiB of memory available" in err
    assert capsys.readouterr().out == ""


def test_a_long_prompt_is_echoed_by_its_end(trained_run, capsys):
    texts = lmzoo_generate.main([f"run_dir={trained_run}", "prompt=" + "ab" * 1500 + "THE END", "max_new_tokens=2",
                                 "temperature=0"])
    out = capsys.readouterr().out
    assert out.startswith("[a prompt of 3,007 characters; its end:]\n...") and "THE END" in out
    assert len(out) < 400 and out.endswith(texts[0] + "\n")
