"""The lowest version of each dependency that adadamp supports: the one place that names them.

As scikit-learn's ``sklearn/_min_dependencies.py``: ``setup.cfg``'s ``install_requires`` and the
installation page (``docs/install.rst``) name the same versions (``tests/project/test_min_dependencies.py``
checks that the three agree), and CI (``.ci/minimums``) installs exactly these versions in a fresh
environment and runs the subset of the suite listed in ``tests/minimums.txt`` on them.

``python -m adadamp._min_dependencies`` prints the pins CI installs, as pip requirements::

    python -m adadamp._min_dependencies > pins.txt    # dask[array]==2024.1.0, ...
    python -m adadamp._min_dependencies --constraints  # the same without extras (pip -c)

Why each minimum is what it is: ``docs/changelog.rst`` and ``docs/install.rst``.
"""

from __future__ import annotations

import sys

PYTHON_MIN_VERSION = "3.11"

#: package -> (lowest supported version, extras that ``install_requires`` asks for, why this one)
dependent_packages: dict[str, tuple[str, str, str]] = {
    "dask": ("2024.1.0", "array", "the oldest Dask whose release line adadamp was written against"),
    "distributed": ("2024.1.0", "", "same release as dask"),
    "torch": ("2.1", "", "declared; CI tests the CPU wheel of TESTED_INSTEAD"),
    "scikit-learn": ("1.6.0", "", "estimator tags (__sklearn_tags__) and check_estimator's expected_failed_checks"),
    "numpy": ("1.24.0", "", "the first NumPy with wheels for Python 3.11 is 1.23.2; 1.24.0 is tested"),
    "dask-jobqueue": ("0.8.0", "", "HPC clusters (SLURMCluster and friends)"),
    "cloudpickle": ("2.2.0", "", "modules defined in the user's script"),
    "tqdm": ("4.60.0", "", "the progress bar"),
    "bokeh": ("3.1.0", "", "the live training page; distributed's dashboard excludes 3.0"),
    "cryptography": ("3.4", "", "the embedded cluster's TLS (distributed's Security.temporary)"),
}

#: package -> (the version CI's minimums job installs instead of the declared minimum, why)
TESTED_INSTEAD: dict[str, tuple[str, str]] = {
    "torch": (
        "2.13.0",
        (
            "the CPU wheel is the only torch that CI's machine installs without downloading CUDA's "
            "gigabytes; torch 2.1 to 2.12 are declared supported but not tested"
        ),
    ),
}


def requirement(name: str) -> str:
    """``name``'s entry of ``install_requires``: ``name[extras]>=minimum``."""
    version, extras, _ = dependent_packages[name]
    return f"{name}[{extras}]>={version}" if extras else f"{name}>={version}"


def install_requires() -> list[str]:
    """What ``setup.cfg``'s ``install_requires`` asks for (it may spell 2024.1.0 as 2024.1), in this order."""
    return [requirement(name) for name in dependent_packages]


def tested_version(name: str) -> str:
    """The version of ``name`` that CI's minimums job installs."""
    return TESTED_INSTEAD.get(name, dependent_packages[name][:1])[0]


def pins(*, extras: bool = True) -> list[str]:
    """``name==version`` of every dependency at the version CI's minimums job installs (``extras``:
    with ``install_requires``' extras; pip's constraint files take none)."""
    out = []
    for name, (_, extra, _) in dependent_packages.items():
        spelled = f"{name}[{extra}]" if extras and extra else name
        out.append(f"{spelled}=={tested_version(name)}")
    return out


def main(argv: list[str]) -> int:
    if set(argv) - {"--constraints"}:
        print("usage: python -m adadamp._min_dependencies [--constraints]", file=sys.stderr)
        return 2
    for name, (version, why) in TESTED_INSTEAD.items():
        print(f"# {name}: declared >={dependent_packages[name][0]}; CI installs {version} ({why})")
    print("\n".join(pins(extras="--constraints" not in argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
