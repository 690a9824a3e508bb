"""The package's rooms import only downward, and no module imports itself back through another.

Read from the source (every ``import``, at the top of a module or inside a function), so the check
needs no import to succeed and catches a lazy import that would close a circle.
"""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap

import lmzoo

PACKAGE = pathlib.Path(lmzoo.__file__).parent

# The rooms, lowest first: a module may import its own room and the rooms before it, never one after.
# A room is a module or a package (its longest matching name wins).
LAYERS = [
    ["lmzoo.schema", "lmzoo.faults", "lmzoo.stats"],  # import nothing of lmzoo (stats: only itself)
    ["lmzoo.registry", "lmzoo.sharding", "lmzoo.plots", "lmzoo.ops",
     "lmzoo.record.migrate"],  # old run directories read as today's: lmzoo.config uses it
    ["lmzoo.positions", "lmzoo.mixers"],
    ["lmzoo.data"],
    ["lmzoo.scoring"],  # above the data: a source's validation is scored by the trainer's scorer, passed in
    ["lmzoo.config"],
    ["lmzoo.model", "lmzoo.cli"],
    ["lmzoo.record"],  # a run on disk: its directory, checkpoints, opening a trained run, resume checks, tracking
    ["lmzoo.run"],  # training a run
    ["lmzoo.measure"],  # measuring trained runs
    ["lmzoo.experiments", "lmzoo.interop"],  # interop: models out of lmzoo and into it
    ["lmzoo", "lmzoo.train", "lmzoo.eval", "lmzoo.compare", "lmzoo.generate", "lmzoo.experiments.__main__",
     "lmzoo.export", "lmzoo.lm_eval"],
]
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def room(module: str) -> str:
    return max((r for r in RANK if module == r or module.startswith(r + ".")), key=len)


def owner(name: str) -> str:
    """The module that defines ``name`` (a module, or a name inside one)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> set[str]:
    """The lmzoo modules ``module`` imports, anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {owner(n) for n in names if n.split(".")[0] == "lmzoo"}
    return found - {module}


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_room():
    assert all(room(m) for m in MODULES)


def test_nothing_imports_upward():
    upward = [f"{m} ({room(m)}) imports {i} ({room(i)})"
              for m, found in GRAPH.items() for i in found if RANK[room(i)] > RANK[room(m)]]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    """Depth-first over the modules: a module met again while it is still open closes a circle."""
    done, open_, cycles = set(), [], []

    def visit(m: str) -> None:
        if m in open_:
            cycles.append(" -> ".join(open_[open_.index(m):] + [m]))
            return
        if m in done:
            return
        open_.append(m)
        for i in sorted(GRAPH[m]):
            visit(i)
        open_.pop()
        done.add(m)

    for m in sorted(GRAPH):
        visit(m)
    assert not cycles, "\n".join(cycles)


def test_schema_and_faults_import_nothing_of_lmzoo():
    assert not GRAPH["lmzoo.schema"] and not GRAPH["lmzoo.faults"]


def test_config_imports_nothing_of_the_data():
    """The config validates against the registered specs; it never reaches into lmzoo.data (an old run's data config
    is translated by lmzoo.record.migrate)."""
    assert not {i for i in GRAPH["lmzoo.config"] if room(i) == "lmzoo.data"}


def test_stats_imports_nothing_of_lmzoo_but_itself():
    outside = {f"{m} imports {i}" for m in GRAPH if room(m) == "lmzoo.stats" for i in GRAPH[m]
               if room(i) != "lmzoo.stats"}
    assert not outside, "\n".join(sorted(outside))


def test_stats_is_numpy_and_scipy_only():
    """No module of lmzoo.stats imports JAX, Flax or Optax (anywhere in its source): statistics run without them."""
    model_side = {"jax", "jaxlib", "flax", "optax"}
    found = []
    for m in (m for m in MODULES if room(m) == "lmzoo.stats"):
        for node in ast.walk(ast.parse(MODULES[m].read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{m} imports {n}" for n in names if n.split(".")[0] in model_side]
    assert not found, "\n".join(found)


def test_the_top_level_holds_only_commands_and_shared_modules():
    top = {m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"}
    assert top == {f"lmzoo.{name}" for name in (
        # the commands (lmzoo.experiments has its own __main__)
        "train", "eval", "compare", "generate", "export", "lm_eval",
        "cli", "config", "schema", "registry", "faults", "plots", "sharding", "positions", "model",
    )}, top


# ----------------------------------------------------------------------------- README's Layout, from the docstrings

README = PACKAGE.parent / "README.md"
BEGIN, END = "<!-- layout begin (tests/test_layout.py writes it) -->", "<!-- layout end -->"
# What README's Layout shows, top down: the commands, the stages of a run (each room's files only for run/ and
# record/, the stages this layout is built around), the model side, the shared bases.
# Each lmzoo entry is described by the first paragraph of its docstring; the others here.
SHOWN = [
    ("configs/", "Hydra configs: train.yaml and groups attn/ model/ data/ optim/ pos/ eval/ hydra/launcher/"),
    "train.py", "eval.py", "compare.py", "generate.py", "export.py", "lm_eval.py", "experiments/", "interop/",
    "run/", "run/loop.py", "run/base.py", "run/steps.py", "run/optim.py", "run/logger.py",
    "record/", "record/directory.py", "record/checkpoints.py", "record/opening.py", "record/resuming.py",
    "record/migrate.py",
    "measure/", "scoring/", "stats/", "data/", "model.py", "mixers/", "ops/",
    "positions.py", "sharding.py", "config.py", "schema.py", "registry.py", "cli.py", "faults.py", "plots.py",
    ("scripts/", ("Thin tools around the package: kernel and training benchmarks (figures in docs/benchmarks.md), "
                 "plots of metrics, the CPU recipe, SLURM, the GPU calls (wheels, offline install, CPU rehearsal)")),
    ("tests/", ("Tests (pytest), one folder per room (ops/ mixers/ run/ record/ measure/ scoring/ stats/ data/ "
               "experiments/), CPU only by default; shared helpers in conftest.py")),
]
WIDTH, COLUMN = 120, 28


def summary(entry: str) -> str:
    """The first paragraph of the docstring of ``lmzoo/<entry>`` on one line; a command as ``python -m`` and its job."""
    path = PACKAGE / entry / "__init__.py" if entry.endswith("/") else PACKAGE / entry
    first = " ".join(ast.get_docstring(ast.parse(path.read_text())).split("\n\n")[0].split())
    command = re.fullmatch(r"``python -m (lmzoo[\w.]*)[^`]*``: (.*)", first)
    text = f"python -m {command[1]}: {command[2]}" if command else first
    return text.replace("``", "").rstrip(".")


def layout() -> str:
    """README's Layout block."""
    lines = []
    for entry in SHOWN:
        name, text = entry if isinstance(entry, tuple) else (f"lmzoo/{entry}", summary(entry))
        wrapped = textwrap.wrap(text, WIDTH - COLUMN)
        lines.append(f"{name:<{COLUMN}}{wrapped[0]}")
        lines += [" " * COLUMN + more for more in wrapped[1:]]
    return "\n".join([BEGIN, "```", *lines, "```", END])


def readme_layout() -> str:
    text = README.read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


def test_every_room_is_shown_in_the_layout():
    shown = {e for e in SHOWN if isinstance(e, str)}
    top = {p.name + ("/" if p.is_dir() else "") for p in PACKAGE.iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert top <= shown, top - shown


def test_readme_layout_is_the_docstrings():
    assert readme_layout() == layout(), "README's Layout is stale: python tests/test_layout.py rewrites it"


if __name__ == "__main__":  # rewrite README's Layout from the docstrings
    README.write_text(README.read_text().replace(readme_layout(), layout()))
