"""The training loop's time per step against the bare jitted step on the same batches: what the host adds.

    python scripts/benchmark_loop.py                        # lmzoo.train's default model, and a tiny MQAR model
    python scripts/benchmark_loop.py --steps 10 --repeats 2 # a quick CPU run
    python scripts/benchmark_loop.py --models mqar --variant gla --json loop.json
    python scripts/benchmark_loop.py --models mqar --steps-per-call 8   # the loop runs 8 steps a jitted call
    python scripts/benchmark_loop.py --host --steps 400 --steps-per-call 1 8   # the host's own cost per step
    python scripts/benchmark_loop.py --host --ready-data --pack-state true false   # ... with the state packed or not
    python scripts/benchmark_loop.py --host --profile --models mqar --steps-per-call 8   # ... and where it goes
    python scripts/benchmark_loop.py --seeds 1 3 8 --steps 20   # several seeds as one jitted step: time per seed
    python scripts/benchmark_loop.py --data --steps 400          # the training data alone: batches a second

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

``--host``: the loop alone, on any machine. The trainer is given a jitted step that does no work (it
takes the same state, packed as the trainer packs it (``--pack-state``, ``train.pack_state``), and batches, and
returns the same state and metrics of the same shapes, dtypes and shardings, every step finite), so the loop's
time per optimizer step is the host's own: pulling and moving batches, dispatching, reading flags, keeping
metrics. One row per ``--steps-per-call`` value; ``--profile`` prints where that time goes (cProfile over one timed
stretch, the functions taking most of it).

``--seeds 1 3 8``: the loop training that many seeds as one jitted step (``train.seeds``, ``lmzoo.run.seeds``;
one seed: the plain trainer), its time per optimizer step of all the seeds, per seed, and the speed-up per seed
over training one.

``--data``: the model's training batches alone, read from the iterator the trainer reads (no step, no device):
milliseconds of wall time and of process CPU time (all threads, the data's reading threads included: robust to
other jobs on the machine) per batch, and batches a second.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from contextlib import ExitStack

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from jsonrows import JsonRows
from lmzoo.cli import compose_and_validate
from lmzoo.data import build_data
from lmzoo.run.base import Steps
from lmzoo.run.loop import Trainer, jitted_call, open_steps, training_batches

MODELS = {
    "default": [],
    "mqar": ["data=mqar", "model.n_layers=2", "model.d_model=32"],
}
NEVER = 10**9  # train.steps and every interval: no step of the benchmark logs, validates or saves


def open_trainer(variant: str, overrides: list[str], run_dir: str, steps_per_call: int = 1,
                 seeds: int = 1, pack: str = "auto", step_fn=jitted_call, batches=training_batches) -> Steps:
    """A trainer that never logs, validates or saves, stepped by ``step_fn`` on ``batches`` (``Trainer``'s); with
    ``seeds`` > 1, a group of seeds 0 .. seeds - 1, each reading ``batches`` (stepped by the group's own call)."""
    never = NEVER // steps_per_call * steps_per_call  # a multiple, as train.steps and every interval must be
    several = [f"train.seeds=[{','.join(map(str, range(seeds)))}]"] if seeds > 1 else []
    cfg = compose_and_validate([f"+attn={variant}", *overrides, f"train.steps={never}", f"train.log_every={never}",
                                f"train.eval_every={never}", f"train.checkpoint_every={never}", *several,
                                f"train.steps_per_call={steps_per_call}", "train.progress=false", f"run_dir={run_dir}",
                                f"train.pack_state={pack}"])
    return open_steps(cfg, batches=batches) if seeds > 1 else Trainer(cfg, step_fn=step_fn, batches=batches)


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
    packed = trainer.arrays.packed
    start = time.perf_counter()
    with jax.set_mesh(trainer.mesh):
        for batch in batches:
            packed, metrics = trainer.step_fn(packed, batch)
        jax.block_until_ready((packed, metrics))
    elapsed = time.perf_counter() - start
    trainer.arrays.packed = packed  # the old ones were donated
    return elapsed / len(batches)


def time_loop(trainer: Trainer, steps: int) -> float:
    """Seconds per step of the trainer's own loop, until its last step's flag is read and its state is ready."""
    start = time.perf_counter()
    for _ in range(steps // trainer.steps_per_call):
        trainer.advance()
    trainer.settle()
    jax.block_until_ready(trainer.packed)
    return (time.perf_counter() - start) / steps


class NoWork:
    """A trainer's step function (``Trainer(step_fn=NoWork)``) that does no work: the same state back, packed as the
    trainer packs it (``train.pack_state``; donated, so no copy), and metrics shaped as its real step's
    (``jitted_call``, traced once, never run), each step finite."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.real_step, self.call = trainer, jitted_call(trainer), None

    def __call__(self, packed, batches):
        if self.call is None:
            _, metrics = jax.eval_shape(self.real_step, packed, batches)
            filled = lambda m: jnp.ones(m.shape, m.dtype) if m.dtype == jnp.bool_ else jnp.zeros(m.shape, m.dtype)  # noqa: E731
            replicated = NamedSharding(self.trainer.mesh, P())
            self.call = jax.jit(lambda packed, batches: (packed, jax.tree.map(filled, metrics)), donate_argnums=0,
                                out_shardings=(self.trainer.packed_shardings, replicated))
        return self.call(packed, batches)


class Replay:
    """A trainer's training batches (``Trainer(batches=replayed)``): ``n`` batches read once from the iterator it
    would read, then served in turn (the data's own cost to make batches left out)."""

    def __init__(self, iterator, n: int):
        self.batches, self.next_index = [next(iterator) for _ in range(n)], 0

    def __next__(self):
        batch = self.batches[self.next_index % len(self.batches)]
        self.next_index += 1
        return batch

    def get_state(self) -> dict:
        return {"next_index": self.next_index}

    def set_state(self, state: dict) -> None:
        self.next_index = state["next_index"]


def replayed(cfg, data) -> Replay:
    """The batch source of a trainer on batches made beforehand: 16 of its own, in turn."""
    return Replay(training_batches(cfg, data), 16)


def profiled(run, top: int = 25) -> str:
    """cProfile's table of ``run()``'s functions taking most time (their own, then with what they call)."""
    profile = cProfile.Profile()
    profile.runcall(run)
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def measure_host(name: str, variant: str, steps: int, repeats: int, steps_per_call: int, profile: bool,
                 ready_data: bool, pack: str = "auto") -> dict:
    """The loop's milliseconds per optimizer step around a step that does no work (with ``ready_data``, on
    batches already made)."""
    with ExitStack() as held:
        run_dir = held.enter_context(tempfile.TemporaryDirectory(prefix="lmzoo-host-"))
        trainer = open_trainer(variant, MODELS[name], run_dir, steps_per_call, pack=pack, step_fn=NoWork,
                               batches=replayed if ready_data else training_batches)
        held.callback(trainer.close)
        time_loop(trainer, 2 * steps_per_call)  # compiles the call that does nothing
        host = [time_loop(trainer, steps) for _ in range(repeats)]
        row = {"model": name, "variant": variant, "batch": trainer.cfg.train.batch_size,
               "seq_len": trainer.cfg.data.seq_len, "steps": steps, "steps_per_call": steps_per_call,
               "ready_data": ready_data, "pack_state": pack, "arrays": len(trainer.packed),
               "host_ms": 1e3 * statistics.median(host),
               "host_ms_each": [1e3 * t for t in host]}
        if profile:
            row["profile"] = profiled(lambda: time_loop(trainer, steps))
        return row


def measure_seeds(name: str, variant: str, steps: int, repeats: int, steps_per_call: int, seeds: int,
                  ready_data: bool = False) -> dict:
    """The training loop's milliseconds per optimizer step of ``seeds`` seeds trained as one jitted step (one seed:
    the plain trainer), and per seed; with ``ready_data``, on batches made beforehand."""
    with ExitStack() as held:
        run_dir = held.enter_context(tempfile.TemporaryDirectory(prefix="lmzoo-seeds-"))
        trainer = open_trainer(variant, MODELS[name], run_dir, steps_per_call, seeds,
                               batches=replayed if ready_data else training_batches)
        held.callback(trainer.close)
        time_loop(trainer, 2 * steps_per_call)  # compiles the step
        times = [time_loop(trainer, steps) for _ in range(repeats)]
        cfg = trainer.cfg
        return {"model": name, "variant": variant, "batch": cfg.train.batch_size, "seq_len": cfg.data.seq_len,
                "steps": steps, "steps_per_call": steps_per_call, "seeds": seeds, "ready_data": ready_data,
                "ms": 1e3 * statistics.median(times), "ms_per_seed": 1e3 * statistics.median(times) / seeds,
                "ms_each": [1e3 * t for t in times]}


def measure(name: str, variant: str, steps: int, repeats: int, steps_per_call: int = 1, pack: str = "auto") -> dict:
    with ExitStack() as held:
        run_dir = held.enter_context(tempfile.TemporaryDirectory(prefix="lmzoo-loop-"))
        trainer = open_trainer(variant, MODELS[name], run_dir, steps_per_call, pack=pack)
        held.callback(trainer.close)
        stepper = trainer  # whose step_fn the bare column times: one step a call
        if steps_per_call > 1:
            bare_dir = held.enter_context(tempfile.TemporaryDirectory(prefix="lmzoo-loop-bare-"))
            stepper = open_trainer(variant, MODELS[name], bare_dir, pack=pack)
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
                "pack_state": pack, "arrays": len(trainer.arrays.packed),
                "bare_ms": 1e3 * statistics.median(bare), "loop_ms": 1e3 * statistics.median(loop),
                "ratio": statistics.median(loop) / statistics.median(bare),
                "bare_ms_each": [1e3 * t for t in bare], "loop_ms_each": [1e3 * t for t in loop]}


def measure_data(name: str, variant: str, steps: int, repeats: int) -> dict:
    """Milliseconds (wall and process CPU) per training batch read from the trainer's own iterator."""
    cfg = compose_and_validate([f"+attn={variant}", *MODELS[name], "train.progress=false"])
    iterator = training_batches(cfg, build_data(cfg.data, seed=cfg.seed))
    try:
        next(iterator)  # starts the reading threads
        wall, cpu = [], []
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                next(iterator)
            wall.append((time.perf_counter() - start) / steps)
            cpu.append((time.process_time() - start_cpu) / steps)
    finally:
        getattr(iterator, "close", lambda: None)()
    return {"model": name, "batch": cfg.train.batch_size, "seq_len": cfg.data.seq_len, "steps": steps,
            "ms": 1e3 * statistics.median(wall), "cpu_ms": 1e3 * statistics.median(cpu),
            "ms_each": [1e3 * t for t in wall], "cpu_ms_each": [1e3 * t for t in cpu]}


def main_data(args, rows: JsonRows) -> None:
    print("the training batches alone, read from the trainer's iterator: milliseconds per batch (wall, and process "
          "CPU over all threads)")
    print(f"{'model':<9}{'batch':>6}{'seq_len':>8}{'ms/batch':>10}{'cpu ms':>10}{'batches/s':>11}")
    for name in args.models:
        row = measure_data(name, args.variant, args.steps, args.repeats)
        rows.add(row)
        print(f"{name:<9}{row['batch']:>6}{row['seq_len']:>8}{row['ms']:>10.3f}{row['cpu_ms']:>10.3f}"
              f"{1e3 / row['ms']:>11.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--variant", default="softmax", help="the +attn=<variant> of every model")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-per-call", type=int, nargs="+", default=[1],
                        help="train.steps_per_call of the timed loop (the bare column: one step a call); several "
                             "values give a row each")
    parser.add_argument("--host", action="store_true",
                        help="time the loop around a step that does no work: the host's own cost per step")
    parser.add_argument("--profile", action="store_true", help="with --host: print where the host's time goes")
    parser.add_argument("--pack-state", nargs="+", default=["auto"], choices=["auto", "true", "false"],
                        help="train.pack_state of the trainers (the state packed into a buffer per dtype for each "
                             "call); several values give a row each")
    parser.add_argument("--ready-data", action="store_true",
                        help="with --host or --seeds: a row more per setting, on batches made beforehand (the loop "
                             "without the data's own cost of making them)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="time the loop training this many seeds as one jitted step (train.seeds), each count a "
                             "row (1: the plain trainer), with the time per seed and its speed-up over one seed")
    parser.add_argument("--data", action="store_true",
                        help="time the training batches alone (the trainer's iterator, no step): ms and CPU ms a batch")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    for k in args.steps_per_call:
        if k < 1 or args.steps % k:
            parser.error(f"--steps={args.steps} must be a multiple of --steps-per-call={k} (at least 1)")
    if args.seeds and (args.host or min(args.seeds) < 1):
        parser.error("--seeds takes counts of at least 1, and times the real step (not with --host)")
    if args.profile and not args.host:
        parser.error("--profile profiles the host's loop: add --host")
    if args.ready_data and not (args.host or args.seeds):
        parser.error("--ready-data is for --host and --seeds")

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}, {jax.device_count()} device(s)), "
          f"jax {jax.__version__}; {args.steps} steps x {args.repeats} repeats, medians")
    if args.data and (args.host or args.seeds):
        parser.error("--data times the data alone: not with --host or --seeds")
    meta = {"device": device.device_kind, "backend": jax.default_backend(), "devices": jax.device_count(),
            "jax": jax.__version__, "steps": args.steps, "repeats": args.repeats,
            "steps_per_call": args.steps_per_call, "host": args.host, "data": args.data, "seeds": args.seeds}
    rows = JsonRows(args.json, meta)  # rewritten after every row
    mains = [(args.data, main_data), (args.host, main_host), (args.seeds, main_seeds), (True, main_bare_and_loop)]
    next(run for chosen, run in mains if chosen)(args, rows)
    rows.close()


def main_bare_and_loop(args, rows: JsonRows) -> None:
    print(f"{'model':<9}{'variant':<10}{'k':>3}{'batch':>6}{'seq_len':>8}{'params':>11}{'dtype':>10}{'pack':>6}"
          f"{'arrays':>7}{'bare ms':>10}{'loop ms':>10}{'loop/bare':>10}")
    for name in args.models:
        for k in args.steps_per_call:
            for pack in args.pack_state:
                row = measure(name, args.variant, args.steps, args.repeats, k, pack)
                rows.add(row)
                print(f"{name:<9}{args.variant:<10}{k:>3}{row['batch']:>6}{row['seq_len']:>8}{row['params']:>11,}"
                      f"{row['dtype']:>10}{pack:>6}{row['arrays']:>7}{row['bare_ms']:>10.2f}{row['loop_ms']:>10.2f}"
                      f"{row['ratio']:>10.3f}", flush=True)


def main_seeds(args, rows: JsonRows) -> None:
    print("the training loop with several seeds as one jitted step: milliseconds per optimizer step of all of them, "
          "and per seed")
    print(f"{'model':<9}{'variant':<10}{'steps/call':>11}{'data':>7}{'seeds':>6}{'ms/step':>10}{'ms/seed':>10}"
          f"{'speed-up':>10}")
    for name in args.models:
        for k in args.steps_per_call:
            for ready in (False, True) if args.ready_data else (False,):
                one = None
                for n in args.seeds:
                    row = measure_seeds(name, args.variant, args.steps, args.repeats, k, n, ready)
                    one = row["ms"] if n == 1 else one
                    row["speedup_per_seed"] = one / row["ms_per_seed"] if one else None
                    rows.add(row)
                    speedup = f"{row['speedup_per_seed']:.2f}x" if one else "-"
                    print(f"{name:<9}{args.variant:<10}{k:>11}{'ready' if ready else 'made':>7}{n:>6}{row['ms']:>10.2f}"
                          f"{row['ms_per_seed']:>10.2f}{speedup:>10}", flush=True)


def main_host(args, rows: JsonRows) -> None:
    print("the loop around a jitted step that does no work: the host's own milliseconds per optimizer step")
    print(f"{'model':<9}{'variant':<10}{'steps/call':>11}{'batch':>6}{'seq_len':>8}{'data':>7}{'pack':>6}{'arrays':>7}"
          f"{'host ms/step':>14}")
    for name in args.models:
        for k in args.steps_per_call:
            for ready in (False, True) if args.ready_data else (False,):
                for pack in args.pack_state:
                    row = measure_host(name, args.variant, args.steps, args.repeats, k, args.profile, ready, pack)
                    rows.add(row)
                    print(f"{name:<9}{args.variant:<10}{k:>11}{row['batch']:>6}{row['seq_len']:>8}"
                          f"{'ready' if ready else 'made':>7}{pack:>6}{row['arrays']:>7}{row['host_ms']:>14.3f}",
                          flush=True)
                    if args.profile:
                        print(row.pop("profile"), flush=True)


if __name__ == "__main__":
    main()
