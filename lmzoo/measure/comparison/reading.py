"""Reading runs for a comparison: each run directory as a ``Run``, each run counted once, runs grouped into arms
by the settings that can change the trained model, and only runs on the same data and scored tokens kept."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from lmzoo.scoring.lengths import sampling_note
from lmzoo.record.directory import CONFIG, RunDir, describe_changes
from lmzoo.schema import ConfigError, changes_trained_model, flatten
from lmzoo.stats.bootstrap import bits_per_nat

SAME_SEED = ("refuse", "distinct")  # two runs of one arm with one seed: an error, or counted apart as the user says


def arm_settings(config: dict) -> dict:
    """The dotted settings that make an arm: those that can change the trained model, the seed aside."""
    return {k: v for k, v in flatten(config).items() if k != "seed" and changes_trained_model(k)}


@dataclass
class Run:
    path: Path
    config: dict
    info: dict
    metrics: list[dict]
    results: dict | None = field(default=None)
    changes: list[dict] = field(default_factory=list)  # settings changed on resume (resumes.jsonl)
    fingerprint: dict | None = None  # what the data was (data_fingerprint.json)
    harness: dict | None = None  # lm-evaluation-harness results (lm_eval/<tag>/results.json), per example

    @property
    def name(self) -> str:
        return self.info.get("variant", self.path.name)

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def label(self) -> str | None:
        return self.config.get("label")

    @property
    def identity(self) -> str:
        """The arm a run belongs to: its label, else its settings that can change the trained model (seed aside),
        with such settings changed on resuming. Progress bars, intervals, paths and device layout do not split
        arms (``lmzoo.schema.CANNOT_CHANGE_TRAINED_MODEL``)."""
        if self.label is not None:
            return json.dumps(["label", self.label])
        return json.dumps([arm_settings(self.config), self.model_changes], sort_keys=True, default=str)

    @property
    def recorded_as(self) -> str:
        """What the run's own records say it is: its whole config (run directory included), seed and data
        fingerprint. A copy of a run folder records the same; another run, even of the same seed, another
        ``run_dir``."""
        return json.dumps([self.config, self.fingerprint, self.changes], sort_keys=True, default=str)

    @property
    def content(self) -> str | None:
        """What its evaluation measured, to the bit: a digest of its block sums at every length (None without them).
        Two trained models never score every block alike, so equal content is one model's evaluation, whatever the
        two configs say."""
        if not self.has_blocks:
            return None
        return hashlib.sha256(json.dumps(self.results["block_sums"], sort_keys=True).encode()).hexdigest()

    @property
    def model_changes(self) -> list[dict]:
        """The settings changed on resuming that can change the trained model (they split arms)."""
        return [c for c in self.changes if changes_trained_model(str(c.get("key")))]

    @property
    def budget(self) -> tuple[int | None, int | None]:
        """(optimizer steps, training tokens) the config asked for: steps x batch rows x sequence length."""
        train, data = self.config.get("train", {}), self.config.get("data", {})
        steps, rows, length = train.get("steps"), train.get("batch_size"), data.get("seq_len")
        return steps, (steps * rows * length if None not in (steps, rows, length) else None)

    @property
    def kernels(self) -> tuple[str, ...] | None:
        """The implementations its mixers ran in training (run_info.json's "kernels"); None before they were
        recorded."""
        layers = self.info.get("kernels")
        return None if layers is None else tuple(sorted({op["implementation"] for ops in layers for op in ops}))

    @property
    def documents(self) -> str:
        """``data.document_boundaries`` of the run: "mask" (documents mixed alone) or "none"."""
        return self.info.get("document_boundaries", "none")

    @property
    def train_len(self) -> int | None:
        return self.results["train_seq_len"] if self.results else None

    def last(self, key: str):
        values = [r[key] for r in self.metrics if key in r]
        return values[-1] if values else None

    def mean_throughput(self):
        values = [r["tokens_per_s"] for r in self.metrics if "tokens_per_s" in r][1:]  # the first includes compilation
        return float(np.mean(values)) if values else None

    def at(self, length: int | None) -> dict:
        """Evaluation results at ``length`` ({} when not evaluated there)."""
        return (self.results or {}).get("lengths", {}).get(str(length), {})

    @property
    def at_train(self) -> dict:
        return self.at(self.train_len)

    @property
    def has_blocks(self) -> bool:
        return bool(self.results) and "block_sums" in self.results

    @property
    def sampling(self) -> str:
        """Which validation tokens the evaluation scored ("first": the first N, before spread sampling)."""
        return (self.results or {}).get("sampling", "first")

    def ratio(self, length: int) -> float | None:
        """bpb at ``length`` over bpb at the training length (computed for results that predate ``ratio``)."""
        here, train = self.at(length), self.at_train
        if "ratio" in here:
            return here["ratio"]
        return here["bpb"] / train["bpb"] if here and train else None

    def blocks(self, length: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Per-block (loss sum, token count) at ``length``, or None for results without block sums."""
        sums = (self.results or {}).get("block_sums", {}).get(str(length))
        return (np.asarray(sums["loss"], float), np.asarray(sums["count"], float)) if sums else None

    def scored_tokens(self) -> tuple | None:
        """What this run's evaluation scored: (sampling, digest of the scored tokens where recorded, training
        length, token count of every block)."""
        blocks = self.blocks(self.train_len) if self.has_blocks else None
        if blocks is None:
            return None
        return self.sampling, self.results.get("scored_digest"), self.train_len, tuple(blocks[1].tolist())

    @property
    def stale(self) -> str | None:
        """Why its evaluation is not of the run as its metrics show it, in a few words (None when it is): made at
        an older step than the newest logged (a run still training, or resumed since), or on changed data."""
        if not self.results:
            return None
        evaluated, logged = self.results.get("step"), max((r.get("step", 0) for r in self.metrics), default=0)
        if evaluated is not None and evaluated < logged:
            return (f"evaluated at step {evaluated} while its metrics reach step {logged}: its evaluation columns are "
                    "of an older model (rerun lmzoo.eval)")
        if changed := self.results.get("data_changed"):
            return (f"evaluated on changed data ({', '.join(changed)} differ from what it trained on): its evaluation "
                    "columns are not comparable")
        return None

    @property
    def bits_per_nat(self) -> float:
        """The data's bits-per-byte factor per nat of loss, as the evaluation applied it."""
        return bits_per_nat(self.results)


@dataclass
class Group:
    """The runs of one arm: one label, or one config that differ only in seed."""

    label: str
    runs: list[Run]

    @property
    def variant(self) -> str:
        return self.runs[0].name

    @property
    def kernels(self) -> list[tuple[str, ...]]:
        """The distinct sets of implementations its runs recorded (one set where the seeds agree); none for runs
        whose mixers call no op with a choice of kernels (lmzoo's own JAX alone ran: nothing to tell apart)."""
        return sorted({r.kernels for r in self.runs if r.kernels})

    @property
    def evaluated(self) -> list[Run]:
        """Runs with block sums, the ones intervals are made of."""
        return [r for r in self.runs if r.has_blocks]


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding config.yaml and metrics.jsonl) at or below each path, links to runs followed
    (experiments link twin runs). Below a path, folders whose name starts with a dot are skipped: they hold
    copies still being written (``scripts/cpu_recipe.sh KEEP=``)."""
    found = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        candidates = [path] if RunDir(path).is_run() else folders_below(path)
        found += [p for p in candidates if RunDir(p).is_run() and p not in found]
    return found


def folders_below(path: Path) -> list[Path]:
    """Folders holding a config.yaml below ``path``, sorted, through links; a real folder is entered once (no
    loops), a second way to it is still listed (and counted once later, by name)."""
    found, visited = [], set()
    for folder, subfolders, files in os.walk(path, followlinks=True):
        if CONFIG in files and Path(folder) != path:
            found.append(Path(folder))
        real = os.path.realpath(folder)
        subfolders[:] = [] if real in visited else [s for s in subfolders if not s.startswith(".")]
        visited.add(real)
    return sorted(found)


def load_run(path: Path, tag: str) -> Run:
    run_dir = RunDir(path)
    config = OmegaConf.to_container(run_dir.read_config())
    if "tokenizer" in config.get("data", {}):  # a corpus; runs from before the setting packed without masks
        config["data"].setdefault("document_boundaries", "none")
    return Run(path, config, run_dir.read_run_info(), run_dir.read_metrics(), run_dir.read_results(tag),
               run_dir.read_resumes(), run_dir.read_fingerprint(), run_dir.read_harness_results(tag))


def load_runs(paths: list[Path], tag: str) -> tuple[list[Run], list[tuple[Path, str]]]:
    """(the runs that could be read, [(path, why not)]): one damaged run does not stop a comparison."""
    runs, unreadable = [], []
    for path in paths:
        try:
            runs.append(load_run(path, tag))
        except (ConfigError, OSError, ValueError) as e:
            unreadable.append((path, str(e).splitlines()[0]))
    return runs, unreadable


def distinct_runs(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """(each run once, a line per duplicate naming it): a symlink to a run, a copy of its folder (the same real
    path, or the same recorded config, run directory, seed and data), or any run whose evaluation has the same block
    sums (a copy whose config was edited, ``same_seed=distinct`` or not) is one run, not another seed."""
    kept, seen, notes = [], {}, []
    for run in runs:
        keys = [run.path.resolve(), run.recorded_as] + ([run.content] if run.content else [])
        original = next((seen[key] for key in keys if key in seen), None)
        if original is not None:
            notes.append(f"counted once: {run.path} {duplicate_of(run, original)} {original.path}")
            continue
        seen.update(dict.fromkeys(keys, run))
        kept.append(run)
    return kept, notes


def duplicate_of(run: Run, original: Run) -> str:
    """How ``run`` repeats ``original``, in the words of the note that leaves it out."""
    if run.path.resolve() == original.path.resolve():
        return "is a link to"
    if run.recorded_as == original.recorded_as:
        return "is a copy of"
    return ("scored the same block sums as (one model's evaluation, whatever its config says: a copy with an "
            "edited config, or one evaluation twice)")


def validation_budgets(groups: list[Group]) -> list[str]:
    """A line per arm whose runs validated during training on different budgets (``train.eval_tokens``): its val
    bpb column pools numbers measured on different text (its evaluation columns do not)."""
    notes = []
    for group in groups:
        budgets = sorted({str(r.config.get("train", {}).get("eval_tokens")) for r in group.runs})
        if len(budgets) > 1:
            notes.append(f"arm {group.label} pools runs validated on different budgets (train.eval_tokens "
                         f"{', '.join(budgets)}): its val bpb column mixes texts, its evaluation columns do not")
    return notes


def check_distinct_seeds(groups: list[Group], same_seed: str = "refuse") -> None:
    """ValueError in one line where two runs of one arm trained the same seed, unless ``same_seed="distinct"``
    says they are different runs (e.g. a nondeterministic rerun): counting one model twice narrows the
    interval as if it were two seeds."""
    if same_seed not in SAME_SEED:
        raise ValueError(f"same_seed={same_seed!r} is not valid (choose from: {', '.join(SAME_SEED)})")
    if same_seed == "distinct":
        return
    for group in groups:
        by_seed: dict[str, list[Run]] = {}
        for run in group.runs:
            if run.seed is not None:
                by_seed.setdefault(str(run.seed), []).append(run)
        for seed, runs in by_seed.items():
            if len(runs) > 1:
                paths = ", ".join(str(r.path) for r in runs)
                raise ValueError(f"arm {group.label} has {len(runs)} runs of seed {seed} ({paths}): one seed counts "
                                 "once; if they are different runs, say so with same_seed=distinct")


def group_runs(runs: list[Run]) -> list[Group]:
    """One group per label or distinct config (seed aside), in the order runs were found; runs sorted by seed."""
    by_identity: dict[str, list[Run]] = {}
    for run in runs:
        by_identity.setdefault(run.identity, []).append(run)
    groups = [Group(members[0].label or members[0].name, sorted(members, key=lambda r: str(r.seed)))
              for members in by_identity.values()]
    names = [g.label for g in groups]
    for group, name in zip(groups, names):
        siblings = [g for g, other in zip(groups, names) if other == name]
        if len(siblings) > 1:
            group.label = f"{name} ({distinguishing(group, siblings)})"
    return groups


def distinguishing(group: Group, siblings: list[Group]) -> str:
    """The settings in which ``group`` differs from other groups of the same variant, as key=value, and the
    changes made on resuming where those differ (two arms split only by a resumed change name it)."""
    flat = [arm_settings(g.runs[0].config) for g in siblings]
    mine = arm_settings(group.runs[0].config)
    keys = sorted(k for k in set().union(*flat) if len({str(f.get(k)) for f in flat}) > 1)
    parts = [f"{k}={mine.get(k)}" for k in keys]
    resumes = [json.dumps(g.runs[0].model_changes, sort_keys=True, default=str) for g in siblings]
    if len(set(resumes)) > 1:
        parts.append(resumed_as(group.runs[0].model_changes))
    return ", ".join(parts)


def resumed_as(changes: list[dict]) -> str:
    """``resumed at step 5: optim.lr 0.001 -> 0.0005``, or ``not changed on resuming``."""
    if not changes:
        return "not changed on resuming"
    by_step: dict = {}
    for change in changes:
        by_step.setdefault(change.get("step"), []).append(change)
    return "; ".join(f"resumed at step {step}: {describe_changes(found)}" for step, found in by_step.items())


# ----------------------------------------------------------------------------- same data or no comparison


def data_difference(run: Run, reference: Run) -> str | None:
    """Why ``run`` is not on ``reference``'s data or tokens, in a few words; None when it is."""
    if run.fingerprint is not None and reference.fingerprint is not None and run.fingerprint != reference.fingerprint:
        keys = sorted(k for k in set(run.fingerprint) | set(reference.fingerprint)
                      if run.fingerprint.get(k) != reference.fingerprint.get(k))
        shown = ", ".join(f"{k} {run.fingerprint.get(k)} vs {reference.fingerprint.get(k)}" for k in keys[:2])
        return f"other data than {reference.path} ({shown})"
    mine, theirs = run.scored_tokens(), reference.scored_tokens()
    if mine is not None and theirs is not None and mine != theirs:
        return (f"scored other validation tokens than {reference.path} (another budget, length or sampling: "
                f"{sampling_note(run.results)})")
    return None


def on_the_same_data(runs: list[Run], reference: Run) -> tuple[list[Run], list[tuple[Run, str]]]:
    """(runs on ``reference``'s data and scored tokens, [(run left out, why)])."""
    kept, left_out = [], []
    for run in runs:
        why = data_difference(run, reference)
        (left_out.append((run, why)) if why else kept.append(run))
    return kept, left_out


def reference_run(runs: list[Run], baseline: str | None) -> Run:
    """The run others must match: the baseline arm's first evaluated run, else the first evaluated run."""
    preferred = [r for r in runs if baseline in (r.label, r.name)] if baseline else []
    return next((r for r in preferred + runs if r.has_blocks), (preferred or runs)[0])


def probe_mean(nested) -> float | None:
    """The mean over layers and heads of a probe's nested per-layer values (None when absent)."""
    return None if nested is None else float(np.nanmean(np.asarray(nested, dtype=float)))


def evaluated_lengths(runs: list[Run]) -> list[int]:
    return sorted({int(n) for r in runs if r.results for n in r.results["lengths"]})


def stale_evaluations(runs: list[Run]) -> list[str]:
    """A note per run whose evaluation columns are not of the run as its training columns show it."""
    return [f"{run.path}: {run.stale}" for run in runs if run.stale]
