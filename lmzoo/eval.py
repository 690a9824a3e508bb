"""``python -m lmzoo.eval run_dir=<dir> [eval.<key>=...] [pos=<option> pos.<key>=... attn.<key>=...]``:
evaluate a trained run at several lengths.

Loads a run's checkpoint and saved config, applies evaluation-time overrides (position methods,
attention switches; ``pos=ntk`` picks a config group as in training) without retraining, and
measures validation loss and bits per byte at each length, with per-position loss, each with a 95%
bootstrap interval (``lmzoo.measure.evaluation``). Results go to ``<run_dir>/eval/<tag>/``:
``results.json`` (its layout: ``lmzoo.stats.bootstrap``), ``results.csv``, PNG plots, and
TensorBoard scalars in the run's ``tb/eval/<tag>/`` (``lmzoo.measure.outputs``).

``run_dir=`` a folder that holds runs (a sweep's, ``runs/sweep-<date>-<time>``, beside Hydra's ``multirun.yaml``)
evaluates each run in it with the same settings; one that cannot be evaluated is named and passed over, and ends
the command with its exit code once the others are done.

``--help`` lists the settings. The tag is named after the overrides of the run's config (``default`` without any),
not after the ``eval.*`` settings: it names the model measured, so comparisons meet every run's plain evaluation
under ``default`` however it was measured (docs/guide.md, "Evaluating a checkpoint"). results.json
records the settings that made it; evaluating a tag again with other measuring settings (``eval.step``, ``eval.lengths``
...) is refused in one line rather than replacing those results, unless ``eval.tag`` names the tag.
The folders are checked for writing before anything is computed. A damaged newest checkpoint is
named and passed over for the next older intact one (unless ``eval.step`` names it). A position
override that changes nothing for the variant gets a warning line.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import NoReturn, Optional

from omegaconf import OmegaConf

from lmzoo.cli import (
    RUN_OVERRIDES, errors_in_one_line, exit_codes, parse_settings, run_command, schema_options, show_help, shown_as,
    wants_help, with_defaults,
)
from lmzoo.config import ConfigError
from lmzoo.faults import (
    EXIT_ABORTED, EXIT_CONFIG, EXIT_FINISHED, EXIT_INTERRUPTED, EXIT_NETWORK, EXIT_RUN_FAULT, EXIT_UNPARSABLE,
    EXIT_WRITE_FAILED, RunFault, RunLock,
)
from lmzoo.interop.hf import open_hf
from lmzoo.measure.comparison.reading import folders_below
from lmzoo.measure.evaluation import (
    EvalSettings, check_request, eval_defaults, evaluate, result_settings, warn_inert_overrides,
)
from lmzoo.measure.outputs import check_writable, write_outputs
from lmzoo.record.directory import RunDir, flat_settings
from lmzoo.record.opening import check_overrides, open_trained, trained_run
from lmzoo.record.resuming import data_changes

log = logging.getLogger("lmzoo.eval")
EVAL_LOCK = ".lock"  # in eval/<tag>/: held while an evaluation computes and writes that tag


@dataclass
class EvalCommand(EvalSettings):
    """The settings of ``python -m lmzoo.eval``: the run, and how to measure it (``eval.*``)."""

    run_dir: Optional[str] = shown_as("<dir>")  # the trained run to evaluate, or a folder of runs (a sweep's): each
    hf: Optional[str] = shown_as("<folder>")  # or a local Hugging Face Llama folder (lmzoo.interop.hf)

    def check(self) -> None:
        if (self.run_dir is None) == (self.hf is None):
            raise ConfigError("run_dir=<dir> is required: the run to evaluate (or hf=<folder>: a Hugging Face Llama)")
        super().check()


def show_usage() -> NoReturn:
    options = with_defaults(schema_options(EvalCommand), OmegaConf.create(eval_defaults()))
    show_help("python -m lmzoo.eval run_dir=<dir> [eval.<key>=value ...] "
              "[pos=<option> pos.<key>=value attn.<key>=value ...]",
              "Measure a trained run's loss and bits per byte at each length, with 95% intervals.",
              [("required", [o for o in options if "." not in o.key]),
               ("evaluation settings", [o for o in options if o.key.startswith("eval.")]),
               ("overrides of the run's config (as in training)", RUN_OVERRIDES),
               ("exit codes", exit_codes(EXIT_FINISHED, EXIT_CONFIG, EXIT_RUN_FAULT, EXIT_WRITE_FAILED, EXIT_NETWORK,
                                         EXIT_UNPARSABLE, EXIT_INTERRUPTED, EXIT_ABORTED))])


def parse_args(argv: list[str]) -> tuple[RunDir, EvalCommand, list[str]]:
    """(run, settings, overrides of the run's config) from ``key=value`` arguments."""
    settings, overrides, _ = parse_settings(EvalCommand, argv, "eval", others=True, defaults=eval_defaults())
    run = RunDir(settings.hf) if settings.hf is not None else trained_run(settings.run_dir)  # results go into either
    check_overrides(overrides)
    return run, settings, overrides


def default_tag(overrides: list[str]) -> str:
    return ",".join(sorted(o.lstrip("+") for o in overrides)).replace("/", "_") or "default"


def check_tag(run: RunDir, tag: str, settings: dict, *, named: bool) -> None:
    """Refuse to replace a tag's results made with other settings, unless ``eval.tag`` named the tag."""
    earlier = (run.read_results(tag) or {}).get("settings")
    settings = json.loads(json.dumps(settings))  # as results.json holds them
    if earlier is None or earlier == settings:
        return
    before, now = flat_settings(OmegaConf.create(earlier)), flat_settings(OmegaConf.create(settings))
    differ = ", ".join(f"{k} {before.get(k)} -> {now.get(k)}" for k in sorted(set(before) | set(now))
                       if before.get(k) != now.get(k))
    if named:
        log.warning("warning: replacing %s, evaluated with other settings (%s)", run.eval_dir(tag), differ)
        return
    raise ConfigError(f"{run.eval_dir(tag)} holds results of other settings ({differ}); add eval.tag=<name> "
                      f"to keep both, or eval.tag={tag} to replace them")


def tag_in_use(tag: str, lock: Path, holder: str) -> RunFault:
    """Two evaluations of one tag at once would each replace the other's results: the second is refused."""
    return RunFault(f"{lock.parent} is being evaluated by another process ({holder}); wait for it to finish, "
                    f"or add eval.tag=<name> other than {tag!r} to keep both")


def runs_in(folder: Path) -> list[RunDir]:
    """The trained runs below a folder that is not a run itself (a sweep's, say), in order; [] if none."""
    if not folder.is_dir() or RunDir(folder).is_run():
        return []
    return [RunDir(p) for p in folders_below(folder) if RunDir(p).is_trained()]


def main(argv: list[str] | None = None) -> dict:
    """The results written (one run's; for a folder holding runs, ``{run directory: its results}``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        settings, _, _ = parse_settings(EvalCommand, argv, "eval", others=True, defaults=eval_defaults())
        runs = runs_in(Path(settings.run_dir)) if settings.run_dir is not None else []
    if runs:
        return evaluate_each(runs, argv)
    return evaluate_one(argv)


def evaluate_each(runs: list[RunDir], argv: list[str]) -> dict:
    """Every run of a folder evaluated with the same settings: one that cannot be is named and passed over, and the
    first such failure ends the command with its exit code once the others are done."""
    folder = next(a.split("=", 1)[1] for a in argv if a.startswith("run_dir="))
    others = [a for a in argv if not a.startswith("run_dir=")]
    results, failed = {}, []
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.path}")
        try:
            results[str(run.path)] = evaluate_one([f"run_dir={run.path}", *others], fail_in_one_line=False)
        except (ConfigError, RunFault) as e:
            log.warning("warning: %s was not evaluated: %s", run.path, e)
            failed.append(e)
    if failed:
        with errors_in_one_line():
            raise type(failed[0])(f"{len(failed)} of the {len(runs)} runs in {folder} were not evaluated "
                                  f"(the first: {failed[0]}); the others' results were written")
    return results


def evaluate_one(argv: list[str], *, fail_in_one_line: bool = True) -> dict:
    with errors_in_one_line() if fail_in_one_line else nullcontext():
        run, settings, overrides = parse_args(argv)
        eval_cfg, hf = settings.eval, settings.hf is not None
        tag = eval_cfg.tag or default_tag(overrides)
        measured_with = result_settings(eval_cfg, overrides)
        trained = open_hf(run.path, overrides) if hf else open_trained(run, overrides, eval_cfg.step,
                                                                       step_setting="eval.step")
        first_window = check_request(trained, eval_cfg)
        check_writable(run, tag)
        with RunLock(run.eval_dir(tag) / EVAL_LOCK, refused=partial(tag_in_use, tag)):
            check_tag(run, tag, measured_with, named=eval_cfg.tag is not None)
            if not hf:  # these rebuild the run's model and data from its config.yaml, which a Hugging Face folder lacks
                warn_inert_overrides(run, overrides, trained.model, trained.data.tokenizer.vocab_size, first_window)
            results = {**evaluate(trained, eval_cfg, tag=tag, extra_dir=run.eval_dir(tag)), "settings": measured_with}
            # data.allow_changed=true let them through
            if not hf and (changed := data_changes(run, trained.data.fingerprint)):
                results["data_changed"] = changed
            path = write_outputs(run, results)
    for length, r in results["lengths"].items():
        lo, hi = r["bpb_ci"]
        print(f"L={length:>6}  loss {r['loss']:.4f}  bpb {r['bpb']:.4f} [{lo:.4f}, {hi:.4f}]  "
              f"ratio {r['ratio']:.3f}  accuracy {r['accuracy']:.3f}")
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    run_command(main, "nothing was written (results are replaced whole: earlier ones are intact)")
