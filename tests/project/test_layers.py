"""The package's layers import downward only, and no module imports itself back through others.

The layer map is the folder tree: every room of ``adadamp`` (a package folder under it, or a module
at its root) is named in exactly one layer (``LAYERS``, bottom first), and every module belongs to
its room's layer.  An import of a module in a higher layer fails the test, as does a module in a
room no layer names (a new root module or package is placed on purpose: there is no fallback) and
an import cycle, counting imports inside functions (a deferred import hides a cycle, it does not
remove it).  The house's size is bounded too: rooms, arrows between them, modules at the root.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "adadamp"

#: Bottom first: (what the layer holds, its rooms).  A module may import its own layer and those below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: records, errors, conventions", (
        "exceptions", "records", "porting", "modules", "sample_weight", "_min_dependencies",
    )),
    ("wire: what both sides of the connection use", ("wire",)),
    ("worker: what runs inside a Dask worker", ("worker",)),
    ("dampers: schedules and their clock", ("dampers",)),
    ("data: inputs become data sources", ("data",)),
    ("cluster: its size, the allocator, the embedded cluster, clients", ("cluster",)),
    ("engine: the fit loop, its backends and checkpoints", ("engine", "checkpoint")),
    ("what a user watches, and tools", ("callbacks", "dashboard", "plot", "simulate")),
    ("estimators: the scikit-learn face", ("estimators", "__main__", "__init__")),
]

#: The bounds of the drawn house (rooms: packages and sub-packages, and the modules at the root).
MAX_ROOMS, MAX_ARROWS, MAX_ROOT_MODULES = 22, 65, 10


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room_of(module: str) -> str:
    """The folder tree's top room of ``module``: ``wire`` for ``adadamp.wire.shm``, ``__init__`` for
    ``adadamp`` itself, ``records`` for ``adadamp.records``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(module: str, layers=LAYERS) -> int:
    """The index of the layer that names ``module``'s room, or -1 where none does."""
    room = room_of(module)
    found = [k for k, (_, rooms) in enumerate(layers) if room in rooms]
    assert len(found) <= 1, f"{room} is named in {len(found)} layers"
    return found[0] if found else -1


def unplaced(modules, layers=LAYERS) -> list[str]:
    return [m for m in modules if layer_of(m, layers) < 0]


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
    assert unplaced(MODULES) == []


def test_a_module_in_no_declared_layer_fails():
    """The check itself: a new root module, or a module of a new package, is in no layer until one names it."""
    assert unplaced([*MODULES, "adadamp.newcomer", "adadamp.newpackage.part"]) == ["adadamp.newcomer", "adadamp.newpackage.part"]
    assert unplaced(["adadamp.newcomer"], [*LAYERS, ("new", ("newcomer",))]) == []


def test_every_layer_names_rooms_that_exist():
    rooms = {room_of(m) for m in MODULES}
    assert sorted(r for _, names in LAYERS for r in names if r not in rooms) == []


def rooms() -> dict[str, str]:
    """Module -> its room as drawn: its package (sub-packages are rooms of their own), or itself at the root."""
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    drawn = {}
    for m, p in MODULES.items():
        if p.name == "__init__.py" or m.count(".") == 1 and m not in packages:
            drawn[m] = m
        else:
            drawn[m] = m.rsplit(".", 1)[0]
    return drawn


def test_the_house_stays_small():
    drawn = rooms()
    arrows = {(drawn[m], drawn[t]) for m, targets in GRAPH.items() for t in targets if t in drawn and drawn[m] != drawn[t]}
    root = [m for m, p in MODULES.items() if p.parent == PACKAGE]
    assert len(set(drawn.values())) <= MAX_ROOMS, sorted(set(drawn.values()))
    assert len(arrows) <= MAX_ARROWS, sorted(arrows)
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)


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
    assert layer_of("adadamp.estimators.fitting") > layer_of("adadamp.cluster.policy") > layer_of("adadamp.data.convert")
    assert layer_of("adadamp.worker.gradient") < layer_of("adadamp.engine.backends.parameter_server")
    assert layer_of("adadamp.dampers.epoch") < layer_of("adadamp.engine.backends.base")  # the shared epoch loop
