"""State passing (``train.state_passing``): ``carry`` over windows equals the forward over their concatenation,
rows restart at document starts, the stream's lanes, micro-batches, bit-identical resumes, and refusals."""

from __future__ import annotations

import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo import registry
from lmzoo.config import ConfigError
from lmzoo.data.train_iterators import StreamLanes, stream_iterator
from lmzoo.experiments import run_experiment
from lmzoo.experiments.judging import SMOKE
from lmzoo.mixers.base import MixerContext
from lmzoo.model import LM
from lmzoo.positions import Positions, PosConfig
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import Trainer, train
from lmzoo.run.steps import init_train_state, train_step

from conftest import VARIANTS, tiny_config
from mixer_checks import VOCAB, build, compiled

FIRST = 7  # tokens of the first window; the second has 6 (odd lengths, unequal windows)
# Row 0 is one document across both windows; row 1 opens a document inside the first window that runs on
# into the second, then one more.
SEGMENTS = np.array([[0] * 13, [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]], np.int32)
# One variant per implementation of carry: the linear family's (normalised linear attention's pair of states,
# RetNet's rotations at positions counted on), the delta rule's, RWKV-7's, and each state-space mixer's.
CARRIERS = ["linear", "retnet", "gated_deltanet", "rwkv7", "mamba", "mamba2", "log_linear_mamba2", "mamba3", "h3"]


def in_windows(model, tokens, segment_ids):
    """(logits of the whole, carry's logits over two windows, carry's state after the whole, after the windows)."""
    whole = model(tokens, segment_ids=segment_ids)
    _, state_whole = model.carry(tokens, segment_ids=segment_ids)
    first, state = model.carry(tokens[:, :FIRST], segment_ids=segment_ids[:, :FIRST])
    second, state = model.carry(tokens[:, FIRST:], state, segment_ids=segment_ids[:, FIRST:])
    return whole, jnp.concatenate([first, second], axis=1), state_whole, state


@pytest.mark.parametrize("variant", CARRIERS)
def test_carry_over_two_windows_equals_the_forward_over_both(variant):
    _, model = build(variant, "model.n_layers=1")
    tokens = jax.random.randint(jax.random.key(0), SEGMENTS.shape, 0, VOCAB)
    whole, pieces, state_whole, state = compiled(in_windows, model)(tokens, jnp.asarray(SEGMENTS))
    np.testing.assert_allclose(pieces, whole, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(state["position"], [13, 3])  # row 1's last document began at step 10
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state_whole)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_row_that_does_not_continue_starts_afresh():
    _, model = build("retnet", "model.n_layers=1")  # rotations read positions: the counter restarts too

    def windows(model, tokens):  # without segment ids: the positions count on over the whole window
        first, state = model.carry(tokens[:, :FIRST])
        restarted, _ = model.carry(tokens[:, FIRST:], state, continues=jnp.array([False, True]))
        fresh, _ = model.carry(tokens[:, FIRST:])
        continued, _ = model.carry(tokens[:, FIRST:], state)
        return restarted, fresh, continued, jnp.concatenate([first, continued], axis=1), model(tokens)

    tokens = jax.random.randint(jax.random.key(1), (2, 13), 0, VOCAB)
    restarted, fresh, continued, pieces, whole = compiled(windows, model)(tokens)
    np.testing.assert_allclose(pieces, whole, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(restarted[0], fresh[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(restarted[1], continued[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(fresh[0], continued[0], atol=1e-3)  # the carried state matters


def test_lanes_run_on_through_the_stream_and_restart_after_eos_and_at_wraps():
    eos, seq_len = 99, 4
    tokens = np.arange(1, 42, dtype=np.int32) % 50
    tokens[[11, 27]] = eos  # windows of 4 inputs: the windows starting at 12 and at 28 open new documents
    lanes = StreamLanes(tokens, seq_len, batch_size=2, seed=3, eos_id=eos)  # 10 windows: 2 lanes of 5
    starts = lanes.lane_starts
    assert sorted((starts - starts[0]) % 10) == [0, 5]
    batches = [lanes(step) for step in range(lanes.steps_per_pass)]
    for step, batch in enumerate(batches):
        index = (starts + step) % 10
        np.testing.assert_array_equal(batch["inputs"], tokens[index[:, None] * seq_len + np.arange(seq_len)])
        after_eos = tokens[index * seq_len - 1] == eos
        np.testing.assert_array_equal(batch["continues"], (step > 0) & (index > 0) & ~after_eos)
        assert "segment_ids" in batch
    assert not batches[0]["continues"].any()  # each pass starts afresh
    assert any(b["continues"].all() for b in batches) and any(after_eos_seen(b, tokens, eos) for b in batches)

    shard = StreamLanes(tokens, seq_len, batch_size=2, seed=3, shard_index=1, shard_count=2, eos_id=eos)
    np.testing.assert_array_equal(shard(2)["inputs"], batches[2]["inputs"][1:])  # this process's block of rows

    iterator = stream_iterator(tokens, seq_len, 2, 3, eos_id=eos)
    for _ in range(7):
        next(iterator)
    resumed = stream_iterator(tokens, seq_len, 2, 3, eos_id=eos)
    resumed.set_state(iterator.get_state())
    np.testing.assert_array_equal(next(resumed)["inputs"], next(iterator)["inputs"])  # step 7: a wrapped pass


def after_eos_seen(batch, tokens, eos):
    """Whether a row of the batch opens a document that the stream's previous window closed (it must not continue)."""
    opened = np.isin(batch["inputs"][:, 0], tokens[[12, 28]]) & ~batch["continues"]
    return opened.any()


def test_micro_batches_keep_each_rows_state_in_its_place_and_a_skipped_step_restarts_every_row():
    cfg = tiny_config("gla", "model.n_layers=1", "train.state_passing=true", "data.seq_len=9", "train.batch_size=4")
    model = LM(cfg, VOCAB, rngs=nnx.Rngs(0))
    graphdef, state, tx = init_train_state(cfg, model)
    tokens = jax.random.randint(jax.random.key(2), (4, 10), 0, VOCAB)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "continues": jnp.array([True, False, True, True])}
    _, state["carried"] = model.carry(tokens[:, :-1] + 1)  # a state worth carrying
    step = jax.jit(partial(train_step, graphdef, tx, micro_batches=2))  # slices of rows 0, 2 and 1, 3

    new, metrics = step(state, batch)
    logits, expected = model.carry(batch["inputs"], state["carried"], continues=batch["continues"])
    for a, b in zip(jax.tree.leaves(new["carried"]), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], axis=-1).mean()
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)

    blown_up = {**state, "params": jax.tree.map(lambda x: x * 1e30 if x.ndim == 2 else x, state["params"])}
    kept, metrics = step(blown_up, batch)
    assert not bool(metrics["finite"])
    jax.tree.map(np.testing.assert_array_equal, kept["params"], blown_up["params"])
    for a in jax.tree.leaves(kept["carried"]):  # the data moved on: no row continues a state the step refused
        np.testing.assert_array_equal(a, np.zeros_like(a))


RESUME = ["model.n_layers=1", "train.state_passing=true", "data.document_boundaries=mask", "train.steps=6",
          "train.checkpoint_every=2", "train.eval_every=6", "train.log_every=1", "train.probe_batch=0"]


class Killed(Exception):
    pass


@pytest.mark.slow
def test_a_killed_run_resumes_bit_identically(tmp_path, monkeypatch):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    train(tiny_config("gla", *RESUME, run_dir=whole))

    advance = Trainer.advance

    def killed_after_step_5(self):  # the newest checkpoint is step 4's: step 5 is lost and redone
        if self.step == 5:
            raise Killed
        return advance(self)

    monkeypatch.setattr(Trainer, "advance", killed_after_step_5)
    with pytest.raises(Killed):
        train(tiny_config("gla", *RESUME, run_dir=broken))
    monkeypatch.setattr(Trainer, "advance", advance)
    train(tiny_config("gla", *RESUME, run_dir=broken))

    losses = [[r["loss"] for r in RunDir(run).read_metrics()] for run in (whole, broken)]
    assert len(losses[0]) == 6 and losses[1] == losses[0]  # bit-identical, no step lost or doubled
    for a, b in zip(*(final_state(run) for run in (whole, broken))):
        np.testing.assert_array_equal(a, b)

    with pytest.raises(ConfigError, match="state_passing=false: run_dir .* trained with train.state_passing=true"):
        Trainer(tiny_config("gla", *RESUME, "train.state_passing=false", run_dir=broken))


def final_state(run_dir):
    """Every leaf of the newest checkpoint's training state (the carried state included), as numpy."""
    trainer = Trainer(tiny_config("gla", *RESUME, run_dir=run_dir))
    try:
        assert "carried" in trainer.state and trainer.step == 6
        return [np.asarray(x) for x in jax.tree.leaves(trainer.state)]
    finally:
        trainer.close()


def refusal(capsys, *overrides: str) -> str:
    """The one line ``lmzoo: error: ...`` a config is refused with (exit code 2)."""
    with pytest.raises(SystemExit) as exit_info:
        tiny_config(*overrides)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_mixers_without_a_carried_state_are_refused_in_one_line(capsys):
    message = refusal(capsys, "softmax", "train.state_passing=true")
    assert "train.state_passing=true needs recurrent mixers, and softmax carries no state" in message
    assert "gla" in message and "mamba2" in message and "h3" in message
    hybrid = refusal(capsys, "gla_softmax", "train.state_passing=true", "model.n_layers=4")  # its 4th layer: softmax
    assert "gla_softmax.softmax carries no state" in hybrid
    tiny_config("mamba", "train.state_passing=true")  # accepted


def test_every_spec_that_says_it_carries_a_state_builds_a_mixer_with_carry():
    ctx = MixerContext(32, 4, 0, 2, jnp.float32, Positions.from_config(PosConfig(), train_len=32))
    for name in registry.names():
        spec = registry.lookup(name)
        if name == "hybrid":
            continue
        mixer = nnx.eval_shape(lambda: spec(name=name, mixer=name).build(ctx, rngs=nnx.Rngs(0)))
        assert hasattr(mixer, "carry") == spec.carries_state, name
    assert {v for v in VARIANTS if v in registry.names() and registry.lookup(v).carries_state} >= set(CARRIERS)


@pytest.mark.slow
def test_state_passing_quick_run_compares_both_arms_at_every_length(tmp_path):
    record = run_experiment("state_passing", tmp_path, quick=True)
    saved = json.loads((tmp_path / "state_passing" / "verdict.json").read_text())
    assert saved == record and saved["verdict"] == SMOKE
    variant = record["settings"]["variants"][0]
    lengths = [str(f * record["settings"]["seq_len"]) for f in record["settings"]["factors"]]
    for arm in ("windows", "passing"):
        assert set(record["evidence"]["conditions"][f"{variant} {arm}"]["bpb"]) == set(lengths)
    assert {c["name"] for c in record["checks"] if not c["control"]} == {
        f"{variant} passing: bpb ratio at {lengths[-1]}", f"{variant}: bpb ratio at {lengths[-1]}, passing - windows"}
    config = (tmp_path / "state_passing" / "runs" / f"{variant}-passing-s0" / "config.yaml").read_text()
    assert "state_passing: true" in config
    assert all((tmp_path / "state_passing" / f).stat().st_size > 0 for f in record["figures"])


def test_state_passing_judge_fails_where_passing_still_blows_up_and_is_inconclusive_without_a_blowup():
    from lmzoo.experiments.judging import familywise, outcome
    from lmzoo.experiments.state_passing import Settings, judge

    settings = Settings(variants=["gla", "mamba2"], seq_len=16, factors=[1, 8])
    record = lambda estimate: {"estimate": estimate, "lo": estimate - 0.01, "hi": estimate + 0.01,  # noqa: E731
                               "seeds": [3, 3], "uncertainty": "seeds+text"}

    def evidence(windows_ratio, passing_ratio):
        curve = lambda ratio: {"bpb": {"16": record(2.0), "128": record(2.0 * ratio)},  # noqa: E731
                               "ratio": {"16": record(1.0), "128": record(ratio)}}
        conditions = {f"{v} {arm}": curve(ratio) for v in settings.variants
                      for arm, ratio in (("windows", windows_ratio), ("passing", passing_ratio))}
        differences = {f"{v}: bpb ratio at 128, passing - windows": record(passing_ratio - windows_ratio)
                       for v in settings.variants}
        return {"conditions": conditions, "differences": differences,
                "ngram_bpb": {"unigram": 4.8, "bigram": 3.6, "trigram": 2.6}}  # the windows models' 2.0 learned context

    verdict = lambda windows, passing: outcome(familywise(judge(evidence(windows, passing), settings)))[0]  # noqa: E731
    assert verdict(1.5, 0.9) == "reproduced"
    assert verdict(1.5, 1.5) == "not reproduced"  # state passing changed nothing
    assert verdict(1.0, 0.9) == "inconclusive"  # no blow-up on windows: nothing to remove (the control)
