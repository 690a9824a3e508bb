"""``python -m lmzoo.lm_eval run_dir=<run> tasks=<task,...> [include_path=<dir> limit=... tag=...]``:
lm-evaluation-harness tasks on a run.

Runs lm-eval's tasks on a trained run's newest intact checkpoint (or ``step=``), or on a local Hugging
Face Llama folder (``hf=<folder>`` in place of ``run_dir``), through the ``lmzoo`` model adapter
(``lmzoo.interop.lm_eval``). ``include_path`` adds a folder of task YAMLs (a task over a local JSONL
file runs offline). The results, each task's metrics and every example's scores, are written
whole to ``<run_dir>/lm_eval/<tag>/results.json`` (tag ``default`` unless named), beside the run's
own evaluations. Needs ``pip install -e '.[eval]'``. ``--help`` lists the settings.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from lmzoo.cli import Option, errors_in_one_line, exit_codes, key_values, show_help, wants_help
from lmzoo.config import ConfigError
from lmzoo.record.directory import RunDir, atomic_write_text, json_text

SETTINGS = [
    Option("run_dir", "<dir>", "the trained run to evaluate (or hf=<folder>)"),
    Option("hf", "<folder>", "a local Hugging Face Llama folder to evaluate instead of a run"),
    Option("tasks", "<task,...>", "lm-eval task names, comma-separated"),
    Option("include_path", "null", "a folder of task YAMLs of your own (e.g. over a local JSONL file)"),
    Option("limit", "null", "examples per task at most (a fraction below 1: that share); null: all"),
    Option("num_fewshot", "null", "few-shot examples per prompt; null: each task's own"),
    Option("batch_size", "8", "sequences scored per forward pass"),
    Option("max_length", "null", "tokens a scored sequence keeps at most; null: the training length"),
    Option("max_gen_toks", "256", "tokens generated at most, where a task does not say"),
    Option("step", "null", "the checkpoint step; null: the newest intact one"),
    Option("seed", "0", "lm-eval's random seeds (few-shot draws)"),
    Option("tag", "default", "results go to <run_dir>/lm_eval/<tag>/results.json"),
]
INTEGERS = ("num_fewshot", "batch_size", "max_length", "max_gen_toks", "step", "seed")


def show_usage() -> NoReturn:
    show_help("python -m lmzoo.lm_eval run_dir=<dir> tasks=<task,...> [key=value ...]",
              "Run lm-evaluation-harness tasks on a trained run (or a Hugging Face folder).",
              [("settings", SETTINGS), ("exit codes", exit_codes())])


def parse_args(argv: list[str]) -> dict:
    given = dict(key_values(argv, "lm_eval"))
    known = [o.key for o in SETTINGS]
    for key, value in given.items():
        if key not in known:
            raise ConfigError(f"unknown setting {key!r} (valid: {', '.join(known)})")
        if key in INTEGERS and value != "null" and not value.lstrip("-").isdigit():
            raise ConfigError(f"{key}={value!r} must be a whole number or null")
    if ("run_dir" in given) == ("hf" in given):
        raise ConfigError("name the model with exactly one of run_dir=<run> and hf=<folder>")
    if not given.get("tasks"):
        raise ConfigError("tasks=<task,...> is required: lm-eval task names, comma-separated")
    args = {key: None if value == "null" else value for key, value in given.items()}
    args.update({key: int(args[key]) for key in INTEGERS if args.get(key) is not None})
    if args.get("limit") is not None:
        try:
            args["limit"] = float(args["limit"]) if float(args["limit"]) < 1 else int(float(args["limit"]))
        except ValueError:
            raise ConfigError(f"limit={args['limit']!r} must be a number") from None
    args["tasks"] = [task for task in args["tasks"].split(",") if task]
    return args


def main(argv: list[str] | None = None) -> dict:
    """The results written (also summarised on the terminal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        args = parse_args(argv)
        try:
            from lmzoo.interop.lm_eval import LmzooLM, run_tasks
        except ImportError as e:
            raise ConfigError(f"lm-evaluation-harness is not installed ({e.name}): pip install -e '.[eval]'") from None
        lm = LmzooLM(run_dir=args.get("run_dir"), hf=args.get("hf"), step=args.get("step"),
                     batch_size=args.get("batch_size") or 8, max_length=args.get("max_length"),
                     max_gen_toks=args.get("max_gen_toks") or 256)
        found = run_tasks(lm, args["tasks"], include_path=args.get("include_path"), limit=args.get("limit"),
                          num_fewshot=args.get("num_fewshot"), seed=args.get("seed") or 0)
        tag = args.get("tag") or "default"
        where = Path(args.get("run_dir") or args["hf"])
        settings = {key: value for key, value in args.items() if key not in ("run_dir", "hf", "tag")}
        results = {"variant": lm.trained.cfg.attn.name, "step": lm.trained.step, "tag": tag,
                   "max_length": lm.max_length, "settings": settings, **found}
        path = RunDir(where).harness_results_path(tag)
        atomic_write_text(path, json_text(results))
    for task, metrics in results["results"].items():
        shown = "  ".join(f"{name.split(',')[0]} {value:.4f}" for name, value in metrics.items()
                          if isinstance(value, float) and "stderr" not in name)
        print(f"{task}: {shown}")
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
