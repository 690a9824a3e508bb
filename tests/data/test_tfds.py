"""The ``tfds`` source on a small dataset prepared here as TFDS lays it out (ArrayRecord files and dataset_info),
with TFDS's own builder and without TensorFlow: training, resuming at the same data position, evaluating it
over long documents, and the one-line refusals."""

from __future__ import annotations

import json
import signal
import sys

import jax
import numpy as np
import pytest
from flax import nnx

tfds = pytest.importorskip("tensorflow_datasets")

from lmzoo import eval as eval_command  # noqa: E402
from lmzoo.data.tfds import TFDSConfig, text_feature  # noqa: E402
from lmzoo.model import LM  # noqa: E402
from lmzoo.record.checkpoints import Checkpointer  # noqa: E402
from lmzoo.record.directory import RunDir  # noqa: E402
from lmzoo.record.opening import trained_config  # noqa: E402
from lmzoo.run.loop import Trainer, train  # noqa: E402
from lmzoo.schema import ConfigError  # noqa: E402

from conftest import tiny_config  # noqa: E402

NAME = "lmzoo_tiny_text"
TRAIN_SIZES = [100 + 37 * i % 260 for i in range(40)]  # bytes, so byte tokens, per document
VALIDATION_SIZES = [40, 60, 90, 120, 150, 200, 260, 330, 400, 70, 500, 35]


def text_of(size: int, seed: int) -> str:
    """``size`` bytes of ASCII words, different for every seed."""
    words = np.random.default_rng(seed).choice(["the", "a", "cat", "sat", "on", "mat", "and", "ran", "far"], size)
    return " ".join(words)[:size]


class LmzooTinyText(tfds.core.GeneratorBasedBuilder):
    """Documents of known sizes, in a train and a validation split."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict({"text": tfds.features.Text(), "title": tfds.features.Text()})
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(TRAIN_SIZES, 0),
                "validation": self._generate_examples(VALIDATION_SIZES, 1000)}

    def _generate_examples(self, sizes, first_seed):
        for i, size in enumerate(sizes):
            yield i, {"text": text_of(size, first_seed + i), "title": f"document {first_seed + i}"}


def prepare(data_dir) -> str:
    """Prepare the dataset under ``data_dir`` (a few hundred ms, no download); returns ``data_dir``."""
    LmzooTinyText(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return str(data_dir)


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("tfds"))


def tfds_args(data_dir: str) -> list[str]:
    return ["data=tfds", f"data.tfds_name={NAME}", f"data.tfds_dir={data_dir}", "train.eval_every=4",
            "train.probe_batch=0", "train.checkpoint_every=2", "train.log_every=2"]


def final_params(run_dir):
    ckpt = Checkpointer(run_dir / "checkpoints")
    step = ckpt.latest_step()
    model = ckpt.restore_model(step, LM(trained_config(RunDir(run_dir), []), 259, rngs=nnx.Rngs(0)))
    ckpt.close()
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_documents_are_the_splits_rows_and_their_fingerprint_names_the_dataset(tfds_dir):
    docs = TFDSConfig(tfds_name=NAME, tfds_dir=tfds_dir).documents()
    assert sorted(map(len, docs.validation)) == sorted(VALIDATION_SIZES)  # the "text" feature, not "title"
    assert sorted(map(len, docs.train)) == sorted(TRAIN_SIZES)
    assert docs.fingerprint["name"] == f"{NAME}/1.0.0" and docs.fingerprint["val_split"] == "validation"
    few = TFDSConfig(tfds_name=NAME, tfds_dir=tfds_dir, tfds_max_documents=4).documents()
    assert len(few.train) == len(few.validation) == 4 and set(few.train) <= set(docs.train)
    assert few.fingerprint["sha256"] != docs.fingerprint["sha256"]


@pytest.mark.slow
def test_tfds_run_trains_resumes_at_the_same_position_and_evaluates_long_documents(tmp_path, tfds_dir, capsys,
                                                                                    monkeypatch):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    def config(run_dir):
        return tiny_config("softmax", *tfds_args(tfds_dir), "train.steps=4", run_dir=run_dir)

    train(config(straight))
    advance = Trainer.advance

    def advance_then_stop_at_2(self):
        metrics = advance(self)
        if self.step == 2:  # a stop request: the run saves a checkpoint and returns
            signal.raise_signal(signal.SIGTERM)
        return metrics

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "advance", advance_then_stop_at_2)
        assert train(config(resumed))["interrupted"]
    train(config(resumed))
    (step_a, params_a), (step_b, params_b) = final_params(straight), final_params(resumed)
    assert step_a == step_b == 4
    for a, b in zip(params_a, params_b):  # the resumed run saw the same batches from step 2 on
        np.testing.assert_array_equal(a, b)
    fingerprint = json.loads((straight / "data_fingerprint.json").read_text())
    assert fingerprint["source"] == "tfds" and fingerprint["val_documents"] == len(VALIDATION_SIZES)

    args = [f"run_dir={straight}", "eval.lengths=[16,32]", "eval.min_doc_tokens=64", "eval.tokens=null",
            "eval.probe_batch=0", "eval.progress=false", "eval.resamples=100"]
    results = eval_command.main(args)
    long_enough = [n for n in VALIDATION_SIZES if n >= 64]
    assert results["sampling"] == "long_documents"
    assert results["qualifying_documents"] == {"16": len(long_enough), "32": len(long_enough)}
    assert results["documents"] == len(long_enough)  # the whole budget: every long document is scored
    assert results["eval_tokens"] == sum(n // 32 * 32 for n in long_enough)
    assert all(np.isfinite(results["lengths"][n]["bpb"]) for n in ("16", "32"))

    with pytest.raises(SystemExit):
        eval_command.main([*args[:3], "eval.min_doc_tokens=501", "eval.tag=too_long", *args[4:]])
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "eval.min_doc_tokens=501" in err
    assert "no validation document is 501 tokens long (the longest of the 12 has 500 tokens)" in err


def test_an_unprepared_dataset_names_the_build_command(tmp_path):
    with pytest.raises(ConfigError) as error:
        TFDSConfig(tfds_name="wiki40b/en", tfds_dir=str(tmp_path)).documents()
    assert "tfds build wiki40b/en --file_format=array_record" in str(error.value) and "\n" not in str(error.value)


def test_settings_the_dataset_lacks_are_one_line(tfds_dir):
    with pytest.raises(ConfigError, match=r"data.tfds_split='dev': dataset lmzoo_tiny_text/1.0.0 has the splits"):
        TFDSConfig(tfds_name=NAME, tfds_dir=tfds_dir, tfds_split="dev").documents()
    with pytest.raises(ConfigError, match=r"data.text_field='body'.*text features: text, title"):
        TFDSConfig(tfds_name=NAME, tfds_dir=tfds_dir, text_field="body").documents()


def test_the_text_feature_is_found_by_its_name():
    pg19 = tfds.features.FeaturesDict({"book_text": tfds.features.Text(), "book_id": np.int32, "book_title": np.str_,
                                       "book_link": np.str_})
    assert text_feature(pg19, None, "pg19") == "book_text"
    wiki40b = tfds.features.FeaturesDict({"text": tfds.features.Text(), "wikidata_id": tfds.features.Text()})
    assert text_feature(wiki40b, None, "wiki40b/en") == "text"
    with pytest.raises(ConfigError, match=r"2 text features \(title, url\).*data.text_field"):
        text_feature(tfds.features.FeaturesDict({"title": np.str_, "url": np.str_}), None, "pages")


def test_without_tensorflow_datasets_installed_the_error_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[tfds\]'"):
        TFDSConfig(tfds_name=NAME).documents()
