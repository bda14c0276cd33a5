"""The package's house rules on size: no module of ``adadamp`` longer than ``MAX_LINES`` lines, no

A module that grows past it is split along a concept (one concept per module, each with a
docstring saying why it exists), not cut at a line count.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "adadamp"
MAX_LINES = 600


def test_no_module_is_longer_than_the_bound():
    lengths = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(lengths) > 50
    over = {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each along a concept): {over}"


#: The most lines of code (no blank lines, comments or docstring) of one function of ``adadamp``.
MAX_FUNCTION_LINES = 60


def _code_lines(source: list[str], node) -> int:
    body = node.body
    first = body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    start = first.end_lineno + 1 if docstring and len(body) > 1 else first.lineno
    return sum(1 for line in source[start - 1: node.end_lineno] if line.strip() and not line.strip().startswith("#"))


def test_no_function_is_longer_than_the_bound():
    over = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        source = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _code_lines(source, node) > MAX_FUNCTION_LINES:
                over[f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"] = _code_lines(source, node)
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines of code (split each into named steps): {over}"


#: What users imported from the last release, by the path they used; each still imports (docs/changelog.rst
#: lists the paths that moved).
PUBLIC_PATHS = [
    ("adadamp", "DaskClassifier"), ("adadamp", "DaskRegressor"), ("adadamp", "TensorBoard"), ("adadamp", "MLflowLogger"),
    ("adadamp", "close_embedded_cluster"), ("adadamp", "auto_requeue"), ("adadamp", "StopTraining"),
    ("adadamp.estimators", "DaskClassifier"), ("adadamp.estimators", "BaseDaskEstimator"),
    ("adadamp.callbacks", "Callback"), ("adadamp.callbacks", "EarlyStopping"), ("adadamp.callbacks", "Checkpoint"),
    ("adadamp.callbacks", "ProgressBar"), ("adadamp.callbacks", "LRScheduler"), ("adadamp.callbacks", "StopTraining"),
    ("adadamp.cluster", "ClusterPolicy"), ("adadamp.cluster", "ensure_plugin"), ("adadamp.cluster", "heal"),
    ("adadamp.cluster", "embedded_cluster"), ("adadamp.cluster", "close_embedded_cluster"),
    ("adadamp.dashboard", "routes"), ("adadamp.dashboard", "PageRoutes"), ("adadamp.dashboard", "CSP"),
    ("adadamp.dashboard", "Publisher"), ("adadamp.dashboard", "serve"),
    ("adadamp.dampers", "GeoDamp"), ("adadamp.checkpoint", "save"), ("adadamp.plot", "plot_history"),
]


def test_the_last_releases_public_paths_still_import():
    missing = [f"{m}.{n}" for m, n in PUBLIC_PATHS if not hasattr(importlib.import_module(m), n)]
    assert missing == []
