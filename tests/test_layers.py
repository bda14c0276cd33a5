"""The package's layers import downward only, and no module imports itself back through others.

Every module of ``adadamp`` belongs to one layer (``LAYERS``, bottom first); an import of a module
in a higher layer fails the test, as does a module no layer claims (a new module is placed on
purpose) and an import cycle, counting imports inside functions (a deferred import hides a cycle,
it does not remove it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "adadamp"

#: Bottom first.  A module may import its own layer and those below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: records, errors, conventions", (
        "adadamp.exceptions", "adadamp.records", "adadamp.porting", "adadamp.modules", "adadamp.sample_weight",
    )),
    ("wire: what both sides of the connection use", ("adadamp.wire",)),
    ("worker: what runs inside a Dask worker", ("adadamp.worker",)),
    ("dampers: schedules and their clock", ("adadamp.dampers",)),
    ("data: inputs become data sources", ("adadamp.data", "adadamp.inference")),
    ("engine: the fit loop, backends (adadamp.engine.backends), cluster", (
        "adadamp.engine", "adadamp.checkpoint", "adadamp.cluster", "adadamp.embedded", "adadamp.allocator",
    )),
    ("integrations and tools", (
        "adadamp.callbacks", "adadamp.loggers", "adadamp.dashboard", "adadamp.plot", "adadamp.simulate",
    )),
    ("estimators: the scikit-learn contract", (
        "adadamp.estimators", "adadamp.routing", "adadamp.__main__", "adadamp",
    )),
]


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    """The index of the layer that claims ``module`` (the longest prefix wins)."""
    best, depth = -1, -1
    for k, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = k, len(prefix)
    return best


def imports(module: str) -> set[str]:
    """The ``adadamp`` modules ``module`` imports, wherever the import statement is."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "adadamp"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] + ([node.module] if node.module else [])
                target = ".".join(base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "adadamp":
                continue
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
    found.discard(module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_is_in_a_layer():
    assert [m for m in MODULES if layer_of(m) < 0] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_its_layer_and_those_below_only(module):
    mine = layer_of(module)
    upward = sorted(f"{t} ({LAYERS[layer_of(t)][0]})" for t in GRAPH[module] if layer_of(t) > mine)
    assert upward == [], f"{module} ({LAYERS[mine][0]}) imports from above"


def test_no_import_cycle():
    """Tarjan's strongly connected components over the import graph: every one is a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    # ``adadamp`` itself names its submodules lazily (PEP 562): that is no import at load time
    assert [c for c in cycles if c != ["adadamp"]] == []


def test_the_layers_catch_an_upward_import():
    """The check itself: the dampers' simulation once imported the engine's sampler."""
    assert layer_of("adadamp.engine.loop") > layer_of("adadamp.dampers.simulation")
    assert layer_of("adadamp.worker.gradient") < layer_of("adadamp.engine.backends.parameter_server")
    assert layer_of("adadamp.dampers.epoch") < layer_of("adadamp.engine.backends.base")  # the shared epoch loop
