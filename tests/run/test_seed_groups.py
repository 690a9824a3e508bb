"""Several seeds as one jitted step (``train.seeds``, ``lmzoo.run.seeds``): each seed's run directory holds the run
its single-seed training writes, with its losses; a killed group resumes bit for bit per seed (also when it died
between the seeds' checkpoints); one seed diverging stops only that seed; bad settings are one line."""

from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from lmzoo.cli import compose_and_validate
from lmzoo.config import ConfigError
from lmzoo.faults import Diverged
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import Trainer, open_steps, train

from conftest import REPO, TINY, tiny_config

SHORT = ["model.n_layers=1", "train.probe_batch=0", "train.steps=4", "train.log_every=1", "train.eval_every=4",
         "train.checkpoint_every=2"]


def saved_digest(run_dir, step: int) -> dict:
    """The digests a checkpoint holds of its parts (parameters, optimizer state, step, data position): equal
    digests, bit-identical states."""
    return json.loads((run_dir / "checkpoints" / str(step) / "digest" / "metadata").read_text())


def losses(run_dir) -> list[float]:
    return [row["loss"] for row in RunDir(run_dir).read_metrics()]


@pytest.mark.slow
def test_each_seed_of_a_group_is_its_single_seed_run(tmp_path):
    """Three seeds in one step: each seed's directory holds its own config (its seed), and its losses and
    validation are those of the same seed trained alone, to float rounding."""
    summary = train(tiny_config("softmax", *SHORT, "train.seeds=[0,1,5]", run_dir=tmp_path / "group"))
    assert sorted(summary["seeds"]) == [0, 1, 5] and summary["step"] == 4
    for seed in (0, 1, 5):
        own = tmp_path / "group" / f"seed{seed}"
        saved = OmegaConf.load(own / "config.yaml")
        assert saved.seed == seed and list(saved.train.seeds) == [] and saved.run_dir == str(own)
        alone = train(tiny_config("softmax", *SHORT, f"seed={seed}", run_dir=tmp_path / f"alone{seed}"))
        assert len(losses(own)) == 4
        np.testing.assert_allclose(losses(own), losses(tmp_path / f"alone{seed}"), rtol=1e-5)
        assert summary["seeds"][seed]["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
        assert sorted(p.name for p in (own / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    assert losses(tmp_path / "group" / "seed0") != losses(tmp_path / "group" / "seed1")  # own data, own start


@pytest.mark.slow
def test_each_learning_rate_of_a_grid_is_its_single_run(tmp_path):
    """train.lrs with train.seeds: every learning rate with every seed in one step, each run in lr<lr>/seed<s>
    with its own optim.lr, its losses and validation those of the same run trained alone (rtol 1e-5: the grid's
    optimizer scales a peak-1 update by the rate, a rounding apart), its checkpoint one a single run resumes."""
    summary = train(tiny_config("softmax", *SHORT, "train.lrs=[0.001,0.02]", "train.seeds=[0,1]", run_dir=tmp_path))
    assert sorted(summary["runs"]) == [str(tmp_path / f"lr{lr}" / f"seed{s}")
                                       for lr in ("0.001", "0.02") for s in (0, 1)]
    for lr, seed in [("0.001", 1), ("0.02", 0)]:
        own = tmp_path / f"lr{lr}" / f"seed{seed}"
        saved = OmegaConf.load(own / "config.yaml")
        assert saved.optim.lr == float(lr) and saved.seed == seed
        assert list(saved.train.lrs) == list(saved.train.seeds) == []
        single = [*SHORT, f"optim.lr={lr}", f"seed={seed}"]
        alone = train(tiny_config("softmax", *single, run_dir=tmp_path / f"alone{lr}"))
        np.testing.assert_allclose(losses(own), losses(tmp_path / f"alone{lr}"), rtol=1e-5)
        assert summary["runs"][str(own)]["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
        assert train(tiny_config("softmax", *single, run_dir=own))["step"] == 4  # a single run opens its checkpoint
    assert losses(tmp_path / "lr0.001" / "seed0") != losses(tmp_path / "lr0.02" / "seed0")


class Killed(Exception):
    pass


@pytest.mark.slow
def test_a_killed_group_resumes_bit_identically_per_seed(tmp_path, monkeypatch):
    """Two steps a call, killed after step 4's checkpoint of seed 0 but before seed 3's: seed 0's step 4 is set
    aside, both resume from step 2, and every logged row and final parameter is the uninterrupted run's."""
    settings = [*SHORT, "train.steps=6", "train.steps_per_call=2", "train.log_every=2", "train.eval_every=6",
                "train.seeds=[0,3]"]
    whole = tmp_path / "whole"
    train(tiny_config("softmax", *settings, run_dir=whole))

    broken = tmp_path / "broken"
    save = Trainer.save

    def dies_saving_seed_3_at_step_4(self):
        if self.cfg.seed == 3 and self.step == 4:
            raise Killed
        save(self)

    monkeypatch.setattr(Trainer, "save", dies_saving_seed_3_at_step_4)
    with pytest.raises(Killed):
        train(tiny_config("softmax", *settings, run_dir=broken))
    monkeypatch.setattr(Trainer, "save", save)
    assert (broken / "seed0" / "checkpoints" / "4").is_dir() and not (broken / "seed3" / "checkpoints" / "4").exists()

    train(tiny_config("softmax", *settings, run_dir=broken))
    assert (broken / "seed0" / "checkpoints_ahead" / "4").is_dir()
    for seed in (0, 3):
        rows = [[(r["step"], r["loss"], r.get("val_loss")) for r in RunDir(run / f"seed{seed}").read_metrics()]
                for run in (whole, broken)]
        assert [r[0] for r in rows[0]] == [2, 4, 6] and rows[1] == rows[0]  # bit for bit, no row lost or doubled
        assert saved_digest(whole / f"seed{seed}", 6) == saved_digest(broken / f"seed{seed}", 6)


@pytest.mark.slow
def test_one_seed_diverging_stops_only_that_seed(tmp_path, caplog):
    """Seed 1's parameters made NaN: its every step is skipped and after train.max_nonfinite of them it stops
    (nothing saved for it), while seed 0 trains to the end; then the run fails naming seed 1."""
    cfg = tiny_config("softmax", *SHORT, "train.steps=6", "train.checkpoint_every=3", "train.eval_every=6",
                      "train.max_nonfinite=2", "train.seeds=[0,1]", run_dir=tmp_path)
    group = open_steps(cfg)
    group.leaves = [x.at[1].set(jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in group.leaves]
    with pytest.raises(Diverged, match=r"seed 1: diverged at step 2: 2 steps in a row .* none saved yet"):
        train(cfg, group)
    assert [r["step"] for r in RunDir(tmp_path / "seed0").read_metrics()] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "seed0" / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
    assert not any(p.name.isdigit() for p in (tmp_path / "seed1" / "checkpoints").iterdir())
    assert np.isfinite(losses(tmp_path / "seed0")).all()


@pytest.mark.parametrize("overrides, message", [
    (["train.seeds=[0,1,0]"], "train.seeds=[0, 1, 0] must be distinct non-negative seeds"),
    (["train.seeds=[-1]"], "train.seeds=[-1] must be distinct non-negative seeds"),
    (["train.seeds=[0,1]", "train.distributed=true"], "train.distributed=true is not supported with it"),
    (["train.lrs=[0.001,0.001]"], "train.lrs=[0.001, 0.001] must be distinct positive learning rates"),
    (["train.lrs=[0]"], "train.lrs=[0.0] must be distinct positive learning rates"),
    (["train.lrs=[0.001,0.0010000001]"], "0.001 and 0.0010000001 would both train in run_dir/lr0.001"),
    (["train.lrs=[0.001]", "optim=muon"], "optim.name=muon is not supported with it"),
])
def test_bad_seeds_are_one_line(tmp_path, capsys, overrides, message):
    with pytest.raises(SystemExit):
        compose_and_validate(["+attn=softmax", *TINY, *overrides, f"run_dir={tmp_path}"])
    error = capsys.readouterr().err
    assert error.startswith("lmzoo: error: ") and message in error and error.count("\n") == 1


def test_a_trainer_is_one_seed(tmp_path):
    with pytest.raises(ConfigError, match="several runs train through lmzoo.run.loop.train"):
        Trainer(tiny_config("softmax", "train.seeds=[0,1]", run_dir=tmp_path))


@pytest.mark.slow
def test_benchmark_loop_times_the_host_alone_and_seeds_in_one_step(tmp_path):
    """scripts/benchmark_loop.py --host (a step that does no work, on made and ready batches) and --seeds."""
    def script(*args):
        proc = subprocess.run([sys.executable, "scripts/benchmark_loop.py", "--models", "mqar", "--steps", "2",
                               "--repeats", "1", *args, "--json", str(tmp_path / "rows.json")], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads((tmp_path / "rows.json").read_text())["rows"]

    rows = script("--host", "--ready-data", "--steps-per-call", "1", "2")
    assert [(r["steps_per_call"], r["ready_data"]) for r in rows] == [(1, False), (1, True), (2, False), (2, True)]
    assert all(r["host_ms"] > 0 for r in rows)
    rows = script("--seeds", "1", "2")
    assert [r["seeds"] for r in rows] == [1, 2] and rows[0]["speedup_per_seed"] == 1.0
    assert rows[1]["ms_per_seed"] == pytest.approx(rows[1]["ms"] / 2)
