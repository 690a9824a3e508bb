"""The grammar every command shares: ``key=value`` arguments, ``--help``, one-line errors, exit codes.

Every command (``lmzoo.train``, ``eval``, ``generate``, ``compare``, ``experiments``, ``lm_eval``, ``export``)
takes settings as ``key=value`` (``group=option`` picks a config file of a group, as ``pos=ntk``), lists them
with ``-h``/``--help`` (key, default, one line each; exit 0), and ends any mistake with
``lmzoo: error: <one line>`` and an exit code of ``lmzoo.faults`` (2 for a bad setting).

Training's settings are Hydra's composed config. Every other command's are a dataclass, read by
``parse_settings``: its fields are the keys, their defaults and trailing comments its ``--help``
(``schema_options``), and the values are checked against the fields' types.

Training's overrides are also checked before Hydra runs: Hydra reports bad overrides as multi-line
messages from deep inside its composition, so each requested configuration (every combination of a
sweep) is composed and validated here first.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
import os
import re
import signal
import sys
import threading
import types
import typing
from contextlib import contextmanager
from typing import Any, NamedTuple, NoReturn

import yaml
from omegaconf import OmegaConf

from lmzoo.config import (
    CONFIG_DIR, Config, ConfigError, explain, group_options, register_schemas, to_dataclass, validate, variant_names,
)
from lmzoo.faults import (
    EXIT_ABORTED, EXIT_CONFIG, EXIT_FINISHED, EXIT_INTERRUPTED, RunFault, Stopped, debugging, exit_at_once,
    redelivering, unparsable,
)

MAX_CHECKED_COMBINATIONS = 256
NOT_IN_DEFAULTS = ("attn",)  # config groups train.yaml's defaults list leaves out: chosen with +group=option
_HYDRA_FLAGS_WITH_VALUES = ("-cp", "-cn", "-cd", "--config-path", "--config-name", "--config-dir")
_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-i", "--info", "-c", "--cfg", "--resolve", "--version",
               "--shell-completion", "-sc")


def fail(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    print(f"lmzoo: error: {message}", file=sys.stderr)
    sys.exit(code)


@contextmanager
def errors_in_one_line():
    """A command's body: a ConfigError or RunFault ends it with its one line and exit code
    (``LMZOO_DEBUG=1`` lets a RunFault's traceback through); so does a config file that is not YAML."""
    try:
        yield
    except ConfigError as e:
        fail(str(e))
    except yaml.YAMLError as e:
        if debugging():
            raise
        fault = unparsable(e)
        fail(str(fault), fault.exit_code)
    except RunFault as e:
        if debugging():
            raise
        fail(str(e), e.exit_code)


@contextmanager
def interrupts_in_one_line(after: str):
    """A command's body, stopped by Ctrl-C (exit 130) or SIGTERM (exit 75, the code a requeue waits for) with one
    line: which signal, then ``after`` (what is on disk, how to go on). The process ends at once, as an
    interrupted interpreter tearing down its native threads can crash on the way out. An interrupt that lands where
    Python ignores exceptions (JAX's garbage-collection callback) is sent again, not lost
    (``lmzoo.faults.redelivering``)."""
    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm) if handled else None
    if handled and signal.getsignal(signal.SIGINT) is exit_at_once:  # the command has started: Ctrl-C is now a
        signal.signal(signal.SIGINT, signal.default_int_handler)     # KeyboardInterrupt that it handles
    previous_hook = sys.unraisablehook
    sys.unraisablehook = ours = redelivering(previous_hook)
    try:
        yield
    except KeyboardInterrupt as e:
        if debugging():
            raise
        by, code = ("SIGTERM", EXIT_INTERRUPTED) if isinstance(e, Stopped) else ("Ctrl-C", EXIT_ABORTED)
        print(f"lmzoo: error: stopped by {by}; {after() if callable(after) else after}", file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    finally:
        if sys.unraisablehook is ours:  # a hook the body added on top (a failed restore silencing TensorStore's
            sys.unraisablehook = previous_hook  # late reports) must outlive it: those reports come at exit
        if handled:
            signal.signal(signal.SIGTERM, previous)


def stop_on_sigterm(signum, frame) -> NoReturn:
    raise Stopped


COMPILATION_CACHE = "LMZOO_COMPILATION_CACHE"  # the environment variable naming the folder, or "off"
CACHE_OFF = ("off", "0", "false", "no", "none")
COMPILATION_CACHE_BYTES = 4 * 2**30  # kept at most: beyond it the least recently used programs go


def use_compilation_cache() -> str | None:
    """Keep XLA's compiled programs on disk between runs (JAX's persistent compilation cache), and say where.

    Compiling a training step takes seconds to many minutes on a CPU (by variant and model), and every run of
    the same shapes compiles the same programs again: another seed, a resume, an evaluation. Cached, a later
    run loads them in seconds. The folder is ``$LMZOO_COMPILATION_CACHE``, else ``xla/`` in lmzoo's cache
    folder (``$LMZOO_CACHE``, else ``~/.cache/lmzoo``); ``LMZOO_COMPILATION_CACHE=off`` keeps nothing. JAX's own
    ``JAX_COMPILATION_CACHE_DIR``, where set, wins. It holds at most 4 GiB (the least recently used programs go
    first). A folder that cannot be made gives a warning, not a fault."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    from lmzoo.data.tokenizers import cache_dir

    folder = os.environ.get(COMPILATION_CACHE) or str(cache_dir() / "xla")
    if folder.strip().lower() in CACHE_OFF:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        logging.getLogger("lmzoo").warning("warning: no compilation cache (%s: %s); every run compiles afresh",
                                           folder, e.strerror)
        return None
    import jax

    jax.config.update("jax_compilation_cache_dir", folder)
    if jax.config.jax_compilation_cache_max_size == -1:  # unbounded by default: the least recently used go first
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)
    return folder


@contextmanager
def reader_may_leave():
    """A command whose reader stops reading (``| head``) stops there quietly with exit 0, as the commands of a
    pipeline do, not with a BrokenPipeError traceback. Its stdout then points at /dev/null, so Python's flush at
    exit cannot fail again. (Training writes through ``logging``, which drops a line it cannot write: a run piped to
    ``head`` trains on.)"""
    try:
        yield
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_FINISHED)


def run_command(main, after: str) -> None:
    """What ``python -m lmzoo.<command>`` runs: ``main()`` with warnings as plain lines (``warning: ...``, not
    ``WARNING:lmzoo.x:warning: ...``), XLA's compilation cache on (``use_compilation_cache``), and Ctrl-C or SIGTERM
    in one line saying ``after``."""
    logging.basicConfig(format="%(message)s", level=logging.WARNING, force=True)
    logging.raiseExceptions = False  # a handler on a full disk: no traceback per line
    use_compilation_cache()
    with reader_may_leave(), interrupts_in_one_line(after):
        main()


# ----------------------------------------------------------------------------- arguments and --help


HELP_FLAGS = ("-h", "--help")


class HelpLine(NamedTuple):
    """One line of a command's ``--help``: a setting (``key=default  note``) or an exit code (``code  note``)."""

    key: str
    default: str | None  # None: a line without "=default" (an exit code)
    note: str = ""


def wants_help(argv: list[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in argv)


def show_help(usage: str, summary: str, sections: list[tuple[str, list[HelpLine]]]) -> NoReturn:
    """Print ``usage``, ``summary`` and each section's options (key=default  note), then exit 0."""
    lines = [f"usage: {usage}", "", summary]
    for title, options in sections:
        heads = [o.key if o.default is None else f"{o.key}={o.default}" for o in options]
        width = min(max(map(len, heads), default=0), 36)  # a long default pushes only its own note right
        lines += ["", f"{title}:"] + [f"  {head:<{width}}  {o.note}".rstrip() for head, o in zip(heads, options)]
    print("\n".join(lines))
    sys.exit(0)


def shown_as(placeholder: str, default=None):
    """A settings field whose ``--help`` line reads ``key=<placeholder>`` in place of its default: a setting a
    command requires (its ``check`` says so), or one whose default is worked out when the command runs."""
    return dataclasses.field(default=default, metadata={"shown_as": placeholder})


class Parsed(NamedTuple):
    settings: Any  # an instance of the schema, checked
    others: list[str]  # key=value arguments that are no setting of the schema, for the command to pass on
    paths: list[str]  # arguments that are not key=value, where the command takes paths


def parse_settings(schema: type, argv: list[str], command: str, *, others: bool = False, paths: bool = False,
                   dashes: bool = False, defaults: dict | None = None) -> Parsed:
    """The grammar of every command but train: ``key=value`` arguments as an instance of the dataclass ``schema``.

    A key is a field of ``schema`` (``eval.tokens``: a field of a nested dataclass); with ``others``, a key that
    names no field is left for the command (the overrides of a run's config), otherwise it is refused naming the
    valid keys. A text setting takes its value verbatim (``null`` is None where the field may be None); any other
    is read as YAML and must fit the field's type. ``paths``: an argument without ``=`` (or one that exists as a
    path) is a path; ``dashes``: ``--key value`` and ``--key=value`` are accepted too. ``defaults`` (nested
    values) lie under the arguments. The settings' own ``check()`` runs last. Every mistake is one ConfigError."""
    names = [f.name for f in dataclasses.fields(schema)]
    given, left, found = {}, [], []
    for arg in dashed_as_key_values(argv, names) if dashes else argv:
        if paths and ("=" not in arg or os.path.exists(arg)):
            found.append(arg)
            continue
        key, value = key_value(arg, command)
        if key.split(".")[0] in names:
            set_nested(given, key, typed_value(schema, key, value))
        elif others:
            left.append(arg)
        else:
            raise ConfigError(f"unknown key {key!r} (valid keys: {', '.join(names)})")
    settings = to_dataclass(schema, OmegaConf.merge(OmegaConf.create(defaults or {}), OmegaConf.create(given)))
    if hasattr(settings, "check"):
        settings.check()
    return Parsed(settings, left, found)


def key_value(arg: str, command: str) -> tuple[str, str]:
    key, equals, value = arg.partition("=")
    if not equals or not key.lstrip("+"):
        raise ConfigError(f"could not parse {arg!r}: arguments are key=value (python -m lmzoo.{command} --help "
                          "lists them)")
    return key, value


def dashed_as_key_values(argv: list[str], keys: list[str]) -> list[str]:
    """``--baseline softmax`` and ``--baseline=softmax`` as ``baseline=softmax``, for the keys ``keys``."""
    args, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--"):
            args.append(arg)
            continue
        key, equals, value = arg[2:].partition("=")
        if key not in keys:
            raise ConfigError(f"unknown option {arg!r} (valid keys: {', '.join(keys)}, as key=value or --key value)")
        if not equals:
            if not rest:
                raise ConfigError(f"{arg} needs a value: {arg} <{key}> or {key}=<{key}>")
            value = rest.pop(0)
        args.append(f"{key}={value}")
    return args


def set_nested(tree: dict, key: str, value) -> None:
    *parents, last = key.split(".")
    for name in parents:
        tree = tree.setdefault(name, {})
    tree[last] = value


# What a value of each scalar type must be, and the test of a value read as YAML (a bool is no number).
KINDS = {bool: ("true or false", lambda v: isinstance(v, bool)),
         int: ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
         float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))}


def typed_value(schema: type, key: str, value: str):
    """``value`` as the field ``key`` of ``schema`` takes it; ConfigError naming the key and what it must be."""
    kind, optional = field_type(schema, key)
    if optional and value == "null":
        return None
    if kind is str:
        return value  # verbatim: a prompt keeps its spaces, a tag of digits stays text
    try:
        parsed = OmegaConf.from_dotlist([f"value={value}"]).value
    except Exception as e:  # a malformed list, say: which argument, in one line
        raise ConfigError(f"could not parse {key}={value!r}: {str(e).strip().splitlines()[0]}") from None
    if kind is float and isinstance(parsed, str):
        parsed = as_float(parsed)  # nan and inf are text to YAML: refused as not finite where a number must be
    if kind in KINDS and not KINDS[kind][1](parsed):
        raise ConfigError(f"{key}={value!r} must be {KINDS[kind][0]}{' or null' if optional else ''}")
    return OmegaConf.to_container(parsed) if OmegaConf.is_config(parsed) else parsed


def as_float(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def field_type(schema: type, key: str) -> tuple[Any, bool]:
    """(the type of the field ``key`` names inside ``schema``, whether it may be None); ConfigError naming the valid
    keys where a part of ``key`` is no field."""
    for depth, name in enumerate(key.split(".")):
        fields = {f.name: f for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
        if name not in fields:
            if not fields:  # inside a dict or list setting: the schema says no more
                return Any, False
            raise ConfigError(f"unknown key {key!r} (valid keys{' here' if depth else ''}: {', '.join(fields)})")
        schema = typing.get_type_hints(schema)[name]
    args = typing.get_args(schema)
    optional = typing.get_origin(schema) in (typing.Union, types.UnionType) and type(None) in args
    kind = next((a for a in args if a is not type(None)), Any) if optional else schema
    return kind, optional


def field_notes(schema: type) -> dict[str, str]:
    """Each field's trailing ``# comment`` in the source of ``schema`` (and of its bases): its one-line help."""
    notes = {}
    for cls in reversed(schema.__mro__):
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        module = sys.modules.get(cls.__module__)
        notes.update((name, spelled_out(note, module)) for name, note in trailing_comments(source))
    return notes


def trailing_comments(source: str) -> list[tuple[str, str]]:
    """Each ``name: ... # comment`` line of ``source`` as (name, comment); a comment too long for one line goes on
    in comment-only lines below it whose ``#`` stands in its column, and is joined back into one line."""
    lines, found = source.splitlines(), []
    for i, line in enumerate(lines):
        match = re.match(r"(\s+(\w+)\s*:[^#\n]*)#\s*(.+)$", line)
        if not match:
            continue
        note, column = match[3], len(match[1])
        for more in lines[i + 1:]:
            if not (continued := re.fullmatch(rf" {{{column}}}#\s*(.+)", more)):
                break
            note += " " + continued[1]
        found.append((match[2], note))
    return found


def spelled_out(note: str, module) -> str:
    """A note with each constant of ``module`` it names (``one of KINDS``) replaced by its values."""
    def values(match: re.Match) -> str:
        value = getattr(module, match[0], None)
        is_names = isinstance(value, (tuple, list)) and value and all(isinstance(v, str) for v in value)
        return ", ".join(value) if is_names else match[0]

    return re.sub(r"\b[A-Z][A-Z0-9_]{2,}\b", values, note)


def schema_options(schema: type, prefix: str = "") -> list[HelpLine]:
    """A help line per field of the dataclass ``schema`` (nested dataclasses field by field): its default (or what
    ``shown_as`` puts in its place) and its comment."""
    notes, options = field_notes(schema), []
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            options += schema_options(type(default), f"{prefix}{f.name}.")
        elif not f.name.startswith("_"):
            text = "???" if default is dataclasses.MISSING or default == "???" else shown(default)
            text = f.metadata.get("shown_as", text)
            options.append(HelpLine(f"{prefix}{f.name}", text, notes.get(f.name, "")))
    return options


def group_choices(groups: list[str] | None = None) -> list[HelpLine]:
    """``group=option`` for each config group (or those named), with its options."""
    return [HelpLine(group, "<option>", f"one of: {', '.join(group_options(group))}")
            for group in groups or config_groups()]


RUN_OVERRIDES = [  # what eval and generate may change in a trained run's config (never model: it shapes the parameters)
    HelpLine("pos", "<option>", "a position method of configs/pos/ (e.g. pos=ntk), as in training"),
    HelpLine("pos.<key>", "<value>", "a position setting (python -m lmzoo.train --help lists them)"),
    HelpLine("attn.<key>", "<value>", "a setting of the run's variant that keeps its parameters (e.g. attn.window)"),
    HelpLine("data.<key>", "<value>", "a data setting (e.g. data.document_boundaries=mask)"),
]


def shown(value) -> str:
    """A default as it would be typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(shown(v) for v in value) + "]"
    return str(value)


def with_defaults(options: list[HelpLine], config) -> list[HelpLine]:
    """``options`` with the defaults a composed ``config`` gives them (a config file may change a schema's)."""
    found = []
    for option in options:
        value = OmegaConf.select(config, option.key, default=None, throw_on_resolution_failure=False)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        found.append(option if value is None else option._replace(default=shown(value)))
    return found


def exit_codes(*codes: int) -> list[HelpLine]:
    """The exit codes of ``lmzoo.faults`` (those in ``codes`` where given: what one command can end with), each
    with its comment there."""
    from lmzoo import faults

    found = re.findall(r"^EXIT_\w+ = (\d+)\s*#\s*(.+)$", inspect.getsource(faults), flags=re.MULTILINE)
    return [HelpLine(code, None, note) for code, note in found if not codes or int(code) in codes]


def config_groups() -> list[str]:
    return sorted(d for d in os.listdir(CONFIG_DIR) if d != "hydra" and os.path.isdir(os.path.join(CONFIG_DIR, d)))


def check_argv(argv: list[str], *, config_name: str = "train", require_attn: bool = True, also=None) -> None:
    """Exit with one line on stderr if any configuration these overrides describe is invalid (or fails
    ``also(config)``, a command's own checks)."""
    if any(a.split("=")[0] in _INFO_FLAGS + _HYDRA_FLAGS_WITH_VALUES for a in argv):
        return  # Hydra's own information commands and custom config locations: Hydra knows best
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if bad := [a for a in argv if not a.startswith(("-", "~")) and "=" not in a]:
        fail(f"could not parse {bad[0]!r}: arguments are key=value (python -m lmzoo.train --help lists them)")
    parser = OverridesParser.create()
    try:
        overrides = parser.parse_overrides([a for a in argv if not a.startswith("-")])
    except HydraException as e:
        fail(unparsed_override(parser, [a for a in argv if not a.startswith("-")], e))
    ours = [o for o in overrides if not o.key_or_group.startswith("hydra")]
    for o in ours:
        if o.key_or_group in NOT_IN_DEFAULTS and not o.is_add() and not o.is_delete() and not o.is_force_add():
            fail(f"{o.input_line}: {o.key_or_group} is added with a plus: +{o.input_line} "
                 f"(train.yaml picks no {o.key_or_group} by default)")
    if require_attn and not any(o.key_or_group == "attn" for o in ours):
        fail(f"no attention variant given: add +attn=<name> (available: {', '.join(variant_names())})")
    for o in ours:
        if o.key_or_group in config_groups() and not o.is_delete():
            _check_group_choice(o)
    for combination in itertools.islice(_combinations(ours), MAX_CHECKED_COMBINATIONS):
        cfg = compose_and_validate(combination, config_name=config_name)
        try:
            also and also(cfg)
        except ConfigError as e:
            fail(str(e))


def unparsed_override(parser, args: list[str], error: Exception) -> str:
    """One line for overrides Hydra's grammar refuses: the argument, why, and how to quote its value (Hydra reads
    a value with non-ASCII letters or characters of its grammar only between quotes)."""
    from hydra.errors import HydraException

    for arg in args:
        try:
            parser.parse_overrides([arg])
        except HydraException as e:
            key, _, value = arg.partition("=")
            return (f"could not parse {arg!r} ({str(e).strip().splitlines()[0]}): quote the value for Hydra, "
                    f"as \"{key}='{value}'\" (the double quotes for the shell)")
    return str(error).strip().splitlines()[0]


def _check_group_choice(override) -> None:
    group, options = override.key_or_group, group_options(override.key_or_group)
    values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
    for value in values:
        if value not in options:
            what = "attention variant" if group == "attn" else f"{group} config"
            fail(f"unknown {what} {group}={value!r} (available: {', '.join(options)})")


def _combinations(overrides):
    """Every combination of sweep values, as lists of plain override strings."""
    choices = []
    for o in overrides:
        if not o.is_sweep_override():
            choices.append([o.input_line])
            continue
        try:
            choices.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        except Exception:  # sweeps Hydra only expands itself (e.g. glob): leave those to Hydra
            continue
    return itertools.product(*choices)


def compose_and_validate(overrides: list[str], *, config_name: str = "train") -> Config:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    register_schemas()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        try:
            cfg = compose(config_name, overrides=list(overrides))
        except HydraException as e:
            fail(describe(e))
        except yaml.YAMLError as e:
            fault = unparsable(e)
            fail(str(fault), fault.exit_code)
    if OmegaConf.is_interpolation(cfg, "run_dir"):  # resolved by Hydra only once a run starts
        cfg.run_dir = "."
    try:
        return validate(cfg)
    except ConfigError as e:
        fail(str(e))


def describe(error: Exception) -> str:
    """One line for a Hydra composition error."""
    from omegaconf import errors as oc_errors

    cause = error.__cause__
    if isinstance(cause, oc_errors.OmegaConfBaseException) and cause.full_key:
        return explain(cause)
    return str(error).strip().splitlines()[0]
