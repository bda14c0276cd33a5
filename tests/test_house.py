"""The package's house rule on size: no module of ``adadamp`` is longer than ``MAX_LINES`` lines.

A module that grows past it is split along a concept (one concept per module, each with a
docstring saying why it exists), not cut at a line count.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "adadamp"
MAX_LINES = 600


def test_no_module_is_longer_than_the_bound():
    lengths = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(lengths) > 50
    over = {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each along a concept): {over}"
