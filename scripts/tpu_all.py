"""The TPU measurements docs/benchmarks.md lacks, as one command on a TPU VM: the kernel table and the end-to-end table
of the GPU plan (scripts/gpu_all.py), for deltanet-tpu beside lmzoo's own forms.

    python scripts/tpu_all.py --archive tpu_out.tar.gz   # on a TPU VM, after pip install -U "jax[tpu]" -e ".[tpu,dev]"
    python scripts/tpu_all.py --dry-run                  # the same steps at tiny shapes, anywhere (a CPU: interpreted)
    python scripts/tpu_all.py --list                     # every step

Steps, most decisive first (``PLAN``): ``env`` records the chips and versions; ``tpu_kernel_tests`` runs the
deltanet-tpu mappings' tests compiled for the TPU (tests/ops/test_kernels_tpu.py: every mapping against lmzoo's
reference, values, gradients, states, documents) and the lowering tests; ``ops_tpu`` times deltanet-tpu's own calls
(the baseline), lmzoo's ``auto`` (deltanet-tpu on a TPU) and lmzoo's ``chunk`` and ``pallas`` forms at K = V = 128
(scripts/benchmark.py); ``e2e_2048`` and ``e2e_8192`` train ``model=small`` at 6 heads of 128 (the width
deltanet-tpu takes; at 12 heads of 64 ``auto`` runs lmzoo's ``chunk``, and run_info.json says why; Mamba-2 with a
state of 128) in ``auto`` and in ``chunk``, beside softmax (scripts/throughput.py, which prints the implementation
each layer ran). The runner is gpu_all.py's: each step its own process under its own limit, raw output in
``<out>/<step>.txt``, JSON rows after every row, ``<out>/summary.md`` and the archive kept current, a step whose
minimum no longer fits not started.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import gpu_all  # scripts/gpu_all.py: its runner, steps and archive
from gpu_all import PY, Step

SHAPES = "4x2048x16x128,1x8192x16x128"  # (B, T, H, D): deltanet-tpu's kernels take D = 128
TINY_OP_SHAPE = "1x67x2x16"
KERNEL_OPS = ",".join([  # deltanet-tpu's own call (the baseline auto is held to), auto, then lmzoo's own forms
    "tpu_chunk_gla/own", "tpu_chunk_gdn/own", "tpu_chunk_delta_rule/own", "tpu_chunk_kda/own",
    "gla/auto", "gated_delta_rule/auto", "delta_rule/auto", "channel_delta_rule/auto", "simple_gla/auto",
    "gla/chunk64", "gated_delta_rule/chunk64", "delta_rule/chunk64", "channel_delta_rule/chunk64",
    "gla/pallas", "gated_delta_rule/pallas", "simple_gla/pallas",
])
WIDE = "model.n_heads=6"  # model=small's d_model 768 as 6 heads of 128
DRY_WIDE = "model.n_heads=2"  # the tiny model's d_model 128 as 2 heads of 64 (a dry run checks the commands)


def e2e_variants(wide: str) -> list[str]:
    """softmax, then each variant deltanet-tpu maps in auto (wide heads), then lmzoo's chunk form of three."""
    mapped = [("gla", " attn.key_ratio=1.0"), ("gated_deltanet", ""), ("kda", ""), ("gdn2", ""), ("deltanet", ""),
              ("retnet", "")]
    return ["softmax", *(f"{v} {wide}{extra}" for v, extra in mapped),
            f"gla {wide} attn.key_ratio=1.0 attn.method=chunk", f"gated_deltanet {wide} attn.method=chunk",
            f"kda {wide} attn.method=chunk", "mamba2 attn.d_state=128", "mamba2 attn.d_state=128 attn.method=chunk",
            "mamba2 attn.d_state=128 attn.method=pallas"]


def e2e_step(name: str, length: int) -> Step:
    full = gpu_all.throughput_step(name, e2e_variants(WIDE), 1200, length=length)
    dry = gpu_all.throughput_step(name, e2e_variants(DRY_WIDE), 1200, length=length)
    return Step(name, full.full, dry.dry, full.cap_s, min_s=full.min_s)


PLAN = ["env", "tpu_kernel_tests", "ops_tpu", "e2e_2048", "e2e_8192"]
BUDGET_S = 3600  # a TPU VM is not a 9-minute loan: an hour for the whole plan
TEST_FILES = ["tests/ops/test_kernels_tpu.py", "tests/run/test_tpu_lowering.py"]


def steps() -> list[Step]:
    versions = ("import jax, jaxlib, flax; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', "
                "flax.__version__); print(jax.devices())\n"
                "try: import deltanet_tpu; print('deltanet-tpu', deltanet_tpu.__version__)\n"
                "except ImportError as e: print('deltanet-tpu unavailable:', e)")
    tests = gpu_all.pytest_argv("-n", "0", *TEST_FILES)
    return [
        Step("env", [PY, "-c", versions], [PY, "-c", versions], 60, min_s=5),
        Step("tpu_kernel_tests", tests, [*tests, "-m", "not slow"], 900, min_s=120),
        gpu_all.ops_step("ops_tpu", KERNEL_OPS, 900, shapes=SHAPES),
        e2e_step("e2e_2048", 2048),
        e2e_step("e2e_8192", 8192),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated step names, run in this order (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated step names to leave out")
    parser.add_argument("--out", default="tpu_out", help="folder for the raw outputs and summary.md")
    parser.add_argument("--budget-s", type=float, help=f"stop starting steps after this long (default {BUDGET_S})")
    parser.add_argument("--archive", help="write the output folder as this .tar.gz after every step")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes: check every command on any machine")
    parser.add_argument("--list", action="store_true", help="print every step with its cap and exit")
    args = parser.parse_args()
    all_steps = steps()
    if args.list:
        print("\n".join(f"{s.name:<24} cap {s.cap_s:>5} s  least {s.min_s:>4} s" for s in all_steps))
        return
    args.call = None
    if not args.only:
        args.only = ",".join(PLAN)
    chosen = gpu_all.choose(all_steps, args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    packed = Path(args.archive) if args.archive else None
    budget = args.budget_s or BUDGET_S * (gpu_all.DRY_SLOWER if args.dry_run else 1)
    runner = gpu_all.Runner(out, budget, args.dry_run, "steps " + ",".join(s.name for s in chosen), packed)
    runner.summary[0] = "# TPU measurements"

    def stop(signum, frame):  # ^C or the VM's shutdown: kill the running step's group, keep what was measured
        runner.kill()
        runner.summary.append(f"| (interrupted by signal {signum}) | interrupted | |")
        runner.write()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.run(chosen)
    runner.write()
    print("\n".join(runner.summary))
    sys.exit(1 if runner.failed else 0)


if __name__ == "__main__":
    main()
