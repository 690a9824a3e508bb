"""``python -m lmzoo.lm_eval run_dir=<run> tasks=<task,...> [include_path=<dir> limit=... tag=...]``:
lm-evaluation-harness tasks on a run.

Runs lm-eval's tasks on a trained run's newest intact checkpoint (or ``step=``), or on a local Hugging
Face Llama folder (``hf=<folder>`` in place of ``run_dir``), through the ``lmzoo`` model adapter
(``lmzoo.interop.eval_harness``). ``include_path`` adds a folder of task YAMLs (a task over a local JSONL
file runs offline). The results, each task's metrics and every example's scores, are written
whole to ``<run_dir>/lm_eval/<tag>/results.json`` (tag ``default`` unless named), beside the run's
own evaluations. Needs ``pip install -e '.[eval]'``. ``--help`` lists the settings.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn, Optional

from lmzoo.cli import (
    errors_in_one_line, exit_codes, parse_settings, run_command, schema_options, show_help, shown_as, wants_help,
)
from lmzoo.config import ConfigError
from lmzoo.record.directory import RunDir, atomic_write_text, json_text


@dataclass
class HarnessSettings:
    """The settings of ``python -m lmzoo.lm_eval``: the model, the tasks and how to run them."""

    run_dir: Optional[str] = shown_as("<dir>")  # the trained run to evaluate (or hf=<folder>)
    hf: Optional[str] = shown_as("<folder>")  # a local Hugging Face Llama folder to evaluate instead of a run
    tasks: str = shown_as("<task,...>", "")  # lm-eval task names, comma-separated
    include_path: Optional[str] = None  # a folder of task YAMLs of your own (e.g. over a local JSONL file)
    limit: Optional[float] = None  # examples per task at most (a fraction below 1: that share); null: all
    num_fewshot: Optional[int] = None  # few-shot examples per prompt; null: each task's own
    batch_size: int = 8  # sequences scored per forward pass
    max_length: Optional[int] = None  # tokens a scored sequence keeps at most; null: the training length
    max_gen_toks: int = 256  # tokens generated at most, where a task does not say
    step: Optional[int] = None  # the checkpoint step; null: the newest intact one
    seed: int = 0  # lm-eval's random seeds (few-shot draws)
    tag: str = "default"  # results go to <run_dir>/lm_eval/<tag>/results.json

    def check(self) -> None:
        if (self.run_dir is None) == (self.hf is None):
            raise ConfigError("name the model with exactly one of run_dir=<run> and hf=<folder>")
        if not self.task_names():
            raise ConfigError("tasks=<task,...> is required: lm-eval task names, comma-separated")

    def task_names(self) -> list[str]:
        return [task for task in self.tasks.split(",") if task]

    def examples(self) -> int | float | None:
        """``limit`` as lm-eval takes it: a share of each task below 1, a number of examples from 1 up."""
        return self.limit if self.limit is None or self.limit < 1 else int(self.limit)

    def recorded(self) -> dict:
        """The settings results.json records (the model and the tag are recorded apart)."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("run_dir", "hf", "tag")}
        return {**settings, "tasks": self.task_names(), "limit": self.examples()}


def show_usage() -> NoReturn:
    show_help("python -m lmzoo.lm_eval run_dir=<dir> tasks=<task,...> [key=value ...]",
              "Run lm-evaluation-harness tasks on a trained run (or a Hugging Face folder).",
              [("settings", schema_options(HarnessSettings)), ("exit codes", exit_codes())])


def main(argv: list[str] | None = None) -> dict:
    """The results written (also summarised on the terminal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        s = parse_settings(HarnessSettings, argv, "lm_eval").settings
        try:
            from lmzoo.interop.eval_harness import LmzooLM, run_tasks
        except ImportError as e:
            raise ConfigError(f"lm-evaluation-harness is not installed ({e.name}): pip install -e '.[eval]'") from None
        lm = LmzooLM(run_dir=s.run_dir, hf=s.hf, step=s.step, batch_size=s.batch_size, max_length=s.max_length,
                     max_gen_toks=s.max_gen_toks)
        found = run_tasks(lm, s.task_names(), include_path=s.include_path, limit=s.examples(),
                          num_fewshot=s.num_fewshot, seed=s.seed)
        results = {"variant": lm.trained.cfg.attn.name, "step": lm.trained.step, "tag": s.tag,
                   "max_length": lm.max_length, "settings": s.recorded(), **found}
        path = RunDir(Path(s.run_dir or s.hf)).harness_results_path(s.tag)
        atomic_write_text(path, json_text(results))
    for task, metrics in results["results"].items():
        shown = "  ".join(f"{name.split(',')[0]} {value:.4f}" for name, value in metrics.items()
                          if isinstance(value, float) and "stderr" not in name)
        print(f"{task}: {shown}")
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    run_command(main, "nothing was written (results are replaced whole: earlier ones are intact)")
