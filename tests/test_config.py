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
        (["+attn=softmax", "data.source=parquet"],
         ["data.source='parquet'", "registered: hf, induction, mad, mix, modular_arithmetic"]),
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


def test_each_registered_source_is_a_data_option_and_each_data_file_names_one():
    """Every source is ``data=<source>``: made by the registry, or its own configs/data/<source>.yaml where that sets
    more; any other file there is a preset of a source (a named corpus such as data=fineweb_edu, which is data=hf
    with its settings)."""
    from lmzoo.config import CONFIG_DIR, group_options
    from omegaconf import OmegaConf
    import pathlib

    assert set(registry.SOURCES.names()) <= set(group_options("data"))
    sources = {f.stem: OmegaConf.load(f).source for f in pathlib.Path(CONFIG_DIR, "data").glob("*.yaml")}
    for name, source in sources.items():
        assert source == name if name in registry.SOURCES.names() else source in registry.SOURCES.names(), name


@pytest.mark.parametrize("group", ["attn", "data"])
def test_a_yaml_file_exists_only_where_it_sets_something(group):
    """An option that would only name its schema is made by the registry (``lmzoo.config.options_made``), not
    written as a file: each file of configs/attn and configs/data sets something besides its identity keys."""
    from lmzoo.config import SPEC_GROUPS

    identity = set(SPEC_GROUPS[group][1]) | {"defaults"}
    for rel in (r for r in config_files() if r.startswith(f"{group}/")):
        raw = load_config_file(rel)
        section = raw.get(group, raw)  # a variant that also sets model.* (# @package _global_)
        assert set(raw) - {group} - identity or set(section) - identity, f"{rel} only names its schema: delete it"


def test_the_registry_makes_every_variant_a_file_does_not_and_no_incomplete_one():
    """``+attn=<mixer>`` works for every registered mixer whose defaults make a variant, with or without a file;
    a hybrid (its layers named in a file) is not offered alone."""
    from lmzoo.config import options_made, variant_names

    complete = {name for name in registry.names() if registry.lookup(name).complete_by_default}
    assert complete <= set(variant_names()) and "hybrid" not in variant_names()
    assert {"softmax", "gla", "mamba"} <= set(options_made("attn"))
    cfg = tiny_config("gla")
    assert (cfg.attn.name, cfg.attn.mixer) == ("gla", "gla") and cfg.attn == registry.lookup("gla")(name="gla",
                                                                                                    mixer="gla")


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


# ----------------------------------------------------------------------------- defaults written once

# Keys that say what a file is: they stay even where they equal a default (rope.yaml's kind: rope).
IDENTITY = {"name", "mixer", "source", "kind"}
# The knobs a sub-config lists (a hybrid's ``layers.<n>``, a mix's ``components.<n>``) stay, so that
# ``attn.layers.<n>.<key>=`` overrides them without a ``+``; they restate the sub-spec's default except
# these, which each file sets on purpose.
SUB_CONFIG_SETTINGS = {"attn/hwfa.yaml": {"layers.window.window", "layers.full.nope", "layers.full.logn"},
                       "attn/qwen3_next_like.yaml": {"layers.gated_attention.output_gate",
                                                     "layers.gated_attention.qk_norm"},
                       "attn/kimi_linear_like.yaml": {"layers.mla.nope"}}


def schema_defaults(spec) -> dict:
    """``spec``'s fields that have a default, as YAML would write them (nested dataclasses as dicts)."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(spec):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            out[f.name] = dataclasses.asdict(made) if dataclasses.is_dataclass(made) else made
    return out


def config_sections(rel: str, raw: dict) -> list[tuple[str, dict, type]]:
    """(key prefix, the YAML mapping, the schema it merges onto) for every section of one file under configs/."""
    from lmzoo.config import Config, EvalConfig, TrainConfig
    from lmzoo.positions import PosConfig
    from lmzoo.schema import ModelConfig, OptimConfig
    from lmzoo.sharding import MeshConfig

    group = rel.split("/")[0]
    if rel == "train.yaml":
        train = raw.get("train", {})
        top = {k: v for k, v in raw.items() if k not in ("defaults", "hydra", "train")}
        return [("", top, Config), ("train.", train, TrainConfig), ("train.mesh.", train.get("mesh", {}), MeshConfig)]
    if group == "attn" and "attn" in raw:  # a variant that also sets model.* (# @package _global_)
        return [("attn.", raw["attn"], registry.lookup(raw["attn"]["mixer"])),
                ("model.", raw.get("model", {}), ModelConfig)]
    specs = {"attn": lambda: registry.lookup(raw["mixer"]), "data": lambda: registry.SOURCES.lookup(raw["source"]),
             "model": lambda: ModelConfig, "optim": lambda: OptimConfig, "pos": lambda: PosConfig,
             "eval": lambda: EvalConfig}
    return [("", raw, specs[group]())]


def config_files() -> list[str]:
    import pathlib

    from lmzoo.config import CONFIG_DIR

    root = pathlib.Path(CONFIG_DIR)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.yaml") if p.relative_to(root).parts[0] != "hydra")


def load_config_file(rel: str) -> dict:
    import pathlib

    from lmzoo.config import CONFIG_DIR
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(pathlib.Path(CONFIG_DIR, rel))) or {}


@pytest.mark.parametrize("rel", config_files())
def test_no_config_file_restates_a_default(rel):
    """The dataclasses hold every default; a YAML file sets only what differs from them (muon.yaml: from
    adamw.yaml, which it composes over). Changing a default in the dataclass then changes every run."""
    raw = load_config_file(rel)
    for prefix, section, spec in config_sections(rel, raw):
        base = schema_defaults(spec)
        if rel == "optim/muon.yaml":
            base.update(load_config_file("optim/adamw.yaml"))
        restated = [f"{prefix}{k}={v!r}" for k, v in section.items()
                    if k not in IDENTITY and k in base and v == base[k]]
        assert not restated, (f"configs/{rel} restates {spec.__name__}'s defaults ({', '.join(restated)}): "
                              "leave them out")


def sub_configs(rel: str, raw: dict) -> list[tuple[str, dict, type]]:
    """(key prefix, mapping, spec) of every sub-config in a file: a hybrid's layers, a mix's components."""
    if raw.get("mixer") == "hybrid":
        return [(f"layers.{n}.", sub, registry.lookup(sub["mixer"])) for n, sub in raw["layers"].items()]
    if raw.get("source") == "mix":
        return [(f"components.{n}.", sub, registry.SOURCES.lookup(sub["source"]))
                for n, sub in raw["components"].items()]
    return []


def test_sub_config_knobs_restate_their_defaults_unless_set_on_purpose():
    """A knob a sub-config lists to keep it overridable equals its spec's default: when the dataclass's default
    changes, this names each restatement to update (or, set on purpose, to list in SUB_CONFIG_SETTINGS)."""
    checked, stale = 0, []
    for rel in config_files():
        for prefix, sub, spec in sub_configs(rel, load_config_file(rel)):
            base = schema_defaults(spec)
            for key, value in sub.items():
                if key in IDENTITY or key not in base:
                    continue
                deliberate = f"{prefix}{key}" in SUB_CONFIG_SETTINGS.get(rel, set())
                checked += 1
                if (value == base[key]) == deliberate:
                    stale.append(f"configs/{rel}: {prefix}{key}={value!r} ({spec.__name__}'s default: {base[key]!r})")
    assert not stale, "; ".join(stale)
    assert checked >= 10  # the hybrids' and the mix's knobs were found


def test_every_config_file_composes_onto_its_schema_defaults():
    """Each group option (a file, or made by the registry) composes, its unset keys holding the dataclass's
    defaults (model=tiny sets none)."""
    from hydra import compose, initialize_config_dir
    from lmzoo.config import CONFIG_DIR, EvalConfig, group_options, register_schemas
    from lmzoo.measure.evaluation import eval_settings
    from lmzoo.schema import ModelConfig

    register_schemas()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for group in ("model", "pos", "data", "optim"):
            for option in group_options(group):
                cfg = compose("train", overrides=["+attn=softmax", f"{group}={option}"])
                assert cfg.attn.name == "softmax" and cfg[group], (group, option)
        assert dict(compose("train", overrides=["+attn=softmax"]).model) == schema_defaults(ModelConfig)
    assert eval_settings([]) == EvalConfig()
