"""``lmzoo.ops.MIXER_OPS`` (the ops each mixer computes with), checked against the mixers' source: never stale."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import lmzoo.mixers
import lmzoo.ops
from lmzoo import registry
from lmzoo.mixers.base import Mixer
from lmzoo.ops import MIXER_OPS
from lmzoo.record.migrate import OP_METHODS_RENAMED

MIXERS = pathlib.Path(lmzoo.mixers.__file__).parent
SHARED = {"common", "kernels", "pallas"}  # pieces every op shares, not an op of their own


def mixer_modules() -> list[str]:
    """Every mixer module by its name under lmzoo.mixers (``family.<name>`` for a family base)."""
    paths = sorted(MIXERS.glob("*.py")) + sorted((MIXERS / "family").glob("*.py"))
    names = [".".join(p.relative_to(MIXERS).with_suffix("").parts) for p in paths]
    return [n for n in names if n.rpartition(".")[2] not in ("__init__", "base")]


def op_module(module: str, name: str) -> str:
    """The lmzoo/ops module that ``from <module> import <name>`` reaches (names the package re-exports included)."""
    if module != "lmzoo.ops":
        return module.removeprefix("lmzoo.ops.").split(".")[0]
    found = getattr(lmzoo.ops, name)
    owner = found.__name__ if inspect.ismodule(found) else found.__module__
    return owner.removeprefix("lmzoo.ops.").split(".")[0]


def imported_ops(mixer: str) -> set[str]:
    """The op modules a mixer module imports (anywhere in its source), the shared pieces left out."""
    found = set()
    for node in ast.walk(ast.parse((MIXERS / (mixer.replace(".", "/") + ".py")).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lmzoo.ops"):
            found |= {op_module(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {op_module(a.name, "") for a in node.names if a.name.startswith("lmzoo.ops.")}
    return found - SHARED


def family_bases(mixer: str) -> set[str]:
    """The family modules (``family.<name>``) of the mixers a mixer module defines or builds: each mixer class's
    nearest class in a family module, itself included (deltanet builds the delta family's mixer as it is)."""
    module = importlib.import_module(f"lmzoo.mixers.{mixer}")
    bases = set()
    for _, cls in inspect.getmembers(module, inspect.isclass):
        family = [c.__module__ for c in cls.__mro__ if issubclass(cls, Mixer)
                  and c.__module__.startswith("lmzoo.mixers.family.")]
        bases |= {family[0].removeprefix("lmzoo.mixers.")} if family else set()
    return bases


def computes_with(mixer: str) -> set[str]:
    """The ops a mixer module imports, or where it imports none, those of the family bases its mixers extend."""
    own = imported_ops(mixer)
    if own or mixer.startswith("family."):
        return own
    return set().union(*(imported_ops(family) for family in family_bases(mixer)))


def test_the_table_names_every_mixer_module_once():
    missing, gone = set(mixer_modules()) - set(MIXER_OPS), set(MIXER_OPS) - set(mixer_modules())
    assert not missing and not gone, f"lmzoo.ops.MIXER_OPS lacks {sorted(missing)}, names no module {sorted(gone)}"


def test_every_registered_mixer_is_its_module():
    """A registered name is the module's name, so the table's keys are the names configs select."""
    assert set(registry.names()) <= set(MIXER_OPS)


def test_the_table_is_what_the_mixers_import():
    stale = {m: (sorted(MIXER_OPS[m]), sorted(computes_with(m))) for m in mixer_modules()
             if set(MIXER_OPS[m]) != computes_with(m)}
    assert not stale, "lmzoo.ops.MIXER_OPS is stale (the table, the imports): " + repr(stale)


def test_the_table_names_only_ops():
    ops = {p.stem for p in pathlib.Path(lmzoo.ops.__file__).parent.glob("*.py")} - SHARED - {"__init__"}
    assert set().union(*map(set, MIXER_OPS.values())) <= ops


# ----------------------------------------------------------------------------- one-token decoding: STEP_FORM

FORM_WORDS = {"naive", "parallel", "chunk", "chunk_recompute", "blocked", "scan", "assoc", "fft", "gather", "pallas"}


def step_forms() -> dict[str, str]:
    """Every op module's ``STEP_FORM`` (the form mixers decode one token with), by module name."""
    modules = {p.stem: importlib.import_module(f"lmzoo.ops.{p.stem}")
               for p in pathlib.Path(lmzoo.ops.__file__).parent.glob("*.py") if p.stem != "__init__"}
    return {name: m.STEP_FORM for name, m in modules.items() if hasattr(m, "STEP_FORM")}


def test_each_step_form_is_one_of_its_ops_forms_by_its_current_name():
    for name, form in step_forms().items():
        forms = importlib.import_module(f"lmzoo.ops.{name}").METHODS
        old_names = OP_METHODS_RENAMED.get(name, {})
        assert form in forms and form not in old_names, f"ops.{name}: STEP_FORM={form!r}, forms {forms}"


def test_no_mixer_step_names_a_form_itself():
    """A mixer's ``step`` takes its form from the op (``STEP_FORM``, or a family's ``step_form``), so decoding
    has one name across the families and a form is written in one place."""
    written = []
    for mixer in mixer_modules():
        tree = ast.parse((MIXERS / (mixer.replace(".", "/") + ".py")).read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "step"):
            written += [f"{mixer}.step: {c.value!r}" for c in ast.walk(fn)
                        if isinstance(c, ast.Constant) and c.value in FORM_WORDS]
    assert not written, "\n".join(written)


def test_a_family_mixer_decodes_with_the_form_its_op_names():
    """``step_form`` (the family bases' class attribute; a variant on another op sets its own) is the STEP_FORM
    of the ops ``MIXER_OPS`` gives the module that defines the class."""
    forms, wrong = step_forms(), []
    for mixer in mixer_modules():
        module = importlib.import_module(f"lmzoo.mixers.{mixer}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not hasattr(cls, "step_form"):
                continue
            wrong += [f"{cls.__name__}.step_form={cls.step_form!r}, ops.{op}.STEP_FORM={forms[op]!r}"
                      for op in MIXER_OPS[mixer] if op in forms and forms[op] != cls.step_form]
    assert not wrong, "\n".join(wrong)
