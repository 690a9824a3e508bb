"""The source articles' claims as experiments: ``python -m lmzoo.experiments [name] [key=value ...]``.

An experiment is a module of this package that defines

- ``CLAIM``: the claim in one sentence, and ``SOURCE``: the number of the source article it comes from (``ARTICLES``,
  docs/seeds.md), None for a claim beyond them;
- ``Settings``: a dataclass of the full run's settings, each overridable as ``key=value``;
  ``QUICK``: the overrides that shrink it to about a minute on a CPU (``quick=true``);
- ``run(settings, out_dir) -> Outcome``: measures and plots into ``out_dir``;
- ``judge(evidence, settings) -> list[Check]``: the checks its outcome rests on, its positive
  controls among them (``lmzoo.experiments.judging``), a pure function of the evidence, so a
  committed verdict.json can be re-judged without rerunning (``rejudge``) and tests can feed it
  evidence where the claim is false.

Adding one is that module plus its name in ``MODULES``. ``run_experiment`` writes the outcome to
``<out_dir>/<name>/verdict.json`` (layout in its docstring). Experiments that train go through
the normal trainer and run directories under ``<out_dir>/<name>/runs``, so a rerun with the same
``out_dir`` resumes them instead of starting over.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from lmzoo.cli import parse_settings
from lmzoo.config import ConfigError
from lmzoo.experiments.judging import OUTCOMES, RULES_VERSION, SMOKE, Check, familywise, outcome
from lmzoo.faults import first_line
from lmzoo.record.directory import atomic_write_text
from lmzoo.schema import one_of

MODULES = ("sparsity_closed_forms", "sparsity_vs_length", "sparsity_predicted", "decode_cache", "logn_entropy",
           "position_extrapolation", "mqar_state_size", "state_tracking", "state_passing", "mad", "mqar_zoology",
           "state_tracking_papers")
# The source articles (docs/seeds.md): number -> title. "Source", not "seed": a seed here is a random seed.
ARTICLES = {
    "000": "Can attention really concentrate? (PaperWeekly's copy of 001)",
    "001": "Can attention really concentrate? (Su Jianlin, 2023)",
    "002": "Linearizing attention (Shitanshu Bhushan, 2024)",
    "003": "Su Jianlin's posts on attention and length extrapolation (kexue.fm)",
}
VERDICTS = (*OUTCOMES, SMOKE)  # what verdict.json may say; SMOKE only for quick runs
SEED_GROUPS = ("auto", "true", "false")  # when an arm's seeds train as one group (lmzoo.experiments.runs)
_seed_groups = contextvars.ContextVar("seed_groups", default="auto")
_kept = contextvars.ContextVar("kept", default=None)  # the Keeping of the experiment running, or None


@contextmanager
def seeds_grouped(when: str):
    """Within the block, an arm's seeds train as one group ``when`` (one of ``SEED_GROUPS``)."""
    one_of("seed_groups", when, SEED_GROUPS)
    token = _seed_groups.set(when)
    try:
        yield
    finally:
        _seed_groups.reset(token)


def seed_groups_setting() -> str:
    return _seed_groups.get()


@dataclass
class Keeping:
    """Where an experiment's runs keep their records: each run directory's record in ``keep`` at the path the run
    has in ``folder``; ``skipped``: the configs of runs left untrained because their record is kept, by run
    directory (trained after all where a measurement asked of one is not kept)."""

    folder: Path
    keep: Path
    skipped: dict = field(default_factory=dict)


@contextmanager
def records_kept(folder: Path, keep: Path | None):
    """Within the block, each run the experiment in ``folder`` trains keeps its record (its settings and every
    measurement of it) in ``keep`` (``lmzoo.experiments.runs``); None keeps none."""
    token = _kept.set(None if keep is None else Keeping(Path(folder), Path(keep)))
    try:
        yield
    finally:
        _kept.reset(token)


def kept_setting() -> Keeping | None:
    return _kept.get()


@dataclass
class Outcome:
    evidence: dict  # the numbers the checks rest on, with their intervals
    figures: list[str]  # PNG paths
    runs: list[str] = field(default_factory=list)  # run directories the experiment trained


def load(name: str) -> ModuleType:
    one_of("experiment", name, MODULES)
    return importlib.import_module(f"lmzoo.experiments.{name}")


def settings_for(module: ModuleType, overrides: list[str], *, quick: bool):
    """The module's Settings with QUICK (when asked) and then ``key=value`` overrides applied (``lmzoo.cli``'s
    grammar: an unknown key or a value of the wrong type is one line naming it)."""
    quick_values = dict(module.QUICK) if quick else {}
    return parse_settings(module.Settings, list(overrides), "experiments", defaults=quick_values).settings


def at_scale(settings, scales: dict, *, by: str = "scale"):
    """``settings`` with the values of its scale (``scales[settings.scale]``: a named grid, such as a GPU's; or of
    the setting named ``by``, such as a protocol) in place of the settings left at their defaults; a ``key=value``
    given on the command line still wins."""
    name = getattr(settings, by)
    one_of(by, name, tuple(scales))
    defaults = type(settings)()
    chosen = {key: value for key, value in scales[name].items() if getattr(settings, key) == getattr(defaults, key)}
    return dataclasses.replace(settings, **chosen)


def _plain(value):
    """NumPy scalars in the evidence as JSON numbers and booleans."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} in an experiment's record is not JSON")


def judged(module: ModuleType, evidence: dict, settings, *, quick: bool) -> dict:
    """The verdict fields of a record: its checks, outcome and reason, and the rules that judged them.
    Claim checks are judged on family-wise intervals (``judging.familywise``). A quick run's outcome is
    recorded as a smoke run: its settings test the pipeline, not the claim."""
    checks: list[Check] = familywise(module.judge(evidence, settings))
    word, reason = outcome(checks)
    if quick:
        word, reason = SMOKE, f"quick settings: a test of the pipeline, not of the claim (its checks would give {word})"
    return {"verdict": word, "reason": reason, "rules_version": RULES_VERSION, "checks": [c.record() for c in checks]}


def run_experiment(name: str, out_dir: Path, *, quick: bool = False, overrides: list[str] = (),
                   seed_groups: str = "auto", keep: Path | None = None) -> dict:
    """Run one experiment and write ``<out_dir>/<name>/verdict.json`` (``seed_groups``: when an arm's seeds
    train as one group; ``keep``: a folder keeping each run's record, so that a run kept there is not trained
    again, even in another ``out_dir``; ``lmzoo.experiments.runs``):

    ``{"name", "claim", "seed_article", "verdict", "reason", "rules_version", "checks", "evidence",
    "figures", "runs", "settings", "quick", "seconds"}``; figure and run paths are relative to that
    folder; ``checks`` as ``Check.record`` writes them; ``verdict`` is ``SMOKE`` when ``quick``.
    """
    module = load(name)
    settings = settings_for(module, list(overrides), quick=quick)
    folder = Path(out_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with seeds_grouped(seed_groups), records_kept(folder, keep):
        result = module.run(settings, folder)
    relative = lambda paths: [str(Path(p).relative_to(folder)) for p in paths]  # noqa: E731
    record = {
        "name": name, "claim": module.CLAIM, "seed_article": module.SOURCE,  # the key older records have
        **judged(module, as_json(result.evidence), settings, quick=quick),
        "evidence": result.evidence, "figures": relative(result.figures), "runs": relative(result.runs),
        "settings": dataclasses.asdict(settings), "quick": quick, "seconds": round(time.perf_counter() - start, 1),
    }
    write(folder / "verdict.json", record)
    return record


def as_json(evidence: dict) -> dict:
    """The evidence as verdict.json will hold it, so a run and a re-judging see the same numbers."""
    return json.loads(json.dumps(evidence, default=_plain))


def write(path: Path, record: dict) -> None:
    """Replaced whole (``atomic_write_text``): a kill mid-write leaves the earlier verdict, never a torn one."""
    atomic_write_text(path, json.dumps(record, indent=2, default=_plain) + "\n")


def settings_of(module: ModuleType, record: dict):
    """The Settings a verdict.json was run with; keys of older settings that no longer exist are dropped."""
    names = {f.name for f in dataclasses.fields(module.Settings)}
    return module.Settings(**{k: v for k, v in record["settings"].items() if k in names})


def read_committed_json(path: Path, command: str, what: str, keys: tuple[str, ...] = ()):
    """A committed JSON record's content; ConfigError naming the command and the file where it cannot be read or
    (``keys`` given) is not an object holding every one of them."""
    try:
        record = json.loads(path.read_text())
    except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError: a binary file
        raise ConfigError(f"{command}: {path} is not {what} ({first_line(e)})") from None
    if keys:
        missing = [key for key in keys if key not in record] if isinstance(record, dict) else [keys[0]]
        if missing:
            raise ConfigError(f"{command}: {path} is not {what} (no {', '.join(missing)})")
    return record


def read_verdict(path: Path) -> dict:
    """A verdict.json's record; ConfigError naming the file where it is not one (not JSON, not text, other keys)."""
    return read_committed_json(path, "rejudge", "a verdict.json file", ("name", "verdict", "evidence", "settings"))


def rejudge(path: Path) -> dict:
    """Apply the current rules to a verdict.json's evidence, without rerunning, and rewrite it, recording
    that it was re-judged, from which verdict and under which rules."""
    record = read_verdict(Path(path))
    module = load(record["name"])
    earlier = record.get("rejudged") or {"verdict": record["verdict"], "rules_version": record.get("rules_version", 1)}
    fields = judged(module, record["evidence"], settings_of(module, record), quick=record.get("quick", False))
    record = {**{k: v for k, v in record.items() if k not in fields and k != "rejudged"}, **fields,
              "rejudged": {**earlier, "by": f"rules version {RULES_VERSION}, from the committed evidence"}}
    ordered = {k: record[k] for k in ("name", "claim", "seed_article", *fields, "rejudged")}
    record = {**ordered, **record}
    write(Path(path), record)
    return record
