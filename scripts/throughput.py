"""End-to-end training throughput: tokens/s and model FLOPs utilisation of whole train steps.

    python scripts/throughput.py                                     # small model; softmax, gla, mamba
    python scripts/throughput.py --variants softmax "gla attn.method=pallas" "mamba attn.method=pallas"
    python scripts/throughput.py --model tiny --lengths 128 --batch-tokens 4096   # a CPU smoke run
    python scripts/throughput.py --variants "gla train.mesh.fsdp=-1 train.mesh.data=1"  # a mesh layout (lmzoo.sharding)
    python scripts/throughput.py --variants softmax "softmax attn.method=xla" --documents 4  # packed documents

Each entry of ``--variants`` is a variant name followed by config overrides for it. It is built
from the same configs as ``lmzoo.train`` (``+attn=<variant> model=<model> data.seq_len=<T>`` plus
its overrides) and runs the trainer's own jitted ``train_step`` (AdamW update included) on random
tokens; the batch holds ``--batch-tokens`` tokens at every length; ``--documents n`` packs n documents of equal
length into every row (segment ids, as ``data.document_boundaries=mask`` gives the model). The state and batch are
placed on the training mesh exactly as ``lmzoo.train`` places them (``train.mesh.*`` overrides choose the
layout; by default data-parallel over every device), and the row says which layout it measured.

MFU = model FLOPs per second / the device's peak dense bf16 FLOP/s (``--peak-tflops``, or a table
of known devices). Model FLOPs per token are 6 x parameters for the matmuls, plus layers x what the
attn spec's ``flops_per_token`` counts for the token-token mixing the 6N rule misses (forward +
backward): softmax attention's causal scores and values, 6 x T x d_model per layer without a
window; the recurrent mixers' chunked matmuls (``lmzoo.mixers.family.linear.chunked_mixing_flops``). GiB is
what the compiled step holds at once on one device (XLA's memory analysis: train state, batch,
outputs and temporaries), comparable across variants, layouts and devices. ``compile s`` is the seconds XLA takes to
compile the step, with the persistent compilation cache off (the first step of a run waits that long; a later run
of the same shapes loads it from the cache). ``--steps 0`` only compiles (compile seconds and GiB, e.g. on a CPU as a
proxy for a GPU's memory); the default run's figures, per variant: ``--model tiny --lengths 256 --batch-tokens 4096
--steps 0``. Each row names the kernels its mixers ran
(``lmzoo.ops.kernels``). A variant that fails (out of memory, a method the device lacks) prints one line and
the sweep goes on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from jax.sharding import NamedSharding, PartitionSpec as P

from jsonrows import JsonRows
from lmzoo.cli import compose_and_validate
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.model import LM, count_params
from lmzoo.run.loop import training_mesh
from lmzoo.run.steps import init_train_state, train_step
from lmzoo.sharding import batch_sharding, state_shardings

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "TPU v5": 197.0, "TPU v4": 275.0}  # dense bf16
VOCAB = ByteTokenizer.vocab_size


def peak_tflops(kind: str, given: float | None) -> float | None:
    if given:
        return given
    return next((value for name, value in PEAK_TFLOPS.items() if name in kind), None)


def model_flops_per_token(cfg, params: int, length: int) -> float:
    mixing = cfg.model.n_layers * cfg.attn.flops_per_token(cfg.model, length)  # a hybrid's is its mean over layers
    return 6 * params + mixing


def measure(variant: str, overrides: list[str], model: str, length: int, batch_tokens: int, steps: int,
            documents: int = 1) -> dict:
    batch_size = max(1, batch_tokens // length)
    cfg = compose_and_validate([f"+attn={variant}", f"model={model}", f"data.seq_len={length}",
                                f"train.batch_size={batch_size}",
                                "train.progress=false", *overrides])
    mesh = training_mesh(cfg)
    lm = LM(cfg, VOCAB, rngs=nnx.Rngs(0))
    params = count_params(lm)
    graphdef, state, tx = init_train_state(cfg, lm)
    shardings = state_shardings(state, mesh, cfg.train.mesh.rules)
    state = jax.device_put(state, shardings)
    tokens = jax.random.randint(jax.random.key(0), (batch_size, length + 1), 0, VOCAB)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    if documents > 1:
        ids = jnp.arange(length, dtype=jnp.int32) * documents // length
        batch["segment_ids"] = jnp.broadcast_to(ids, (batch_size, length))
    batch = jax.device_put(batch, batch_sharding(mesh))
    kernels = {op["implementation"] for layer in lm.mixer_kernels(batch_size, length, documents > 1) for op in layer}
    with jax.set_mesh(mesh):
        compile_start = time.perf_counter()
        step = jax.jit(partial(train_step, graphdef, tx), donate_argnums=0,
                       out_shardings=(shardings, NamedSharding(mesh, P()))).lower(state, batch).compile()
        compile_s = time.perf_counter() - compile_start
        times = [float("nan")]
        if steps:
            state, metrics = step(state, batch)  # warm up
            jax.block_until_ready(metrics)
            times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens_per_s = batch_size * length / seconds
    layout = "x".join(str(mesh.shape[axis]) for axis in mesh.axis_names)
    return {"variant": " ".join([variant, *overrides]), "mesh": layout, "T": length, "batch": batch_size,
            "documents": documents, "params": params,
            "step_ms": 1e3 * seconds,
            "tokens_per_s": tokens_per_s,
            "model_tflops": tokens_per_s * model_flops_per_token(cfg, params, length) / 1e12,
            "memory_gib": compiled_gib(step), "compile_s": compile_s, "kernels": ",".join(sorted(kernels))}


def compiled_gib(compiled) -> float:
    """What the compiled step holds at once: its arguments (the train state, the batch), outputs and temporaries."""
    stats = compiled.memory_analysis()
    if stats is None:
        return float("nan")
    held = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
            - stats.alias_size_in_bytes)
    return held / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["softmax", "gla", "mamba"],
                        help='e.g. softmax "gla attn.method=pallas"')
    parser.add_argument("--model", default="small")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="tokens per step at every length")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--documents", type=int, default=1, help="documents packed into every row (segment ids)")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak dense bf16 TFLOP/s (for MFU)")
    parser.add_argument("--json", help="also write the rows to this JSON file (rewritten after every row)")
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)  # compile seconds time compiling, not a cache's load

    device = jax.devices()[0]
    peak = peak_tflops(device.device_kind, args.peak_tflops)
    meta = {"device": device.device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
            "model": args.model, "batch_tokens": args.batch_tokens, "documents": args.documents, "peak_tflops": peak}
    rows = JsonRows(args.json, meta)
    print(f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}; model={args.model}, "
          f"{args.batch_tokens} tokens per step, {args.documents} document(s) a row; peak {peak or '?'} TFLOP/s")
    print(f"{'variant':<32}{'mesh d x f x t':>15}{'T':>7}{'batch':>7}{'params':>12}{'step ms':>10}{'tokens/s':>12}"
          f"{'TFLOP/s':>9}{'MFU':>7}{'GiB':>7}{'compile s':>10}  kernels")
    for entry in args.variants:
        variant, *overrides = entry.split()
        for length in map(int, args.lengths.split(",")):
            try:
                row = measure(variant, overrides, args.model, length, args.batch_tokens, args.steps, args.documents)
            except Exception as error:  # out of memory, a method the device lacks: report it and go on
                print(f"{entry:<32}{length:>7}  failed: {str(error).strip().splitlines()[0][:120]}", flush=True)
                continue
            rows.add(row)
            mfu = f"{100 * row['model_tflops'] / peak:.1f}%" if peak else "?"
            print(f"{row['variant']:<32}{row['mesh']:>15}{length:>7}{row['batch']:>7}{row['params']:>12,}{row['step_ms']:>10.1f}"
                  f"{row['tokens_per_s']:>12,.0f}{row['model_tflops']:>9.2f}{mfu:>7}{row['memory_gib']:>7.2f}"
                  f"{row['compile_s']:>10.1f}  {row['kernels']}", flush=True)
    rows.close()


if __name__ == "__main__":
    main()
