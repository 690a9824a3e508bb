"""End to end: training runs, logs, checkpoints, resumes bit for bit, and data-parallelises."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lmzoo.faults import EXIT_INTERRUPTED
from lmzoo.model import LM
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.record.directory import RunDir
from lmzoo.record.opening import trained_config
from lmzoo.run.loop import Trainer, train
from lmzoo.run.steps import init_train_state

from conftest import REPO, TINY, run_lmzoo, tiny_config

RESUME_ARGS = ["train.steps=12", "train.checkpoint_every=2", "train.eval_every=6", "train.log_every=1"]


def final_params(run_dir: Path):
    """Parameters of the newest checkpoint, as numpy leaves."""
    cfg = trained_config(RunDir(run_dir), [])
    ckpt = Checkpointer(run_dir / "checkpoints")
    step = ckpt.latest_step()
    model = ckpt.restore_model(step, LM(cfg, 259, rngs=nnx.Rngs(0)))
    ckpt.close()
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_short_run_learns_and_writes_its_run_directory(tmp_path):
    cfg = tiny_config("softmax", "train.steps=40", "train.eval_every=20", "train.log_every=5", run_dir=tmp_path)
    summary = train(cfg)
    rows = RunDir(tmp_path).read_metrics()
    assert [r["step"] for r in rows] == list(range(5, 41, 5))
    assert all("loss" in r for r in rows)
    val = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in val] == [20, 40]
    assert val[-1]["val_loss"] < val[0]["val_loss"] < np.log(259)  # learning, and past uniform guessing
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert summary["val_bpb"] == pytest.approx(val[-1]["val_bpb"])
    for key in ("bpb", "ppl", "lr", "grad_norm", "tokens_per_s", "step_time_s"):
        assert np.isfinite(rows[-1][key]), key
    assert (tmp_path / "config.yaml").exists()
    assert json.loads((tmp_path / "data_fingerprint.json").read_text())["files"] > 100
    assert json.loads((tmp_path / "run_info.json").read_text())["params"] > 0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert final_params(tmp_path)[0] == 40


def test_checkpoint_round_trip(tmp_path):
    tree = {"a": jax.numpy.arange(6.0).reshape(2, 3), "b": {"c": jax.numpy.ones((), jax.numpy.int32)}}
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(5, tree, {"next_index": 17})
    restored, data_state = ckpt.restore(5, jax.tree.map(jax.numpy.zeros_like, tree))
    assert data_state == {"next_index": 17}
    jax.tree.map(np.testing.assert_array_equal, restored, tree)
    ckpt.close()


def test_model_restore_returns_the_saved_parameters_and_state(tmp_path):
    cfg = tiny_config("softmax")
    saved = LM(cfg, 259, rngs=nnx.Rngs(0))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, init_train_state(cfg, saved)[1], {"next_index": 0})
    restored = ckpt.restore_model(3, LM(cfg, 259, rngs=nnx.Rngs(1)))  # other initial values, same shapes
    ckpt.close()
    jax.tree.map(np.testing.assert_array_equal, nnx.state(restored), nnx.state(saved))


@pytest.mark.slow
def test_resuming_a_finished_run_with_different_model_is_refused(tmp_path):
    train(tiny_config("softmax", "train.steps=2", run_dir=tmp_path))
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", *TINY, "train.steps=4", "model.d_model=64",
                     f"run_dir={tmp_path}")
    assert proc.returncode == 2
    assert "different 'model' config" in proc.stderr


@pytest.mark.slow
def test_a_stop_request_saves_one_checkpoint_and_returns(tmp_path, monkeypatch, caplog):
    saved_steps, save, advance = [], Checkpointer.save, Trainer.advance
    handler_before = signal.getsignal(signal.SIGTERM)

    def counting_save(self, step, *args):
        saved_steps.append(step)
        save(self, step, *args)

    def advance_then_stop_at_4(self):
        metrics = advance(self)
        if self.step == 4:  # a checkpoint step too: the stop must not save it twice
            signal.raise_signal(signal.SIGTERM)
        return metrics

    monkeypatch.setattr(Checkpointer, "save", counting_save)
    monkeypatch.setattr(Trainer, "advance", advance_then_stop_at_4)
    caplog.set_level(logging.INFO, logger="lmzoo.train")
    summary = train(tiny_config("softmax", *RESUME_ARGS, run_dir=tmp_path))
    assert (summary["step"], summary["interrupted"]) == (4, True)
    assert saved_steps == [2, 4]
    assert "interrupted: saved a checkpoint at step 4" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the run's handler is gone


def start_training(run_dir: Path) -> subprocess.Popen:
    args = ["-m", "lmzoo.train", "+attn=softmax", *TINY, *RESUME_ARGS, f"run_dir={run_dir}"]
    return subprocess.Popen(
        [sys.executable, *args], cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_for_checkpoint(run_dir: Path, proc: subprocess.Popen, step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not (run_dir / "checkpoints" / str(step)).exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final step and parameters of the run each killed one must end up equal to (trained once for both)."""
    whole = tmp_path_factory.mktemp("whole")
    train(tiny_config("softmax", *RESUME_ARGS, run_dir=whole))
    return final_params(whole)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_resume_after_kill_reproduces_uninterrupted_parameters(tmp_path, sig, uninterrupted):
    broken = tmp_path / "broken"
    proc = start_training(broken)
    wait_for_checkpoint(broken, proc, 4)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    interrupted_at, _ = final_params(broken)
    assert interrupted_at < 12, "the run finished before it was interrupted"
    if sig == signal.SIGTERM:  # a clean stop: checkpoint at the current step, the exit code of an interruption
        assert proc.returncode == EXIT_INTERRUPTED, output
        assert "interrupted: saved a checkpoint" in output
        assert max(r["step"] for r in RunDir(broken).read_metrics()) == interrupted_at

    summary = train(tiny_config("softmax", *RESUME_ARGS, run_dir=broken))
    assert summary["step"] == 12
    assert [r["step"] for r in RunDir(broken).read_metrics()] == list(range(1, 13))  # no step lost or doubled
    step_a, params_a = uninterrupted
    step_b, params_b = final_params(broken)
    assert step_a == step_b == 12
    for a, b in zip(params_a, params_b):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_multirun_sweeps_variants(tmp_path):
    run_lmzoo(
        "-m", "lmzoo.train", "-m", "+attn=softmax,mqa", *TINY, "model.n_layers=1", "train.steps=2",
        "train.eval_every=2", f"hydra.sweep.dir={tmp_path}", check=True,
    )
    run_dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name for p in run_dirs] == ["0-softmax", "1-mqa"]
    for run_dir in run_dirs:
        assert RunDir(run_dir).read_metrics()[-1]["step"] == 2
        assert (run_dir / "checkpoints" / "2").exists()


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_sweep(tmp_path):
    """hydra/launcher=local: the SLURM launcher's code path, each run a local submitit job."""
    run_lmzoo("-m", "lmzoo.train", "-m", "hydra/launcher=local", "+attn=softmax,gla", *TINY, "model.n_layers=1",
              "train.steps=2", f"hydra.sweep.dir={tmp_path}", check=True)
    run_dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in run_dirs] == ["0-softmax", "1-gla"]
    for run_dir in run_dirs:
        assert RunDir(run_dir).read_metrics()[-1]["step"] == 2


def test_mixer_auxiliary_losses_join_the_objective(monkeypatch):
    """A mixer that sows an AuxLoss has it added to the objective and reported by name."""
    from dataclasses import dataclass

    import jax.numpy as jnp

    from lmzoo import registry
    from lmzoo.mixers.base import AuxLoss
    from lmzoo.mixers.softmax import SoftmaxAttention, SoftmaxConfig
    from lmzoo.run.steps import loss_and_extra

    @dataclass
    class PenaltyConfig(SoftmaxConfig):
        def build(self, ctx, *, rngs):
            return Penalised(self, ctx, rngs=rngs)

    class Penalised(SoftmaxAttention):
        def __call__(self, x, *, positions=None, segment_ids=None):
            self.sow(AuxLoss, "penalty", jnp.float32(0.25))
            return super().__call__(x, positions=positions, segment_ids=segment_ids)

    monkeypatch.setitem(registry.MIXERS._specs, "penalised", PenaltyConfig)
    cfg = tiny_config("softmax")
    cfg.attn = PenaltyConfig(name="penalised", mixer="penalised")
    graphdef, state, _ = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))
    batch = {"inputs": jnp.ones((2, 8), jnp.int32), "targets": jnp.ones((2, 8), jnp.int32)}
    objective, (metrics, _) = loss_and_extra(state["params"], state["extra"], graphdef, batch)
    assert float(metrics["aux/penalty"]) == pytest.approx(0.5)  # two layers
    assert float(objective) == pytest.approx(float(metrics["loss"]) + 0.5)


@pytest.mark.parametrize("variant, weighted", [("gla", True)])
def test_gradient_accumulation_makes_the_large_batch_update(variant, weighted):
    """``train.grad_accum=4``: one step over four micro-batches gives the whole batch's update and
    metrics, also when a synthetic task weights the scored positions unevenly across the slices."""
    from lmzoo.run.steps import train_step

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 259, (8, 17)))
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    if weighted:
        batch["weights"] = jnp.asarray(rng.integers(0, 2, (8, 16)) * rng.integers(1, 4, (8, 1)), jnp.float32)
    cfg = tiny_config(variant)
    graphdef, state, tx = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))
    results = [jax.jit(partial(train_step, graphdef, tx, micro_batches=m))(state, batch) for m in (1, 4)]
    (whole, whole_metrics), (accumulated, accumulated_metrics) = results
    for a, b in zip(jax.tree.leaves(accumulated["params"]), jax.tree.leaves(whole["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    for key in ("loss", "accuracy", "grad_norm"):
        np.testing.assert_allclose(accumulated_metrics[key], whole_metrics[key], rtol=1e-5)


def test_grad_accum_must_divide_the_batch(capsys):
    with pytest.raises(SystemExit):
        tiny_config("softmax", "train.grad_accum=3")
    assert "train.batch_size=8 does not split into train.grad_accum=3 equal micro-batches" in capsys.readouterr().err


@pytest.mark.slow
def test_training_names_its_run_directory_parameter_count_and_first_compile(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lmzoo.train")
    train(tiny_config("softmax", "model.n_layers=1", "train.steps=1", "train.probe_batch=0", run_dir=tmp_path))
    params = RunDir(tmp_path).read_run_info()["params"]
    named = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"run_dir {tmp_path}: softmax")]
    assert len(named) == 2 and all(f"{params:,} parameters" in m for m in named), named
    assert named[1].endswith("trained to step 1")
    messages = [r.getMessage() for r in caplog.records]
    compiling = next(i for i, m in enumerate(messages) if m.startswith("compiling the training step"))
    compiled = next(i for i, m in enumerate(messages) if m.startswith("compiled the training step in "))
    assert compiling < compiled and float(messages[compiled].split(" in ")[1].removesuffix(" s")) > 0
