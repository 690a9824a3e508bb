"""An experiment arm's seeds trained as one group (``lmzoo.experiments.runs.train_runs``): each seed's run is
where, and what, training it alone gives; a run directory trained one seed at a time is reused, not retrained."""

from __future__ import annotations

import numpy as np
import pytest

from lmzoo.cli import compose_and_validate
from lmzoo.experiments import run_experiment, runs, seeds_grouped
from lmzoo.experiments.runs import by_start, train_grid, train_run, train_runs
from lmzoo.record.directory import RunDir

TINY = ["data.seq_len=32", "train.batch_size=2", "model.n_layers=1", "model.d_model=32", "train.eval_every=2",
        "train.eval_tokens=128", "train.probe_batch=0"]


def rows(run_dir) -> list[tuple]:
    return [(r["step"], r["loss"], r.get("val_loss")) for r in RunDir(run_dir).read_metrics()]


@pytest.fixture
def groups(monkeypatch) -> list[list[int]]:
    """The seeds of each group ``train_runs`` trained as one, in order."""
    trained, group_train = [], runs.loop.train_runs
    monkeypatch.setattr(runs.loop, "train_runs", lambda configs: trained.append([c.seed for c in configs])
                        or group_train(configs))
    return trained


@pytest.mark.slow
def test_a_quick_experiment_trains_each_arm_as_one_group_with_its_single_runs_losses(tmp_path, groups):
    """decode_cache with two seeds per arm: grouped, each seed's logged loss and validation equal those of
    the seed trained alone to rtol 1e-5 (float rounding of the vmapped program), and the checks come out alike."""
    overrides = ["variants=[gqa,mla]", "seeds=[0,1]"]
    grouped = run_experiment("decode_cache", tmp_path / "grouped", quick=True, overrides=overrides, seed_groups="true")
    assert groups == [[0, 1], [0, 1]]
    alone = run_experiment("decode_cache", tmp_path / "alone", quick=True, overrides=overrides, seed_groups="false")
    assert groups == [[0, 1], [0, 1]] and grouped["runs"] == alone["runs"]
    for run in grouped["runs"]:
        mine, theirs = (rows(tmp_path / which / "decode_cache" / run) for which in ("grouped", "alone"))
        assert [r[0] for r in mine] == [r[0] for r in theirs] == [8]  # the quick run logs its last step
        np.testing.assert_allclose(np.array(mine, float), np.array(theirs, float), rtol=1e-5)
    outcome = lambda record: [(c["name"], c["passed"], c.get("undecided")) for c in record["checks"]]
    assert outcome(grouped) == outcome(alone) and grouped["reason"] == alone["reason"]


@pytest.mark.slow
def test_an_out_dir_trained_one_seed_at_a_time_is_reused_and_its_missing_seeds_train_as_a_group(tmp_path, groups):
    """Seed 0 trained alone (the old way) stays as it is; seeds 1 and 2 train as one group into the directories
    a run of their own would use; another experiment's arm of the same settings links to them all."""
    one = {seed: tmp_path / "one" / "runs" / f"softmax-s{seed}" for seed in (0, 1, 2)}
    train_run("softmax", one[0], seed=0, steps=2, overrides=TINY)
    before = (one[0] / "metrics.jsonl").read_bytes()
    with seeds_grouped("true"):
        configs = train_runs("softmax", one, steps=2, overrides=TINY)
    assert groups == [[1, 2]] and (one[0] / "metrics.jsonl").read_bytes() == before
    for seed, run_dir in one.items():
        assert configs[seed].seed == seed and not run_dir.is_symlink() and RunDir(run_dir).is_trained()
        saved = RunDir(run_dir).read_config()
        assert saved.seed == seed and list(saved.train.seeds) == [] and saved.run_dir == str(run_dir)
    assert rows(one[1]) != rows(one[2])
    two = {seed: tmp_path / "two" / "runs" / f"rope-s{seed}" for seed in (0, 1, 2)}
    with seeds_grouped("true"):
        train_runs("softmax", two, steps=2, overrides=TINY)
    assert groups == [[1, 2]] and all(two[s].resolve() == one[s].resolve() for s in two)


@pytest.mark.slow
def test_a_learning_rate_grid_trains_as_one_group_with_adamw_and_one_group_per_rate_otherwise(tmp_path, groups):
    grid = lambda name: {(lr, seed): tmp_path / name / "runs" / f"softmax-lr{lr:g}-s{seed}"
                         for lr in (0.001, 0.02) for seed in (0, 1)}
    with seeds_grouped("true"):
        configs = train_grid("softmax", grid("adamw"), steps=2, overrides=TINY)
        assert groups == [[0, 1, 0, 1]]
        for (lr, seed), run_dir in grid("adamw").items():
            saved = RunDir(run_dir).read_config()
            assert configs[lr, seed].optim.lr == saved.optim.lr == lr and saved.seed == seed
        train_grid("softmax", grid("muon"), steps=2, overrides=[*TINY, "optim=muon"])
    assert groups == [[0, 1, 0, 1], [0, 1], [0, 1]]
    runs = tmp_path / "adamw" / "runs"
    assert rows(runs / "softmax-lr0.02-s0") != rows(runs / "softmax-lr0.001-s0")


def test_runs_group_by_the_step_they_resume_from(tmp_path):
    """Fresh runs together, runs saved at one step together, each finished run alone."""
    def at(seed: int, *saved: int):
        run_dir = tmp_path / f"s{seed}"
        for step in saved:
            (run_dir / "checkpoints" / str(step)).mkdir(parents=True)
        return compose_and_validate(["+attn=softmax", f"run_dir={run_dir}", f"seed={seed}", "train.steps=4", *TINY])

    configs = [at(0), at(1, 2), at(2, 4), at(3), at(4, 2), at(5, 2, 4)]
    assert [[c.seed for c in group] for group in by_start(configs, 4)] == [[0, 3], [1, 4], [2], [5]]


def test_seed_groups_is_one_of_its_choices():
    from lmzoo.config import ConfigError

    with pytest.raises(ConfigError, match="seed_groups='sometimes' is not valid"), seeds_grouped("sometimes"):
        pass
