"""What every fla check shares: loading fla's naive files by path and moving arrays between frameworks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np


def fla_naive(op: str, file: str = "naive.py"):
    """fla's ``fla/ops/<op>/<file>`` as a module, without importing the Triton kernels beside it."""
    root = Path(importlib.util.find_spec("fla").submodule_search_locations[0])
    path = root / "ops" / op / file
    spec = importlib.util.spec_from_file_location(f"fla_naive_{op}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def to_torch(x, dtype=None):
    import torch

    return torch.from_numpy(np.asarray(x, dtype=np.float64 if dtype is None else dtype).copy())


def to_numpy(x) -> np.ndarray:
    return x.detach().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)


def max_diff(ours, theirs, *, atol: float, what: str) -> float:
    """The largest absolute difference, checked against ``atol``."""
    diff = float(np.max(np.abs(to_numpy(ours) - to_numpy(theirs))))
    assert diff <= atol, f"{what}: max |diff| {diff:.2e} > {atol:.0e}"
    return diff
