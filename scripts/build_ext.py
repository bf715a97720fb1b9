"""Build the C extensions declared in pyproject.toml in place, next to their sources.

``pip install -e .`` (scripts/bootstrap.sh) does this for the checkout it installs. A second
checkout of the repository used with ``PYTHONPATH`` (a git worktree running the tests
against a shared virtualenv) has no built extension; this builds it there without touching
the virtualenv:

    .venv/bin/python scripts/build_ext.py

The modules come from ``[[tool.setuptools.ext-modules]]``, so the list lives in one place.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    os.chdir(ROOT)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    # Not optional here: whoever runs this wants to see the compiler's error.
    modules = [Extension(m["name"], sources=list(m["sources"])) for m in declared]
    command = build_ext(Distribution({"ext_modules": modules}))
    command.inplace = True
    command.build_temp = str(ROOT / "build" / "temp-ext")
    command.ensure_finalized()
    command.run()
    for module in modules:
        print(f"built {module.name}: {command.get_ext_fullpath(module.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
