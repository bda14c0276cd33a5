"""The minimum versions are named once (adadamp/_min_dependencies.py), and setup.cfg, the installation
page and CI's minimums job agree with it; on that job, the installed versions are those minimums."""

import configparser
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from adadamp import _min_dependencies as md

ROOT = Path(__file__).resolve().parents[2]


def _setup_cfg() -> configparser.ConfigParser:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return setup


def _install_table() -> dict[str, str]:
    """Dependency -> minimum version, from the table of docs/install.rst's "Minimum versions"."""
    text = (ROOT / "docs" / "install.rst").read_text()
    section = text.split("Minimum versions\n----------------\n", 1)[1]
    rows = section.split("Dependency")[1].split("\n")
    table = {}
    for line in rows[2:]:  # after the header's rule
        if line.startswith("==="):
            break
        name, minimum = line.split()
        table[name] = minimum
    return table


def test_setup_cfg_requires_the_minimums():
    setup = _setup_cfg()
    declared = {}
    for line in setup["options"]["install_requires"].strip().splitlines():
        req = Requirement(line.strip())
        (spec,) = req.specifier  # one lower bound each
        assert spec.operator == ">=", line
        declared[req.name] = (Version(spec.version), ",".join(sorted(req.extras)))
    expected = {name: (Version(v), extras) for name, (v, extras, _) in md.dependent_packages.items()}
    assert declared == expected
    assert setup["options"]["python_requires"].strip() == f">={md.PYTHON_MIN_VERSION}"


def test_the_installation_page_names_the_minimums():
    table = _install_table()
    assert table.pop("Python") == md.PYTHON_MIN_VERSION
    assert {k: Version(v) for k, v in table.items()} == {k: Version(v) for k, (v, _, _) in md.dependent_packages.items()}
    install = (ROOT / "docs" / "install.rst").read_text()
    for name, (tested, _) in md.TESTED_INSTEAD.items():  # the page says what CI installs instead
        assert re.search(rf"{name}\s+{re.escape(tested)}", install), (name, tested)


def test_the_pins_are_the_minimums_and_ci_installs_them():
    out = subprocess.run(
        [sys.executable, "-m", "adadamp._min_dependencies"], capture_output=True, text=True, check=True
    ).stdout
    pins = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert pins == md.pins()
    for pin in pins:
        req = Requirement(pin)
        (spec,) = req.specifier
        assert spec.operator == "=="
        assert Version(spec.version) >= Version(md.dependent_packages[req.name][0])
    constraints = subprocess.run(
        [sys.executable, "-m", "adadamp._min_dependencies", "--constraints"], capture_output=True, text=True,
        check=True,
    ).stdout
    assert "[" not in constraints  # pip's constraint files take no extras
    script = (ROOT / ".ci" / "minimums").read_text()
    assert "adadamp/_min_dependencies.py" in script and "tests/minimums.txt" in script
    assert "bash .ci/minimums" in (ROOT / ".ci" / "run").read_text()


def test_the_subset_lists_only_tests_that_exist():
    """pytest refuses an id it cannot find; the files, at least, are checked here without running them."""
    ids = [line.strip() for line in (ROOT / "tests" / "minimums.txt").read_text().splitlines()]
    ids = [i for i in ids if i and not i.startswith("#")]
    assert len(ids) >= 20
    for node in ids:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        if name:
            func = name.split("[")[0]
            assert re.search(rf"^def {func}\(", (ROOT / path).read_text(), re.MULTILINE), node


@pytest.mark.skipif(not os.environ.get("ADADAMP_MIN_DEPENDENCIES"), reason="only in CI's minimums job (.ci/minimums)")
def test_the_installed_versions_are_the_minimums():
    installed = {name: Version(version(name)) for name in md.dependent_packages}
    wanted = {name: Version(md.tested_version(name)) for name in md.dependent_packages}
    # a local version label (torch's "+cpu") is no other release
    assert {n: Version(v.public) for n, v in installed.items()} == wanted
