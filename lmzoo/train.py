"""``python -m lmzoo.train +attn=<variant> [key=value ...]``: train one model, resumably.

The run directory holds the resolved config, Orbax checkpoints, TensorBoard events and the metrics
log (``lmzoo.record.directory``). Running the same command on an existing run directory resumes from its
newest intact checkpoint; SIGTERM or Ctrl-C saves a checkpoint before exiting. The training itself
is ``lmzoo.run.loop.train`` (with ``train.seeds=[0,1,2]``, several seeds as one jitted step, each a run of its
own in ``run_dir/seed<s>``, and with ``train.lrs=[1e-3,3e-3]`` several AdamW learning rates the same way, in
``run_dir/lr<lr>``: ``lmzoo.run.seeds``); this module is its command line (Hydra's: ``-m`` sweeps,
``--hydra-help``). ``--help`` lists the settings. Exit codes: ``lmzoo.faults``.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import NoReturn

import hydra

from lmzoo.cli import (
    HelpLine, check_argv, exit_codes, fail, group_choices, interrupts_in_one_line, reader_may_leave, schema_options,
    show_help, use_compilation_cache, wants_help, with_defaults,
)
from lmzoo.config import CONFIG_DIR, Config, ConfigError, data_spec, register_schemas, validate, variant_names
from lmzoo.faults import EXIT_FINISHED, EXIT_INTERRUPTED, RunFault, check_unlocked, debugging, probe_writable
from lmzoo.mixers.hybrid import check_layers_used
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import train

log = logging.getLogger("lmzoo.train")


# ----------------------------------------------------------------------------- entry point


_exit_codes: list[int] = []  # one per run of this process (several in a multirun)
_run_dirs: list[str] = []  # the run directory of each run started, the newest last


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def _hydra_main(raw) -> None:
    try:
        cfg = validate(raw)
        check_layers_used(cfg.attn, cfg.model.n_layers)
        note_short_schedule(cfg)
        _run_dirs.append(cfg.run_dir)
        summary = train(cfg)
    except ConfigError as e:
        fail(str(e))
    except RunFault as e:  # one run of a sweep failing leaves the others to run
        if debugging():
            raise
        print(f"lmzoo: error: {e}", file=sys.stderr)
        _exit_codes.append(e.exit_code)
        return
    if not summary["interrupted"]:
        _exit_codes.append(EXIT_FINISHED)
        return
    log.info("to resume: %s", resume_command(cfg.run_dir))
    if jobs_run_here():  # the interrupt stops the process: a sweep's later runs do not start
        sys.exit(EXIT_INTERRUPTED)
    _exit_codes.append(EXIT_INTERRUPTED)  # a job of a launcher's own (SLURM's): its process ends with it


def jobs_run_here() -> bool:
    """Whether this process runs the jobs one after another (Hydra's basic launcher, and a single run), rather
    than a launcher that gives each job a process of its own (submitit's, for SLURM or local processes)."""
    from hydra.core.hydra_config import HydraConfig

    launcher = HydraConfig.get().get("launcher") or {}
    return "BasicLauncher" in str(launcher.get("_target_", "BasicLauncher"))


def note_short_schedule(cfg: Config) -> None:
    """A warmup as long as the run is cut to fit it, so its peak learning rate is never held: say so."""
    warmup, steps = cfg.optim.warmup_steps, cfg.train.steps
    if warmup >= steps:
        log.warning("note: optim.warmup_steps=%d is not below train.steps=%d: the warmup is cut to end by step %d, "
                    "so the learning rate peaks at the end", warmup, steps, max(steps - 1, 0))


def resume_command(run_dir: str) -> str:
    """The command that resumes ``run_dir``: this run's own overrides (one job's values in a sweep) and ``run_dir``,
    since without it the same command starts afresh in a new timestamped folder."""
    from hydra.core.hydra_config import HydraConfig

    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(("run_dir=", "hydra."))]
    return shlex.join(["python", "-m", "lmzoo.train", *overrides, f"run_dir={run_dir}"])


def after_an_interrupt() -> str:
    """What an interrupt outside the training loop (or a second Ctrl-C inside it) leaves behind."""
    if not _run_dirs:
        return "nothing was trained"
    return (f"no checkpoint was saved now; those in {_run_dirs[-1]} are intact, and the same command with "
            f"run_dir={_run_dirs[-1]} resumes from the newest")


TRAINING_GROUPS = ["model", "pos", "data", "optim"]  # the config groups besides attn (configs/eval is lmzoo.eval's)


def show_usage() -> NoReturn:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        defaults = compose("train")
    settings = [o for o in schema_options(Config) if o.key not in ("attn", "data")]
    source = defaults.data.source
    show_help(
        "python -m lmzoo.train +attn=<variant> [key=value ...]   "
        "(-m: a sweep over key=a,b; --hydra-help: Hydra's flags)",
        __doc__.splitlines()[0].split(": ", 1)[1],
        [("required", [HelpLine("+attn", "<variant>", f"the sequence mixer, one of: {', '.join(variant_names())}"),
                       HelpLine("attn.<key>", "<value>", "the variant's own settings (its spec in lmzoo/mixers/)")]),
         ("config groups (group=option loads configs/<group>/<option>.yaml, or a registered spec's defaults)",
          group_choices(TRAINING_GROUPS)),
         ("settings", with_defaults(settings, defaults)),
         (f"data settings of data={source} (another source has its own)",
          with_defaults(schema_options(data_spec(source), "data."), defaults)),
         ("exit codes", exit_codes())],
    )


def refuse_a_held_run(run_dir: str) -> None:
    """Before Hydra writes its files (``.hydra/``, train.log) into the run directory: one line and exit
    if it cannot be written or another trainer holds it, so a refused trainer touches nothing."""
    try:
        check_unlocked(RunDir(run_dir).lock_path)
        probe_writable(Path(run_dir), "run_dir")
    except RunFault as e:
        fail(str(e), e.exit_code)


@reader_may_leave()
def main(argv: list[str] | None = None) -> None:
    """Exits with the largest of the runs' exit codes (``lmzoo.faults``) unless every run finished."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.raiseExceptions = False  # a log file on a full disk: no traceback per line; the write's own fault says it
    use_compilation_cache()
    register_schemas()
    if wants_help(argv):
        show_usage()
    check_argv(argv, also=lambda cfg: check_layers_used(cfg.attn, cfg.model.n_layers))
    multirun = any(a in ("-m", "--multirun") for a in argv)
    run_dirs = [a.split("=", 1)[1] for a in argv if a.startswith("run_dir=")]
    if run_dirs and not multirun:  # keep Hydra's own files in the run directory too
        refuse_a_held_run(run_dirs[-1])
        argv.append(f"hydra.run.dir={run_dirs[-1]}")
    elif not multirun and any(a.split("=")[0] in ("-c", "--cfg") for a in argv):
        argv.insert(0, "run_dir=${hydra:run.dir}")  # what a run would use; the job's output dir exists only in a run
    sys.argv = [sys.argv[0], *argv]
    _exit_codes.clear()
    _run_dirs.clear()
    with interrupts_in_one_line(after_an_interrupt):
        _hydra_main()
    if code := max(_exit_codes, default=EXIT_FINISHED):
        sys.exit(code)


if __name__ == "__main__":
    main()
