"""Every GPU measurement of docs/benchmarks.md, in order, inside one time budget.

    python scripts/gpu_all.py --out gpu_out --budget-s 540                  # everything that fits in 9 minutes
    python scripts/gpu_all.py --out gpu_out --only fla,throughput           # some steps (names: --list)
    python scripts/gpu_all.py --out smoke --dry-run                         # tiny shapes: checks the commands anywhere

The first step installs jax-linear-attention (the kernel provider behind attn.method=auto) from ``wheels/``,
prepared beside the checkout with ``pip download --no-deps jax-linear-attention==0.1.0 -d wheels`` (git-ignored;
carry it to a GPU machine whose image has jax 0.11.2 but not jla; ``import jla.ops`` needs nothing else).

A GPU may be lent for minutes, not hours, so each step runs as its own process under its own limit (the
smaller of its cap and the budget left) and a step whose minimum no longer fits is skipped rather than
started: however short the loan, every step that ran leaves its raw output in ``<out>/<step>.txt``
(JSON rows where the script writes them), and ``<out>/summary.md`` lists each step's outcome, seconds and
the end of its output. Kernel compile times are results too: a Pallas op that does not compile within its
step's cap is reported as such, and the steps after it still run. ``--dry-run`` runs the same steps at
tiny shapes (Pallas in interpret mode on a CPU) so the commands are checked before a GPU is at hand.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PY = sys.executable
SHAPES = "4x2048x16x128,1x8192x32x128,8x1024x16x64"  # (B, T, H, D): the shapes fla's kernels are compared at
XLA_OPS = ("softmax/xla,softmax/cudnn,fox/xla,gla/chunk64,simple_gla/chunk64,ssd/chunk64,delta_rule/chunk64,"
           "gated_delta_rule/chunk64,selective_scan/scan")
PALLAS_OPS = ("gla/pallas", "simple_gla/pallas", "ssd/pallas", "selective_scan/pallas", "delta_rule/pallas",
              "gated_delta_rule/pallas")
FLA_OPS = "chunk_gla,chunk_gated_delta_rule,chunk_delta_rule,chunk_simple_gla"  # mamba-ssm: not installable there
# lmzoo's default (auto) and jla forms beside jax-linear-attention's own call: the kernel table, first
PROVIDER_OPS = ("gla/auto,gla/jla,jla_gla/own,gla/chunk64,simple_gla/auto,simple_gla/jla,jla_simple_gla/own,"
                "simple_gla/pallas,gated_delta_rule/auto,gated_delta_rule/jla,jla_gated_deltanet/own,"
                "gated_delta_rule/chunk64,delta_rule/auto,jla_deltanet/own,channel_delta_rule/auto,jla_kda/own,"
                "mamba3/auto,mamba3/jla,jla_mamba3/own,mamba3/chunk64")
# every variant at its default form (auto: jla's kernels on Hopper, cuDNN for softmax), the table
DEFAULT_VARIANTS = ["softmax", "gla", "gated_deltanet", "mamba2", "kda", "rwkv7", "retnet", "deltaproduct", "gdn2",
                    "mamba3"]
THROUGHPUT_VARIANTS = ["softmax", "softmax attn.method=cudnn", "gla attn.method=chunk", "gla attn.method=pallas",
                       "mamba2", "gated_deltanet attn.method=chunk", "mamba2 attn.method=pallas",
                       "gated_deltanet attn.method=pallas"]  # in the order a short loan should measure them
MEMORY_VARIANTS = ["softmax", "gla attn.method=chunk", "gla attn.method=chunk_recompute",
                   "gated_deltanet attn.method=chunk_recompute", "gla attn.method=chunk model.remat=mixer",
                   # the mixers' own short convs and float32 norms recomputed, on the default form (jla's kernels)
                   "gated_deltanet model.remat=light", "mamba2 model.remat=light"]
DOCUMENT_VARIANTS = ["softmax", "softmax attn.method=xla", "gla"]
KERNEL_TESTS = ["tests/ops/test_pallas_gla.py", "tests/ops/test_pallas_ssm.py", "tests/ops/test_delta_rule.py"]


@dataclass
class Step:
    """One command: its argv at full size and at --dry-run size, its cap and the least time worth starting it with."""
    name: str
    full: list[str]
    dry: list[str]
    cap_s: int
    min_s: int = 30
    env: dict = field(default_factory=dict)


def ops_step(name: str, ops: str, cap_s: int) -> Step:
    """A benchmark.py row set at the GPU shapes in bfloat16 (tiny float32 shapes in a dry run)."""
    return Step(name, [PY, "scripts/benchmark.py", "--shapes", SHAPES, "--dtype", "bfloat16", "--ops", ops,
                       "--repeats", "20", "--json", "{out}/" + name + ".json"],
                [PY, "scripts/benchmark.py", "--shapes", "1x67x2x16", "--ops", ops, "--repeats", "2",
                 "--copy-mb", "16", "--json", "{out}/" + name + ".json"], cap_s, min_s=60)


def steps() -> list[Step]:
    tests_env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # several test workers share the one GPU
    versions = ("import jax, jaxlib, flax, optax; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', "
                "flax.__version__, 'optax', optax.__version__); print(jax.devices())\n"
                "for name in ('triton', 'torch', 'fla', 'mamba_ssm'):\n"
                "    try: print(name, __import__(name).__version__)\n"
                "    except Exception as e: print(name, 'unavailable:', type(e).__name__)")
    env_cmd = [PY, "-c", versions]
    return [
        Step("kernels_install", ["bash", "-c", "pip install --no-deps wheels/*.whl && " + shlex.join(env_cmd)],
             ["bash", "-c", "ls wheels/*.whl 2>/dev/null; " + shlex.join(env_cmd)], 120, min_s=20),
        Step("ops_providers", [PY, "scripts/benchmark.py", "--shapes", "4x2048x16x128", "--dtype", "bfloat16", "--ops",
                               PROVIDER_OPS, "--repeats", "20", "--json", "{out}/ops_providers.json"],
             [PY, "scripts/benchmark.py", "--shapes", "1x67x2x16", "--ops", "gla/auto,gla/jla,jla_gla/own,mamba3/auto,mamba3/jla,jla_mamba3/own",
              "--repeats", "2",
              "--json", "{out}/ops_providers.json"], 240, min_s=60),
        # the jla mappings' gpu-marked tests: Mosaic kernels (and jla's attention kernel) against lmzoo's references
        Step("jla_kernel_tests", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4", "-m", "gpu", "-rfE",
                                  "tests/ops/test_kernels.py"],
             [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "gpu", "tests/ops/test_kernels.py"],
             150, min_s=60, env=tests_env),
        Step("throughput_default", [PY, "scripts/throughput.py", "--model", "small", "--lengths", "2048,8192",
                                    "--batch-tokens", "65536", "--variants", *DEFAULT_VARIANTS,
                                    "--json", "{out}/throughput_default.json"],
             [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "256", "--steps",
              "2", "--variants", "softmax", "gla"], 420, min_s=120),
        # what GLA's own chunk form holds (54 GiB against softmax's 20 at 900775a): with and without recomputing
        # the mixer in the backward pass, beside softmax, at the length the issue measured
        Step("memory_gla", [PY, "scripts/throughput.py", "--model", "small", "--lengths", "2048", "--batch-tokens",
                            "65536", "--steps", "0", "--variants", *MEMORY_VARIANTS, "--json", "{out}/memory_gla.json"],
             [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "256", "--steps",
              "0", "--variants", *MEMORY_VARIANTS], 300, min_s=90),
        # packed documents: softmax's auto (jla's Hopper kernel, the ids read per tile) against XLA's dense mask
        Step("throughput_documents", [PY, "scripts/throughput.py", "--model", "small", "--lengths", "2048",
                                      "--batch-tokens", "65536", "--documents", "4", "--variants", *DOCUMENT_VARIANTS,
                                      "--json", "{out}/throughput_documents.json"],
             [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "256", "--steps",
              "2", "--documents", "4", "--variants", *DOCUMENT_VARIANTS], 240, min_s=90),
        Step("env", ["bash", "-c", "nvidia-smi; nvidia-smi -q -d CLOCK | head -30; " + shlex.join(env_cmd)],
             env_cmd, 60, min_s=5),
        Step("kernel_tests", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4", *KERNEL_TESTS],
             [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests/ops/test_pallas_ssm.py", "-k",
              "gpu or lower"], 300, min_s=120, env=tests_env),
        ops_step("ops_xla", XLA_OPS, 240),
        *(ops_step("ops_" + op.replace("/", "_"), op, 150) for op in PALLAS_OPS),
        Step("fla", [PY, "scripts/benchmark_fla.py", "--shapes", SHAPES, "--ops", FLA_OPS, "--json", "{out}/fla.json"],
             [PY, "scripts/benchmark_fla.py", "--shapes", "1x64x2x16", "--ops", FLA_OPS, "--repeats", "2"],
             480, min_s=120),
        Step("loop", [PY, "scripts/benchmark_loop.py", "--json", "{out}/loop.json"],
             [PY, "scripts/benchmark_loop.py", "--steps", "4"], 300, min_s=60),
        Step("throughput", [PY, "scripts/throughput.py", "--model", "small", "--lengths", "2048", "--batch-tokens",
                            "65536", "--variants", *THROUGHPUT_VARIANTS, "--json", "{out}/throughput_small.json"],
             [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "256", "--steps",
              "2", "--variants", "softmax", "gla attn.method=chunk"], 420, min_s=120),
        Step("throughput_medium", [PY, "scripts/throughput.py", "--model", "medium", "--lengths", "2048",
                                   "--batch-tokens", "65536", "--variants", *THROUGHPUT_VARIANTS,
                                   "--json", "{out}/throughput_medium.json"],
             [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "256", "--steps",
              "2", "--variants", "mamba2"], 480, min_s=120),
        Step("tune", [PY, "scripts/tune_pallas.py", "--budget-s", "240", "--json", "{out}/tune.json"],
             [PY, "scripts/tune_pallas.py", "--smoke", "--budget-s", "60"], 360, min_s=120),
        Step("all_tests", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "8", "-rfE"],
             [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"], 1200, min_s=300, env=tests_env),
    ]


def run_step(step: Step, out: Path, limit_s: float, dry: bool) -> tuple[str, float]:
    """Run one step with its output in ``<out>/<name>.txt``; its outcome and seconds."""
    argv = [a.replace("{out}", str(out)) for a in (step.dry if dry else step.full)]
    start = time.perf_counter()
    with open(out / f"{step.name}.txt", "w") as log:
        log.write("$ " + " ".join(argv) + "\n\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **step.env},
                                start_new_session=True)
        try:
            code = proc.wait(timeout=limit_s)
            outcome = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the whole group: pytest workers and compilers too
            proc.wait()
            outcome = f"stopped at its limit ({limit_s:.0f} s)"
            log.write(f"\n[stopped at its limit of {limit_s:.0f} s]\n")
    return outcome, time.perf_counter() - start


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_out", help="folder for the raw outputs and summary.md")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting steps after this long")
    parser.add_argument("--only", default="", help="comma-separated step names, run in this order (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated step names to leave out")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes: check every command on any machine")
    parser.add_argument("--list", action="store_true", help="print the step names and exit")
    args = parser.parse_args()
    all_steps = steps()
    if args.list:
        print("\n".join(f"{s.name:<32} cap {s.cap_s:>5} s" for s in all_steps))
        return
    only, skip = set(filter(None, args.only.split(","))), set(filter(None, args.skip.split(",")))
    unknown = (only | skip) - {s.name for s in all_steps}
    if unknown:
        sys.exit(f"unknown step(s) {sorted(unknown)}; valid: {', '.join(s.name for s in all_steps)}")
    by_name = {s.name: s for s in all_steps}
    order = [by_name[n] for n in dict.fromkeys(filter(None, args.only.split(",")))] if only else all_steps
    chosen = [s for s in order if s.name not in skip]  # --only's order, so a short loan runs what matters first
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget_s
    summary = ["# GPU measurements", "", f"budget {args.budget_s:.0f} s{' (dry run)' if args.dry_run else ''}", "",
               "| step | outcome | s |", "|---|---|---|"]
    details = []
    for step in chosen:
        left = deadline - time.perf_counter()
        if left < step.min_s:
            summary.append(f"| {step.name} | not started: {left:.0f} s left, needs {step.min_s} | |")
            continue
        print(f"== {step.name} (limit {min(step.cap_s, left):.0f} s)", flush=True)
        outcome, seconds = run_step(step, out, min(step.cap_s, left), args.dry_run)
        print(f"   {outcome} in {seconds:.0f} s", flush=True)
        summary.append(f"| {step.name} | {outcome} | {seconds:.0f} |")
        details += ["", f"## {step.name}", "", "```", tail(out / f"{step.name}.txt", 25), "```"]
        (out / "summary.md").write_text("\n".join(summary + details) + "\n")  # kept current if the call is cut off
    (out / "summary.md").write_text("\n".join(summary + details) + "\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
