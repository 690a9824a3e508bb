"""Every GPU measurement of docs/benchmarks.md, planned as calls of at most 9 minutes, each one command.

    python3 scripts/gpu_all.py --call 1 --archive $OUT/gpu_call1.tar.gz  # on the GPU machine: install, then call 1
    python scripts/gpu_all.py --call 1 --dry-run                         # the same steps at tiny shapes, anywhere
    python scripts/gpu_all.py --calls                                    # the plan: each call's steps and caps
    python scripts/gpu_all.py --only ops_xla,fla --budget-s 300          # chosen steps, in this order
    python scripts/gpu_all.py --list                                     # every step

A call is what one command on a lent GPU machine does, install included (the machine starts bare, with no network):
``install`` runs scripts/gpu_install.py over the wheels carried in ``wheels/`` (scripts/gpu_wheels.sh), ``env`` records
the device and versions, and the call's steps follow, most decisive first (``CALLS`` below). Each step runs as its own
process (its own process group) under its own limit, the smaller of its cap and the budget left; a step whose minimum no
longer fits is not started, so however short the loan, every step that ran leaves its raw output in ``<out>/<step>.txt``
and the JSON rows its script writes after every row, and ``<out>/summary.md`` (current after every step) lists each
step's outcome and seconds. ``--archive`` packs the folder into one ``.tar.gz`` after every step and at the end: the one
file a GPU call brings back, kept current so that even a call killed outright (SIGKILL, which no handler sees) brings
back every step finished before it. On SIGTERM or SIGINT the running step's whole process group is killed, the summary
says "interrupted", and the archive is still written. A step that needs a module this Python lacks (``torch`` for the
PyTorch peer) is reported as skipped. ``--dry-run`` runs the same steps at tiny shapes, with the full lists of ops and
variants (Pallas in interpret mode on a CPU): scripts/gpu_rehearsal.sh runs every call that way, offline, in a fresh
Python 3.12 venv holding only jax and flax, before a GPU is asked for. The exit status is 0 when every step that started
ended well.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import gpu_install  # scripts/gpu_install.py: the install step, standard library only

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
SHAPES = "4x2048x16x128,1x8192x32x128,8x1024x16x64"  # (B, T, H, D): the shapes fla's kernels are compared at
TINY_OP_SHAPE = "1x67x2x16"  # an odd length: the dry run meets the kernels' padding paths too
XLA_OPS = ("softmax/xla,softmax/cudnn,fox/xla,gla/chunk64,simple_gla/chunk64,ssd/chunk64,delta_rule/chunk64,"
           "gated_delta_rule/chunk64,selective_scan/scan")
PALLAS_OPS = ("gla/pallas", "simple_gla/pallas", "ssd/pallas", "selective_scan/pallas", "delta_rule/pallas",
              "gated_delta_rule/pallas")
FLA_OPS = "chunk_gla,chunk_gated_delta_rule,chunk_delta_rule,chunk_simple_gla"  # mamba-ssm: not installable there
# The kernel table, in the order a cut-off call should have measured it: jax-linear-attention's own call (the
# baseline each mapped op is held to), then lmzoo's default form (auto), lmzoo's jla form, and lmzoo's own forms.
PROVIDER_OPS = ",".join([
    "jla_gla/own", "jla_simple_gla/own", "jla_gated_deltanet/own", "jla_deltanet/own", "jla_kda/own", "jla_mamba3/own",
    "gla/auto", "simple_gla/auto", "gated_delta_rule/auto", "delta_rule/auto", "channel_delta_rule/auto", "mamba3/auto",
    "gla/jla", "simple_gla/jla", "gated_delta_rule/jla", "mamba3/jla",
    "gla/chunk64", "simple_gla/pallas", "gated_delta_rule/chunk64", "mamba3/chunk64",
])
# every variant at its default form (auto: jla's kernels on Hopper, cuDNN for softmax), split over two calls
RECURRENT_A = ["gla", "gated_deltanet", "mamba2", "kda"]
RECURRENT_B = ["rwkv7", "retnet", "deltaproduct", "gdn2", "mamba3"]
DEFAULT_VARIANTS = ["softmax", *RECURRENT_A, *RECURRENT_B]
THROUGHPUT_VARIANTS = ["softmax", "softmax attn.method=cudnn", "gla attn.method=chunk", "gla attn.method=pallas",
                       "mamba2", "gated_deltanet attn.method=chunk", "mamba2 attn.method=pallas",
                       "gated_deltanet attn.method=pallas"]  # in the order a short loan should measure them
MEMORY_VARIANTS = ["softmax", "gla attn.method=chunk", "gla attn.method=chunk_recompute",
                   "gated_deltanet attn.method=chunk_recompute", "gla attn.method=chunk model.remat=mixer",
                   # the mixers' own short convs and float32 norms recomputed, on the default form (jla's kernels)
                   "gated_deltanet model.remat=light", "mamba2 model.remat=light"]
DOCUMENT_VARIANTS = ["softmax", "softmax attn.method=xla", "gla"]
KERNEL_TESTS = ["tests/ops/test_pallas_gla.py", "tests/ops/test_pallas_ssm.py", "tests/ops/test_delta_rule.py"]
MQAR_TINY = ["variants=[softmax]", "widths=[16]", "pairs=[4]", "lrs=[3e-3,1e-2]", "seeds=[0,1]", "steps=16",
             "seq_len=16", "eval_tokens=256"]  # the zoology grid's path at tiny sizes (tests/experiments)
TESTS_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # several test workers share the one GPU

# The plan: one command each, at most 9 minutes with its install (BUDGET_S), most decisive first.
CALLS = {
    "1": ["install", "env", "ops_providers", "jla_kernel_tests", "loop", "seeds", "throughput_documents"],
    "2": ["install", "env", "e2e_softmax_2048", "torch_gpt_2048", "e2e_2048_a"],
    "3": ["install", "env", "e2e_softmax_2048", "e2e_2048_b", "memory"],
    "4": ["install", "env", "e2e_softmax_8192", "torch_gpt_8192", "e2e_8192"],
    "5": ["install", "env", "mqar_zoology"],
}
BUDGET_S = 510  # a call's steps, install included: a 9-minute command with half a minute to pack and return
DRY_SLOWER = 3  # a dry run's caps and budget: a shared 2-core CPU compiles slower than the GPU machine's 16 cores


@dataclass
class Step:
    """One command: its argv at full size and at --dry-run size, its cap and the least time worth starting it with."""
    name: str
    full: list[str]
    dry: list[str]
    cap_s: int
    min_s: int = 30
    env: dict = field(default_factory=dict)
    needs: str = ""  # a module this Python must have (else the step is reported as skipped)


def ops_step(name: str, ops: str, cap_s: int, shapes: str = SHAPES, min_s: int = 60) -> Step:
    """A benchmark.py row set at the GPU shapes in bfloat16 (tiny float32 shapes in a dry run)."""
    json_out = ["--json", "{out}/" + name + ".json"]
    return Step(name, [PY, "scripts/benchmark.py", "--shapes", shapes, "--dtype", "bfloat16", "--ops", ops,
                       "--repeats", "20", *json_out],
                [PY, "scripts/benchmark.py", "--shapes", TINY_OP_SHAPE, "--ops", ops, "--repeats", "2",
                 "--copy-mb", "16", *json_out], cap_s, min_s=min_s)


def throughput_step(name: str, variants: list[str], cap_s: int, *, length: int = 2048, extra: tuple = (),
                    min_s: int = 90) -> Step:
    """scripts/throughput.py at model=small, 65,536 tokens a step (model=tiny, T = 64 in a dry run)."""
    json_out = ["--json", "{out}/" + name + ".json"]
    steps = [] if "--steps" in extra else ["--steps", "2"]
    return Step(name, [PY, "scripts/throughput.py", "--model", "small", "--lengths", str(length), "--batch-tokens",
                       "65536", *extra, "--variants", *variants, *json_out],
                [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "128", *steps,
                 *extra, "--variants", *variants, *json_out], cap_s, min_s=min_s)


def torch_gpt_step(length: int) -> Step:
    name = f"torch_gpt_{length}"
    json_out = ["--json", "{out}/" + name + ".json"]
    return Step(name, [PY, "scripts/throughput_torch.py", "--lengths", str(length), "--batch-tokens", "65536",
                       *json_out],
                [PY, "scripts/throughput_torch.py", "--d-model", "64", "--layers", "2", "--heads", "2", "--lengths",
                 "64", "--batch-tokens", "128", "--steps", "2", *json_out], 150, min_s=60, needs="torch")


def pytest_argv(*args: str) -> list[str]:
    return [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *args]


def steps() -> list[Step]:
    versions = ("import jax, jaxlib, flax, optax; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', "
                "flax.__version__, 'optax', optax.__version__); print(jax.devices())\n"
                "for name in ('jla', 'triton', 'torch', 'fla', 'mamba_ssm'):\n"
                "    try: print(name, getattr(__import__(name), '__version__', 'installed'))\n"
                "    except Exception as e: print(name, 'unavailable:', type(e).__name__)")
    env_cmd = [PY, "-c", versions]
    install = [PY, "scripts/gpu_install.py"]
    mqar = [PY, "-m", "lmzoo.experiments", "mqar_state_size", "scale=zoology", "out_dir={out}/experiments"]
    return [
        Step("install", install, install, 150, min_s=20),
        Step("env", ["bash", "-c", "nvidia-smi; nvidia-smi -q -d CLOCK | head -30; " + shlex.join(env_cmd)],
             env_cmd, 60, min_s=5),
        ops_step("ops_providers", PROVIDER_OPS, 240, shapes="4x2048x16x128"),
        # the jla mappings' gpu-marked tests: Mosaic kernels (and jla's attention kernel) against lmzoo's references
        Step("jla_kernel_tests", pytest_argv("-n", "4", "-m", "gpu", "tests/ops/test_kernels.py"),
             pytest_argv("-n", "0", "-m", "gpu", "tests/ops/test_kernels.py"), 120, min_s=45, env=TESTS_ENV),
        Step("loop", [PY, "scripts/benchmark_loop.py", "--json", "{out}/loop.json"],
             [PY, "scripts/benchmark_loop.py", "--steps", "2", "--repeats", "1", "--json", "{out}/loop.json"],
             90, min_s=45),
        # the default model's seeds as one vmapped step: 3 seeds within 1.5x one seed's time?
        Step("seeds", [PY, "scripts/benchmark_loop.py", "--models", "default", "--seeds", "1", "3", "8", "--steps",
                       "30", "--repeats", "2", "--json", "{out}/seeds.json"],
             [PY, "scripts/benchmark_loop.py", "--models", "default", "--seeds", "1", "3", "--steps", "2",
              "--repeats", "1", "--json", "{out}/seeds.json"], 120, min_s=45),
        # packed documents: softmax's auto (jla's Hopper kernel, the ids read per tile) against XLA's dense mask
        throughput_step("throughput_documents", DOCUMENT_VARIANTS, 180, extra=("--documents", "4")),
        # end to end at T = 2048, softmax first in each call: the ratios are to softmax measured in the same call
        throughput_step("e2e_softmax_2048", ["softmax"], 120, min_s=60),
        torch_gpt_step(2048),
        throughput_step("e2e_2048_a", RECURRENT_A, 420),
        throughput_step("e2e_2048_b", RECURRENT_B, 420),
        # what each form holds: GLA's chunk form with and without recomputing the mixer, remat=light, beside softmax
        throughput_step("memory", MEMORY_VARIANTS, 300, extra=("--steps", "0")),
        throughput_step("e2e_softmax_8192", ["softmax"], 150, length=8192, min_s=60),
        torch_gpt_step(8192),
        throughput_step("e2e_8192", RECURRENT_A + RECURRENT_B, 420, length=8192),
        Step("mqar_zoology", mqar, mqar + MQAR_TINY, 480, min_s=240),
        # the rest of docs/benchmarks.md's GPU figures (their own calls, with --only)
        Step("kernel_tests", pytest_argv("-n", "4", *KERNEL_TESTS),
             pytest_argv("-n", "2", "tests/ops/test_pallas_ssm.py", "-k", "gpu or lower"), 300, min_s=120,
             env=TESTS_ENV),
        ops_step("ops_xla", XLA_OPS, 240),
        *(ops_step("ops_" + op.replace("/", "_"), op, 150) for op in PALLAS_OPS),
        Step("fla", [PY, "scripts/benchmark_fla.py", "--shapes", SHAPES, "--ops", FLA_OPS, "--json", "{out}/fla.json"],
             [PY, "scripts/benchmark_fla.py", "--shapes", "1x64x2x16", "--ops", FLA_OPS, "--repeats", "2"],
             480, min_s=120, needs="fla"),
        throughput_step("throughput", THROUGHPUT_VARIANTS, 420, min_s=120),
        Step("throughput_medium", [PY, "scripts/throughput.py", "--model", "medium", "--lengths", "2048",
                                   "--batch-tokens", "65536", "--variants", *THROUGHPUT_VARIANTS,
                                   "--json", "{out}/throughput_medium.json"],
             [PY, "scripts/throughput.py", "--model", "tiny", "--lengths", "64", "--batch-tokens", "256", "--steps",
              "2", "--variants", "mamba2"], 480, min_s=120),
        Step("tune", [PY, "scripts/tune_pallas.py", "--budget-s", "240", "--json", "{out}/tune.json"],
             [PY, "scripts/tune_pallas.py", "--smoke", "--budget-s", "60"], 360, min_s=120),
        Step("all_tests", pytest_argv("-n", "8"), pytest_argv("--collect-only"), 1200, min_s=300, env=TESTS_ENV),
    ]


class Runner:
    """Runs steps in order within a deadline, keeping summary.md current; stops cleanly on SIGTERM/SIGINT."""

    def __init__(self, out: Path, budget_s: float, dry: bool, title: str, packed: Path | None = None):
        self.out, self.dry, self.deadline, self.packed = out, dry, time.perf_counter() + budget_s, packed
        self.summary = ["# GPU measurements", "", f"{title}; budget {budget_s:.0f} s{' (dry run)' if dry else ''}", "",
                        "| step | outcome | s |", "|---|---|---|"]
        self.details: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.failed = False
        self.env = dict(os.environ)

    def run(self, chosen: list[Step]) -> None:
        for step in chosen:
            left = self.deadline - time.perf_counter()
            if step.needs and importlib.util.find_spec(step.needs) is None:
                self.record(step, f"skipped: needs {step.needs}, which this Python lacks", None)
            elif left < step.min_s:
                self.record(step, f"not started: {left:.0f} s left, needs {step.min_s}", None)
            else:
                outcome, seconds = self.run_step(step, min(step.cap_s * (DRY_SLOWER if self.dry else 1), left))
                print(f"   {outcome} in {seconds:.0f} s", flush=True)
                self.failed |= outcome != "ok"
                self.record(step, outcome, seconds)
            if step.name == "install":
                self.pick_up_install()

    def run_step(self, step: Step, limit_s: float) -> tuple[str, float]:
        """Run one step with its output in ``<out>/<name>.txt``; its outcome and seconds."""
        argv = [a.replace("{out}", str(self.out)) for a in (step.dry if self.dry else step.full)]
        start = time.perf_counter()
        print(f"== {step.name} (limit {limit_s:.0f} s)", flush=True)
        with open(self.out / f"{step.name}.txt", "w") as log:
            log.write("$ " + shlex.join(argv) + "\n\n")
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                         env={**self.env, "PYTHONUNBUFFERED": "1", **step.env},
                                         start_new_session=True)  # its own group: pytest workers, compilers too
            try:
                code = self.proc.wait(timeout=limit_s)
                outcome = "ok" if code == 0 else f"exit {code}"
            except subprocess.TimeoutExpired:
                self.kill()
                outcome = f"stopped at its limit ({limit_s:.0f} s)"
                log.write(f"\n[stopped at its limit of {limit_s:.0f} s]\n")
            self.proc = None
        return outcome, time.perf_counter() - start

    def pick_up_install(self) -> None:
        """Where gpu_install.py had to install into a folder of its own, the later steps import from there."""
        path_file = gpu_install.TARGET / "PYTHONPATH"
        if path_file.exists():
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [path_file.read_text().strip(),
                                                                   self.env.get("PYTHONPATH")]))

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def record(self, step: Step, outcome: str, seconds: float | None) -> None:
        self.summary.append(f"| {step.name} | {outcome} | {'' if seconds is None else f'{seconds:.0f}'} |")
        log = self.out / f"{step.name}.txt"
        if seconds is not None and log.exists():
            self.details += ["", f"## {step.name}", "", "```", tail(log, 25), "```"]
        self.write()

    def write(self) -> None:
        (self.out / "summary.md").write_text("\n".join(self.summary + self.details) + "\n")
        if self.packed:
            archive(self.out, self.packed)


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def archive(out: Path, path: Path) -> None:
    """``out`` as ``path`` (.tar.gz), replaced whole: a call killed while packing keeps the previous archive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    os.replace(partial, path)


def choose(all_steps: list[Step], args) -> list[Step]:
    by_name = {s.name: s for s in all_steps}
    only = [n for n in args.only.split(",") if n]
    skip = {n for n in args.skip.split(",") if n}
    unknown = sorted((set(only) | skip) - set(by_name))
    if unknown:
        sys.exit(f"unknown step(s) {unknown}; valid: {', '.join(by_name)}")
    if args.call:
        order = CALLS[args.call]
    elif only:
        order = list(dict.fromkeys(only))  # --only's order, so a short loan runs what matters first
    else:
        order = list(by_name)
    return [by_name[n] for n in order if n not in skip]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--call", choices=sorted(CALLS), help="one call of the plan (--calls), install first")
    parser.add_argument("--only", default="", help="comma-separated step names, run in this order (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated step names to leave out")
    parser.add_argument("--out", help="folder for the raw outputs and summary.md (default gpu_out/call<N>, gpu_out)")
    parser.add_argument("--budget-s", type=float, help=f"stop starting steps after this long (default {BUDGET_S})")
    parser.add_argument("--archive",
                        help="write the output folder as this .tar.gz after every step (and when stopped)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes: check every command on any machine")
    parser.add_argument("--list", action="store_true", help="print every step with its cap and exit")
    parser.add_argument("--calls", action="store_true", help="print the plan, call by call, and exit")
    args = parser.parse_args()
    all_steps = steps()
    if args.list:
        print("\n".join(f"{s.name:<24} cap {s.cap_s:>5} s  least {s.min_s:>4} s" for s in all_steps))
        return
    if args.calls:
        caps = {s.name: s.cap_s for s in all_steps}
        for call, names in CALLS.items():
            print(f"call {call}: " + ", ".join(f"{n} ({caps[n]} s)" for n in names) + f"; budget {BUDGET_S} s")
        return
    if args.call and args.only:
        parser.error("--call runs its own steps; --only picks steps outside the plan: give one of them")
    chosen = choose(all_steps, args)
    out = Path(args.out or ("gpu_out" + (f"/call{args.call}" if args.call else ""))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    title = f"call {args.call}" if args.call else "steps " + ",".join(s.name for s in chosen)
    packed = Path(args.archive) if args.archive else None
    runner = Runner(out, args.budget_s or BUDGET_S * (DRY_SLOWER if args.dry_run else 1), args.dry_run, title, packed)

    def stop(signum, frame):  # the device's time limit, or ^C: keep what was measured
        runner.kill()
        runner.summary.append(f"| (interrupted by signal {signum}) | interrupted | |")
        runner.write()  # the archive too
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.run(chosen)
    runner.write()  # the summary and archive once more, even where no step was chosen
    print("\n".join(runner.summary))
    if packed:
        print(f"archive: {packed} ({packed.stat().st_size / 2**20:.1f} MiB)", flush=True)
    sys.exit(1 if runner.failed else 0)


if __name__ == "__main__":
    main()
