"""Bad input gets one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from lmzoo import registry
from lmzoo.config import variant_names
from lmzoo.train import main as train_main

from conftest import TINY, run_lmzoo, tiny_config


def error_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        train_main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmzoo: error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], ["+attn=<name>", "softmax", "gqa", "mqa"]),
        (["+attn=nope"], ["attn='nope'", "gqa", "mqa", "softmax"]),
        (["-m", "+attn=softmax,nope"], ["attn='nope'"]),
        (["+attn=softmax", "model.foo=1"], ["unknown key 'model.foo'", "d_model"]),
        (["+attn=softmax", "+model.foo=1"], ["unknown key 'model.foo'", "n_heads"]),
        (["+attn=softmax", "attn.window_size=4"], ["unknown key 'attn.window_size'", "n_kv_heads"]),
        (["+attn=softmax", "model.d_model=100", "model.n_heads=3"], ["model.d_model=100", "model.n_heads=3"]),
        (["+attn=gqa", "attn.n_kv_heads=3"], ["model.n_heads=4", "attn.n_kv_heads=3"]),
        (["+attn=softmax", "train.steps=0"], ["train.steps=0", "positive"]),
        (["+attn=softmax", "data.seq_len=-8"], ["data.seq_len=-8", "positive"]),
        (["+attn=softmax", "train.batch_size=0"], ["train.batch_size=0"]),
        (["+attn=softmax", "train.steps=abc"], ["train.steps"]),
        (["+attn=softmax", "model=huge"], ["model='huge'", "tiny", "small"]),
        (["+attn=softmax", "attn.method=fast"], ["attn.method='fast'", "naive", "xla"]),
        (["+attn=softmax", "data=text_files", "data.paths=/no/such/dir/*.txt"], ["data.paths", "/no/such/dir/*.txt"]),
        (["+attn=softmax", "data.tokenizer=/no/such/tokenizer.json"], ["data.tokenizer", "no such file"]),
        (["+attn=softmax", "data=text_files"], ["data.paths must be set"]),
    ],
)
def test_bad_input_is_one_line(capsys, argv, expected):
    err = error_of(capsys, *argv)
    for fragment in expected:
        assert fragment in err, (fragment, err)


def test_bad_input_from_the_command_line_exits_2_without_traceback():
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", "model.d_model=100", "model.n_heads=3")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lmzoo: error: model.d_model=100 is not divisible by model.n_heads=3"
    ]


def test_every_variant_config_validates_and_names_a_registered_mixer():
    assert {"softmax", "gqa", "mqa"} <= set(variant_names())
    for variant in variant_names():
        cfg = tiny_config(variant)
        assert cfg.attn.name == variant
        assert isinstance(cfg.attn, registry.lookup(cfg.attn.mixer))


def test_registry_lookup():
    spec = registry.lookup("softmax")
    assert spec.__name__ == "SoftmaxConfig"
    assert type(tiny_config("softmax").attn.build).__name__ == "method"
    with pytest.raises(KeyError, match="registered: .*softmax"):
        registry.lookup("no-such-mixer")


def test_registry_refuses_a_second_class_under_one_name():
    from dataclasses import dataclass

    @dataclass
    class Impostor:
        pass

    with pytest.raises(ValueError, match="already registered"):
        registry.register("softmax")(Impostor)


def test_overrides_reach_the_typed_config():
    cfg = tiny_config("gqa", "model.d_model=64", "attn.n_kv_heads=1", "seed=3", "train.steps=7")
    assert (cfg.model.d_model, cfg.attn.n_kv_heads, cfg.seed, cfg.train.steps) == (64, 1, 3, 7)
    assert cfg.model.n_layers == 2 and TINY  # the tiny overrides applied


def test_configs_cannot_name_code_to_run():
    from lmzoo.config import CONFIG_DIR
    import pathlib

    for path in pathlib.Path(CONFIG_DIR).rglob("*.yaml"):
        assert "_target_" not in path.read_text(), path
