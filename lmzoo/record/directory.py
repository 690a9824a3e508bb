"""A run directory and every file in it: the one place that names them and writes them.

    <run_dir>/
      config.yaml            the config the run started with (it stays so)
      resumes.jsonl          settings changed on resume: one row per key (step, key, old, new)
      data_fingerprint.json  the data the run started on (never rewritten)
      tokenizer.json         the BPE the run trained with (data.tokenizer=bpe): resumes, eval and generate use it
      run_info.json          what the model is: variant, parameters, state size, devices
      metrics.jsonl          one JSON object per logged step
      lock                   held by the trainer using the run (``lmzoo.faults.RunLock``)
      checkpoints/           Orbax checkpoints (``lmzoo.record.checkpoints``)
      damaged_checkpoints/   checkpoints that failed their digest, set aside
      eval/<tag>/            results.json, results.csv and plots of one evaluation
      tb/, tb/eval/<tag>/    TensorBoard events of training and of each evaluation

A kill can come at any moment, so no write leaves a torn file behind: whole files are written
to a temporary file in the same folder, synced and renamed over the old one; the append-only
logs (``metrics.jsonl``, ``resumes.jsonl``) are synced after each append, read tolerantly (a
line cut short is left out with a one-line warning, never fatal) and repaired before the next
append, so a torn line never swallows the row written after it.

Resuming with any key outside the identity sections changed (``optim.lr``, ``train.steps`` ...; the checks are
``lmzoo.record.resuming``) is allowed and recorded in ``resumes.jsonl``, so the run's history says how it was
trained; the config in effect is ``config.yaml`` with those rows applied in order.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml
from omegaconf import DictConfig, OmegaConf

from lmzoo.config import Config, ConfigError
from lmzoo.faults import WriteFault, first_line, probe_writable, unparsable
from lmzoo.record.migrate import saved_config
from lmzoo.schema import flatten

log = logging.getLogger("lmzoo.rundir")

CONFIG = "config.yaml"
RESUMES = "resumes.jsonl"
FINGERPRINT = "data_fingerprint.json"
TOKENIZER = "tokenizer.json"
RUN_INFO = "run_info.json"
METRICS = "metrics.jsonl"
LOCK = "lock"
CHECKPOINTS = "checkpoints"
DAMAGED_CHECKPOINTS = "damaged_checkpoints"
EVAL = "eval"
RESULTS = "results.json"
RESULTS_CSV = "results.csv"
LM_EVAL = "lm_eval"  # lm-evaluation-harness results (python -m lmzoo.lm_eval), one folder per tag
TENSORBOARD = "tb"

# Keys that may differ between two invocations of one run without changing how it trains.
NOT_SETTINGS = ("run_dir",)
# A resumes.jsonl row that records an event rather than a setting (the corpus changing under the run).
DATA_CHANGED = "data_fingerprint"


# ----------------------------------------------------------------------------- writing safely


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would have given the file


def atomic_write_text(path: Path | str, text: str) -> None:
    """Replace ``path`` by ``text`` all at once: a kill leaves the old file or the new one, never a torn one."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temporary, FILE_MODE)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        sync_directory(path.parent)  # the rename itself survives a power cut
    except OSError as e:
        raise WriteFault(f"cannot write {path} ({e.strerror or first_line(e)})") from None


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


# ----------------------------------------------------------------------------- append-only logs


_warned_lines: set[tuple[str, int]] = set()  # (log, line number) already named in a warning


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines log; a line that does not parse (a write cut short) is left out with a warning."""
    rows, bad = parse_jsonl(path)
    for number, is_last in bad:
        if (str(path), number) in _warned_lines:  # the logs are read several times in one start: one warning
            continue
        _warned_lines.add((str(path), number))
        where = "its last line is cut short" if is_last else f"line {number} does not parse"
        log.warning("warning: %s: %s (an interrupted write); that row is left out", path, where)
    return rows


def parse_jsonl(path: Path) -> tuple[list[dict], list[tuple[int, bool]]]:
    """(rows, [(line number, whether last)] of the lines that do not parse)."""
    if not path.exists():
        return [], []
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows, bad = [], []
    for position, (number, line) in enumerate(numbered):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
            rows.append(row)
        except ValueError:
            bad.append((number, position == len(numbered) - 1))
    return rows, bad


def rewrite_jsonl(path: Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def repair_jsonl(path: Path) -> list[dict]:
    """Make ``path`` hold only whole rows (rewriting it if a line is torn or the end lacks a newline); its rows."""
    if not path.exists():
        return []
    rows, bad = parse_jsonl(path)
    if bad or not path.read_bytes().endswith(b"\n") and path.stat().st_size:
        for number, _ in bad:
            log.warning("warning: %s: line %d is torn (an interrupted write); it is removed", path, number)
        rewrite_jsonl(path, rows)
    return rows


def append_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Append whole rows and sync them to disk (the caller has repaired the file)."""
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if not text:
        return
    try:
        with open(path, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise WriteFault(f"cannot append to {path} ({e.strerror or first_line(e)})") from None


# ----------------------------------------------------------------------------- the run directory


class RunDir:
    """The files of one run directory (see the module docstring): paths, tolerant reads, atomic writes."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    # paths
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def resumes_path(self) -> Path:
        return self.path / RESUMES

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def damaged_checkpoints(self) -> Path:
        return self.path / DAMAGED_CHECKPOINTS

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    def eval_tensorboard(self, tag: str) -> Path:
        """Each evaluation's own events folder: rewriting one never touches training's or another tag's."""
        return self.path / TENSORBOARD / EVAL / tag

    def eval_dir(self, tag: str) -> Path:
        return self.path / EVAL / tag

    def results_path(self, tag: str) -> Path:
        return self.eval_dir(tag) / RESULTS

    def harness_results_path(self, tag: str) -> Path:
        return self.path / LM_EVAL / tag / RESULTS

    def results_csv_path(self, tag: str) -> Path:
        return self.eval_dir(tag) / RESULTS_CSV

    def eval_tags(self) -> list[str]:
        """Tags of the evaluations with results, sorted."""
        folder = self.path / EVAL
        return sorted(p.parent.name for p in folder.glob(f"*/{RESULTS}")) if folder.is_dir() else []

    # what the directory holds
    def is_run(self) -> bool:
        return self.config_path.exists() and self.metrics_path.exists()

    def is_trained(self) -> bool:
        return self.config_path.exists() and self.checkpoints.exists()

    # reading
    def read_config(self) -> DictConfig:
        """``config.yaml`` as saved, read as today's lmzoo reads it (``lmzoo.record.migrate``); ConfigError in one line
        when it is missing, empty or does not parse."""
        if not self.config_path.exists():
            raise ConfigError(f"run_dir {str(self.path)!r} has no {CONFIG}: it holds no run")
        if not self.config_path.read_text().strip():
            raise ConfigError(f"{self.config_path} is empty (a write cut short?); the run's settings are lost")
        try:
            return saved_config(OmegaConf.load(self.config_path))
        except ConfigError:
            raise
        except yaml.YAMLError as e:  # half a file (a write cut short, an edit): where it stops parsing
            raise unparsable(e) from None
        except Exception as e:  # OmegaConf and missing sections raise many types
            raise ConfigError(f"{self.config_path} cannot be read ({first_line(e)})") from None

    def read_resumes(self) -> list[dict]:
        """The recorded changes of a run: ``{"step", "key", "old", "new"}`` rows, oldest first."""
        return read_jsonl(self.resumes_path)

    def settings_in_effect(self) -> DictConfig:
        """``config.yaml`` with every recorded change of a setting applied."""
        config = self.read_config()
        for change in self.read_resumes():
            if change.get("key") != DATA_CHANGED and "key" in change:
                OmegaConf.update(config, change["key"], change.get("new"), force_add=True)
        return config

    def read_json(self, relative: str | Path, layout: Callable[[Any], str | None] | None = None) -> Any:
        """A JSON file of the run, or None when absent, unreadable or (``layout`` says what is wrong with its content)
        of another layout: named in a warning and left out, so one such file leaves out that file, not the run."""
        path = self.path / relative
        if not path.exists():
            return None
        try:
            content = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            log.warning("warning: %s cannot be read (%s); it is left out", path, first_line(e))
            return None
        if layout is not None and (problem := layout(content)) is not None:
            log.warning("warning: %s is not laid out as lmzoo writes it (%s); it is left out", path, problem)
            return None
        return content

    def read_run_info(self) -> dict:
        info = self.read_json(RUN_INFO)
        return info if isinstance(info, dict) else {}

    def read_fingerprint(self) -> dict | None:
        return self.read_json(FINGERPRINT)

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def read_results(self, tag: str) -> dict | None:
        return self.read_json(Path(EVAL) / tag / RESULTS, evaluation_layout)

    def read_harness_results(self, tag: str) -> dict | None:
        """The run's lm-eval results of ``tag`` (None when absent, or unreadable and named in a warning, as
        ``read_results``: one damaged file leaves out that file, not the run)."""
        return self.read_json(self.harness_results_path(tag).relative_to(self.path), harness_layout)

    # writing
    def write_text(self, relative: str | Path, text: str) -> Path:
        path = self.path / relative
        atomic_write_text(path, text)
        return path

    def write_json(self, relative: str | Path, obj) -> Path:
        return self.write_text(relative, json_text(obj))

    def write_config(self, cfg: Config) -> Path:
        return self.write_text(CONFIG, OmegaConf.to_yaml(OmegaConf.structured(cfg)))

    def write_run_info(self, info: dict) -> Path:
        return self.write_json(RUN_INFO, info)

    def write_fingerprint(self, fingerprint: dict) -> Path:
        return self.write_json(FINGERPRINT, fingerprint)

    def write_results(self, tag: str, results: dict) -> Path:
        return self.write_json(Path(EVAL) / tag / RESULTS, results)

    def append_metrics(self, row: dict) -> None:
        append_jsonl(self.metrics_path, [row])

    def append_resumes(self, rows: list[dict]) -> None:
        repair_jsonl(self.resumes_path)
        append_jsonl(self.resumes_path, rows)

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the whole rows up to ``last_step`` (the step training continues from; later ones will be redone).

        Torn lines go too, so the next append starts on a line of its own."""
        rows = repair_jsonl(self.metrics_path)
        kept = [r for r in rows if r.get("step", 0) <= last_step]
        if len(kept) < len(rows):
            rewrite_jsonl(self.metrics_path, kept)

    def start_afresh(self) -> None:
        """A new run in this directory: the history of an earlier one goes."""
        self.resumes_path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- checks before training


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def maps_to(value, test: Callable[[Any], bool]) -> bool:
    """Whether ``value`` is a JSON object whose every value passes ``test``."""
    return isinstance(value, dict) and all(test(v) for v in value.values())


def evaluation_layout(results) -> str | None:
    """What keeps ``results`` from being an evaluation's results.json as readers take it, or None: the training
    length, each length's scores, and the block sums (loss and count lists) where present."""
    if not isinstance(results, dict):
        return f"a JSON {type(results).__name__}, not an object"
    if not isinstance(results.get("train_seq_len"), int):
        return "no train_seq_len"
    if not maps_to(results.get("lengths"), lambda r: isinstance(r, dict) and is_number(r.get("bpb"))):
        return "no lengths with their bpb"
    if not maps_to(results.get("block_sums", {}),
                   lambda s: isinstance(s, dict) and all(isinstance(s.get(k), list) for k in ("loss", "count"))):
        return "block_sums without loss and count lists"
    return None


def harness_layout(results) -> str | None:
    """What keeps ``results`` from being an lm_eval results.json as readers take it, or None: each task's metrics,
    and each task's per-example scores by metric where present."""
    if not isinstance(results, dict):
        return f"a JSON {type(results).__name__}, not an object"
    if not maps_to(results.get("results"), lambda metrics: isinstance(metrics, dict)):
        return "no results by task"
    if not maps_to(results.get("per_example", {}), lambda task: maps_to(task, lambda v: isinstance(v, list))):
        return "per_example is not lists of scores by task and metric"
    return None


def check_run_dir(run: RunDir) -> None:
    """The run directory and its ``checkpoints/`` exist and take files: checked before any compute is spent."""
    probe_writable(run.path, "run_dir")
    probe_writable(run.checkpoints, "checkpoints folder")


def flat_settings(config: DictConfig) -> dict:
    flat = flatten(OmegaConf.to_container(config, resolve=True))
    return {k: v for k, v in flat.items() if k not in NOT_SETTINGS}


def describe_changes(changes: list[dict]) -> str:
    return ", ".join(f"{c['key']} {c['old']} -> {c['new']}" for c in changes)
