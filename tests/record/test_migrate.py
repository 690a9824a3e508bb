"""What older lmzoo wrote, read as today's (``lmzoo.record.migrate``): an old flat data config and the old names of
forms load, evaluate, resume and compute what they did, with a one-line note for a renamed form."""

from __future__ import annotations

import logging

import pytest

from lmzoo import registry
from lmzoo.record import migrate

from conftest import tiny_config

# ----------------------------------------------------------------------------- the flat data config

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
    from lmzoo.record.directory import RunDir
    from lmzoo.record.resuming import prepare_run_dir
    from lmzoo.record.opening import trained_config

    cfg = tiny_config("softmax", run_dir=tmp_path)
    old_run_dir(tmp_path, cfg)
    assert trained_config(RunDir(tmp_path), []) == cfg
    prepare_run_dir(cfg)  # the identity check passes: same data


def test_an_old_flat_data_config_keeps_its_meaning(tmp_path):
    from lmzoo.config import ConfigError
    from lmzoo.record.directory import RunDir
    from lmzoo.record.resuming import prepare_run_dir
    from lmzoo.record.opening import trained_config

    mqar = tiny_config("softmax", "data=mqar", "data.num_pairs=4", run_dir=tmp_path)
    old_run_dir(tmp_path, mqar, source="mqar", num_pairs=4)
    assert trained_config(RunDir(tmp_path), []).data == mqar.data
    with pytest.raises(ConfigError, match="different 'data' config"):
        prepare_run_dir(tiny_config("softmax", "data=mqar", "data.num_pairs=5", run_dir=tmp_path))
    old_run_dir(tmp_path / "odd", mqar, source="mqar", num_marked=3)  # a setting mqar never read, off its default
    with pytest.raises(ConfigError, match="^unknown key 'data.num_marked'"):
        trained_config(RunDir(tmp_path / "odd"), [])


def test_a_run_saved_before_its_checkpoint_settings_existed_resumes_as_it_trained(tmp_path):
    """``optim.name`` and ``train.state_passing`` missing from config.yaml: the run trained with AdamW and no carried
    state, which a resume must keep."""
    from omegaconf import OmegaConf

    from lmzoo.config import ConfigError
    from lmzoo.record.directory import RunDir
    from lmzoo.record.resuming import check_checkpoints_fit

    cfg = tiny_config("gla", run_dir=tmp_path)
    saved = OmegaConf.to_container(OmegaConf.structured(cfg))
    del saved["optim"]["name"], saved["train"]["state_passing"]
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    check_checkpoints_fit(RunDir(tmp_path), cfg)
    with pytest.raises(ConfigError, match="optim.name='muon': run_dir .* trained with optim.name='adamw'"):
        check_checkpoints_fit(RunDir(tmp_path), tiny_config("gla", "optim=muon", run_dir=tmp_path))
    with pytest.raises(ConfigError, match="state_passing=true: run_dir .* trained with train.state_passing=false"):
        check_checkpoints_fit(RunDir(tmp_path), tiny_config("gla", "train.state_passing=true", run_dir=tmp_path))


# ----------------------------------------------------------------------------- old names of forms

# (variant, the form's old name in a saved config.yaml, its name today)
RENAMED_FORMS = [("deltanet", "scan", "naive"), ("gated_deltanet", "scan", "naive"), ("kda", "scan", "naive"),
                 ("comba", "scan", "naive"), ("deltaproduct", "scan", "naive"), ("rwkv7", "scan", "naive"),
                 ("gdn2", "scan", "naive"), ("h3", "quadratic", "parallel"), ("h3", "scan", "naive"),
                 ("nsa", "dense", "parallel"), ("vq", "blockwise", "blocked")]


def test_the_renames_are_these_and_each_old_name_is_a_form_no_more():
    assert sorted((m, old, new) for m, renamed in migrate.ATTN_METHODS_RENAMED.items()
                  for old, new in renamed.items()) == sorted(RENAMED_FORMS)
    for mixer, renamed in migrate.ATTN_METHODS_RENAMED.items():
        forms = registry.MIXERS.lookup(mixer).forms
        assert all(new in forms and old not in forms for old, new in renamed.items()), mixer


def test_each_renamed_op_form_is_a_form_of_that_op_today():
    import importlib

    for op, renamed in migrate.OP_METHODS_RENAMED.items():
        forms = importlib.import_module(f"lmzoo.ops.{op}").METHODS
        assert all(new in forms and old not in forms for old, new in renamed.items()), op


@pytest.fixture
def fresh_notes(monkeypatch):
    """Forget which old names of forms were noted, so a test sees its own note."""
    monkeypatch.setattr(migrate, "_NOTED", set())


def form_notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lmzoo.migrate" and r.getMessage().startswith("note:")]


def test_an_old_form_name_on_the_command_line_runs_the_new_one_with_one_note(fresh_notes, caplog):
    with caplog.at_level(logging.WARNING, logger="lmzoo.migrate"):
        assert tiny_config("deltanet", "attn.method=scan").attn.method == "naive"
        assert tiny_config("deltanet", "attn.method=scan").attn.method == "naive"
    assert form_notes(caplog) == [("note: attn.method='scan' is the old name of 'naive'; running 'naive' "
                                   "(the forms: naive, parallel, chunk, chunk_recompute, pallas, auto, jla)")]


def test_a_hybrid_layer_naming_an_old_form_runs_the_new_one_and_the_note_names_the_layer(fresh_notes, caplog):
    with caplog.at_level(logging.WARNING, logger="lmzoo.migrate"):
        cfg = tiny_config("gated_deltanet_softmax", "attn.layers.gated_deltanet.method=scan")
    assert cfg.attn.sub_config("gated_deltanet").method == "naive"
    assert [n.split(";")[0] for n in form_notes(caplog)] == [
        "note: attn.layers.gated_deltanet.method='scan' is the old name of 'naive'"]


def test_a_name_that_was_never_that_mixers_form_is_still_refused_with_its_forms(capsys):
    with pytest.raises(SystemExit):
        tiny_config("deltanet", "attn.method=dense")  # NSA's old name, never the delta rule's
    assert "attn.method='dense' is not valid (choose from: naive, parallel" in capsys.readouterr().err


@pytest.mark.parametrize("variant, old, new", RENAMED_FORMS)
def test_a_saved_run_naming_an_old_form_loads_resumes_and_computes_what_the_new_name_does(variant, old, new, tmp_path,
                                                                                           fresh_notes, caplog):
    """A run saved with ``attn.method: <old name>`` evaluates and resumes as that form under today's name:
    the same config, the same outputs to the bit."""
    import jax
    import numpy as np
    from flax import nnx
    from omegaconf import OmegaConf

    from lmzoo.model import LM
    from lmzoo.record.directory import RunDir
    from lmzoo.record.opening import trained_config
    from lmzoo.record.resuming import prepare_run_dir

    today = tiny_config(variant, f"attn.method={new}", run_dir=tmp_path)
    saved = OmegaConf.structured(today)
    saved.attn.method = old
    OmegaConf.save(saved, tmp_path / "config.yaml")
    (tmp_path / "checkpoints").mkdir()
    with caplog.at_level(logging.WARNING, logger="lmzoo.migrate"):
        loaded = trained_config(RunDir(tmp_path), [])
    assert loaded == today and len(form_notes(caplog)) == 1
    prepare_run_dir(today)  # the identity check passes: the same form under its two names
    tokens = jax.random.randint(jax.random.key(0), (2, 32), 0, 259)
    logits = [np.asarray(LM(cfg, 259, rngs=nnx.Rngs(0))(tokens)) for cfg in (loaded, today)]
    np.testing.assert_array_equal(*logits)
