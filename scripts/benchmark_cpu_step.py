"""lmzoo's CPU training step against the same model in PyTorch eager, measured side by side.

    python scripts/benchmark_cpu_step.py --torch-python ../torchenv/bin/python   # softmax default
    python scripts/benchmark_cpu_step.py --variants softmax gla mamba --rounds 8
    python scripts/benchmark_cpu_step.py --smoke                                     # toy shapes, CI

The lmzoo half is the trainer's own jitted ``train_step`` (state donated, AdamW and the finite-step
guard included) on the configs ``python -m lmzoo.train +attn=<variant>`` uses; the PyTorch half is
``scripts/cpu_step_torch.py`` (the same shapes and parameter count, asserted), run as a worker in
``--torch-python`` (default: this interpreter when it can import torch, else the PyTorch half is
skipped with a message; torch is no dependency of lmzoo). Both use ``--threads`` threads (XLA's
CPU backend uses every core it sees; set ``taskset`` to change that) and take turns: every round
times ``--steps`` lmzoo steps, then as many PyTorch steps, so both see the same machine load.
Printed per side: min / median / max milliseconds per step; the ratio is PyTorch's median over
lmzoo's (above 1: lmzoo is faster), also per round (paired).

The breakdown times, on each side, forward (loss), forward+backward and the optimizer alone, and
forward+backward of one layer's mixer, MLP and norm and of the head with the loss, on inputs of
the training shape. ``--trainer-steps`` also runs ``lmzoo.run.loop.train`` itself (data pipeline,
per-step finiteness check, logging) and reports the time per step outside the compiled step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lmzoo.cli import compose_and_validate
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.scoring.lengths import logit_scores
from lmzoo.model import LM, count_params
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train
from lmzoo.run.steps import gradients, init_train_state, loss_and_extra, train_step

sys.path.insert(0, str(Path(__file__).parent))
from benchmark import milliseconds  # noqa: E402

VOCAB = ByteTokenizer.vocab_size
TORCH_WORKER = Path(__file__).with_name("cpu_step_torch.py")
SMOKE = ["model.d_model=32", "model.n_layers=2", "data.seq_len=64", "train.batch_size=4"]


def spread(seconds: list[float]) -> str:
    ms = sorted(1e3 * s for s in seconds)
    return f"{ms[0]:7.1f} {statistics.median(ms):7.1f} {ms[-1]:7.1f}"


# ----------------------------------------------------------------------------- the PyTorch half


def torch_interpreter(given: str | None) -> str | None:
    if given:
        return given
    return sys.executable if importlib.util.find_spec("torch") else None


class TorchWorker:
    """``cpu_step_torch.py`` in its own interpreter, answering one JSON line per request."""

    def __init__(self, python: str, cfg, variant: str, threads: int):
        m = cfg.model
        a = cfg.attn
        mixer = {"gla": lambda: {"key_ratio": a.key_ratio, "gate_rank": a.gate_rank, "temperature": a.gate_temperature,
                                 "chunk": a.chunk_size},
                 "mamba": lambda: {"d_state": a.d_state, "d_conv": a.d_conv, "expand": a.expand}}
        spec = {"variant": variant, "d_model": m.d_model, "heads": m.n_heads, "layers": m.n_layers, "vocab": VOCAB,
                "batch": cfg.train.batch_size, "seq_len": cfg.data.seq_len, "threads": threads,
                "steps": cfg.train.steps, "mixer": mixer.get(variant, dict)()}
        self.proc = subprocess.Popen([python, str(TORCH_WORKER), json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.info = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the PyTorch worker stopped (exit code {self.proc.wait()})")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# ----------------------------------------------------------------------------- the lmzoo half


def random_batch(cfg, key=0) -> dict:
    tokens = jax.random.randint(jax.random.key(key), (cfg.train.batch_size, cfg.data.seq_len + 1), 0, VOCAB)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


class LmzooStep:
    """The trainer's jitted step on a fixed random batch, and the pieces it is made of."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.model = LM(cfg, VOCAB, rngs=nnx.Rngs(cfg.seed))
        self.params = count_params(self.model)
        self.graphdef, self.state, self.tx = init_train_state(cfg, self.model)
        self.batch = random_batch(cfg)
        self.step = jax.jit(partial(train_step, self.graphdef, self.tx), donate_argnums=0)
        self.run(2)  # compile and warm up

    def run(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.state, metrics = self.step(self.state, self.batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        return times

    def phases(self, repeats: int) -> dict:
        """Milliseconds of the loss alone, of loss and gradients, and of the optimizer update alone."""
        g, batch = self.graphdef, self.batch
        forward = jax.jit(lambda s: loss_and_extra(s["params"], s["extra"], g, batch)[0])
        backward = jax.jit(lambda s: gradients(s["params"], s["extra"], g, batch)[0])
        grads = backward(self.state)

        def update(s, grads):
            updates, opt = self.tx.update(grads, s["opt"], s["params"])
            return optax.apply_updates(s["params"], updates), opt

        optimizer = jax.jit(update)
        return {"fwd": milliseconds(forward, (self.state,), repeats),
                "fwd+bwd": milliseconds(backward, (self.state,), repeats),
                "opt": milliseconds(optimizer, (self.state, grads), repeats)}

    def components(self, repeats: int) -> dict:
        """Milliseconds of forward+backward (gradients of parameters and input) of each part of the model."""
        cfg = self.cfg
        shape = (cfg.train.batch_size, cfg.data.seq_len, cfg.model.d_model)
        x, cotangent = (jax.random.normal(jax.random.key(i), shape, self.model.dtype) for i in (1, 2))
        targets = self.batch["targets"]
        parts = {
            "mixer": lambda m, x: m.blocks[0].mixer(x),
            "mlp": lambda m, x: m.blocks[0].mlp(x),
            "norm": lambda m, x: m.blocks[0].mlp_norm(x),
            "head+loss": lambda m, x: logit_scores(m.logits(x), targets)["loss"].mean(),
        }
        params, extra = self.state["params"], self.state["extra"]
        out = {}
        for name, part in parts.items():
            def objective(params, x, part=part):
                y = part(nnx.merge(self.graphdef, params, extra, copy=True), x)
                return y if y.ndim == 0 else jnp.sum(y * cotangent)

            out[name] = milliseconds(jax.jit(jax.grad(objective, argnums=(0, 1))), (params, x), repeats)
        return out


def trainer_step_seconds(overrides: list[str], steps: int) -> list[float]:
    """Seconds per step of ``lmzoo.run.loop.train`` over ``steps`` steps, per logged window after the first
    (which holds the compilation): data, host transfers, the per-step finiteness read and logging included."""
    window = max(1, steps // 5)
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose_and_validate([*overrides, f"run_dir={run_dir}", f"train.steps={steps}",
                                    f"train.log_every={window}", f"train.eval_every={steps}",
                                    f"train.checkpoint_every={steps}", "train.eval_tokens=4096",
                                    "train.probe_batch=0", "train.progress=false"])
        train(cfg)
        return [row["step_time_s"] for row in RunDir(run_dir).read_metrics()[1:] if "step_time_s" in row]


# ----------------------------------------------------------------------------- the comparison


def compare(variant: str, args, torch_python: str | None) -> dict:
    overrides = [f"+attn={variant}", f"model={args.model}", *(SMOKE if args.smoke else []), *args.overrides]
    cfg = compose_and_validate(overrides)
    lmzoo = LmzooStep(cfg)
    print(f"\n{variant}: d_model {cfg.model.d_model}, {cfg.model.n_layers} layers, {cfg.model.n_heads} heads, "
          f"T {cfg.data.seq_len}, batch {cfg.train.batch_size}, {cfg.model.dtype}; lmzoo {lmzoo.params:,} parameters",
         flush=True)
    worker = None
    if torch_python:
        worker = TorchWorker(torch_python, cfg, variant, args.threads)
        print(f"PyTorch {worker.info['torch']} ({worker.info['threads']} threads): "
              f"{worker.info['params']:,} parameters")
        assert worker.info["params"] == lmzoo.params, "the two models differ in size"
    else:
        print("PyTorch half skipped: torch is not importable here (give --torch-python)")

    times = {"lmzoo": [], "torch": [], "torch_fwd": [], "torch_bwd": [], "torch_opt": [], "paired": []}
    for _ in range(args.rounds):
        mine = lmzoo.run(args.steps)
        times["lmzoo"] += mine
        if worker:
            theirs = worker.ask({"steps": args.steps})
            steps = [sum(p) for p in zip(theirs["fwd"], theirs["bwd"], theirs["opt"])]
            times["torch"] += steps
            for phase in ("fwd", "bwd", "opt"):
                times[f"torch_{phase}"] += theirs[phase]
            times["paired"].append(statistics.median(steps) / statistics.median(mine))

    print(f"{'ms per step':<26}{'min':>7} {'median':>7} {'max':>7}")
    print(f"{'lmzoo train_step':<26}{spread(times['lmzoo'])}")
    row = {"variant": variant, "params": lmzoo.params, "lmzoo_ms": 1e3 * statistics.median(times["lmzoo"])}
    if worker:
        print(f"{'PyTorch eager':<26}{spread(times['torch'])}")
        row["torch_ms"] = 1e3 * statistics.median(times["torch"])
        row["ratio"] = row["torch_ms"] / row["lmzoo_ms"]
        paired = sorted(times["paired"])
        print(f"ratio PyTorch / lmzoo: {row['ratio']:.2f}x (per round: {paired[0]:.2f} {statistics.median(paired):.2f} "
              f"{paired[-1]:.2f}; above 1: lmzoo faster)")

    if args.breakdown:
        phases, parts = lmzoo.phases(args.breakdown), lmzoo.components(args.breakdown)
        theirs = {}
        if worker:
            median_ms = lambda seconds: 1e3 * statistics.median(seconds)  # noqa: E731
            fwd_bwd = [f + b for f, b in zip(times["torch_fwd"], times["torch_bwd"])]
            theirs = {"fwd": median_ms(times["torch_fwd"]), "fwd+bwd": median_ms(fwd_bwd),
                      "opt": median_ms(times["torch_opt"]),
                      **{k: 1e3 * v for k, v in worker.ask({"components": args.breakdown}).items()}}
        print(f"{'breakdown (median ms)':<26}{'lmzoo':>9}{'PyTorch':>9}   (parts: one layer's, forward+backward)")
        for name, ms in {**phases, **parts}.items():
            print(f"{name:<26}{ms:>9.1f}" + (f"{theirs[name]:>9.1f}" if name in theirs else f"{'-':>9}"))
        row.update(phases=phases, components=parts, torch_breakdown=theirs)

    if args.trainer_steps:
        bare = lmzoo.run(args.steps)
        loop = trainer_step_seconds(overrides, args.trainer_steps)
        bare += lmzoo.run(args.steps)
        outside = 1e3 * (statistics.median(loop) - statistics.median(bare))
        print(f"{'lmzoo.train loop':<26}{spread(loop)}   ({outside:+.1f} ms per step outside the compiled step)")
        row.update(trainer_ms=1e3 * statistics.median(loop), outside_ms=outside)
    if worker:
        worker.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["softmax"])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--overrides", nargs="*", default=[], help="config overrides for every variant")
    parser.add_argument("--rounds", type=int, default=6, help="turns each side takes")
    parser.add_argument("--steps", type=int, default=5, help="steps per turn")
    parser.add_argument("--breakdown", type=int, default=5, help="repeats per piece of the breakdown (0: none)")
    parser.add_argument("--trainer-steps", type=int, default=0, help="also time lmzoo.train over this many steps")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch's threads")
    parser.add_argument("--torch-python", help="an interpreter that can import torch")
    parser.add_argument("--smoke", action="store_true", help="toy shapes: d_model 32, 2 layers, T 64, batch 4")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()

    torch_python = torch_interpreter(args.torch_python)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__} "
          f"({jax.default_backend()}), Python {platform.python_version()}")
    rows = [compare(variant, args, torch_python) for variant in args.variants]
    if args.json:
        meta = {"jax": jax.__version__, "cores": os.cpu_count(), "machine": platform.machine()}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
