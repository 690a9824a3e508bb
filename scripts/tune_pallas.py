"""Sweep the Pallas kernels' GPU launch settings, one kernel at a time, and print the best of each.

    python scripts/tune_pallas.py                          # GLA, delta rule, selective scan, 4x2048x16x128 bf16
    python scripts/tune_pallas.py --shape 1x8192x16x128 --budget-s 300 --json tune.json
    python scripts/tune_pallas.py --smoke                  # tiny shapes and grid: checks the script on a CPU

Each kernel is timed alone, on inputs laid out as it sees them inside ``gla_pallas`` /
``selective_scan_pallas`` at the shape (B, T, H, D) (the selective scan runs H x D channels with a
16-entry state, like benchmark.py). For every setting (warps, stages, and the knobs that change the
kernel's tiling: the state block of the sequential GLA kernels, the chunk size, the selective
scan's channel block) it prints the median milliseconds next to the current default's. Settings
apply through ``lmzoo.ops.pallas.common.GPU_TUNING`` (warps, stages) and the kernels' own arguments;
put the winners there and in the ops' defaults by hand, then confirm with ``scripts/benchmark.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import jax
import jax.numpy as jnp

from benchmark import milliseconds  # scripts/benchmark.py: the same timing as the benchmark rows
from lmzoo.ops.pallas import common, delta, gla, selective_scan as scan


def gla_inputs(b, t, h, d, chunk, per_dimension, dtype, key):
    """Head-major padded inputs [BH, T, D] of the four GLA kernels, gates already cumulated per chunk."""
    ks = jax.random.split(key, 6)
    q, k, v, do = (jax.random.normal(kk, (b * h, t, d), dtype) for kk in ks[:4])
    width = d if per_dimension else 1
    log_g = jax.nn.log_sigmoid(jax.random.normal(ks[4], (b * h, t, width))) / 16
    cumulated = gla.chunk_cumsum(log_g, chunk)
    state = jax.random.normal(ks[5], (b * h, d, d), jnp.float32)
    states = jnp.broadcast_to(state[:, None], (b * h, t // chunk, d, d))
    return dict(q=q, k=k, v=v, do=do, b=cumulated, s0=state, states=states)


GLA_KERNELS = {  # kernel name -> the launch, as gla_pallas makes it, on inputs of the sweep's shape
    "gla_states": lambda c, x: gla._states(c, x["k"], x["v"], x["b"], x["s0"]),
    "gla_state_grads": lambda c, x: gla._state_grads(c, x["q"], x["b"], x["do"], x["s0"]),
    "gla_outputs": lambda c, x: gla._outputs(c, x["q"], x["k"], x["v"], x["b"], x["states"]),
    "gla_key_grads": lambda c, x: gla._key_grads(c, x["q"], x["k"], x["v"], x["b"], x["do"], x["states"], x["states"]),
    "gla_value_grads": lambda c, x: gla._value_grads(c, x["q"], x["k"], x["b"], x["do"], x["states"]),
    # the delta rule's pass across chunks (its outputs run on gla_outputs and the gradient kernels above)
    "delta_states": lambda c, x: delta._launch(delta._states_kernel, "delta_states", c, delta_key_side(c, x), (x["v"],),
                                               x["s0"], values_out=1),
    "delta_state_grads": lambda c, x: delta._launch(delta._state_grads_kernel, "delta_state_grads", c,
                                                    delta_key_side(c, x), (x["do"],), x["s0"], values_out=1,
                                                    chunk_values=x["states"]),
}


def delta_key_side(config, x):
    """(w_k, keys to the chunk's end, decay across each chunk) from the sweep's inputs."""
    return x["k"], x["k"], jnp.exp(x["b"][:, config.chunk - 1 :: config.chunk])


def timed_setting(kernel_name, run, settings, repeats):
    """Trace a fresh jit under ``settings`` (warps, stages) and time it; None if it fails to build."""
    common.GPU_TUNING[kernel_name] = settings
    try:
        return milliseconds(jax.jit(run), (), repeats)
    except Exception as error:  # a setting the compiler refuses (shared memory, registers) is skipped
        print(f"    {kernel_name} {settings}: failed ({str(error).splitlines()[0][:100]})")
        return None
    finally:
        common.GPU_TUNING.pop(kernel_name, None)


class Sweep:
    def __init__(self, budget_s: float, repeats: int):
        self.deadline, self.repeats, self.rows = time.monotonic() + budget_s, repeats, []

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def record(self, row: dict, default: float | None):
        self.rows.append(row)
        ratio = f"{row['ms'] / default:6.2f}x default" if default and row["ms"] else ""
        print(f"  {row['kernel']:<26}{row['setting']:<44}{row['ms'] or float('nan'):>9.3f} ms  {ratio}", flush=True)


def sweep_gla(sweep, shape, dtype, per_dimension, chunks, blocks, warps, stages):
    b, t, h, d = shape
    label = "gla" if per_dimension else "simple_gla"
    for chunk in chunks:
        inputs = gla_inputs(b, t, h, d, chunk, per_dimension, dtype, jax.random.key(0))
        for name, kernel in GLA_KERNELS.items():
            default = None
            for block, w, s in itertools.product(blocks, [None, *warps], [None, *stages]):
                if (w is None) != (s is None) or sweep.out_of_time():
                    continue
                config = gla.KernelConfig(chunk, 16, min(block, d), min(block, d), common.current_platform())
                settings = {} if w is None else {"num_warps": w, "num_stages": s}
                ms = timed_setting(name, lambda c=config: kernel(c, inputs), settings, sweep.repeats)
                row = {"op": label, "kernel": name, "chunk": chunk, "block": config.block_k, **settings, "ms": ms,
                       "setting": f"chunk={chunk} block={config.block_k} "
                                 + (f"warps={w} stages={s}" if w else "defaults")}
                if w is None and block == 64:
                    default = ms
                sweep.record(row, default)


def sweep_selective_scan(sweep, shape, chunks, blocks, warps, stages):
    b, t, h, d = shape
    channels, n = h * d, 16
    ks = jax.random.split(jax.random.key(0), 5)
    u = jax.random.normal(ks[0], (b, t, channels))
    delta = jax.nn.softplus(jax.random.normal(ks[1], (b, t, channels)) - 4)
    A = -jnp.tile(jnp.arange(1, n + 1, dtype=jnp.float32), (channels, 1))
    B, C = (jax.random.normal(k, (b, t, 1, n)) for k in ks[2:4])
    h0 = jnp.zeros((b, channels, n))
    dy = jax.random.normal(ks[4], (b, t, channels))
    for chunk, block in itertools.product(chunks, blocks):
        def both(chunk=chunk, block=block):
            fn = lambda *a: scan.selective_scan_pallas(*a, chunk_size=chunk, block_channels=block)[0]  # noqa: E731
            y, pullback = jax.vjp(fn, u, delta, A, B, C, h0)
            return y, pullback(dy)

        default = None
        for w, s in [(None, None), *itertools.product(warps, stages)]:
            if sweep.out_of_time():
                return
            settings = {} if w is None else {"num_warps": w, "num_stages": s}
            for kernel in ("selective_scan_forward", "selective_scan_backward"):
                common.GPU_TUNING[kernel] = settings
            try:
                ms = milliseconds(jax.jit(both), (), sweep.repeats)
            except Exception as error:
                print(f"    selective_scan {settings}: failed ({str(error).splitlines()[0][:100]})")
                ms = None
            finally:
                common.GPU_TUNING.clear()
            row = {"op": "selective_scan", "kernel": "forward+backward", "chunk": chunk, "block": block, **settings,
                   "ms": ms,
                   "setting": f"chunk={chunk} block={block} " + (f"warps={w} stages={s}" if w else "defaults")}
            if w is None:
                default = ms
            sweep.record(row, default)


def best_per_kernel(rows):
    best = {}
    for row in rows:
        key = (row["op"], row["kernel"], row["chunk"])
        if row["ms"] is not None and (key not in best or row["ms"] < best[key]["ms"]):
            best[key] = row
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4x2048x16x128", help="B x T x H x D")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--ops", default="gla,simple_gla,selective_scan")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=420, help="stop starting new settings after this long")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and grid (any device)")
    parser.add_argument("--json", help="also write every row to this JSON file")
    args = parser.parse_args()
    grid = dict(chunks=[64, 128], blocks=[32, 64, 128], warps=[2, 4, 8], stages=[1, 2, 3])
    scan_grid = dict(chunks=[8, 16, 32], blocks=[32, 64, 128], warps=[1, 2, 4], stages=[1, 2])
    if args.smoke:
        args.shape, args.repeats = "1x64x2x32", 1
        grid = dict(chunks=[32], blocks=[32], warps=[4], stages=[1])
        scan_grid = dict(chunks=[16], blocks=[32], warps=[4], stages=[1])
    shape = tuple(map(int, args.shape.split("x")))
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
          f"shape {args.shape}, {args.dtype}")
    sweep = Sweep(args.budget_s, args.repeats)
    ops = args.ops.split(",")
    if "gla" in ops:
        sweep_gla(sweep, shape, jnp.dtype(args.dtype), True, grid["chunks"][:1],
                  **{k: grid[k] for k in ("blocks", "warps", "stages")})
    if "simple_gla" in ops:
        sweep_gla(sweep, shape, jnp.dtype(args.dtype), False, grid["chunks"],
                  **{k: grid[k] for k in ("blocks", "warps", "stages")})
    if "selective_scan" in ops:
        sweep_selective_scan(sweep, shape, **scan_grid)
    print("\nbest per kernel:")
    for (op, kernel, chunk), row in best_per_kernel(sweep.rows).items():
        print(f"  {op:<16}{kernel:<26}{row['setting']:<44}{row['ms']:>9.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"device": device.device_kind, "jax": jax.__version__, "shape": args.shape,
                                "dtype": args.dtype}, "rows": sweep.rows}, f, indent=2)


if __name__ == "__main__":
    main()
