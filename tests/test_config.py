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
        (["+attn=softmax", "optim.lr=nan"], ["optim.lr=nan must be a finite number"]),
        (["+attn=softmax", "optim.b2=inf"], ["optim.b2=inf must be a finite number"]),
        (["+attn=softmax", "pos=ntk", "pos.factor=-inf"], ["pos.factor=-inf must be a finite number"]),
        (["+attn=softmax", "model=huge"], ["model='huge'", "tiny", "small"]),
        (["+attn=softmax", "attn.method=fast"], ["attn.method='fast'", "naive", "xla"]),
        (["+attn=softmax", "data=text_files", "data.paths=/no/such/dir/*.txt"], ["data.paths", "/no/such/dir/*.txt"]),
        (["+attn=softmax", "data.tokenizer=/no/such/tokenizer.json"], ["data.tokenizer", "no such file"]),
        (["+attn=softmax", "data=text_files"], ["data.paths must be set"]),
        (["+attn=softmax", "data=parquet"], ["data='parquet'", "stdlib", "mqar"]),
        (["+attn=softmax", "data.source=parquet"], ["data.source='parquet'", "registered: hf, induction, mix, mqar"]),
        (["+attn=softmax", "data.num_pairs=4"], ["unknown key 'data.num_pairs'", "tokenizer, val_fraction"]),
        (["+attn=softmax", "data=mqar", "data.paths=a.txt"], ["unknown key 'data.paths'", "num_pairs, num_queries"]),
        (["+attn=softmax", "data=mqar", "data.num_pairs=0"], ["data.num_pairs=0 must be positive"]),
    ],
)
def test_bad_input_is_one_line(capsys, argv, expected):
    err = error_of(capsys, *argv)
    for fragment in expected:
        assert fragment in err, (fragment, err)


@pytest.mark.slow
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


def test_each_registered_source_has_a_config_file_naming_it():
    """Every source has its own configs/data/<source>.yaml; any other file there is a preset of a source
    (a named corpus such as data=fineweb_edu, which is data=hf with its settings)."""
    from lmzoo.config import CONFIG_DIR
    from omegaconf import OmegaConf
    import pathlib

    sources = {f.stem: OmegaConf.load(f).source for f in pathlib.Path(CONFIG_DIR, "data").glob("*.yaml")}
    assert set(registry.SOURCES.names()) <= set(sources)
    for name, source in sources.items():
        assert source == name if name in registry.SOURCES.names() else source in registry.SOURCES.names(), name


@pytest.mark.parametrize("overrides", [["data=mqar", "data.num_pairs=4"], ["data=induction"], ["data=selective_copy"]])
def test_data_overrides_reach_the_source_spec(overrides):
    cfg = tiny_config("softmax", *overrides)
    assert isinstance(cfg.data, registry.SOURCES.lookup(overrides[0].split("=")[1]))
    assert cfg.data.seq_len == 32  # the tiny override applies to every source
    if "data.num_pairs=4" in overrides:
        assert cfg.data.num_pairs == 4


def test_text_and_hf_sources_from_the_command_line(tmp_path):
    (tmp_path / "a.txt").write_text("a\n")
    cfg = tiny_config("softmax", "data=text_files", f"data.paths={tmp_path}/*.txt")
    assert type(cfg.data).__name__ == "TextFilesConfig" and cfg.data.paths == f"{tmp_path}/*.txt"
    cfg = tiny_config("softmax", "data=hf", "data.hf_name=json", f"data.hf_data_files={tmp_path}/a.txt")
    assert (type(cfg.data).__name__, cfg.data.hf_name, cfg.data.tokenizer) == ("HFConfig", "json", "byte")


# The data section of a run directory written when one flat data config held every source's settings.
FLAT_STDLIB = {
    "source": "stdlib", "seq_len": 32, "tokenizer": "byte", "val_fraction": 0.05, "paths": None, "text_field": "text",
    "hf_name": None, "hf_config": None, "hf_data_files": None, "hf_train_split": "train", "hf_val_split": None,
    "task_vocab": 64, "num_pairs": 8, "num_queries": None, "num_marked": 8,
}


def old_run_dir(tmp_path, cfg, **data):
    """A run directory as the flat-data-config version saved it for ``cfg``."""
    from omegaconf import OmegaConf

    saved = OmegaConf.structured(cfg)
    saved.data = {**FLAT_STDLIB, **data}
    (tmp_path / "checkpoints").mkdir(parents=True)
    OmegaConf.save(saved, tmp_path / "config.yaml")
    return tmp_path


def test_an_old_flat_data_config_still_resumes_and_evaluates(tmp_path):
    from lmzoo.run.directory import RunDir
    from lmzoo.run.resume import prepare_run_dir
    from lmzoo.run.load import trained_config

    cfg = tiny_config("softmax", run_dir=tmp_path)
    old_run_dir(tmp_path, cfg)
    assert trained_config(RunDir(tmp_path), []) == cfg
    prepare_run_dir(cfg)  # the identity check passes: same data


def test_an_old_flat_data_config_keeps_its_meaning(tmp_path):
    from lmzoo.config import ConfigError
    from lmzoo.run.directory import RunDir
    from lmzoo.run.resume import prepare_run_dir
    from lmzoo.run.load import trained_config

    mqar = tiny_config("softmax", "data=mqar", "data.num_pairs=4", run_dir=tmp_path)
    old_run_dir(tmp_path, mqar, source="mqar", num_pairs=4)
    assert trained_config(RunDir(tmp_path), []).data == mqar.data
    with pytest.raises(ConfigError, match="different 'data' config"):
        prepare_run_dir(tiny_config("softmax", "data=mqar", "data.num_pairs=5", run_dir=tmp_path))
    old_run_dir(tmp_path / "odd", mqar, source="mqar", num_marked=3)  # a setting mqar never read, off its default
    with pytest.raises(ConfigError, match="^unknown key 'data.num_marked'"):
        trained_config(RunDir(tmp_path / "odd"), [])
