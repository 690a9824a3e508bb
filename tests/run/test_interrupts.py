"""Interrupts, injected where they land in a real session: SIGTERM or Ctrl-C during training, while it is being
built, a second Ctrl-C, an interrupted sweep, an interrupted evaluation. Each ends in one line with the exit
code ``lmzoo.faults`` gives it, nothing on disk lost, and (where training stopped) a command that resumes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmzoo.faults import EXIT_ABORTED, EXIT_INTERRUPTED

from conftest import REPO, TINY

SHORT = [*TINY, "model.n_layers=1", "train.steps=8", "train.checkpoint_every=4", "train.eval_every=8",
         "train.probe_batch=0", "optim.warmup_steps=2"]

# Runs ``python -m <module>`` with the signals sent from inside, at a chosen point: deterministic, unlike a timer.
INJECT = """
import os, runpy, signal, sys
module, where, signals = sys.argv[1], sys.argv[2], [getattr(signal, s) for s in sys.argv[3].split(",")]
sys.argv = [module, *sys.argv[4:]]

def send():
    for sig in signals:
        os.kill(os.getpid(), sig)

if where.startswith("step"):  # after the given training step
    from lmzoo.run import loop
    advance, at = loop.Trainer.advance, int(where[4:])
    def advance_then_signal(self):
        metrics = advance(self)
        if self.step == at:
            send()
        return metrics
    loop.Trainer.advance = advance_then_signal
elif where == "last_save":  # while the last step's checkpoint is saved, after the loop's last look for a stop
    from lmzoo.run import loop
    save = loop.Trainer.save
    def save_then_signal(self):
        save(self)
        if self.step == self.cfg.train.steps:
            send()
    loop.Trainer.save = save_then_signal
elif where == "build":  # while the trainer is being built (model, compile)
    from lmzoo.run import loop
    start = loop.Trainer._start
    def signalled_start(self, *args):
        send()
        return start(self, *args)
    loop.Trainer._start = signalled_start
elif where == "evaluate":  # while an evaluation computes
    from lmzoo.measure import evaluation
    def signalled_evaluate(*args, **kwargs):
        send()
        raise AssertionError("the signal should have stopped the evaluation")
    evaluation.evaluate = signalled_evaluate
elif where == "experiment":  # while an experiment sets itself up, outside any training loop
    import time
    import lmzoo.experiments
    def signalled_experiment(*args, **kwargs):
        send()
        time.sleep(30)
        raise AssertionError("the signal should have stopped the experiment")
    lmzoo.experiments.run_experiment = signalled_experiment
runpy.run_module(module, run_name="__main__", alter_sys=True)  # as python -m: __main__ is the module
"""


def interrupted(module: str, where: str, signals: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-c", INJECT, module, where, signals, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert len(err.splitlines()) == 1 and err.startswith("lmzoo: error: "), err
    return err


def steps_saved(run_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_an_interrupted_run_without_run_dir_prints_the_command_that_resumes_it(tmp_path):
    proc = interrupted("lmzoo.train", "step2", "SIGTERM", "+attn=softmax", *SHORT, cwd=tmp_path)
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-2000:]
    hint = [line for line in proc.stdout.splitlines() if line.startswith("to resume: ")]
    assert len(hint) == 1 and "run_dir=" in hint[0], proc.stdout[-2000:]
    command = shlex.split(hint[0].removeprefix("to resume: "))
    run_dir = Path(command[-1].removeprefix("run_dir="))
    assert steps_saved(run_dir) == [2]
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed" in resumed.stdout and steps_saved(run_dir)[-1] == 8
    assert len(list((tmp_path / "runs").iterdir())) == 1  # the same run went on: no new timestamped folder


@pytest.mark.slow
def test_interrupting_a_sweep_stops_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    proc = interrupted("lmzoo.train", "step2", "SIGINT", "-m", "+attn=softmax,gla", *SHORT, f"hydra.sweep.dir={sweep}")
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-2000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0-softmax"], jobs  # the second job never started
    assert steps_saved(sweep / "0-softmax") == [2]
    assert "to resume: " in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("signals, code", [("SIGINT", EXIT_ABORTED), ("SIGTERM", EXIT_INTERRUPTED)])
def test_an_interrupt_while_training_is_built_is_one_line(tmp_path, signals, code):
    err = one_line(interrupted("lmzoo.train", "build", signals, "+attn=softmax", *SHORT, f"run_dir={tmp_path}"), code)
    assert ("Ctrl-C" if signals == "SIGINT" else "SIGTERM") in err and f"run_dir={tmp_path}" in err


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_in_one_line_and_keeps_the_checkpoints(tmp_path):
    err = one_line(interrupted("lmzoo.train", "step6", "SIGINT,SIGINT", "+attn=softmax", *SHORT, f"run_dir={tmp_path}"),
                   EXIT_ABORTED)
    assert "no checkpoint was saved now" in err
    assert steps_saved(tmp_path) == [4]  # the one saved before the interrupts, intact


@pytest.mark.slow
@pytest.mark.parametrize("signals, code", [("SIGINT", EXIT_ABORTED), ("SIGTERM", EXIT_INTERRUPTED)])
def test_an_interrupted_evaluation_is_one_line_and_writes_nothing(tmp_path, signals, code):
    run_dir = tmp_path / "run"
    trained = interrupted("lmzoo.train", "none", "SIGINT", "+attn=softmax", *SHORT, f"run_dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    proc = interrupted("lmzoo.eval", "evaluate", signals, f"run_dir={run_dir}", "eval.lengths=[32]", "eval.tokens=512",
                       "eval.progress=false", "eval.probe_batch=0")
    assert "nothing was written" in one_line(proc, code)
    assert not list(run_dir.glob("eval/*/results.json"))
    assert json.loads((run_dir / "run_info.json").read_text())["variant"] == "softmax"


@pytest.mark.slow
def test_sigterm_to_an_experiment_outside_training_is_exit_75_with_a_line(tmp_path):
    proc = interrupted("lmzoo.experiments", "experiment", "SIGTERM", "decode_cache", "quick=true",
                       f"out_dir={tmp_path}")
    assert "no verdict was written" in one_line(proc, EXIT_INTERRUPTED)
    assert not list(tmp_path.rglob("verdict.json"))


@pytest.mark.slow
def test_ctrl_c_while_an_experiments_run_saves_its_last_step_stops_the_experiment(tmp_path):
    proc = interrupted("lmzoo.experiments", "last_save", "SIGINT", "decode_cache", "quick=true", f"out_dir={tmp_path}")
    assert "run the same experiment again to resume" in one_line(proc, EXIT_INTERRUPTED)
    assert not list(tmp_path.rglob("verdict.json"))
    assert steps_saved(tmp_path / "decode_cache" / "runs" / "softmax-s0") == [8]  # the run itself is whole
    assert not (tmp_path / "decode_cache" / "runs" / "gqa-s0").exists()  # the next arm never started
    # its progress on stdout, stderr kept to the error's line: the run it began, and no end to it
    assert f"{tmp_path / 'decode_cache' / 'runs' / 'softmax-s0'}: training to step 8" in proc.stdout, proc.stdout
    assert "trained in" not in proc.stdout


# Python code that a garbage collection runs, as JAX's ``_xla_gc_callback``: an interrupt landing there is an
# "Exception ignored in" line, and the command would go on.
SWALLOWED = """
import gc, os, signal, sys, time
from lmzoo.cli import run_command

def main():
    def callback(phase, info):
        if phase == "start" and not sent:
            sent.append(os.kill(os.getpid(), getattr(signal, sys.argv[1])))
            sum(range(10))  # bytecode: the handler runs here, inside the callback
    sent = []
    gc.callbacks.append(callback)
    gc.collect()
    time.sleep(60)
    print("went on")

run_command(main, "the command did not go on")
"""


@pytest.mark.parametrize("signal_name, code", [("SIGINT", EXIT_ABORTED), ("SIGTERM", EXIT_INTERRUPTED)])
def test_an_interrupt_in_a_garbage_collection_callback_is_not_lost(signal_name, code):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", SWALLOWED, signal_name], env=env, capture_output=True, text=True,
                          timeout=120)
    assert "the command did not go on" in one_line(proc, code)
    assert "went on" not in proc.stdout


def jax_loaded(pid: int) -> bool:
    """Whether the process has mapped JAX's native library: it is importing JAX (or past it)."""
    try:
        return "jaxlib" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("command", [["lmzoo.train", "+attn=softmax", *SHORT], ["lmzoo.eval"], ["lmzoo.export"],
                                     ["lmzoo.lm_eval", "tasks=none"]])
def test_ctrl_c_while_a_command_starts_is_one_line(tmp_path, command):
    """``python -m`` itself: Ctrl-C as soon as JAX loads, while the command's modules import."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", *command, f"run_dir={tmp_path / 'run'}"]
    with subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        while not jax_loaded(p.pid) and p.poll() is None:
            time.sleep(0.01)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
    proc = subprocess.CompletedProcess(args, p.returncode, out, err)
    assert "stopped by Ctrl-C" in one_line(proc, EXIT_ABORTED)
