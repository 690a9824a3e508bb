"""lm-evaluation-harness runs local tasks on a trained run through the lmzoo adapter, scoring as lmzoo does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_lmzoo, tiny_config

from lmzoo.measure import comparison
from lmzoo.measure.comparison.harness import harness_difference_table, harness_table
from lmzoo.measure.comparison.reading import Group, Run
from lmzoo.scoring.lengths import token_scores
from lmzoo.record.opening import open_trained
from lmzoo.run.loop import train

pytest.importorskip("lm_eval")
from lmzoo import lm_eval as command
from lmzoo.interop.eval_harness import LmzooLM, padded_length

DOCS = [
    {"context": "def main():\n    return", "choices": [" 0", " None", " main()"], "answer": 0,
     "text": "import os\nimport sys\n" * 3, "prompt": "for i in range(", "target": "10):"},
    {"context": "", "choices": ["import os", "x = 1"], "answer": 1,
     "text": "class A:\n    pass\n", "prompt": "", "target": ""},
    {"context": "x = [1, 2, 3]  ", "choices": ["# é", "print(x)"], "answer": 1,
     "text": "y = 2 " * 20, "prompt": "while True:\n", "target": "    break"},
]


def write_tasks(folder):
    """Three tasks over one local JSONL file: multiple choice, rolling log-likelihood and greedy generation."""
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (folder / "choice.yaml").write_text(
        "task: lmzoo_choice\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
        "target_delimiter: ''\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    (folder / "rolling.yaml").write_text(
        "task: lmzoo_rolling\n" + common + "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    (folder / "generate.yaml").write_text(
        "task: lmzoo_generate\n" + common + "output_type: generate_until\ndoc_to_text: '{{prompt}}'\n"
        "doc_to_target: '{{target}}'\ngeneration_kwargs:\n  until: ['\\n\\n']\n  max_gen_toks: 6\n"
        "metric_list:\n  - metric: exact_match\n")
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config("softmax", "train.steps=4", "train.eval_every=4", "train.checkpoint_every=4", run_dir=run_dir))
    return run_dir


def own_log_prob(trained, context_ids, continuation_ids):
    """lmzoo's own scoring of the continuation: minus its summed cross-entropy (lmzoo.scoring.lengths)."""
    tokens = np.asarray(context_ids + continuation_ids, np.int32)[None]
    loss = np.asarray(token_scores(trained.model, tokens[:, :-1], tokens[:, 1:])["loss"])[0]
    return -float(loss[-len(continuation_ids):].sum())


@pytest.mark.slow
def test_local_tasks_run_end_to_end_and_score_as_lmzoo_does(run, tmp_path):
    tasks = write_tasks(tmp_path)
    results = command.main([f"run_dir={run}", "tasks=lmzoo_choice,lmzoo_rolling,lmzoo_generate",
                            f"include_path={tasks}", "batch_size=2"])
    saved = json.loads((run / "lm_eval" / "default" / "results.json").read_text())
    assert saved == json.loads(json.dumps(results)) and (saved["step"], saved["variant"]) == (4, "softmax")
    assert set(saved["results"]) == {"lmzoo_choice", "lmzoo_rolling", "lmzoo_generate"}
    assert 0 <= saved["results"]["lmzoo_choice"]["acc,none"] <= 1
    assert saved["per_example"]["lmzoo_choice"]["doc_id"] == [0, 1, 2]
    assert len(saved["per_example"]["lmzoo_choice"]["acc"]) == 3
    rolling = saved["per_example"]["lmzoo_rolling"]["bits_per_byte"]  # [log-likelihood, bytes] of each document
    assert [n for _, n in rolling] == [len(doc["text"].encode()) for doc in DOCS]
    assert sum(-ll for ll, _ in rolling) / sum(n for _, n in rolling) / np.log(2) == pytest.approx(
        saved["results"]["lmzoo_rolling"]["bits_per_byte,none"])
    for task, metric in [("lmzoo_rolling", "bits_per_byte"), ("lmzoo_choice", "acc")]:  # intervals over examples
        interval = saved["intervals"][task][metric]
        assert interval["estimate"] == pytest.approx(saved["results"][task][f"{metric},none"])
        assert interval["ci"][0] <= interval["estimate"] <= interval["ci"][1] and interval["covers"] == "text"

    trained = open_trained(run)
    lm = LmzooLM(trained=trained, batch_size=2)
    byte = trained.data.tokenizer.encode
    for doc, correct in zip(DOCS, saved["per_example"]["lmzoo_choice"]["acc"]):
        # the same strings: a trailing space of the context belongs to the continuation, "" is the end of a document
        context = doc["context"].rstrip()
        context_ids = byte(context).tolist() or [trained.data.tokenizer.eos_id]
        own = [own_log_prob(trained, context_ids, byte(doc["context"][len(context):] + choice).tolist())
               for choice in doc["choices"]]
        adapter = [log_prob for log_prob, _ in lm.loglikelihood(
            [type("Request", (), {"args": (doc["context"], choice)})() for choice in doc["choices"]])]
        np.testing.assert_allclose(adapter, own, atol=1e-4)
        assert correct == float(np.argmax(own) == doc["answer"])  # what the harness's run scored
    # a text longer than the training length (32) scores in disjoint windows: every token once
    text = DOCS[2]["text"]
    request = type("Request", (), {"args": (text,)})()
    ids = byte(text).tolist()
    expected = 0.0
    for start in range(0, len(ids), 32):
        window = ([trained.data.tokenizer.eos_id] + ids)[:start + 32 + 1][-(32 + 1):]
        scored = ids[start:start + 32]
        expected += own_log_prob(trained, window[:len(window) - len(scored)], scored)
    assert lm.loglikelihood_rolling([request])[0] == pytest.approx(expected, abs=1e-3)


def test_padding_lengths_are_few_and_cover_every_sequence():
    assert [padded_length(n, 256) for n in (1, 16, 17, 100, 256)] == [16, 16, 32, 128, 256]
    assert padded_length(300, 256) == 300  # longer than max_length only when asked to


def test_the_command_names_a_missing_model_or_task(capsys):
    for argv, message in [(["tasks=x"], "exactly one of run_dir"), (["run_dir=a", "hf=b", "tasks=x"], "exactly one"),
                          (["run_dir=a"], "tasks=<task,...> is required"), (["run_dir=a", "tasks=x", "batch=2"],
                                                                            "unknown key 'batch'")]:
        with pytest.raises(SystemExit) as exit:
            command.main(argv)
        assert exit.value.code == 2 and message in capsys.readouterr().err


def harness_run(name: str, seed: int, scores: dict) -> Run:
    """A run whose only results are lm-eval's: per task and metric, each example's score."""
    per_example = {task: {"doc_id": list(range(len(next(iter(metrics.values()))))), **metrics}
                   for task, metrics in scores.items()}
    return Run(Path(name), {"seed": seed, "label": name.split("/")[0]}, {}, [], harness={"per_example": per_example})


def test_compare_pools_lm_eval_examples_over_seeds_with_intervals_that_count_both():
    rng = np.random.default_rng(0)
    scores = {f"{arm}/{seed}": {"choice": {"acc": (rng.random(40) < p).astype(float).tolist()},
                                "rolling": {"bits_per_byte": [[-float(rng.uniform(20, 40)) * p, 30]
                                                             for _ in range(40)]}}
              for arm, p in (("a", 0.3), ("b", 0.8)) for seed in (0, 1)}
    groups = [Group(arm, [harness_run(f"{arm}/{seed}", seed, scores[f"{arm}/{seed}"]) for seed in (0, 1)])
              for arm in ("a", "b")]
    settings = {"resamples": 200, "seed": 0}
    markdown, records, notes = harness_table(groups, settings)
    assert not notes and "| variant | n | choice acc | rolling bits_per_byte | interval |" in markdown
    for group, record in zip(groups, records):
        per_run = [np.mean(r.harness["per_example"]["choice"]["acc"]) for r in group.runs]
        assert record["choice/acc"]["estimate"] == pytest.approx(np.mean(per_run))
        assert record["choice/acc"]["uncertainty"] == "seeds+text" and record["choice/acc"]["seeds"] == [2]
        pairs = [np.asarray(r.harness["per_example"]["rolling"]["bits_per_byte"]) for r in group.runs]
        bpb = [-p[:, 0].sum() / p[:, 1].sum() / np.log(2) for p in pairs]  # lm-eval's ratio of sums, per run
        assert record["rolling/bits_per_byte"]["estimate"] == pytest.approx(np.mean(bpb))
        assert record["choice/acc"]["lo"] <= record["choice/acc"]["estimate"] <= record["choice/acc"]["hi"]
    text, differences = harness_difference_table(groups, groups[0], settings, "holm")
    assert differences[0]["choice/acc"]["estimate"] == pytest.approx(
        records[1]["choice/acc"]["estimate"] - records[0]["choice/acc"]["estimate"])
    assert "Δ choice acc" in text and differences[0]["choice/acc"]["uncertainty"] == "seeds+text"

    groups[1].runs[1].harness["per_example"]["choice"]["doc_id"][0] = 99  # another example scored: not comparable
    markdown, records, notes = harness_table(groups, settings)
    assert "choice acc" not in markdown and "rolling bits_per_byte" in markdown
    assert notes == ["lm-eval choice acc left out: its runs scored different examples (another limit= or task "
                     "version); rerun python -m lmzoo.lm_eval with the same settings on each"]


@pytest.mark.slow
def test_compare_shows_lm_eval_tasks_of_two_arms_of_two_seeds(tmp_path):
    tasks = write_tasks(tmp_path)
    for arm, lr in (("a", "0.003"), ("b", "0.01")):
        train(tiny_config("softmax", "train.seeds=[0,1]", "train.steps=2", "train.eval_every=2",
                                "train.checkpoint_every=2", f"optim.lr={lr}", f"label={arm}", run_dir=tmp_path / arm))
        for seed in (0, 1):
            command.main([f"run_dir={tmp_path / arm / f'seed{seed}'}", "tasks=lmzoo_choice,lmzoo_rolling",
                          f"include_path={tasks}", "batch_size=4"])
    report = comparison.compare([tmp_path / "a", tmp_path / "b"], baseline="a")
    rows = {row["label"]: row for row in report.record["lm_eval"]}
    assert set(rows) == {"a", "b"} and "lm-evaluation-harness" in report.markdown
    for arm in ("a", "b"):
        saved = [json.loads((tmp_path / arm / f"seed{s}" / "lm_eval" / "default" / "results.json").read_text())
                 for s in (0, 1)]
        assert rows[arm]["lmzoo_choice/acc"]["estimate"] == pytest.approx(
            np.mean([s["results"]["lmzoo_choice"]["acc,none"] for s in saved]))
        assert rows[arm]["lmzoo_rolling/bits_per_byte"]["estimate"] == pytest.approx(
            np.mean([s["results"]["lmzoo_rolling"]["bits_per_byte,none"] for s in saved]))
        assert rows[arm]["lmzoo_rolling/bits_per_byte"]["uncertainty"] == "seeds+text"
    [difference] = report.record["lm_eval_differences"]
    assert difference["label"] == "b" and difference["lmzoo_rolling/bits_per_byte"]["estimate"] == pytest.approx(
        rows["b"]["lmzoo_rolling/bits_per_byte"]["estimate"] - rows["a"]["lmzoo_rolling/bits_per_byte"]["estimate"])


@pytest.mark.slow
def test_lm_evals_own_command_line_runs_the_lmzoo_model(run, tmp_path):
    """lm-eval reads no plugin entry points: its command line knows ``lmzoo`` when lmzoo's adapter module runs it."""
    tasks = write_tasks(tmp_path)
    proc = run_lmzoo("-m", "lmzoo.interop.eval_harness", "--model", "lmzoo", "--model_args", f"run_dir={run}",
                     "--tasks", "lmzoo_choice", "--include_path", str(tasks), "--batch_size", "2",
                     "--output_path", str(tmp_path / "out"), check=True, timeout=900)
    [written] = (tmp_path / "out").rglob("results_*.json")
    theirs = json.loads(written.read_text())["results"]["lmzoo_choice"]["acc,none"]
    ours = command.main([f"run_dir={run}", "tasks=lmzoo_choice", f"include_path={tasks}", "batch_size=2",
                         "tag=own"])["results"]["lmzoo_choice"]["acc,none"]
    assert theirs == ours and "lmzoo_choice" in proc.stdout


@pytest.mark.slow
def test_lm_evals_own_command_line_names_a_missing_run_in_one_line(tmp_path):
    proc = run_lmzoo("-m", "lmzoo.interop.eval_harness", "--model", "lmzoo", "--model_args",
                     f"run_dir={tmp_path / 'missing'}", "--tasks", "lambada_openai", timeout=900)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("lmzoo: error: run_dir=")  # lm-eval's own log lines above
