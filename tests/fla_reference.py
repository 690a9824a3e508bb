"""The peer's reference forms, for tests that check an lmzoo op against them.

flash-linear-attention ships a readable PyTorch reference of most of its ops (``fla/ops/<op>/naive.py``), but its
package imports its Triton kernels on import, and a CPU machine has no Triton. ``fla-core`` installs the files
without Triton; each reference is loaded here by its path, alone, so only PyTorch and einops run. A test that
needs one skips when torch or fla-core is missing (``pip install "torch==2.13.0" fla-core==0.6.0``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

FLA_VERSION = "0.6.0"  # the release whose references these tests were written against


def fla_ops_folder() -> Path:
    spec = importlib.util.find_spec("fla")  # finds the package without running its __init__ (Triton)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install fla-core==0.6.0): no peer reference")
    return Path(next(iter(spec.submodule_search_locations))) / "ops"


def fla_reference(op: str, file: str = "naive.py", siblings: tuple[str, ...] = ()) -> ModuleType:
    """``fla/ops/<op>/<file>`` as a module of its own; skips without torch or fla-core.

    ``siblings``: files of the same folder that the reference imports by their package path
    (``from fla.ops.<op>.<name> import ...``), themselves pure PyTorch. Each is loaded by its path too and
    stands in for that import while the reference loads (``sys.modules`` is restored after), so fla's package,
    which imports Triton, never runs."""
    pytest.importorskip("torch")
    folder = fla_ops_folder() / op
    stand_ins = {f"fla.ops.{op}.{Path(name).stem}": load_by_path(folder / name) for name in siblings}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        return load_by_path(folder / file)
    finally:
        for name, module in saved.items():
            if module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = module


def load_by_path(path: Path) -> ModuleType:
    """The module of one file of fla's, run alone; skips where the file is missing or needs what is not here."""
    if not path.is_file():
        pytest.skip(f"this fla-core has no {path.parent.name}/{path.name}")
    spec = importlib.util.spec_from_file_location(f"fla_reference_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as e:  # a reference that imports fla's kernels cannot run without Triton
        pytest.skip(f"fla's {path.parent.name}/{path.name} needs {e.name}")
    return module


def to_torch(x, requires_grad: bool = False):
    """A float64-free copy of ``x`` as a torch tensor (float32 unless ``x`` is another float type)."""
    import torch

    t = torch.from_numpy(np.array(x, dtype=np.float32))
    return t.requires_grad_(requires_grad)


def to_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy()
