"""The measuring scripts run end to end at toy sizes and write the figures they print."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from lmzoo.cli import compose_and_validate


def run_script(name: str, *args: str) -> str:
    result = subprocess.run([sys.executable, f"scripts/{name}", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.slow
def test_benchmark_reports_rates_and_skips_what_cannot_run(tmp_path):
    ops = "gla/pallas,simple_gla/chunk64,selective_scan/scan,softmax/cudnn"
    out = run_script("benchmark.py", "--ops", ops, "--shapes", "1x40x2x16", "--repeats", "1", "--copy-mb", "16",
                     "--json", str(tmp_path / "rows.json"))
    assert "copy bandwidth" in out and "softmax/cudnn" in out and "skipped" in out
    rows = {row["op"]: row for row in json.loads((tmp_path / "rows.json").read_text())["rows"]}
    assert set(rows) == {"softmax/xla", "gla/pallas", "simple_gla/chunk64", "selective_scan/scan"}
    assert all(row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 for row in rows.values())
    assert rows["gla/pallas"]["fwd_bwd_tflops"] > 0 and rows["selective_scan/scan"]["fwd_bwd_gbps"] > 0


@pytest.mark.slow
def test_throughput_runs_variants_with_their_own_overrides(tmp_path):
    two_layers = "model.n_layers=2"  # fewer to compile (the Pallas kernel is interpreted); two: the flops count layers
    gla_variant = f"gla attn.method=pallas attn.chunk_size=16 {two_layers}"
    out = run_script("throughput.py", "--model", "tiny", "--lengths", "32", "--batch-tokens", "64", "--steps", "1",
                     "--variants", f"softmax {two_layers}", gla_variant, "softmax attn.method=cudnn",
                     "--json", str(tmp_path / "rows.json"))
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [row["variant"] for row in rows] == [f"softmax {two_layers}", gla_variant]
    assert all(row["tokens_per_s"] > 0 and row["batch"] == 2 and row["memory_gib"] > 0 and row["mesh"] == "1x1x1"
               and row["compile_s"] > 0 for row in rows)
    assert "compile s" in out.splitlines()[1]  # the header names the column every row fills
    assert "gla attn.method=pallas" in out
    assert "softmax attn.method=cudnn" in out and "failed" in out  # no cuDNN on a CPU: one line, the rest still runs
    softmax, gla = rows
    layers, d_model = 2, 128  # model=tiny, two layers
    attention = 6 * layers * 32 * d_model  # causal scores and values at T=32, forward and backward
    want = softmax["tokens_per_s"] * (6 * softmax["params"] + attention) / 1e12
    assert softmax["model_tflops"] == pytest.approx(want, rel=1e-12)
    mixing = layers * 3 * 4 * (4 * 16 * 32 + (16 + 32) * 16)  # 4 heads, keys 16 and values 32 wide, chunks of 16
    assert gla["model_tflops"] == pytest.approx(gla["tokens_per_s"] * (6 * gla["params"] + mixing) / 1e12, rel=1e-12)


@pytest.mark.slow
def test_tune_pallas_times_every_kernel_setting(tmp_path):
    out = run_script("tune_pallas.py", "--smoke", "--ops", "simple_gla", "--json", str(tmp_path / "rows.json"))
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    kernels = {"gla_states", "gla_state_grads", "gla_outputs", "gla_key_grads", "gla_value_grads", "delta_states",
               "delta_state_grads"}
    assert {row["kernel"] for row in rows} == kernels and all(row["ms"] > 0 for row in rows)
    assert len(rows) == 2 * len(kernels)  # the defaults and the one smoke setting, per kernel
    assert "best per kernel" in out


@pytest.mark.slow
def test_plot_metrics_writes_next_to_the_runs(tmp_path):
    sweep = tmp_path / "sweep"
    for name in ("softmax", "gla"):
        (sweep / name).mkdir(parents=True)
        rows = [{"step": 10, "bpb": 4.0}, {"step": 20, "bpb": 3.5, "val_bpb": 3.6}]
        (sweep / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_script("plot_metrics.py", str(sweep / "softmax"))
    assert (sweep / "softmax" / "curves.png").stat().st_size > 0 and str(sweep / "softmax" / "curves.png") in out
    run_script("plot_metrics.py", str(sweep / "softmax"), str(sweep / "gla"))
    assert (sweep / "curves.png").stat().st_size > 0  # several runs: the directory they share


@pytest.mark.slow
def test_benchmark_decode_times_prefill_and_steps_and_sizes_the_state(tmp_path):
    out = run_script("benchmark_decode.py", "--models", "tiny", "--lengths", "8,24,64", "--max-length", "24",
                     "--new-tokens", "2", "--variants", "softmax", "gla", "softmax attn.method=cudnn",
                     "--out", str(tmp_path / "decode.png"), "--json", str(tmp_path / "rows.json"))
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [(row["variant"], row["T"]) for row in rows] == [("softmax", 8), ("softmax", 24), ("gla", 8), ("gla", 24)]
    assert all(row["prefill_ms"] > 0 and row["ms_per_token"] > 0 for row in rows)
    softmax, gla = rows[:2], rows[2:]
    layers, d_model = 4, 128  # model=tiny: per layer float32 keys and values of T + 2 tokens, their int32 positions, t
    per_layer = lambda t: 2 * (t + 2) * d_model * 4 + (t + 2) * 4 + 4
    assert [row["state_mib"] for row in softmax] == [layers * per_layer(t) / 2**20 for t in (8, 24)]
    assert gla[0]["state_mib"] == gla[1]["state_mib"]  # a recurrent state does not grow with the context
    assert "softmax attn.method=cudnn" in out and "failed" in out
    assert (tmp_path / "decode.png").stat().st_size > 0


@pytest.mark.slow
def test_benchmark_cpu_step_times_the_step_its_pieces_and_the_trainer(tmp_path):
    out = run_script("benchmark_cpu_step.py", "--smoke", "--rounds", "1", "--steps", "1", "--breakdown", "1",
                     "--trainer-steps", "4", "--json", str(tmp_path / "rows.json"))
    (row,) = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert row["variant"] == "softmax" and row["params"] == 41_216 and row["lmzoo_ms"] > 0
    assert set(row["phases"]) == {"fwd", "fwd+bwd", "opt"}
    assert set(row["components"]) == {"mixer", "mlp", "norm", "head+loss"}
    assert row["trainer_ms"] > 0
    assert ("ratio" in row) != ("PyTorch half skipped" in out)  # CI has no torch: the lmzoo half runs alone


def test_slurm_example_command_is_a_valid_config(tmp_path):
    """The overrides scripts/slurm_train.sbatch passes to every process compose and validate."""
    text = (REPO / "scripts" / "slurm_train.sbatch").read_text()
    command = " ".join(line.strip().rstrip("\\") for line in text[text.index("srun "):].splitlines())
    overrides = [arg for arg in shlex.split(command.split("lmzoo.train", 1)[1]) if "=" in arg and "$" not in arg]
    assert "train.distributed=true" in overrides and "train.mesh.fsdp=8" in overrides
    cfg = compose_and_validate([*overrides, f"run_dir={tmp_path}"])
    assert cfg.train.mesh.fsdp == 8 and cfg.model.d_model == 1024


@pytest.mark.slow
def test_fla_check_says_what_to_install_where_torch_or_fla_is_missing():
    import importlib.util

    if importlib.util.find_spec("torch") and importlib.util.find_spec("fla"):
        pytest.skip("torch and fla-core are installed here: scripts/fla_check.py runs the comparisons")
    proc = subprocess.run([sys.executable, "scripts/fla_check.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "skipped" in proc.stdout and "pip install" in proc.stdout


@pytest.mark.slow
def test_benchmark_loop_times_the_trainer_against_its_bare_step(tmp_path):
    out = run_script("benchmark_loop.py", "--models", "mqar", "--steps", "2", "--repeats", "1",
                     "--json", str(tmp_path / "rows.json"))
    (row,) = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert row["bare_ms"] > 0 and row["loop_ms"] > 0 and "loop/bare" in out


@pytest.mark.slow
def test_gpu_all_runs_chosen_steps_in_order_within_a_budget_and_names_bad_steps(tmp_path):
    out = run_script("gpu_all.py", "--dry-run", "--out", str(tmp_path), "--only", "env,kernel_tests",
                     "--budget-s", "90")  # env imports torch and fla where installed: 20 s on a busy machine
    summary = (tmp_path / "summary.md").read_text()
    assert "| env | ok |" in summary and "| kernel_tests | not started" in summary  # needs 120 s, under 90 were left
    assert "jax" in (tmp_path / "env.txt").read_text() and "== env" in out
    bad = subprocess.run([sys.executable, "scripts/gpu_all.py", "--only", "nope"], cwd=REPO, capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "unknown step(s) ['nope']" in bad.stderr and "kernel_tests" in bad.stderr


@pytest.mark.slow
def test_cpu_recipe_keeps_each_runs_record_and_skips_the_kept_runs(tmp_path):
    env = {"VARIANTS": "softmax", "SEEDS": "0", "STEPS": "2", "SEQ_LEN": "16", "OUT": str(tmp_path / "out"),
           "KEEP": str(tmp_path / "keep"), "EVAL_EXTRA": "eval.tokens=256 eval.probe_batch=0",
           "EXTRA": "model.n_layers=1 model.d_model=32 train.batch_size=2 train.eval_tokens=128 train.probe_batch=0"}

    def recipe():
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        result = subprocess.run(["bash", "scripts/cpu_recipe.sh"], cwd=REPO, capture_output=True, text=True,
                                timeout=300, env={**os.environ, **env, "PATH": path})
        assert result.returncode == 0, result.stderr[-2000:]

    recipe()
    kept = tmp_path / "keep" / "softmax-s0"
    assert (kept / "eval" / "default" / "results.json").is_file() and (kept / "config.yaml").is_file()
    assert not (kept / "checkpoints").exists() and not (kept / "tb").exists()
    assert sorted(p.name for p in (tmp_path / "keep").iterdir() if p.is_dir()) == ["softmax-s0"]  # nothing partial left
    assert (tmp_path / "out" / "softmax-s0" / "checkpoints").is_dir()
    shutil.rmtree(tmp_path / "out")
    (tmp_path / "keep" / "comparison.md").unlink()
    recipe()  # the kept run is not trained again; the comparison reads the records
    assert not (tmp_path / "out").exists()
    assert "softmax-s0" in (tmp_path / "keep" / "comparison.md").read_text()
