"""The package's rooms import only downward, and no module imports itself back through another.

Read from the source (every ``import``, at the top of a module or inside a function), so the check
needs no import to succeed and catches a lazy import that would close a circle.
"""

from __future__ import annotations

import ast
import pathlib

import lmzoo

PACKAGE = pathlib.Path(lmzoo.__file__).parent

# The rooms, lowest first: a module may import its own room and the rooms before it, never one after.
# A room is a module or a package (its longest matching name wins).
LAYERS = [
    ["lmzoo.schema", "lmzoo.faults"],  # import nothing of lmzoo
    ["lmzoo.registry", "lmzoo.sharding", "lmzoo.plots", "lmzoo.ops"],
    ["lmzoo.positions", "lmzoo.mixers", "lmzoo.metrics"],
    ["lmzoo.data"],
    ["lmzoo.config"],
    ["lmzoo.model", "lmzoo.cli"],
    ["lmzoo.run"],  # training a run, and opening a trained one
    ["lmzoo.measure"],  # measuring trained runs
    ["lmzoo.experiments"],
    ["lmzoo", "lmzoo.train", "lmzoo.eval", "lmzoo.compare", "lmzoo.generate", "lmzoo.experiments.__main__"],
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
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
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


def test_the_top_level_holds_only_commands_and_shared_modules():
    top = {m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"}
    assert top == {f"lmzoo.{name}" for name in (
        "train", "eval", "compare", "generate",  # the commands (lmzoo.experiments has its own __main__)
        "cli", "config", "schema", "registry", "faults", "plots", "sharding", "positions", "model",
    )}, top
