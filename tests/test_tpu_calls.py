"""The TPU measurements' CPU side (docs/devices.md, "On a TPU"): every row scripts/tpu_all.py asks for exists, every
variant it trains composes into a valid config at the model it names, and its dry run runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from lmzoo.cli import compose_and_validate

sys.path.insert(0, str(REPO / "scripts"))
import benchmark  # noqa: E402
import tpu_all  # noqa: E402


def test_every_kernel_row_is_a_benchmark_case():
    for prefix in tpu_all.KERNEL_OPS.split(","):
        assert benchmark.chosen_cases([prefix]) == [prefix], prefix


@pytest.mark.parametrize("model, wide", [("small", tpu_all.WIDE), ("tiny", tpu_all.DRY_WIDE)])
def test_every_trained_variant_is_a_valid_config(model, wide):
    for entry in tpu_all.e2e_variants(wide):
        variant, *overrides = entry.split()
        compose_and_validate([f"+attn={variant}", f"model={model}", *overrides])


def test_the_plan_names_steps_that_exist():
    names = {step.name for step in tpu_all.steps()}
    assert set(tpu_all.PLAN) <= names


@pytest.mark.slow
def test_the_kernel_table_dry_run_ends_well(tmp_path):
    """The kernel step at tiny shapes (deltanet-tpu's rows skip: its kernels take D = 128), with the env step."""
    proc = subprocess.run([sys.executable, "scripts/tpu_all.py", "--dry-run", "--only", "env,ops_tpu", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=900)
    summary = (tmp_path / "summary.md").read_text()
    assert proc.returncode == 0, summary
    assert "| env | ok |" in summary and "| ops_tpu | ok |" in summary
    rows = (tmp_path / "ops_tpu.txt").read_text()
    assert "gated_delta_rule/auto" in rows and "failed" not in rows, rows
