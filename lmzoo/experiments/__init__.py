"""The seed articles' claims as experiments: ``python -m lmzoo.experiments [name] [key=value ...]``.

An experiment is a module of this package that defines

- ``CLAIM``: the claim in one sentence, and ``SEED``: the article it comes from (``../seeds``' number);
- ``Settings``: a dataclass of the full run's settings, each overridable as ``key=value``;
  ``QUICK``: the overrides that shrink it to about a minute on a CPU (``quick=true``);
- ``run(settings, out_dir) -> Outcome``: measures, plots into ``out_dir`` and judges.

Adding one is that module plus its name in ``MODULES``. ``run_experiment`` writes the outcome to
``<out_dir>/<name>/verdict.json`` (layout in its docstring). Experiments that train go through
the normal trainer and run directories under ``<out_dir>/<name>/runs``, so a rerun with the same
``out_dir`` resumes them instead of starting over.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from omegaconf import OmegaConf

from lmzoo.schema import ConfigError, one_of, to_dataclass

MODULES = ("sparsity_closed_forms", "sparsity_vs_length", "sparsity_predicted", "decode_cache", "logn_entropy",
           "position_extrapolation", "mqar_state_size")
VERDICTS = ("reproduced", "partly", "not reproduced")


@dataclass
class Outcome:
    verdict: str  # one of VERDICTS
    evidence: dict  # the numbers the verdict rests on, with their intervals
    figures: list[str]  # PNG paths
    runs: list[str] = field(default_factory=list)  # run directories the experiment trained


def load(name: str) -> ModuleType:
    one_of("experiment", name, MODULES)
    return importlib.import_module(f"lmzoo.experiments.{name}")


def settings_for(module: ModuleType, overrides: list[str], *, quick: bool):
    """The module's Settings with QUICK (when asked) and then ``key=value`` overrides applied."""
    try:
        given = OmegaConf.from_dotlist(overrides)
    except Exception as error:  # a malformed override: say which, in one line
        raise ConfigError(f"cannot read the overrides {overrides}: {str(error).splitlines()[0]}") from None
    quick_values = OmegaConf.create(module.QUICK if quick else {})
    return to_dataclass(module.Settings, OmegaConf.merge(quick_values, given))


def vote(agreeing: int, total: int) -> str:
    """All checks agree: reproduced; at least half: partly; fewer: not reproduced."""
    if total and agreeing == total:
        return "reproduced"
    return "partly" if 2 * agreeing >= total > 0 else "not reproduced"


def _plain(value):
    """NumPy scalars in the evidence as JSON numbers and booleans."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} in an experiment's record is not JSON")


def run_experiment(name: str, out_dir: Path, *, quick: bool = False, overrides: list[str] = ()) -> dict:
    """Run one experiment and write ``<out_dir>/<name>/verdict.json``:

    ``{"name", "claim", "seed_article", "verdict", "evidence", "figures", "runs", "settings",
    "quick", "seconds"}``; figure and run paths are relative to that folder.
    """
    module = load(name)
    settings = settings_for(module, list(overrides), quick=quick)
    folder = Path(out_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    outcome = module.run(settings, folder)
    one_of(f"{name}'s verdict", outcome.verdict, VERDICTS)
    relative = lambda paths: [str(Path(p).relative_to(folder)) for p in paths]  # noqa: E731
    record = {
        "name": name, "claim": module.CLAIM, "seed_article": module.SEED, "verdict": outcome.verdict,
        "evidence": outcome.evidence, "figures": relative(outcome.figures), "runs": relative(outcome.runs),
        "settings": dataclasses.asdict(settings), "quick": quick, "seconds": round(time.perf_counter() - start, 1),
    }
    (folder / "verdict.json").write_text(json.dumps(record, indent=2, default=_plain) + "\n")
    return record
