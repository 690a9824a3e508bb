"""Fault injection: a run that meets a fault either ends right or stops in one line with a telling exit code.

Divergence, damaged checkpoints, processes killed inside a save, a second trainer, settings changed on
resume, and the faults found before any step is spent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from omegaconf import OmegaConf
from tensorboardX.proto.event_pb2 import SessionLog

from lmzoo.faults import EXIT_CONFIG, EXIT_DIVERGED, EXIT_RUN_FAULT, EXIT_UNPARSABLE, RunFault, RunLock
from lmzoo.model import LM
from lmzoo.record.checkpoints import Checkpointer, CorruptCheckpoint
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train
from lmzoo.run.steps import init_train_state, loss_and_extra, train_step

from conftest import REPO, TINY, read_events, run_lmzoo, tiny_config

ONE_LAYER = ["model.n_layers=1"]  # compiles in half the time of the tiny model's two
RESUME_ARGS = [*ONE_LAYER, "train.steps=12", "train.checkpoint_every=2", "train.eval_every=12", "train.log_every=1",
               "train.probe_batch=0"]
STEPS = list(range(1, 13))


def final_params(run_dir: Path) -> tuple[int, list[np.ndarray]]:
    """The newest checkpoint's step and parameters."""
    ckpt = Checkpointer(run_dir / "checkpoints")
    step = ckpt.latest_step()
    model = ckpt.restore_model(step, LM(tiny_config("softmax", *ONE_LAYER), 259, rngs=nnx.Rngs(0)))
    ckpt.close()
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_params(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    """The single stderr line of a command that failed with exit ``code``."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("lmzoo: error: "), err
    return err


def train_cli(run_dir: Path, *args: str, schedule=RESUME_ARGS, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_lmzoo("-m", "lmzoo.train", "+attn=softmax", *TINY, *schedule, *args, f"run_dir={run_dir}", env=env)


def eval_cli(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_lmzoo("-m", "lmzoo.eval", f"run_dir={run_dir}", "eval.lengths=[32]", "eval.tokens=512",
                     "eval.probe_batch=0", "eval.progress=false", *args)


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """The uninterrupted run every faulty one must end up equal to, and its final parameters."""
    run_dir = tmp_path_factory.mktemp("whole")
    train(tiny_config("softmax", *RESUME_ARGS, run_dir=run_dir))
    return run_dir, final_params(run_dir)[1]


def copy_run(whole: Path, to: Path) -> Path:
    shutil.copytree(whole, to)
    (to / "lock").unlink(missing_ok=True)  # the file only: the lock itself is never copied
    return to


# ----------------------------------------------------------------------------- 1. divergence


def test_a_non_finite_step_keeps_the_state_and_a_finite_one_is_untouched_by_the_guard():
    cfg = tiny_config("softmax", *ONE_LAYER)
    graphdef, state, tx = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 259)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

    @jax.jit
    def unguarded(state):
        grads = jax.grad(lambda p: loss_and_extra(p, state["extra"], graphdef, batch)[0])(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return optax.apply_updates(state["params"], updates), opt

    # XLA's default CPU emitters, whatever the suite's quicker settings: the claim is about the programs
    # training runs, and other emitters may fuse the two programs differently.
    quicker = "--xla_cpu_use_fusion_emitters=false" in os.environ.get("XLA_FLAGS", "")  # tests/conftest.py
    default_emitters = {"xla_cpu_use_fusion_emitters": True} if quicker else {}
    step = jax.jit(partial(train_step, graphdef, tx)).lower(state, batch).compile(default_emitters)
    new, metrics = step(state, batch)
    params, opt = unguarded.lower(state).compile(default_emitters)(state)
    assert bool(metrics["finite"]) and int(new["step"]) == 1
    jax.tree.map(np.testing.assert_array_equal, (new["params"], new["opt"]), (params, opt))

    blown_up = {**state, "params": jax.tree.map(lambda x: x * 1e30 if x.ndim == 2 else x, state["params"])}
    kept, metrics = step(blown_up, batch)
    assert not bool(metrics["finite"]) and int(kept["step"]) == 1
    jax.tree.map(np.testing.assert_array_equal, {k: kept[k] for k in ("params", "extra", "opt")},
                 {k: blown_up[k] for k in ("params", "extra", "opt")})


@pytest.mark.slow
def test_divergence_stops_the_run_in_one_line_and_keeps_a_finite_checkpoint(tmp_path):
    proc = train_cli(tmp_path, "optim.lr=1e30", "optim.warmup_steps=3", "train.max_nonfinite=3")
    err = one_line_error(proc, EXIT_DIVERGED)
    step, params = final_params(tmp_path)
    assert f"last finite checkpoint: step {step}" in err and "train.max_nonfinite=3" in err
    assert all(np.isfinite(p).all() for p in params)
    rows = RunDir(tmp_path).read_metrics()
    assert sum(r["nonfinite_steps"] for r in rows) >= 2  # the rows before the stopping step
    assert "update was skipped (3 in a row)" in proc.stdout
    console = [line for line in proc.stdout.splitlines() if line.startswith(("step ", "warning: "))]
    logged = (tmp_path / "train.log").read_text()  # holds what the console shows
    assert len(console) > 3 and all(line in logged for line in console)


# ----------------------------------------------------------------------------- 2. damaged checkpoints


def damage(checkpoint: Path, how: str) -> None:
    """Random bytes over the middle of every data file, or of the largest only (its values change, yet it
    restores without an error), data files cut in half, or garbage metadata."""
    if how == "garbage_metadata":
        (checkpoint / "train" / "_METADATA").write_text("{not json")
        return
    files = sorted(checkpoint.glob("train/**/d/*"), key=lambda p: p.stat().st_size)
    for path in files[-1:] if how == "random_values" else files:
        size = path.stat().st_size
        if how == "truncated":
            os.truncate(path, size // 2)
        else:
            with open(path, "r+b") as f:
                f.seek(size // 2)
                f.write(np.random.default_rng(0).bytes(min(64, size - size // 2)))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["random_values", "truncated", "garbage_metadata"])  # random_bytes: the eval test
def test_a_damaged_newest_checkpoint_falls_back_and_finishes_like_the_whole_run(tmp_path, whole_run, how, caplog):
    whole, whole_params = whole_run
    run_dir = copy_run(whole, tmp_path / "run")
    damage(run_dir / "checkpoints" / "12", how)
    summary = train(tiny_config("softmax", *RESUME_ARGS, run_dir=run_dir))
    assert summary["step"] == 12
    assert "checkpoint 12" in caplog.text and "trying an older checkpoint" in caplog.text
    if how == "random_values":  # only the digest tells
        assert "differ from the digest saved with them" in caplog.text
    assert (run_dir / "damaged_checkpoints" / "12").is_dir()
    assert [r["step"] for r in RunDir(run_dir).read_metrics()] == STEPS
    step, params = final_params(run_dir)
    assert step == 12
    assert_same_params(params, whole_params)


@pytest.mark.slow
def test_evaluation_passes_over_a_damaged_checkpoint_unless_it_is_asked_for(tmp_path, whole_run):
    run_dir = copy_run(whole_run[0], tmp_path / "run")
    damage(run_dir / "checkpoints" / "12", "random_bytes")
    proc = eval_cli(run_dir, "eval.tag=fallback")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.startswith("warning: checkpoint 12 ") and len(proc.stderr.splitlines()) == 1
    assert json.loads((run_dir / "eval" / "fallback" / "results.json").read_text())["step"] == 10
    err = one_line_error(eval_cli(run_dir, "eval.step=12"), EXIT_RUN_FAULT)
    assert "checkpoint 12" in err


@pytest.mark.slow
def test_no_intact_checkpoint_stops_train_and_eval_in_one_line(tmp_path, whole_run):
    run_dir = copy_run(whole_run[0], tmp_path / "run")
    for checkpoint in (run_dir / "checkpoints").iterdir():
        damage(checkpoint, "garbage_metadata")
    assert "no intact checkpoint" in one_line_error(train_cli(run_dir), EXIT_RUN_FAULT)
    assert "no intact checkpoint" in one_line_error(eval_cli(run_dir), EXIT_RUN_FAULT)


def test_lmzoo_debug_shows_the_fault_behind_a_damaged_checkpoint(tmp_path, monkeypatch):
    cfg = tiny_config("softmax", *ONE_LAYER)
    state = init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))[1]
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state, {"next_index": 0})
    damage(tmp_path / "1", "garbage_metadata")
    with pytest.raises(CorruptCheckpoint, match="checkpoint 1 cannot be restored"):
        ckpt.restore(1, state)
    monkeypatch.setenv("LMZOO_DEBUG", "1")
    with pytest.raises(json.JSONDecodeError):  # what Orbax raised, for developers
        ckpt.restore(1, state)
    ckpt.close()


# ----------------------------------------------------------------------------- 3, 4. killed inside a save

KILL_SNIPPET = """
import os, signal, sys
from orbax.checkpoint._src.path import atomicity
from conftest import tiny_config
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.run.loop import train

point, run_dir, kill_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
args = sys.argv[4:]
saving = [False]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

save = Checkpointer.save

def save_then_maybe_die(self, step, *rest):
    saving[0] = step == kill_step
    if saving[0] and point == "before_write":
        die()
    save(self, step, *rest)
    if saving[0] and point == "after_commit":
        die()

def dying_finalize(original):
    async def finalize(self, *a, **k):  # the checkpoint is written, not yet renamed into place
        if saving[0] and point == "before_commit":
            die()
        return await original(self, *a, **k)
    return finalize

for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
    cls.finalize = dying_finalize(cls.finalize)
Checkpointer.save = save_then_maybe_die
train(tiny_config("softmax", *args, run_dir=run_dir))
"""


def tensorboard_steps(tb_dir: Path, tag: str = "train/loss") -> list[int]:
    """The steps of ``tag`` as TensorBoard shows them: files in name order, and a SessionLog START at step s
    hides the events at steps >= s read before it (TensorBoard's purge of a restarted run)."""
    steps: list[tuple[int, str]] = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        for event in read_events(path):
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                steps = [(s, t) for s, t in steps if s < event.step]
            steps += [(event.step, v.tag) for v in event.summary.value]
    return [s for s, t in steps if t == tag]


@pytest.mark.slow
@pytest.mark.parametrize("point, newest", [("before_write", 4), ("before_commit", 4), ("after_commit", 6)])
def test_a_kill_inside_a_save_resumes_to_the_whole_run_without_doubled_or_lost_logs(tmp_path, whole_run, point,
                                                                                      newest):
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_lmzoo("-c", KILL_SNIPPET, point, str(run_dir), "6", *RESUME_ARGS, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert final_params(run_dir)[0] == newest
    logged = tensorboard_steps(run_dir / "tb")
    assert set(range(1, newest + 1)) <= set(logged)  # durable up to the newest checkpoint
    assert {r["step"] for r in RunDir(run_dir).read_metrics()} >= set(range(1, newest + 1))

    train(tiny_config("softmax", *RESUME_ARGS, run_dir=run_dir))
    assert [r["step"] for r in RunDir(run_dir).read_metrics()] == STEPS
    assert tensorboard_steps(run_dir / "tb") == STEPS
    step, params = final_params(run_dir)
    assert step == 12
    assert_same_params(params, whole_run[1])


LOGGED = [*ONE_LAYER, "train.steps=8", "train.log_every=4", "train.eval_every=8", "train.checkpoint_every=8",
          "train.probe_batch=0"]


def logged_rows(run_dir: Path) -> list[dict]:
    """The numbers of each logged row that do not depend on the clock."""
    return [{k: row[k] for k in ("step", "loss", "bpb", "ppl", "nonfinite_steps", "val_loss") if k in row}
            for row in RunDir(run_dir).read_metrics()]


@pytest.mark.slow
@pytest.mark.parametrize("group, seeds", [([], [""]), (["train.seeds=[0,1]"], ["seed0", "seed1"])])
def test_a_resume_between_two_log_rows_logs_the_rows_of_an_uninterrupted_run(tmp_path, monkeypatch, group, seeds):
    from lmzoo.run.base import StepCalls

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(tiny_config("softmax", *LOGGED, *group, run_dir=whole))
    advance = StepCalls.advance

    def advance_then_stop_at_6(self):  # between the rows of steps 4 and 8: the checkpoint keeps steps 5 and 6
        metrics = advance(self)
        if self.step == 6:
            signal.raise_signal(signal.SIGTERM)
        return metrics

    monkeypatch.setattr(StepCalls, "advance", advance_then_stop_at_6)
    assert train(tiny_config("softmax", *LOGGED, *group, run_dir=cut))["interrupted"]
    monkeypatch.undo()
    train(tiny_config("softmax", *LOGGED, *group, run_dir=cut))
    for seed in seeds:
        assert [r["step"] for r in logged_rows(cut / seed)] == [4, 8]
        assert logged_rows(cut / seed) == logged_rows(whole / seed)  # the row of step 8 averages steps 5 to 8


@pytest.mark.slow
def test_starting_afresh_cuts_the_logs_back_to_step_zero(tmp_path, whole_run):
    run_dir = copy_run(whole_run[0], tmp_path / "run")
    shutil.rmtree(run_dir / "checkpoints")
    train(tiny_config("softmax", *RESUME_ARGS, run_dir=run_dir))
    assert [r["step"] for r in RunDir(run_dir).read_metrics()] == STEPS
    assert tensorboard_steps(run_dir / "tb") == STEPS
    assert_same_params(final_params(run_dir)[1], whole_run[1])


# ----------------------------------------------------------------------------- 5. settings changed on resume


@pytest.mark.slow
def test_a_changed_setting_on_resume_is_recorded_and_compare_marks_the_run(tmp_path):
    from lmzoo.compare import main as compare

    changed, plain = tmp_path / "sweep" / "changed", tmp_path / "sweep" / "plain"
    short = [*ONE_LAYER, "train.eval_every=2", "train.probe_batch=0"]
    train(tiny_config("softmax", "train.steps=2", *short, run_dir=changed))
    copy_run(changed, plain)
    train(tiny_config("softmax", "train.steps=3", *short, "optim.lr=1e-3", run_dir=changed))
    train(tiny_config("softmax", "train.steps=3", *short, "optim.lr=1e-3", run_dir=changed))  # no change
    assert RunDir(changed).read_resumes() == [{"step": 2, "key": "optim.lr", "old": 0.003, "new": 0.001},
                                     {"step": 2, "key": "train.steps", "old": 2, "new": 3}]
    original = OmegaConf.load(changed / "config.yaml")
    assert (original.optim.lr, original.train.steps) == (0.003, 2)  # how the run started stays on record

    markdown = compare([str(changed), str(plain)])
    assert f"{changed} †" in markdown and f"{plain} †" not in markdown
    assert "at step 2: optim.lr 0.003 -> 0.001, train.steps 2 -> 3" in markdown
    assert (tmp_path / "sweep" / "comparison.md").exists()  # where the runs meet, not inside the first one
    assert not (changed / "comparison.md").exists()


@pytest.mark.slow
def test_a_resume_may_change_how_the_model_is_computed_and_records_it(tmp_path):
    short = [*ONE_LAYER, "train.eval_every=4", "train.probe_batch=0"]
    train(tiny_config("softmax", "train.steps=2", *short, run_dir=tmp_path))
    train(tiny_config("softmax", "train.steps=4", *short, "model.remat=light", "attn.method=naive", run_dir=tmp_path))
    assert final_params(tmp_path)[0] == 4
    changes = {(r["step"], r["key"], r["old"], r["new"]) for r in RunDir(tmp_path).read_resumes()}
    assert {(2, "model.remat", "none", "light"), (2, "attn.method", "auto", "naive")} <= changes


def test_checkpoints_of_another_model_name_the_parameters_that_differ(tmp_path):
    softmax, gla = tiny_config("softmax", *ONE_LAYER), tiny_config("gla", *ONE_LAYER)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(2, init_train_state(softmax, LM(softmax, 259, rngs=nnx.Rngs(0)))[1], {"next_index": 0})
    with pytest.raises(RunFault, match=r"checkpoint 2 in .* holds other parameters than these settings build "
                                       r"\(built, not stored: blocks\.0\.mixer\.gate_down") as fault:
        ckpt.restore_model(2, LM(gla, 259, rngs=nnx.Rngs(0)))
    ckpt.close()
    assert not isinstance(fault.value, CorruptCheckpoint) and "resume with the settings" in str(fault.value)


# ----------------------------------------------------------------------------- 6. one trainer per run

HOLDER = """
import sys, time
from lmzoo.faults import RunLock
from lmzoo.record.directory import RunDir
with RunLock(RunDir(sys.argv[1]).lock_path):
    print("held", flush=True)
    time.sleep(120)
"""


def snapshot(folder: Path) -> dict:
    """Every file and folder under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow
def test_a_second_trainer_on_a_live_run_is_refused_and_a_dead_holder_releases_it(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(tmp_path)
        err = one_line_error(train_cli(tmp_path), EXIT_RUN_FAULT)
        assert f"pid {holder.pid} on {socket.gethostname()}" in err
        assert snapshot(tmp_path) == before  # refused before touching the run: no .hydra/, no train.log
    finally:
        holder.kill()
        holder.wait()
    with RunLock(RunDir(tmp_path).lock_path):  # the kernel dropped the killed holder's lock
        with pytest.raises(RunFault, match=f"pid {os.getpid()}"):
            RunLock(RunDir(tmp_path).lock_path).__enter__()


# ----------------------------------------------------------------------------- 7-9. early failures, in one line


@pytest.mark.slow
def test_an_unusable_run_dir_fails_in_one_line_before_any_step(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert "is a file" in one_line_error(train_cli(a_file), EXIT_RUN_FAULT)

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("")
    started = time.perf_counter()
    err = one_line_error(train_cli(run_dir), EXIT_RUN_FAULT)
    assert "checkpoints folder" in err and "is a file" in err
    assert not (run_dir / "metrics.jsonl").exists()
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("name, fragment", [("a" * 300, "cannot be a directory (File name too long)"),
                                            ("loop", "is a symbolic link that leads to no directory")])
def test_a_run_dir_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, name, fragment):
    from lmzoo.train import refuse_a_held_run

    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # a link to itself
    with pytest.raises(SystemExit) as exit_info:
        refuse_a_held_run(str(tmp_path / name))
    assert exit_info.value.code == EXIT_RUN_FAULT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


def read_only_mount(monkeypatch, mount: Path) -> None:
    """Files below ``mount`` as on a read-only mount: creating, writing and removing one (even one that is not there)
    fail with EROFS, for root too (chmod stops no root, and the tests run as root)."""
    import builtins
    import errno

    def below(path) -> bool:
        return Path(path).is_relative_to(mount)

    def refused():
        raise OSError(errno.EROFS, "Read-only file system")

    real_open, real_unlink = builtins.open, Path.unlink
    monkeypatch.setattr(builtins, "open", lambda file, mode="r", *a, **k: refused()
                        if below(file) and ("w" in mode or "a" in mode) else real_open(file, mode, *a, **k))
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: refused() if below(self)
                        else real_unlink(self, missing_ok=missing_ok))


@pytest.mark.parametrize("mount, fragment", [("", "run_dir"), ("checkpoints", "checkpoints folder")])
def test_a_read_only_run_or_checkpoints_folder_on_resume_is_one_line(tmp_path, monkeypatch, mount, fragment):
    from lmzoo.record.directory import check_run_dir

    (tmp_path / "checkpoints").mkdir()
    read_only_mount(monkeypatch, tmp_path / mount)
    with pytest.raises(RunFault, match=r"is not writable \(Read-only file system\)$") as fault:
        check_run_dir(RunDir(tmp_path))  # what resuming checks before anything is compiled
    assert str(fault.value).startswith(fragment)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_checkpoints_folder_fails_in_one_line(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints").chmod(0o500)
    assert "is not writable" in one_line_error(train_cli(tmp_path), EXIT_RUN_FAULT)


@pytest.mark.slow
def test_evaluation_refuses_impossible_requests_in_one_line(whole_run):
    run_dir = whole_run[0]
    err = one_line_error(eval_cli(run_dir, "eval.lengths=[100000]", "eval.tokens=100000"), EXIT_CONFIG)
    assert "length 100000 needs about" in err and "the largest length that fits is about" in err
    err = one_line_error(eval_cli(run_dir, "eval.tag=../../x"), EXIT_CONFIG)
    assert "eval.tag='../../x'" in err
    assert not (run_dir.parent.parent / "x").exists()


@pytest.mark.slow
def test_an_override_that_changes_nothing_gets_a_warning(tmp_path):
    cfg = tiny_config("mamba", *ONE_LAYER, run_dir=tmp_path)  # a saved initial model is enough to evaluate
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml")
    ckpt = Checkpointer(tmp_path / "checkpoints")
    ckpt.save(1, init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))[1], {"next_index": 0})
    ckpt.close()
    proc = eval_cli(tmp_path, "pos.kind=alibi")
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: pos.kind=alibi changes none of this mamba model's outputs: the variant, with the "
                        "other settings, does not use it"]


def test_a_setting_that_acts_only_beside_another_gets_no_warning(tmp_path, caplog):
    from lmzoo.measure.evaluation import warn_inert_overrides

    cfg = tiny_config("softmax", *ONE_LAYER, run_dir=tmp_path)
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml")
    model = LM(cfg, 259, rngs=nnx.Rngs(0))
    tokens = np.arange(24)[None] % 259
    warn_inert_overrides(RunDir(tmp_path), ["pos.kind=rerope", "pos.window=8", "pos.leak=4.0"], model, 259, tokens)
    assert [r.getMessage() for r in caplog.records] == [  # the leak acts only with leaky_rerope
        "warning: pos.leak=4.0 changes none of this softmax model's outputs: the variant, with the other settings, "
        "does not use it"]


@pytest.mark.slow
def test_the_printed_job_config_resolves():
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", "--cfg", "job", "--resolve", check=True)
    run_dir = next(line for line in proc.stdout.splitlines() if line.startswith("run_dir:"))
    assert run_dir.startswith("run_dir: runs/softmax-")


# ----------------------------------------------------------------------------- 10. torn files

SHORT = [*ONE_LAYER, "train.checkpoint_every=2", "train.eval_every=2", "train.log_every=1", "train.probe_batch=0"]


def tear_last_line(path: Path) -> None:
    """Cut the last line of ``path`` in the middle, as a kill inside a write would."""
    text = path.read_text()
    last_start = text.rstrip("\n").rfind("\n") + 1
    path.write_text(text[: last_start + (len(text) - last_start) // 2])


@pytest.mark.slow
def test_a_torn_metrics_line_is_cut_then_resume_evaluate_and_compare_go_on(tmp_path, caplog):
    from lmzoo.compare import main as compare

    run_dir = tmp_path / "sweep" / "run"
    train(tiny_config("softmax", "train.steps=4", *SHORT, run_dir=run_dir))
    tear_last_line(run_dir / "metrics.jsonl")  # row 4 half written
    assert [r["step"] for r in RunDir(run_dir).read_metrics()] == [1, 2, 3]
    assert any("cut short" in r.getMessage() for r in caplog.records)

    train(tiny_config("softmax", "train.steps=6", *SHORT, run_dir=run_dir))  # appends after a repaired tail
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 5, 6]  # every line whole; only the torn row gone
    proc = eval_cli(run_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    compare([str(run_dir)])


def test_a_torn_line_in_the_middle_is_skipped_with_a_warning(tmp_path, caplog):
    run = RunDir(tmp_path)
    run.metrics_path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    assert [r["step"] for r in run.read_metrics()] == [1, 3]
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: {run.metrics_path}: line 2 does not parse (an interrupted write); that row is left out"]
    run.truncate_metrics(3)  # the repair before the next append
    assert run.metrics_path.read_text() == '{"step": 1}\n{"step": 3}\n'


@pytest.mark.slow
def test_a_torn_resumes_line_is_repaired_before_the_next_change_is_recorded(tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_config("softmax", "train.steps=2", *SHORT, run_dir=run_dir))
    train(tiny_config("softmax", "train.steps=3", *SHORT, run_dir=run_dir))
    resumes = run_dir / "resumes.jsonl"
    resumes.write_text(resumes.read_text() + '{"step": 3, "key": "optim.l')  # a second change torn mid-line
    train(tiny_config("softmax", "train.steps=4", *SHORT, "optim.lr=1e-3", run_dir=run_dir))
    rows = RunDir(run_dir).read_resumes()
    assert [(r["step"], r["key"]) for r in rows] == [(2, "train.steps"), (3, "optim.lr"), (3, "train.steps")]
    assert all(json.loads(line) for line in resumes.read_text().splitlines())


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from lmzoo.faults import WriteFault
    from lmzoo.record.directory import atomic_write_text

    target = tmp_path / "verdict.json"
    atomic_write_text(target, "old\n")

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(WriteFault, match="No space left on device"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["verdict.json"]


@pytest.mark.slow
@pytest.mark.parametrize("content, fragment, code", [
    ("", "is empty", EXIT_CONFIG),
    ("model: {d_model: [", "config.yaml, line 1, column 19 does not parse as YAML", EXIT_UNPARSABLE),  # half a file
])
def test_an_empty_or_torn_config_is_one_line_for_train_and_eval(whole_run, tmp_path, content, fragment, code):
    run_dir = copy_run(whole_run[0], tmp_path / "run")
    (run_dir / "config.yaml").write_text(content)
    assert fragment in one_line_error(train_cli(run_dir), code)
    assert fragment in one_line_error(eval_cli(run_dir), code)


def test_torn_run_info_and_results_are_left_out_with_a_warning(tmp_path, caplog):
    def tear_in_half(path: Path) -> None:
        path.write_text(path.read_text()[: len(path.read_text()) // 2])

    run = RunDir(tmp_path)
    run.write_json("run_info.json", {"variant": "softmax"})
    tear_in_half(tmp_path / "run_info.json")
    assert run.read_run_info() == {}
    run.write_results("default", {"tag": "default"})
    tear_in_half(run.results_path("default"))
    assert run.read_results("default") is None
    assert len([r for r in caplog.records if "cannot be read" in r.getMessage()]) == 2


def test_results_of_another_layout_are_named_and_left_out(tmp_path, caplog):
    run = RunDir(tmp_path)
    run.write_results("default", {"lengths": [1, 2], "train_seq_len": 64})  # valid JSON, not an evaluation's
    run.write_json("lm_eval/default/results.json", ["a", "list"])
    run.write_results("block", {"lengths": {"64": {"bpb": 1.0}}, "train_seq_len": 64, "block_sums": {"64": [1]}})
    assert run.read_results("default") is None and run.read_harness_results("default") is None
    assert run.read_results("block") is None
    warned = [r.getMessage() for r in caplog.records if "is not laid out as lmzoo writes it" in r.getMessage()]
    assert len(warned) == 3 and str(run.results_path("default")) in warned[0], warned
    run.write_results("good", {"lengths": {"64": {"bpb": 1.0}}, "train_seq_len": 64,
                               "block_sums": {"64": {"loss": [1.0], "count": [2]}}})
    assert run.read_results("good")["train_seq_len"] == 64


@pytest.mark.parametrize("argv, fragment", [
    (["rejudge", "{binary}"], "is not a verdict.json file (UnicodeDecodeError"),
    (["rejudge", "{other}"], "is not a verdict.json file (no name, verdict"),
])
def test_rejudging_a_file_that_is_no_verdict_is_one_line(tmp_path, capsys, argv, fragment):
    from lmzoo.experiments import __main__ as experiments

    files = {"binary": tmp_path / "binary.json", "other": tmp_path / "other.json"}
    files["binary"].write_bytes(bytes(range(256)))
    files["other"].write_text('{"a": 1}')
    with pytest.raises(SystemExit) as exit_info:
        experiments.main([arg.format(**files) for arg in argv])
    assert exit_info.value.code == EXIT_CONFIG
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


# ----------------------------------------------------------------------------- 11. experiments stop with their runs


@pytest.mark.parametrize("stop, code",
                         [(lambda cfg: {"step": 3, "interrupted": True}, 75), ("diverged", EXIT_DIVERGED)])
def test_an_experiment_stops_with_its_run_and_writes_no_verdict(tmp_path, monkeypatch, capsys, stop, code):
    from lmzoo.experiments import __main__ as experiments
    from lmzoo.experiments import runs
    from lmzoo.faults import Diverged

    def diverge(cfg):
        raise Diverged("diverged at step 3")

    monkeypatch.setattr(runs, "train", diverge if stop == "diverged" else stop)
    with pytest.raises(SystemExit) as exit_info:
        experiments.main(["decode_cache", "quick=true", f"out_dir={tmp_path}"])
    assert exit_info.value.code == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lmzoo: error: "), err
    assert not list(tmp_path.rglob("verdict.json"))


# ----------------------------------------------------------------------------- 12. the data a run trains on


@pytest.mark.slow
def test_a_changed_corpus_is_refused_on_resume_unless_allowed_and_recorded(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"{i}.txt").write_text(f"def f{i}(x):\n    return x * {i}\n" * 40)
    data = ["data=text_files", f"data.paths={corpus}/*.txt", "data.val_fraction=0.25", "data.seq_len=32"]
    run_dir = tmp_path / "run"
    # started in this process (the command's own start is checked elsewhere); the two resumes below are commands
    train(tiny_config("softmax", *data, *SHORT, "train.steps=2", "train.eval_tokens=64", run_dir=run_dir))
    started_on = (run_dir / "data_fingerprint.json").read_text()
    (corpus / "0.txt").write_text("changed\n" * 40)

    more = [*SHORT, "train.steps=3", "train.eval_tokens=64"]
    err = one_line_error(train_cli(run_dir, *data, schedule=more), EXIT_RUN_FAULT)
    assert "the data differ from those run_dir" in err and "data.allow_changed=true" in err
    proc = train_cli(run_dir, *data, "data.allow_changed=true", schedule=more)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = RunDir(run_dir).read_resumes()
    assert [r["key"] for r in rows] == ["data_fingerprint", "data.allow_changed", "train.steps"]
    assert (run_dir / "data_fingerprint.json").read_text() == started_on  # the start stays on record


# ----------------------------------------------------------------------------- 13. a write error at a checkpoint


@pytest.mark.slow
def test_a_write_error_at_a_checkpoint_is_one_line_and_earlier_checkpoints_stay(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    from lmzoo.faults import WriteFault

    save = ocp.CheckpointManager.save

    def full_disk_at_4(self, step, *args, **kwargs):
        if step == 4:
            raise OSError(28, "No space left on device")
        return save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk_at_4)
    with pytest.raises(WriteFault) as fault:
        train(tiny_config("softmax", "train.steps=4", *SHORT, run_dir=tmp_path))
    assert len(str(fault.value).splitlines()) == 1 and "checkpoint 4 could not be written" in str(fault.value)
    monkeypatch.undo()
    ckpt = Checkpointer(tmp_path / "checkpoints")
    assert ckpt.all_steps() == [2]
    ckpt.close()
    assert final_params(tmp_path)[0] == 2  # restores intact


# ----------------------------------------------------------------------------- 13. what a checkpoint's digest covers


@pytest.mark.slow
def test_a_checkpoint_without_its_digest_is_passed_over_not_trusted(tmp_path, whole_run, caplog):
    run_dir = copy_run(whole_run[0], tmp_path / "run")
    shutil.rmtree(run_dir / "checkpoints" / "12" / "digest")
    summary = train(tiny_config("softmax", *RESUME_ARGS, run_dir=run_dir))
    assert summary["step"] == 12 and "checkpoint 12 has no digest/" in caplog.text
    assert (run_dir / "damaged_checkpoints" / "12").is_dir()


@pytest.mark.slow
def test_a_changed_data_position_fails_its_digest(tmp_path, whole_run):
    run_dir = copy_run(whole_run[0], tmp_path / "run")
    position_file = run_dir / "checkpoints" / "12" / "data" / "metadata"  # the data position, as Orbax keeps JSON
    position = json.loads(position_file.read_text())
    position_file.write_text(json.dumps({**position, "next_index": position["next_index"] - 1}))  # still parses
    ckpt = Checkpointer(run_dir / "checkpoints")
    with pytest.raises(CorruptCheckpoint, match="data position differs"):
        ckpt.restore(12, init_state_like(run_dir))
    ckpt.close()


def init_state_like(run_dir: Path):
    cfg = tiny_config("softmax", *RESUME_ARGS, run_dir=run_dir)
    return init_train_state(cfg, LM(cfg, 259, rngs=nnx.Rngs(0)))[1]


# ----------------------------------------------------------------------------- 14. the network and config files


def test_a_hub_dataset_without_network_is_one_line_at_once(monkeypatch):
    from lmzoo.data import hf
    from lmzoo.faults import EXIT_NETWORK, NetworkFault

    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(hf, "hub_reachable", lambda timeout=3.0: False)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # what going offline sets, given back after the test
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    start = time.perf_counter()
    with pytest.raises(NetworkFault, match="data.hf_name='lmzoo/no-such-dataset' could not be downloaded") as fault:
        hf.hf_documents("lmzoo/no-such-dataset")
    assert fault.value.exit_code == EXIT_NETWORK and time.perf_counter() - start < 20


def test_a_config_file_that_does_not_parse_is_one_line_with_its_own_code(tmp_path, capsys):
    from lmzoo.cli import errors_in_one_line
    from lmzoo.faults import EXIT_UNPARSABLE

    broken = tmp_path / "ntk.yaml"
    broken.write_text("kind: ntk\n  factor: [4\n")
    with pytest.raises(SystemExit) as exit_info, errors_in_one_line():
        OmegaConf.load(broken)
    assert exit_info.value.code == EXIT_UNPARSABLE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{broken}, line 2" in err and "does not parse as YAML" in err
