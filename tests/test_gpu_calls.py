"""The GPU calls' CPU side: the wheels' lock covers what lmzoo needs, the plan fits its calls, the measuring scripts
keep their rows when cut off, and a stopped call still leaves its summary and archive (docs/devices.md, "A GPU call").
The whole rehearsal, offline in a fresh Python 3.12 venv, is ``bash scripts/gpu_rehearsal.sh`` (not a test: it
downloads the wheels and jax)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gpu_all  # noqa: E402
from jsonrows import JsonRows  # noqa: E402

GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_machine": "x86_64", "implementation_name": "cpython", "platform_system": "Linux"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock() -> tuple[dict[str, str], dict[str, str]]:
    """scripts/gpu_wheels.txt: the wheels it names, and the base (jax, flax and what they bring) it assumes."""
    wheels, base = {}, {}
    for line in (REPO / "scripts" / "gpu_wheels.txt").read_text().splitlines():
        if line.startswith("# base: "):
            base = dict(pin.split("==") for pin in line.removeprefix("# base: ").split())
        elif re.match(r"[A-Za-z]", line):
            name, version = line.split("#")[0].strip().split("==")
            wheels[name] = version
    return {canonical(k): v for k, v in wheels.items()}, {canonical(k): v for k, v in base.items()}


def applies(requirement: Requirement, extras: tuple[str, ...] = ("",)) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({**GPU_PYTHON, "extra": extra}) for extra in extras)


def test_the_lock_pins_every_requirement_of_lmzoo_kernels_for_python_3_12():
    wheels, base = lock()
    assert not set(wheels) & set(base), "a package both carried and assumed"
    assert {"jax", "flax", "jaxlib"} <= set(base)
    assert {"jax-linear-attention", "hydra-core", "setuptools"} <= set(wheels)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["kernels"]]
    wanted += [Requirement(r) for r in ("pytest", "pytest-timeout", "pytest-xdist")]
    pinned = {**base, **wheels}
    missing = [str(r) for r in wanted if applies(r) and canonical(r.name) not in pinned]
    assert not missing, f"not in scripts/gpu_wheels.txt: {missing} (bash scripts/gpu_wheels.sh --lock)"
    refused = [f"{r} (pinned {pinned[canonical(r.name)]})" for r in wanted
               if applies(r) and not r.specifier.contains(pinned[canonical(r.name)], prereleases=True)]
    assert not refused, refused


def test_every_locked_package_installed_here_at_its_pin_has_its_own_requirements_locked():
    """The lock's closure, read from the metadata of the packages this environment holds at the very versions the lock
    pins (a package at another version here may need other things, so it is not read)."""
    wheels, base = lock()
    pinned, read = {**base, **wheels}, 0
    unlocked = []
    for name, version in pinned.items():
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if distribution.version != version:
            continue
        read += 1
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if applies(requirement) and canonical(requirement.name) not in pinned:
                unlocked.append(f"{name}=={version} needs {requirement}")
    assert read >= 10, "too few locked packages installed here at their pins to check anything"
    assert not unlocked, unlocked


def test_the_plan_starts_each_call_with_its_install_and_fits_its_minimums_in_the_budget():
    by_name = {step.name: step for step in gpu_all.steps()}
    assert len(by_name) == len(gpu_all.steps()), "two steps share a name"
    for call, names in gpu_all.CALLS.items():
        assert names[:2] == ["install", "env"], call
        assert set(names) <= set(by_name), call
        assert sum(by_name[n].min_s for n in names) <= gpu_all.BUDGET_S, f"call {call} cannot start its steps"
    planned = {n for names in gpu_all.CALLS.values() for n in names}
    for wanted in ("ops_providers", "jla_kernel_tests", "loop", "seeds", "throughput_documents", "torch_gpt_2048",
                   "e2e_2048_a", "e2e_2048_b", "memory", "e2e_8192", "mqar_zoology"):
        assert wanted in planned
    assert gpu_all.PROVIDER_OPS.split(",")[0].startswith("jla_"), "jla's own rows, the baseline, come first"
    # every default variant is measured at T = 2048 beside softmax of the same call
    at_2048 = gpu_all.RECURRENT_A + gpu_all.RECURRENT_B
    assert sorted(["softmax", *at_2048]) == sorted(gpu_all.DEFAULT_VARIANTS)


def test_benchmark_measures_ops_in_the_order_given():
    import benchmark

    chosen = benchmark.chosen_cases(["jla_gla/own", "gla/auto", "gla/chunk64", "simple_gla/"])
    assert chosen[:3] == ["jla_gla/own", "gla/auto", "gla/chunk64"]
    assert all(name.startswith("simple_gla/") for name in chosen[3:]) and len(chosen) > 4
    assert benchmark.chosen_cases([]) == list(benchmark.CASES)


def test_json_rows_are_on_disk_after_every_row(tmp_path):
    path = tmp_path / "rows.json"
    rows = JsonRows(path, {"device": "cpu"})
    assert json.loads(path.read_text()) == {"meta": {"device": "cpu"}, "rows": [], "complete": False}
    rows.add({"op": "a"})
    assert json.loads(path.read_text())["rows"] == [{"op": "a"}]
    rows.close()
    assert json.loads(path.read_text())["complete"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]  # no partial file left behind


@pytest.mark.slow
def test_a_stopped_call_kills_its_step_and_keeps_its_summary_and_archive(tmp_path):
    out, packed = tmp_path / "out", tmp_path / "call.tar.gz"
    proc = subprocess.Popen([sys.executable, "scripts/gpu_all.py", "--only", "env,loop", "--dry-run", "--out", str(out),
                             "--archive", str(packed)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "loop.txt").exists():  # made when the loop step starts, after env
        assert time.time() < deadline and proc.poll() is None, "the loop step never started"
        time.sleep(0.1)
    time.sleep(2)  # the loop benchmark is now importing JAX or compiling
    with tarfile.open(packed) as tar:  # kept current after every step: a SIGKILL now would still bring env back
        assert "out/env.txt" in tar.getnames()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    summary = (out / "summary.md").read_text()
    assert "| env | ok |" in summary and "interrupted" in summary
    with tarfile.open(packed) as tar:
        assert "out/summary.md" in tar.getnames() and "out/env.txt" in tar.getnames()
    time.sleep(0.5)
    survivors = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(out) in _cmdline(pid)]
    assert not survivors, "the stopped step's processes outlived the call"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_the_pytorch_peer_times_lmzoo_softmax_model_where_torch_is_installed(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "scripts/throughput_torch.py", "--d-model", "32", "--layers", "2", "--heads",
                           "2", "--lengths", "16,24", "--batch-tokens", "48", "--steps", "1", "--no-compile", "--json",
                           str(tmp_path / "rows.json")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "rows.json").read_text())
    assert record["complete"] and [row["T"] for row in record["rows"]] == [16, 24]
    assert all(row["tokens_per_s"] > 0 and row["batch"] == 48 // row["T"] for row in record["rows"])
