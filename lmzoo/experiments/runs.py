"""What experiments share: training and evaluating runs with the library the commands use, and paired
differences between two evaluations of the same validation tokens.

Runs live in ordinary run directories, so a rerun with the same ``out_dir`` resumes (or reuses) them
and each one can be opened in TensorBoard or compared with ``lmzoo.compare`` like any other run; an
evaluation already made with the same settings from the run's newest checkpoint is read back, not
scored again (delete ``eval/<tag>`` to score it anew). A run
that stops early (interrupted, diverged) stops the experiment with the run's fault: nothing is judged
on a half-trained model, and rerunning the experiment resumes the run.

An arm's seeds train through ``train_runs``: the seeds still to train that stand at the same step go as one
group (``lmzoo.run.seeds``: one vmapped step for all of them), each still written to its own run directory
exactly where a run of its own would be, so a directory does not show how it was trained, and an ``out_dir``
trained one seed at a time is reused and resumed alike. ``seed_groups`` says when: ``auto`` (the default)
groups on an accelerator, where a small model leaves the device idle, and not on a CPU, where the stacked step
costs more per seed (docs/benchmarks.md); ``true`` always, ``false`` never.
"""

from __future__ import annotations

import base64
import logging
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from omegaconf import OmegaConf

from lmzoo.cli import compose_and_validate
from lmzoo.config import Config, ConfigError
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.experiments import kept_setting, read_committed_json, seed_groups_setting
from lmzoo.experiments.judging import measured
from lmzoo.faults import Interrupted, first_line
from lmzoo.measure.evaluation import eval_settings, evaluate, result_settings
from lmzoo.measure.outputs import write_outputs
from lmzoo.model import LM
from lmzoo.ops.common import causal_mask
from lmzoo.plots import error_bars, new_axes, save_axes, series_style, spread
from lmzoo.run import loop
from lmzoo.record.directory import RunDir, atomic_write_text, flat_settings, json_text
from lmzoo.record.opening import open_trained
from lmzoo.run.loop import train
from lmzoo.stats.bootstrap import Interval, bootstrap, paired_difference_interval

# An experiment trains for minutes to hours with its runs' own step lines off: this logger says, a line before and
# after each run it trains, where the experiment stands (``python -m lmzoo.experiments`` prints it on stdout).
progress = logging.getLogger("lmzoo.experiments.progress")


def grouping(cfg: Config) -> bool:
    """Whether seeds of ``cfg`` train as one group: as ``seed_groups`` says, never for a run over processes."""
    when = seed_groups_setting()
    wanted = when == "true" or (when == "auto" and jax.default_backend() != "cpu")
    return wanted and not cfg.train.distributed


def train_run(variant: str, run_dir: Path, *, seed: int, steps: int, overrides: list[str] = ()) -> Config:
    """Train ``+attn=variant`` into ``run_dir`` (resuming, or reusing a finished run); its config.

    A finished run of the same settings that another experiment trained under the same ``out_dir`` is
    reused (``run_dir`` becomes a link to it): training it again would repeat it bit for bit."""
    return train_runs(variant, {seed: run_dir}, steps=steps, overrides=overrides)[seed]


def train_runs(variant: str, run_dirs: dict[int, Path], *, steps: int, overrides: list[str] = ()) -> dict[int, Config]:
    """``train_run`` for each seed's ``run_dirs[seed]``; their configs by seed. The seeds left to train that
    resume from the same step (all of them, in a fresh ``out_dir``) train as one group where ``grouping`` says so."""
    configs = {seed: run_config(variant, run_dir, seed, steps, overrides) for seed, run_dir in run_dirs.items()}
    train_configs(list(configs.values()), steps)
    return configs


def train_grid(variant: str, run_dirs: dict[tuple[float, int], Path], *, steps: int,
               overrides: list[str] = ()) -> dict[tuple[float, int], Config]:
    """``train_runs`` over learning rates too: ``run_dirs[lr, seed]`` trains at ``optim.lr=lr``; with AdamW every
    rate and seed left at one step trains in one group (``train.lrs``' step)."""
    configs = {(lr, seed): run_config(variant, run_dir, seed, steps, [f"optim.lr={lr}", *overrides])
               for (lr, seed), run_dir in run_dirs.items()}
    train_configs(list(configs.values()), steps)
    return configs


def run_config(variant: str, run_dir: Path, seed: int, steps: int, overrides: list[str]) -> Config:
    return compose_and_validate([f"+attn={variant}", f"run_dir={run_dir}", f"seed={seed}", f"train.steps={steps}",
                                 "train.progress=false", *overrides])


def train_configs(configs: list[Config], steps: int) -> None:
    """Train the runs neither kept (``kept_elsewhere``) nor reused from a twin: those resuming from one step as one
    group where ``grouping`` says so (and the group can hold them: other learning rates need AdamW), else one at a
    time; each then kept as trained where records are kept."""
    left = [cfg for cfg in configs if not kept_elsewhere(cfg) and not reused(cfg, Path(cfg.run_dir))]
    for group in by_start(left, steps):
        for runs in stackable(group) if grouping(group[0]) else [[cfg] for cfg in group]:
            finished(announced(runs), runs)
    for cfg in left:
        keep_trained(cfg)


def announced(runs: list[Config]) -> dict:
    """Train ``runs`` (one vmapped group where there are several) with a line before and after: which runs, from
    and to which step, and how long they took. A finished run, only read back, trains without a word."""
    run = RunDir(runs[0].run_dir)
    start, steps = final_step(run), runs[0].train.steps
    names = ", ".join(str(cfg.run_dir) for cfg in runs)
    if start < steps:
        progress.info("%s: training to step %d%s", names, steps, f" from step {start}" if start else "")
    began = time.monotonic()
    summary = loop.train_runs(runs) if len(runs) > 1 else train(runs[0])
    if start < steps and not summary["interrupted"]:
        progress.info("%s: trained in %.0f s", names, time.monotonic() - began)
    return summary


def stackable(group: list[Config]) -> list[list[Config]]:
    """``group`` split where one vmapped step cannot hold it: runs of other learning rates need AdamW."""
    if group[0].optim.name == "adamw":
        return [group]
    by_lr: dict[float, list[Config]] = {}
    for cfg in group:
        by_lr.setdefault(cfg.optim.lr, []).append(cfg)
    return list(by_lr.values())


def finished(summary: dict, runs: list[Config]) -> None:
    """Interrupted where training ``runs`` stopped before their last step (each saved where it stood)."""
    if summary["interrupted"]:
        raise Interrupted(f"interrupted while training {', '.join(c.run_dir for c in runs)} (checkpoint at step "
                          f"{summary['step']}); run the same experiment again to resume")


def reused(cfg: Config, run_dir: Path) -> bool:
    """Whether ``run_dir`` is (or now links to) a finished twin's run rather than one to train here."""
    if run_dir.is_symlink():
        return True
    if not run_dir.exists() and (twin := finished_twin(cfg, run_dir)) is not None:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run_dir.symlink_to(twin.resolve(), target_is_directory=True)
        progress.info("%s: reusing %s, trained with the same settings", run_dir, twin)
        return True
    return False


def by_start(configs: list[Config], steps: int) -> list[list[Config]]:
    """The runs in groups that resume from the same saved step (a group's seeds stand at one step), fresh ones
    at step 0; each finished run alone (training it only reads it back)."""
    groups: dict[int, list[Config]] = {}
    done = []
    for cfg in configs:
        run = RunDir(cfg.run_dir)
        start = final_step(run)
        if start >= steps:
            done.append([cfg])
        else:
            groups.setdefault(start, []).append(cfg)
    return [*groups.values(), *done]


def finished_twin(cfg: Config, run_dir: Path) -> Path | None:
    """A run that trained to ``cfg.train.steps`` with the settings of ``cfg`` (``run_dir`` apart) in any
    experiment's ``runs/`` beside ``run_dir``'s (``<out_dir>/<experiment>/runs/<name>``), or None."""
    wanted = flat_settings(OmegaConf.structured(cfg))
    for candidate in sorted(run_dir.parents[2].glob("*/runs/*")):
        run = RunDir(candidate)
        if candidate.is_symlink() or not run.is_trained() or final_step(run) != cfg.train.steps:
            continue
        try:
            if flat_settings(run.settings_in_effect()) == wanted:
                return candidate
        except ConfigError:  # a sibling whose settings cannot be read is not a twin
            continue
    return None


def final_step(run: RunDir) -> int:
    """The newest checkpoint's step, read from the checkpoint folders' names (0 without one, or without the folder)."""
    if not run.checkpoints.is_dir():
        return 0
    return max((int(p.name) for p in run.checkpoints.iterdir() if p.name.isdigit()), default=0)


def state_floats(cfg: Config) -> int:
    """Floats of decoding state per sequence at the training length (the model built without arrays;
    the state does not depend on the vocabulary)."""
    model = nnx.eval_shape(lambda: LM(cfg, ByteTokenizer.vocab_size, rngs=nnx.Rngs(0)))
    return model.state_size(cfg.data.seq_len)


def evaluate_run(run_dir: Path, *, tag: str, lengths: list[int], tokens: int, overrides: list[str] = (),
                 eval_overrides: list[str] = ()) -> dict:
    """The evaluation of ``run_dir`` at ``lengths`` on ``tokens`` validation targets spread over every document (and
    ``eval_overrides``, e.g. ``eval.min_doc_tokens``), written under ``eval/<tag>`` as ``lmzoo.eval`` writes it (and
    kept with the run's record); its results. ``overrides`` change the trained model's settings (``open_trained``)."""
    eval_cfg = eval_settings([f"eval.tokens={tokens}", f"eval.lengths=[{','.join(map(str, lengths))}]",
                              "eval.probe_batch=0", "eval.progress=false", f"eval.tag={tag}", *eval_overrides])
    run, settings = RunDir(run_dir), result_settings(eval_cfg, list(overrides))
    kept = kept_record(run_dir)
    kept_results = None if kept is None else kept / "eval" / tag / "results.json"
    results = kept_evaluation(kept_results, settings)
    if results is not None:
        return results
    results = finished_evaluation(run, tag, settings)
    if results is None:
        train_skipped(run_dir)
        results = evaluate(open_trained(run, overrides), eval_cfg, tag=tag, extra_dir=run.eval_dir(tag))
        results["settings"] = settings
        write_outputs(run, results)
    if kept_results is not None:
        atomic_write_text(kept_results, json_text(results))
    return results


def finished_evaluation(run: RunDir, tag: str, settings: dict) -> dict | None:
    """The tag's results if they were made with ``settings`` from the run's newest checkpoint, else None: an
    experiment rerun after an interruption does not score its finished evaluations again."""
    results = run.read_results(tag)
    if results is None or results.get("settings") != settings or results.get("step") != final_step(run):
        return None
    return results


# ----------------------------------------------------------------------------- records kept beside the experiment
# Where an experiment runs with ``keep=<folder>`` (``lmzoo.experiments.records_kept``), each run keeps a record
# there, at the path the run has under the experiment's runs folder (``kept_record``): ``config.yaml`` (the settings
# it trained with, once trained) and every measurement the experiment took of it (``eval/<tag>/results.json``,
# ``measurements/*.json``), no checkpoints. A run whose record is kept is not trained again, in any out_dir: its
# measurements are read back, and only a measurement the record lacks (the experiment stopped before taking it)
# trains the run again.

KEPT_CONFIG = "config.yaml"


def kept_record(run_dir: Path | str) -> Path | None:
    """The folder keeping ``run_dir``'s record: its path in the experiment's folder, less the ``runs`` folder they
    share (git ignores folders of that name, and records are kept to be committed); None when no records are kept,
    or the run lies outside the experiment's folder."""
    keeping = kept_setting()
    if keeping is None:
        return None
    try:
        relative = Path(run_dir).relative_to(keeping.folder)
    except ValueError:
        return None
    return keeping.keep.joinpath(*relative.parts[relative.parts[0] == "runs":])


def kept_elsewhere(cfg: Config) -> bool:
    """Whether the run of ``cfg`` is left untrained because its record keeps it trained (and the run directory does
    not hold it trained already); ConfigError where the record keeps other settings, naming the first that
    differs."""
    record = kept_record(cfg.run_dir)
    if record is None or not (record / KEPT_CONFIG).is_file():
        return False
    try:
        kept = flat_settings(OmegaConf.load(record / KEPT_CONFIG))
    except Exception as e:  # YAML's and OmegaConf's errors alike: a record edited by hand or torn
        raise ConfigError(f"{record / KEPT_CONFIG} is not a kept run's settings ({first_line(e)}); remove that "
                          "record to train the run again") from None
    wanted = flat_settings(OmegaConf.structured(cfg))
    if kept != wanted:
        key = next(k for k in sorted(set(kept) | set(wanted)) if kept.get(k) != wanted.get(k))
        raise ConfigError(f"{record} keeps a run trained with {key}={kept.get(key)!r}, not {wanted.get(key)!r}; "
                          "remove that record to train the run again")
    run = RunDir(cfg.run_dir)
    if final_step(run) >= cfg.train.steps:
        return False
    kept_setting().skipped[Path(cfg.run_dir)] = cfg
    return True


def keep_trained(cfg: Config) -> None:
    """Keep the settings of a run trained (or found trained) here, where records are kept."""
    record = kept_record(cfg.run_dir)
    if record is not None and not (record / KEPT_CONFIG).is_file():
        atomic_write_text(record / KEPT_CONFIG, OmegaConf.to_yaml(OmegaConf.structured(cfg)))


def kept_evaluation(path: Path | None, settings: dict) -> dict | None:
    """A kept evaluation's results if they were made with ``settings``, else None."""
    if path is None or not path.is_file():
        return None
    results = read_committed_json(path, "experiments", "a kept evaluation", ("settings",))
    return results if results["settings"] == settings else None


def train_skipped(run_dir: Path) -> None:
    """Train a run left untrained as kept (``kept_elsewhere``) whose record lacks a measurement asked of it."""
    keeping = kept_setting()
    cfg = None if keeping is None else keeping.skipped.pop(Path(run_dir), None)
    if cfg is not None:
        progress.info("%s: its kept record lacks a measurement; training the run again", run_dir)
        finished(announced([cfg]), [cfg])


def open_run(run_dir: Path, overrides: list[str] = ()):
    """``open_trained`` for a measurement not kept with the run's record: a run left untrained as kept trains first."""
    train_skipped(run_dir)
    return open_trained(run_dir, list(overrides))


@nnx.jit
def most_likely(model, tokens):
    """The model's most likely token at each position of ``tokens`` [B, T]."""
    return jnp.argmax(model(tokens), axis=-1)


def measured_once(run_dir: Path, name: str, measure) -> dict[str, np.ndarray]:
    """``measure()``: arrays of 0s and 1s by name, read back from the run's kept record where ``name`` (the
    measurement with its settings) is kept there, else measured (training a run left untrained as kept first) and
    kept as bits."""
    return _kept_once(run_dir, name, measure, _as_bits, _from_bits)


def counted_once(run_dir: Path, name: str, measure) -> dict[str, np.ndarray]:
    """``measured_once`` for arrays of counts (integers from 0 up), kept as their nonzero entries."""
    return _kept_once(run_dir, name, measure, _as_counts, _from_counts)


def _kept_once(run_dir: Path, name: str, measure, encode, decode) -> dict[str, np.ndarray]:
    record = kept_record(run_dir)
    path = None if record is None else record / "measurements" / f"{name}.json"
    if path is not None and path.is_file():
        kept = read_committed_json(path, "experiments", "a kept measurement")
        try:
            return {key: decode(a) for key, a in kept.items()}
        except Exception as e:  # valid JSON of another shape: a record edited by hand
            raise ConfigError(f"experiments: {path} is not a kept measurement ({first_line(e)}); remove it to "
                              "measure the run again") from None
    train_skipped(run_dir)
    arrays = measure()
    if path is not None:
        atomic_write_text(path, json_text({key: encode(f"{name}'s {key}", a) for key, a in arrays.items()}))
    return arrays


def _as_bits(what: str, a: np.ndarray) -> dict:
    if not np.isin(a, (0, 1)).all():
        raise ValueError(f"measured_once keeps arrays of 0s and 1s; {what} holds other values")
    return {"shape": list(a.shape), "bits": base64.b64encode(np.packbits(a.astype(bool))).decode()}


def _from_bits(kept: dict) -> np.ndarray:
    shape = kept["shape"]
    bits = np.unpackbits(np.frombuffer(base64.b64decode(kept["bits"]), np.uint8), count=int(np.prod(shape)))
    return bits.reshape(shape).astype(np.float64)


def _as_counts(what: str, a: np.ndarray) -> dict:
    """The nonzero counts with their flat indices: a count per token class is mostly zeros at a large vocabulary."""
    if not (np.all(a >= 0) and np.array_equal(a, np.round(a))):
        raise ValueError(f"counted_once keeps counts (integers from 0 up); {what} holds other values")
    flat = np.ravel(a)
    at = np.flatnonzero(flat)
    return {"shape": list(a.shape), "at": at.tolist(), "counts": [int(x) for x in flat[at]]}


def _from_counts(kept: dict) -> np.ndarray:
    flat = np.zeros(int(np.prod(kept["shape"])), np.int64)
    flat[np.asarray(kept["at"], np.int64)] = np.asarray(kept["counts"], np.int64)
    return flat.reshape(kept["shape"])


def blocks(results: dict, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(loss, count) block sums of an evaluation at ``length``."""
    sums = results["block_sums"][str(length)]
    return np.asarray(sums["loss"], float), np.asarray(sums["count"], float)


def accuracy_runs(results: list[dict], length: int) -> list[tuple]:
    """(correct, count) block sums of each seed's evaluation at ``length``: blocks of examples."""
    return [(np.asarray(r["block_sums"][str(length)]["correct"], float),
             np.asarray(r["block_sums"][str(length)]["count"], float)) for r in results]


def as_record(interval, scale: float = 1.0) -> dict:
    interval = interval.scaled(scale) if scale != 1.0 else interval
    return {"value": float(interval.estimate), "ci": interval.bounds()}


# ----------------------------------------------------------------------------- attention rows by context


def row_statistic(run_dir: Path, overrides: list[str], statistic, *, length: int, windows: int,
                  tokens: int) -> np.ndarray:
    """(windows, length): ``statistic`` of each query's attention row (a function of weights and the causal
    mask, one value per row, e.g. ``attention_entropy``), averaged over layers and heads, on the first
    ``windows`` validation windows of ``length`` tokens cut from ``tokens`` validation targets spread over the split."""
    _, data, model, _ = open_run(run_dir, overrides)
    cut = data.validation_windows([length], tokens)[length]
    inputs = cut(np.arange(min(windows, len(cut))))["inputs"]
    return np.stack([np.asarray(_rows(model, jnp.asarray(inputs[i : i + 1]), statistic))[0]
                     for i in range(len(inputs))])


@nnx.jit(static_argnums=2)
def _rows(model, tokens, statistic):
    causal = causal_mask(tokens.shape[1])
    per_layer = [statistic(w, causal).mean(axis=1) for w in model.attention_matrices(tokens)]  # (B, T) each
    return jnp.mean(jnp.stack(per_layer), axis=0)


def bucket_means(values: np.ndarray, edges: list[int]) -> np.ndarray:
    """(windows, buckets): mean of the queries seeing n keys, n in (edges[b], edges[b + 1]]."""
    keys_seen = np.arange(1, values.shape[1] + 1)
    return np.stack([values[:, (keys_seen > lo) & (keys_seen <= hi)].mean(axis=1)
                     for lo, hi in zip(edges[:-1], edges[1:])], axis=1)


def mean_of_windows(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return sums / counts


def over_windows(values: np.ndarray, statistic=mean_of_windows) -> Interval:
    """``statistic`` of per-window values (windows, ...) with a bootstrap interval over the windows."""
    return bootstrap(statistic, [values, np.ones_like(values)])


def paired_over_windows(first: np.ndarray, second: np.ndarray, statistic) -> dict:
    """statistic(first) - statistic(second) on the same windows, with its paired 95% interval."""
    return as_record(paired_difference_interval([(first, np.ones_like(first))], [(second, np.ones_like(second))],
                                                statistic))


def plot_against_length(conditions: dict, lengths: list[int], key: str, seeds: int, path: Path, *, what: str) -> str:
    """Each condition's ``key`` ("ratio": bpb@L / bpb@train, or "bpb") at every evaluated length with its 95%
    interval, titled "<what>: ..."; the figure's path."""
    fig, ax = new_axes((6, 4))
    for index, (name, curve) in enumerate(conditions.items()):
        points = [measured(curve[key][str(n)]) for n in lengths]
        error_bars(ax, spread(lengths, index, len(conditions)), [p.estimate for p in points], [p.lo for p in points],
                   [p.hi for p in points], label=name, **series_style(index))
    ax.set_xscale("log", base=2)
    quantity = "ratio to the training length" if key == "ratio" else "bits per byte"
    save_axes(fig, ax, path, train_len=lengths[0], xticks=lengths,
              title=f"{what}: {quantity} ({seeds} seed{'s' * (seeds > 1)})", xlabel="evaluation length (tokens)",
              ylabel=f"{'bpb@L / bpb@train' if key == 'ratio' else 'bits per byte'} (95% interval)")
    return str(path)
