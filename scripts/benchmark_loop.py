"""The training loop's time per step against the bare jitted step on the same batches: what the host adds.

    python scripts/benchmark_loop.py                        # lmzoo.train's default model, and a tiny MQAR model
    python scripts/benchmark_loop.py --steps 10 --repeats 2 # a quick CPU run
    python scripts/benchmark_loop.py --models mqar --variant gla --json loop.json
    python scripts/benchmark_loop.py --models mqar --steps-per-call 8   # the loop runs 8 steps a jitted call

Two models: ``default`` is what ``python -m lmzoo.train +attn=<variant>`` trains (configs/train.yaml's defaults);
``mqar`` is a 2-layer, d_model=32 model on multi-query associative recall (``data=mqar``), whose steps are so short
that any host work between them shows.

Bare: the trainer's own jitted ``step_fn`` called back to back on batches already on the device, blocking only at
the end: the device's time alone. Loop: ``Trainer.advance`` over the same batches, as ``lmzoo.train``'s loop runs
between log rows, validations and checkpoints (none falls in the timed steps): each batch pulled from the
trainer's iterator and moved to the device, each step's finiteness read, its metrics kept for the next log row.
loop/bare near 1: the device never waits on the host; above 1, it does. With ``--steps-per-call k`` the loop is
a trainer with ``train.steps_per_call=k`` (k steps a call, ``--steps`` a multiple of k), and the bare column stays
the step of one step a call (a second trainer's, on the same batches). Both are compiled before timing, each
repeat times both on a fresh stretch of the data, and the medians over repeats are reported. The run directory
is temporary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack

import jax

from lmzoo.cli import compose_and_validate
from lmzoo.data import build_data
from lmzoo.run.loop import Trainer, training_batches

MODELS = {
    "default": [],
    "mqar": ["data=mqar", "model.n_layers=2", "model.d_model=32"],
}
NEVER = 10**9  # train.steps and every interval: no step of the benchmark logs, validates or saves


def open_trainer(variant: str, overrides: list[str], run_dir: str, steps_per_call: int = 1) -> Trainer:
    never = NEVER // steps_per_call * steps_per_call  # a multiple, as train.steps and every interval must be
    cfg = compose_and_validate([f"+attn={variant}", *overrides, f"train.steps={never}", f"train.log_every={never}",
                                f"train.eval_every={never}", f"train.checkpoint_every={never}",
                                f"train.steps_per_call={steps_per_call}", "train.progress=false", f"run_dir={run_dir}"])
    return Trainer(cfg)


def next_batches(trainer: Trainer, data, n: int) -> list:
    """The ``n`` batches the trainer's next ``advance`` calls will take, on the device: read from a second
    iterator over the same data, set to the trainer's data position, and closed at once (its reading threads
    would otherwise go on filling their buffer while the steps are timed)."""
    mirror = training_batches(trainer.cfg, data)
    try:
        mirror.set_state(trainer.data_position())
        batches = [trainer.batch_to_device(next(mirror)) for _ in range(n)]
    finally:
        mirror.close()
    return jax.block_until_ready(batches)


def time_bare(trainer: Trainer, batches: list) -> float:
    """Seconds per step of ``step_fn`` alone, dispatched back to back."""
    leaves = trainer.leaves
    start = time.perf_counter()
    with jax.set_mesh(trainer.mesh):
        for batch in batches:
            leaves, metrics = trainer.step_fn(leaves, batch)
        jax.block_until_ready((leaves, metrics))
    elapsed = time.perf_counter() - start
    trainer.leaves = leaves  # the old ones were donated
    return elapsed / len(batches)


def time_loop(trainer: Trainer, steps: int) -> float:
    """Seconds per step of the trainer's own loop, until its last step's flag is read and its state is ready."""
    start = time.perf_counter()
    for _ in range(steps // trainer.steps_per_call):
        trainer.advance()
    trainer.settle()
    jax.block_until_ready(trainer.state)
    return (time.perf_counter() - start) / steps


def measure(name: str, variant: str, steps: int, repeats: int, steps_per_call: int = 1) -> dict:
    with ExitStack() as held:
        run_dir = held.enter_context(tempfile.TemporaryDirectory(prefix="lmzoo-loop-"))
        trainer = open_trainer(variant, MODELS[name], run_dir, steps_per_call)
        held.callback(trainer.close)
        stepper = trainer  # whose step_fn the bare column times: one step a call
        if steps_per_call > 1:
            bare_dir = held.enter_context(tempfile.TemporaryDirectory(prefix="lmzoo-loop-bare-"))
            stepper = open_trainer(variant, MODELS[name], bare_dir)
            held.callback(stepper.close)
        cfg = trainer.cfg
        data = build_data(cfg.data, seed=cfg.seed)
        time_bare(stepper, next_batches(trainer, data, 2))  # compiles the step
        time_loop(trainer, steps_per_call)
        bare, loop = [], []
        for _ in range(repeats):
            bare.append(time_bare(stepper, next_batches(trainer, data, steps)))
            loop.append(time_loop(trainer, steps))  # the same batches: the bare step left the data where it was
        return {"model": name, "variant": variant, "batch": cfg.train.batch_size, "seq_len": cfg.data.seq_len,
                "params": trainer.n_params, "dtype": cfg.model.dtype, "steps": steps, "steps_per_call": steps_per_call,
                "bare_ms": 1e3 * statistics.median(bare), "loop_ms": 1e3 * statistics.median(loop),
                "ratio": statistics.median(loop) / statistics.median(bare),
                "bare_ms_each": [1e3 * t for t in bare], "loop_ms_each": [1e3 * t for t in loop]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--variant", default="softmax", help="the +attn=<variant> of every model")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-per-call", type=int, default=1,
                        help="train.steps_per_call of the timed loop (the bare column: one step a call)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    if args.steps_per_call < 1 or args.steps % args.steps_per_call:
        parser.error(f"--steps={args.steps} must be a multiple of --steps-per-call={args.steps_per_call} (at least 1)")

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}, {jax.device_count()} device(s)), "
          f"jax {jax.__version__}; {args.steps} steps x {args.repeats} repeats, medians; "
          f"the loop runs {args.steps_per_call} step(s) a call")
    print(f"{'model':<9}{'variant':<10}{'batch':>6}{'seq_len':>8}{'params':>11}{'dtype':>10}"
          f"{'bare ms':>10}{'loop ms':>10}{'loop/bare':>10}")
    rows = []
    for name in args.models:
        row = measure(name, args.variant, args.steps, args.repeats, args.steps_per_call)
        rows.append(row)
        print(f"{name:<9}{args.variant:<10}{row['batch']:>6}{row['seq_len']:>8}{row['params']:>11,}{row['dtype']:>10}"
              f"{row['bare_ms']:>10.2f}{row['loop_ms']:>10.2f}{row['ratio']:>10.3f}", flush=True)
    if args.json:
        meta = {"device": device.device_kind, "backend": jax.default_backend(), "devices": jax.device_count(),
                "jax": jax.__version__, "steps": args.steps, "repeats": args.repeats,
                "steps_per_call": args.steps_per_call}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
