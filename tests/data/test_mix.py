"""Data mixtures (lmzoo.data.mix): proportions, the rows each component gives, resume, shards, per-component
losses, settings, and a tiny training run on ``data=mix``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmzoo.data.mix import (
    SYMBOLS, ComponentMetrics, MixConfig, component_losses, component_terms, component_validation, component_windows,
    forward_in_symbols,
)
from lmzoo.data.base import DataDefaults, SourceMetrics
from lmzoo.data.train_iterators import train_iterator
from lmzoo.data.synthetic import TRAIN, TaskExamples, TaskTokenizer
from lmzoo.faults import RunFault
from lmzoo.scoring.lengths import score_length
from lmzoo.record.directory import RunDir
from lmzoo.record.resuming import check_data
from lmzoo.run.loop import train
from lmzoo.schema import ConfigError, to_dataclass
from lmzoo.stats.bootstrap import BLOCKS
from lmzoo.train import main as train_main

from conftest import tiny_config

L = 19  # an odd sequence length


def corpus(folder):
    """Twelve small files (different text each), enough windows of ``L`` for a few epochs of batches."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(12):
        (folder / f"f{i:02d}.txt").write_text(f"file {i:02d}: " + "".join(chr(97 + (i * j) % 26) for j in range(120)))
    return str(folder / "*.txt")


def mix(paths, weights=(0.8, 0.15, 0.05), **settings):
    text, passkey, mqar = weights
    components = {"text": {"source": "text_files", "paths": paths, "weight": text},
                  "passkey": {"source": "passkey", "weight": passkey, "digits": 3},
                  "mqar": {"source": "mqar", "weight": mqar, "num_pairs": 2, "task_vocab": 8}}
    cfg = to_dataclass(MixConfig, {"seq_len": L, "components": components, **settings}, prefix="data.")
    cfg.check()
    return cfg


def batches(iterator, count):
    return [next(iterator) for _ in range(count)]


def test_rows_follow_the_weights_and_each_component_gives_its_own_rows(tmp_path):
    cfg = mix(corpus(tmp_path))
    data = cfg.build(seed=3, shard_index=0, shard_count=1)
    assert data.component_names == ("text", "passkey", "mqar")
    drawn = batches(data.train_iterator(16), 150)  # 2400 rows
    component = np.concatenate([b["component"] for b in drawn])
    onehot = np.concatenate([b["component_onehot"] for b in drawn])
    np.testing.assert_array_equal(onehot, np.eye(3)[component])
    n = len(component)
    for c, weight in enumerate([0.8, 0.15, 0.05]):
        half_width = 3.29 * np.sqrt(weight * (1 - weight) / n)  # a 99.9% binomial interval around the weight
        assert abs(np.mean(component == c) - weight) < half_width, (c, np.mean(component == c))

    rows = {key: np.concatenate([b[key] for b in drawn]) for key in ("inputs", "targets", "weights")}
    text = component == 0  # the corpus's windows in the order the corpus alone draws them, every target scored
    alone = cfg.parts()[0].spec.build(seed=3, shard_index=0, shard_count=1)
    drawn_alone = batches(train_iterator(alone.train_tokens, L, 8, 3), text.sum() // 8 + 1)
    windows = np.concatenate([b["inputs"] for b in drawn_alone])
    np.testing.assert_array_equal(rows["inputs"][text], windows[: text.sum()])
    assert (rows["weights"][text] == 1).all()
    passkey = cfg.parts()[1].spec  # examples 0, 1, 2 ... of the task's training split, written as characters
    examples = TaskExamples(passkey, 3, TRAIN, L + 1, TaskTokenizer(passkey.task_vocab))
    first = examples(0)
    written = np.array([ord(c) for c in SYMBOLS[: passkey.task_vocab] + " :."])[first["inputs"]]
    np.testing.assert_array_equal(rows["inputs"][component == 1][0], written)
    np.testing.assert_array_equal(rows["weights"][component == 1][0], first["weights"])
    assert data.tokenizer.decode(rows["inputs"][component == 1][0]).count(":") == 2  # needle and question


def test_task_rows_drawn_together_equal_their_examples_one_by_one(tmp_path):
    data = mix(corpus(tmp_path)).build(seed=5, shard_index=0, shard_count=1)
    for part in data.parts[1:]:  # passkey and mqar
        indices = np.array([0, 7, 3, 40, 41, 1000, 2])
        one_by_one = [part.examples(i) for i in indices]
        together = part.rows(indices)
        for key in ("inputs", "targets", "weights"):
            stacked = np.stack([e[key] for e in one_by_one])
            expected = part.tokens[stacked] if key != "weights" else stacked
            np.testing.assert_array_equal(together[key], expected, err_msg=key)
            assert together[key].dtype == expected.dtype, key


def test_resume_gives_the_batches_of_an_uninterrupted_iterator(tmp_path):
    data = mix(corpus(tmp_path), document_boundaries="mask").build(seed=0, shard_index=0, shard_count=1)
    uninterrupted = batches(data.train_iterator(8), 9)
    interrupted = data.train_iterator(8)
    batches(interrupted, 4)
    state = json.loads(json.dumps(interrupted.get_state()))  # as a checkpoint holds it
    resumed = data.train_iterator(8)
    resumed.set_state(state)
    for expected, got in zip(uninterrupted[4:], batches(resumed, 5)):
        assert expected.keys() == got.keys() == {"inputs", "targets", "weights", "component", "component_onehot",
                                                 "segment_ids"}
        for key in expected:
            np.testing.assert_array_equal(expected[key], got[key])


def test_each_process_gets_its_block_of_the_global_rows(tmp_path):
    cfg = mix(corpus(tmp_path))
    whole = batches(cfg.build(seed=1, shard_index=0, shard_count=1).train_iterator(8), 6)
    halves = [batches(cfg.build(seed=1, shard_index=i, shard_count=2).train_iterator(8), 6) for i in range(2)]
    for step, batch in enumerate(whole):
        for key in batch:
            np.testing.assert_array_equal(np.concatenate([h[step][key] for h in halves]), batch[key])


def test_component_losses_by_hand_and_over_micro_batches():
    loss = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 1.0]], np.float32)
    weights = np.array([[1, 1, 1], [0, 0, 1], [1, 1, 1], [0, 1, 0]], np.float32)
    batch = {"weights": weights, "component_onehot": np.eye(3, dtype=np.float32)[[0, 1, 0, 1]]}
    terms = component_terms(loss, batch)
    means = component_losses([terms], ["text", "passkey", "unused"])
    assert means == pytest.approx({"loss/text": (1 + 2 + 3 + 7 + 8 + 9) / 6, "loss/passkey": (6 + 1) / 2})
    np.testing.assert_allclose(terms["component_share"], [6 / 8, 2 / 8, 0])
    # micro-batches (rows 0, 2 and rows 1, 3) weighted by their share of the scored targets add up to the whole
    slices = [{k: v[rows] for k, v in batch.items()} for rows in ([0, 2], [1, 3])]
    shares = [s["weights"].sum() / weights.sum() for s in slices]
    parts = [component_terms(loss[rows], s) for rows, s in zip(([0, 2], [1, 3]), slices)]
    for key in terms:
        np.testing.assert_allclose(sum(share * np.asarray(p[key]) for share, p in zip(shares, parts)), terms[key],
                                   rtol=1e-6)
    # steps pooled by the trainer's accumulator: each step's mean weighted by the component's share of that step
    text_only = component_terms(loss[:1], {k: v[:1] for k, v in batch.items()})
    pooled = ComponentMetrics(("text", "passkey", "unused"), {})
    pooled.add(terms, 1)
    pooled.add(text_only, 1)
    expected = float((terms["component_loss"][0] + 2.0) / (terms["component_share"][0] + 1.0))
    assert pooled.pop() == pytest.approx({"loss/text": expected, "loss/passkey": (6 + 1) / 2})
    assert pooled.pop() == {} and SourceMetrics().pop() == {} and DataDefaults().source_metrics(L, L).pop() == {}
    # a call of two steps stacks their terms [2, components]: the same window as two calls of one step
    pooled.add({k: np.stack([terms[k], text_only[k]]) for k in terms}, 2)
    assert pooled.pop() == pytest.approx({"loss/text": expected, "loss/passkey": (6 + 1) / 2})


def test_each_component_is_validated_on_its_own_windows(tmp_path):
    cfg = mix(corpus(tmp_path))
    data = cfg.build(seed=0, shard_index=0, shard_count=1)
    windows = component_windows(data, L, 4 * L)
    assert list(windows) == ["text", "passkey", "mqar"]
    assert windows["text"] is data.validation_windows([L], 4 * L)[L]  # the main windows: those the corpus alone scores
    alone = cfg.parts()[0].spec.build(seed=0, shard_index=0, shard_count=1).validation_windows([L], 4 * L)[L]
    assert windows["text"].sampling_keys() == alone.sampling_keys()  # the same scored targets (their digest)

    def score(inputs, targets, *segment_ids):  # "loss" = the target token, right where it is even
        return {"loss": targets.astype(np.float32), "correct": (targets % 2 == 0).astype(np.float32)}

    def score_windows(own):
        return score_length(score, own, rows=3, blocks=BLOCKS, n_buckets=1)

    metrics = component_validation(score_windows, windows)
    for name, own in windows.items():
        batch = own(np.arange(len(own)))
        scored = batch.get("weights", np.ones(batch["targets"].shape))
        assert metrics[f"val_loss/{name}"] == pytest.approx((batch["targets"] * scored).sum() / scored.sum())
    assert metrics["val_accuracy/passkey"] == pytest.approx(np.mean(own_answers(windows["passkey"]) % 2 == 0))
    assert "val_accuracy/text" not in metrics
    reused = component_validation(score_windows, {"text": windows["text"]}, scored=(windows["text"], FakeScores()))
    assert reused == {"val_loss/text": 1.5}
    with pytest.raises(ConfigError, match=r"^train\.eval_tokens=19: "):
        component_windows(data, L, L)


def test_long_document_evaluation_reads_the_text_component(tmp_path):
    from lmzoo.measure.evaluation import eval_settings, validation_windows

    data = mix(corpus(tmp_path)).build(seed=0, shard_index=0, shard_count=1)
    long_only = validation_windows(data, eval_settings(["eval.tokens=38", "eval.min_doc_tokens=38"]), [L])[L]
    assert long_only.sampling_keys()["sampling"] == "long_documents"


class FakeScores:
    mean_loss, answers_only = 1.5, False


def own_answers(windows):
    batch = windows(np.arange(len(windows)))
    return batch["targets"][batch["weights"] > 0]


def test_greedy_choices_are_read_back_among_all_tokens():
    tokens = np.array([5, 2, 7])  # task symbols 0, 1, 2 written as tokens 5, 2, 7 of a vocabulary of 9
    logits = np.zeros((1, 3, 9))
    logits[0, 0, 7], logits[0, 1, 2], logits[0, 2, 8] = 1, 1, 1  # symbol 2, symbol 1, then a token of no symbol

    def forward(inputs):
        np.testing.assert_array_equal(inputs, [[5, 2, 7]])
        return logits

    read = forward_in_symbols(forward, tokens, np.array([[0, 1, 2]])).argmax(-1)
    np.testing.assert_array_equal(read, [[2, 1, 3]])  # 3: outside the task's symbols, equal to no target


@pytest.mark.parametrize("overrides, expected", [
    (["data.components.text.weight=-1"], ["data.components.text.weight=-1", "positive"]),
    (["data.components.passkey.source=mix"], ["data.components.passkey.source='mix'", "mqar", "stdlib", "passkey"]),
    (["~data.components.text", "~data.components.passkey"], ["data.components is empty"]),
    (["data.components.passkey.digits=0"], ["data.components.passkey.digits=0 must be positive"]),
    (["+data.components.passkey.depth=1"], ["unknown key 'data.components.passkey.depth'", "digits"]),
])
def test_bad_settings_are_one_line(capsys, overrides, expected):
    with pytest.raises(SystemExit) as exit_info:
        train_main(["+attn=softmax", "data=mix", *overrides])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmzoo: error: ") and len(err.splitlines()) == 1, err
    for fragment in expected:
        assert fragment in err, (fragment, err)


def test_more_bad_settings_name_the_setting(tmp_path):
    paths = corpus(tmp_path)
    for components, settings, message in [
        ({"text": {"source": "text_files", "paths": paths, "weight": "lots"}}, {},
         "data.components.text.weight='lots' must be a positive number"),
        ({"text": {"source": "text_files", "paths": paths, "weight": 1, "tokenizer": "bpe"}}, {},
         "data.components.text.tokenizer: every component of a mix has the mix's; set data.tokenizer"),
        ({"pk": {"source": "passkey", "weight": 1, "seq_len": 64}}, {}, "data.components.pk.seq_len: "),
        ({"pk": {"source": "passkey", "weight": 1}}, {"seq_len": 8}, "data.seq_len=8 is too short for passkey"),
        ({"s5": {"source": "permutation", "weight": 1, "degree": 5, "task_vocab": 120}}, {},
         f"data.components.s5.task_vocab=120: a mix writes each task symbol as one character of the text tokenizer, "
         f"{len(SYMBOLS)} symbols at most"),
        ({"pk": {"source": "passkey", "weight": 1}}, {"tokenizer": "bpe"}, "data.tokenizer=bpe learns from a text"),
        ({"pk": "passkey"}, {}, "data.components.pk='passkey' must be a mapping with a source and a weight"),
        ({"1st": {"source": "passkey", "weight": 1}}, {}, "data.components.1st: a component name is letters"),
    ]:
        with pytest.raises(ConfigError) as error:
            to_dataclass(MixConfig, {"components": components, **settings}, prefix="data.").check()
        assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def test_the_fingerprint_covers_components_and_weights(tmp_path):
    paths = corpus(tmp_path / "corpus")
    first = mix(paths).build(seed=0, shard_index=0, shard_count=1).fingerprint
    assert [(c["name"], c["weight"], c["source"]) for c in first["components"]] == \
        [("text", 0.8, "text_files"), ("passkey", 0.15, "passkey"), ("mqar", 0.05, "mqar")]
    reweighted = mix(paths, (0.7, 0.25, 0.05)).build(seed=0, shard_index=0, shard_count=1).fingerprint
    (tmp_path / "corpus" / "f00.txt").write_text("changed")
    edited = mix(paths).build(seed=0, shard_index=0, shard_count=1).fingerprint
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    check_data(run, first, step=0, allow_changed=False)
    for changed in (reweighted, edited):
        with pytest.raises(RunFault, match=r"the data differ .*\(components changed\)"):
            check_data(run, changed, step=4, allow_changed=False)


@pytest.mark.slow
def test_a_tiny_mix_trains_and_a_changed_mix_is_not_resumed(tmp_path):
    steps = ["train.steps=4", "train.eval_every=4", "train.log_every=2", "train.probe_batch=0"]
    summary = train(tiny_config("softmax", "data=mix", *steps, run_dir=tmp_path))
    assert summary["step"] == 4 and np.isfinite(summary["val_loss"])
    fingerprint = json.loads((tmp_path / "data_fingerprint.json").read_text())
    assert [(c["name"], c["weight"]) for c in fingerprint["components"]] == [("text", 0.95), ("passkey", 0.05)]
    rows = RunDir(tmp_path).read_metrics()  # the trainer logs a mix's losses by component (its SourceMetrics)
    assert "loss/text" in rows[-1] and "val_loss/passkey" in rows[-1] and "val_accuracy/passkey" in rows[-1]
    with pytest.raises(ConfigError, match=r"data\.components\.text\.weight: 0\.95 there, 0\.9 here"):
        train(tiny_config("softmax", "data=mix", *steps, "train.steps=6", "data.components.text.weight=0.9",
                          run_dir=tmp_path))


def test_a_task_components_grid_reads_the_model_through_the_mix_tokens(tmp_path):
    grid = {"weight": 1, "digits": 2, "grid_depths": [0.0, 1.0], "grid_examples": 4}
    cfg = to_dataclass(MixConfig, {"seq_len": L, "components": {"pk": {"source": "passkey", **grid}}}, prefix="data.")
    cfg.check()
    task = cfg.parts()[0].spec
    written = np.array([ord(c) for c in SYMBOLS[: task.task_vocab] + " :."])

    sep = task.task_vocab + 1

    def guess(symbols):  # after a SEP, the symbol that followed the row's first SEP; elsewhere the input itself
        first = symbols[np.arange(len(symbols)), (symbols == sep).argmax(1) + 1]
        return np.where(symbols == sep, first[:, None], symbols)

    def in_task_symbols(inputs):
        return np.eye(task.task_vocab + 3)[guess(inputs)]

    def in_text_tokens(inputs):  # the same guess over the byte tokenizer's 259 tokens
        symbol_of = np.zeros(259, int)
        symbol_of[written] = np.arange(len(written))
        return np.eye(259)[written[guess(symbol_of[inputs])]]

    mixed = cfg.extra_evaluation(in_text_tokens, [L, 2 * L], tmp_path, batch_size=3)["pk"]
    alone = task.extra_evaluation(in_task_symbols, [L, 2 * L], tmp_path, batch_size=3)["passkey"]
    assert mixed["accuracy"] == alone["accuracy"] and mixed["answer_accuracy"] == alone["answer_accuracy"]
    assert 0 < np.mean(mixed["accuracy"]) < 1
    assert (tmp_path / "pk" / "passkey.png").exists()
