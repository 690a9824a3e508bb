"""The RULER tasks: answers read back from the haystack by hand, depths where asked, a grid scoring answers only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lmzoo.config import ConfigError
from lmzoo.data import build_data
from lmzoo.data.retrieval import retrieval_grid, wilson_interval
from lmzoo.data.ruler import MultiKeyConfig, MultiQueryConfig, MultiValueConfig, VariableTrackingConfig
from lmzoo.data.synthetic import TRAIN, TaskExamples

from conftest import tiny_config

TASKS = {
    "multikey": MultiKeyConfig(seq_len=40, num_keys=3, key_vocab=5, task_vocab=20),
    "multivalue": MultiValueConfig(seq_len=40, num_values=3, digits=2),
    "multiquery": MultiQueryConfig(seq_len=64, num_keys=4, num_queries=3, num_values=2, digits=2, filler="noise"),
    "vt": VariableTrackingConfig(seq_len=48, hops=3, num_chains=2, var_vocab=9, task_vocab=24),
    "vt_noise": VariableTrackingConfig(seq_len=40, hops=2, filler="noise"),
}


def sequences(batch: dict) -> np.ndarray:
    """Whole examples from their shifted views."""
    return np.concatenate([batch["inputs"][:, :1], batch["targets"]], axis=1)


def split_tail(cfg, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The haystack and the questions with their answers (the tail's length follows from the settings)."""
    if isinstance(cfg, VariableTrackingConfig):
        tail = 1 + cfg.digits + cfg.hops + 1
    else:
        tail = cfg.num_queries * (1 + (cfg.num_keys > 1) + cfg.num_values * cfg.digits)
    return seq[:-tail], seq[-tail:]


def needles(cfg, haystack: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(start, tokens) of each needle, in order: every SEP starts one, filler symbols never sit inside one."""
    sep = cfg.task_vocab + 1
    starts = np.flatnonzero(haystack == sep)
    if isinstance(cfg, VariableTrackingConfig):
        sizes = [2 + cfg.digits if haystack[at + 2] < cfg.base else 3 for at in starts]
    else:
        sizes = [1 + (cfg.num_keys > 1) + cfg.digits] * len(starts)
    return [(at, haystack[at : at + size]) for at, size in zip(starts, sizes)]


def filler_of(cfg, haystack: np.ndarray) -> np.ndarray:
    inside = np.zeros(len(haystack), bool)
    for at, tokens in needles(cfg, haystack):
        inside[at : at + len(tokens)] = True
    return haystack[~inside]


def niah_answers(cfg, seq: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """Each query's expected answer (its key's numbers in haystack order) and the keys of the needles it needs."""
    haystack, tail = split_tail(cfg, seq)
    named = cfg.num_keys > 1
    filed: dict[int, list[np.ndarray]] = {}
    for _, tokens in needles(cfg, haystack):
        filed.setdefault(int(tokens[1]) if named else None, []).append(tokens[1 + named :])
    assert len(filed) == cfg.num_keys and all(len(v) == cfg.num_values for v in filed.values())
    item = len(tail) // cfg.num_queries
    answers, asked = [], []
    for query in tail.reshape(cfg.num_queries, item):
        assert query[0] == cfg.task_vocab + 1
        key = int(query[1]) if named else None
        asked.append(key)
        answers.append(np.concatenate(filed[key]))
    assert len(set(asked)) == cfg.num_queries  # distinct keys asked
    return answers, asked


def vt_answer(cfg, seq: np.ndarray) -> list[int]:
    """The variables holding the asked value, followed link by link through the haystack's assignments."""
    haystack, tail = split_tail(cfg, seq)
    value = tuple(tail[1 : 1 + cfg.digits])
    holds, assigned = {}, set()  # variable -> value (roots) or variable (links)
    for _, tokens in needles(cfg, haystack):
        left, right = int(tokens[1]), tokens[2:]
        if right[0] >= cfg.base:  # a link: its right side was assigned earlier, the chain reads forward
            assert int(right[0]) in assigned
        holds[left] = tuple(right) if right[0] < cfg.base else int(right[0])
        assigned.add(left)
    chain = [next(var for var, right in holds.items() if right == value)]
    while (following := [var for var, right in holds.items() if right == chain[-1]]):
        assert len(following) == 1
        chain.append(following[0])
    return chain


@pytest.mark.parametrize("task", TASKS)
def test_each_answer_is_what_the_haystack_says(task):
    cfg = TASKS[task]
    cfg.check()
    if task == "vt":  # a grid cell
        batch = cfg.examples_at(cfg.seq_len, 0.5, 16, seed=1)
    else:  # validation examples as training draws them
        batch = build_data(cfg, seed=2).validation_windows([cfg.seq_len], 16 * cfg.seq_len)[cfg.seq_len](np.arange(16))
    for seq, weights in zip(sequences(batch), batch["weights"]):
        scored = seq[1:][weights == 1]
        assert weights.sum() == cfg.answer_tokens and len(seq) == cfg.seq_len + 1
        haystack, tail = split_tail(cfg, seq)
        filler = filler_of(cfg, haystack)
        assert (filler >= cfg.first_filler).all() and (filler < cfg.task_vocab).all()
        if isinstance(cfg, VariableTrackingConfig):
            expected = vt_answer(cfg, seq)
            assert len(expected) == cfg.hops + 1 and len(needles(cfg, haystack)) == cfg.num_chains * (cfg.hops + 1)
            np.testing.assert_array_equal(scored, expected)
            np.testing.assert_array_equal(np.flatnonzero(weights), np.arange(cfg.seq_len - cfg.hops - 1, cfg.seq_len))
        else:
            answers, _ = niah_answers(cfg, seq)
            np.testing.assert_array_equal(scored, np.concatenate(answers))
            assert (scored < cfg.base).all()


def first_needed(cfg, seq: np.ndarray) -> int:
    """Filler tokens before the earliest needle the answer needs."""
    haystack, _ = split_tail(cfg, seq)
    found = needles(cfg, haystack)
    if isinstance(cfg, VariableTrackingConfig):
        first = vt_answer(cfg, seq)[0]
        at = next(at for at, tokens in found if tokens[1] == first)
    else:
        asked = niah_answers(cfg, seq)[1]
        at = next(at for at, tokens in found if (tokens[1] if cfg.num_keys > 1 else None) in asked)
    return at - sum(len(tokens) for start, tokens in found if start < at)


def answer_symbols(batch: dict) -> np.ndarray:
    return np.sort(batch["targets"][batch["weights"] == 1].reshape(len(batch["targets"]), -1), axis=1)


@pytest.mark.parametrize("task", ["multikey", "multiquery", "vt"])
def test_the_answer_reaches_back_to_the_requested_depth_with_the_same_content(task):
    cfg = TASKS[task]
    n_filler = 61 - cfg.min_length
    reference = cfg.examples_at(cfg.seq_len, 0.0, 6, seed=4)
    for depth in (0.0, 0.3, 1.0):
        batch = cfg.examples_at(60, depth, 6, seed=4)
        assert all(first_needed(cfg, seq) == round(depth * n_filler) for seq in sequences(batch))
        # example i holds the same numbers at every length and depth: only where its needles sit changes (and so
        # the order in which several numbers under one key are answered)
        np.testing.assert_array_equal(answer_symbols(batch), answer_symbols(reference))
    training = build_data(cfg, seed=0).validation_windows([cfg.seq_len], 128 * cfg.seq_len)[cfg.seq_len](np.arange(128))
    depths = np.array([first_needed(cfg, seq) for seq in sequences(training)]) / (cfg.seq_len + 1 - cfg.min_length)
    assert depths.min() < 0.2 and depths.max() > 0.5  # drawn, not fixed


@pytest.mark.parametrize("task", ["multivalue", "vt_noise"])
def test_examples_are_deterministic_and_resumable(task):
    cfg = TASKS[task]
    data = build_data(cfg, seed=1)
    train = data.train_iterator(4)
    first, second = next(train), next(train)
    # batch k holds training examples 4k .. 4k + 3, each a function of (seed, split, index) alone: a resumed
    # run that knows its position draws what it would have drawn
    examples = TaskExamples(cfg, 1, TRAIN, cfg.seq_len + 1, data.tokenizer)
    for key in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(second[key], np.stack([examples(i)[key] for i in range(4, 8)]))
    np.testing.assert_array_equal(first["inputs"], build_data(cfg, seed=1).train_iterator(4).__next__()["inputs"])

    def validation(seed: int) -> dict:
        return build_data(cfg, seed=seed).validation_windows([cfg.seq_len], 8 * cfg.seq_len)[cfg.seq_len](np.arange(8))

    np.testing.assert_array_equal(validation(1)["inputs"], validation(1)["inputs"])
    assert not np.array_equal(validation(2)["inputs"], validation(1)["inputs"])
    assert not np.array_equal(validation(1)["inputs"], first["inputs"])  # the splits differ


def lookup_forward(cfg, lengths, depths, n: int, right_on, vocab: int):
    """Logits that predict every target of the examples the grid will draw where ``right_on(weights, example)``,
    and the wrong symbol everywhere else (found by the inputs, which differ from example to example)."""
    table = {}
    for length in lengths:
        for depth in depths:
            batch = cfg.examples_at(length, depth, n)
            for index, (inputs, targets) in enumerate(zip(batch["inputs"], batch["targets"])):
                answer = batch["weights"][index] == 1
                table[inputs.tobytes()] = np.where(right_on(answer, index), targets, (targets + 1) % vocab)

    def forward(tokens: np.ndarray) -> np.ndarray:
        predicted = np.stack([table[row.tobytes()] for row in tokens])
        return np.eye(vocab)[predicted]  # (B, T, V)

    return forward


@pytest.mark.parametrize("task", ["multiquery", "vt"])
def test_the_grid_scores_answer_tokens_only(task):
    cfg = dataclasses.replace(TASKS[task], grid_depths=[0.0, 1.0], grid_examples=6)
    lengths, depths, n, vocab = [cfg.seq_len, 2 * cfg.seq_len], cfg.grid_depths, cfg.grid_examples, cfg.task_vocab + 3
    answers_only = lookup_forward(cfg, lengths, depths, n, lambda answer, i: answer, vocab)
    grid = retrieval_grid(answers_only, cfg, lengths, depths, n, 4)
    assert grid["task"] == cfg.source and grid["answer_tokens"] == cfg.answer_tokens
    assert np.all(np.array(grid["accuracy"]) == 1) and np.all(np.array(grid["answer_accuracy"]) == 1)
    all_but_answers = lookup_forward(cfg, lengths, depths, n, lambda answer, i: ~answer, vocab)
    grid = retrieval_grid(all_but_answers, cfg, lengths, depths, n, 4)
    assert np.all(np.array(grid["accuracy"]) == 0) and np.all(np.array(grid["answer_accuracy"]) == 0)


def test_the_evaluator_gets_the_grid_named_after_the_task_with_its_heat_map(tmp_path):
    cfg = dataclasses.replace(TASKS["vt"], grid_depths=[0.0, 0.5], grid_examples=2)
    lengths = [48, 96, 192, 384, 768]
    forward = lookup_forward(cfg, lengths, cfg.grid_depths, 2, lambda answer, i: answer, cfg.task_vocab + 3)
    grid = cfg.extra_evaluation(forward, None, tmp_path, batch_size=2)["variable_tracking"]  # 1x to 16x by default
    assert grid["lengths"] == lengths and np.array(grid["answer_accuracy"]).shape == (2, 5)
    plot = tmp_path / "variable_tracking.png"
    assert plot.stat().st_size > 0 and grid["plot"] == str(plot)
    assert json.loads(json.dumps(grid)) == grid


def test_grid_intervals_cover_what_was_retrieved():
    cfg = TASKS["multivalue"]
    lengths, depths, n = [cfg.seq_len, 3 * cfg.seq_len], [0.0, 0.5, 1.0], 24
    retrieved = {0, 2, 3, 7, 9, 10, 11, 15, 20}  # these examples are answered right, the others all wrong
    forward = lookup_forward(cfg, lengths, depths, n, lambda answer, i: answer & (i in retrieved), cfg.task_vocab + 3)
    grid = retrieval_grid(forward, cfg, lengths, depths, n, 8)
    share = len(retrieved) / n
    wilson = wilson_interval(len(retrieved), n)
    for key in ("accuracy", "answer_accuracy"):
        assert np.allclose(grid[key], share)
        lo, hi = np.moveaxis(np.array(grid[f"{key}_ci"]), -1, 0)
        assert np.all(0 <= lo) and np.all(lo < share) and np.all(share < hi) and np.all(hi <= 1)
    np.testing.assert_allclose(np.array(grid["answer_accuracy_ci"]), np.full((3, 2, 2), [wilson.lo, wilson.hi]))
    assert grid["intervals"] == {"level": 0.95, "accuracy": "bootstrap over examples", "answer_accuracy": "Wilson"}
    assert grid["chance"] == 1 / cfg.base and TASKS["vt"].chance == 1 / 9


def test_data_selects_each_task_and_its_settings():
    cfg = tiny_config("softmax", "data=niah_multikey", "data.num_keys=3", "data.filler=noise").data
    assert isinstance(cfg, MultiKeyConfig)
    assert (cfg.seq_len, cfg.num_keys, cfg.filler, cfg.digits) == (32, 3, "noise", 3)
    cfg = tiny_config("softmax", "data=variable_tracking", "data.hops=2").data
    assert isinstance(cfg, VariableTrackingConfig) and (cfg.hops, cfg.num_chains, cfg.var_vocab) == (2, 1, 16)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (MultiQueryConfig(num_queries=5), "data.num_queries=5 exceeds data.num_keys=4: each query asks a different"),
        (MultiKeyConfig(key_vocab=3), "data.key_vocab=3 is too small for data.num_keys=4 distinct keys"),
        (MultiKeyConfig(task_vocab=18), r"data.task_vocab=18 leaves no filler symbols: it must exceed data.base=10 \+ "
                                        "data.key_vocab=8"),
        (MultiKeyConfig(filler="essay"), r"data.filler='essay' is not valid \(choose from: sentence, noise\)"),
        (MultiQueryConfig(seq_len=32), "data.seq_len=32 is too short for niah_multiquery: data.digits=3, "
                                       "data.num_keys=4 and data.num_queries=4 need at least 40"),
        (VariableTrackingConfig(var_vocab=4), "data.var_vocab=4 is too small for data.num_chains=1 chains of "
                                              r"data.hops \+ 1 = 5 distinct variables"),
        (VariableTrackingConfig(base=2, digits=1, num_chains=3, var_vocab=15),
         "data.base=2 and data.digits=1 write fewer values than data.num_chains=3"),
        (VariableTrackingConfig(hops=-1), "data.hops=-1 must be non-negative"),
    ],
)
def test_settings_are_checked(cfg, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        cfg.check()
