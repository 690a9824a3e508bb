"""Command-line front door: check Hydra overrides before Hydra runs, so mistakes cost one line.

Hydra reports bad overrides as multi-line messages from deep inside its composition. We compose
each requested configuration ourselves first (every combination of a sweep), validate it against
the structured schema, and turn any problem into ``lmzoo: error: <one line>`` with exit code 2.
"""

from __future__ import annotations

import itertools
import os
import sys
from contextlib import contextmanager
from typing import NoReturn

from omegaconf import OmegaConf

from lmzoo.config import CONFIG_DIR, Config, ConfigError, explain, register_schemas, validate, variant_names
from lmzoo.faults import EXIT_CONFIG, RunFault, debugging

MAX_CHECKED_COMBINATIONS = 256
_HYDRA_FLAGS_WITH_VALUES = ("-cp", "-cn", "-cd", "--config-path", "--config-name", "--config-dir")
_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-i", "--info", "-c", "--cfg", "--resolve", "--version", "--shell-completion", "-sc")


def fail(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    print(f"lmzoo: error: {message}", file=sys.stderr)
    sys.exit(code)


@contextmanager
def errors_in_one_line():
    """A command's body: a ConfigError or RunFault ends it with its one line and exit code
    (``LMZOO_DEBUG=1`` lets a RunFault's traceback through)."""
    try:
        yield
    except ConfigError as e:
        fail(str(e))
    except RunFault as e:
        if debugging():
            raise
        fail(str(e), e.exit_code)


def group_options(group: str) -> list[str]:
    folder = os.path.join(CONFIG_DIR, group)
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml"))


def config_groups() -> list[str]:
    return sorted(d for d in os.listdir(CONFIG_DIR) if d != "hydra" and os.path.isdir(os.path.join(CONFIG_DIR, d)))


def check_argv(argv: list[str], *, config_name: str = "train", require_attn: bool = True) -> None:
    """Exit with one line on stderr if any configuration these overrides describe is invalid."""
    if any(a.split("=")[0] in _INFO_FLAGS + _HYDRA_FLAGS_WITH_VALUES for a in argv):
        return  # Hydra's own information commands and custom config locations: Hydra knows best
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    except HydraException as e:
        fail(str(e).strip().splitlines()[0])
    ours = [o for o in overrides if not o.key_or_group.startswith("hydra")]
    if require_attn and not any(o.key_or_group == "attn" for o in ours):
        fail(f"no attention variant given: add +attn=<name> (available: {', '.join(variant_names())})")
    for o in ours:
        if o.key_or_group in config_groups() and not o.is_delete():
            _check_group_choice(o)
    for combination in itertools.islice(_combinations(ours), MAX_CHECKED_COMBINATIONS):
        compose_and_validate(combination, config_name=config_name)


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
