"""The package's layers, checked from its source (docs/ARCHITECTURE.md, the map).

* the core imports neither Airflow nor PySpark, anywhere (lazy imports included);
* storage, the bottom of the core, imports nothing of the protocol built on it;
* the sinks never read the transaction log (the pipeline passes its answer in the request);
* the core's folders are layered: ``state/`` imports nothing of ``protocol/`` or ``ops/``,
  ``protocol/`` nothing of ``ops/``, and the foundation (errors, config, codec, layout,
  models) none of them;
* no two modules import each other, directly or round a longer cycle (lazy and
  ``TYPE_CHECKING`` imports included: a cycle hidden in a function is still a cycle);
* every module imports on its own, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "airflow_seatunnel_ckpt"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: The parts of the core built on storage, which storage must not know about.
PROTOCOL = ("protocol", "state", "ops", "store")

#: The folders of the core, bottom up: a folder imports nothing of the folders above it.
#: (The top-level foundation -- errors, config, codec, layout, models -- imports none of them.)
FOLDERS = ("state", "protocol", "ops")
FOUNDATION = ("errors", "config", "codec", "layout", "models")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


MODULES = modules()
PACKAGES = {module_name(p) for p in ROOT.rglob("__init__.py")}


def imported(path: Path) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports (absolute names), with the line, wherever the import is."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield (full if full in MODULES else node.module), node.lineno


def test_the_core_imports_neither_airflow_nor_pyspark() -> None:
    offenders = [
        f"{name}:{line} imports {target}"
        for name, path in MODULES.items() if name.startswith(f"{PACKAGE}.core")
        for target, line in imported(path) if target.split(".")[0] in ("airflow", "pyspark")
    ]
    assert offenders == []


def test_sinks_never_read_the_transaction_log() -> None:
    """A sink is told what the log says (``SinkCommit.log_holds``); it never opens the log itself."""
    log = (f"{PACKAGE}.core.protocol.txlog", f"{PACKAGE}.core.protocol.settled")
    sinks = [n for n in MODULES if n.startswith(f"{PACKAGE}.core.sinks")]
    assert sinks, "no sink module found"
    offenders = [f"{name}:{line} imports {target}" for name in sinks for target, line in imported(MODULES[name])
                 if any(target == m or target.startswith(m + ".") for m in log)]
    assert offenders == []


def test_storage_imports_nothing_of_the_protocol() -> None:
    protocol = {f"{PACKAGE}.core.{m}" for m in PROTOCOL}
    storage = [n for n in MODULES if n == f"{PACKAGE}.core.storage" or n.startswith(f"{PACKAGE}.core.storage.")]
    assert storage, "no storage module found"
    offenders = [
        f"{name}:{line} imports {target}"
        for name in storage for target, line in imported(MODULES[name])
        if any(target == p or target.startswith(p + ".") for p in protocol)
    ]
    assert offenders == []


def test_no_module_imports_itself_round_a_cycle() -> None:
    # Package ``__init__`` modules only gather names for users; an edge is to the module
    # that defines what is imported.
    graph = {
        name: {t for t, _ in imported(path) if t in MODULES and t not in PACKAGES and t != name}
        for name, path in MODULES.items() if name not in PACKAGES
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.timeout(300)
def test_every_module_imports_on_its_own() -> None:
    script = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m == "airflow_seatunnel_ckpt" or m.startswith("airflow_seatunnel_ckpt.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""
    names = sorted(MODULES)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(names)], capture_output=True, text=True,
                          cwd=ROOT.parent, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{k}:\n{v}" for k, v in failed.items())


def _imports_of_folders(importer: str, folders: tuple[str, ...]) -> list[str]:
    """``importer:line imports target`` for each import by ``core.<importer>`` of ``core.<folders>``."""
    core = f"{PACKAGE}.core"
    own = [n for n in MODULES if n == f"{core}.{importer}" or n.startswith(f"{core}.{importer}.")]
    assert own, f"no module found for core.{importer}"
    return [
        f"{name}:{line} imports {target}"
        for name in own for target, line in imported(MODULES[name])
        if any(target == f"{core}.{f}" or target.startswith(f"{core}.{f}.") for f in folders)
    ]


@pytest.mark.parametrize("folder", FOLDERS[:-1])
def test_a_core_folder_imports_nothing_of_the_folders_above_it(folder: str) -> None:
    above = FOLDERS[FOLDERS.index(folder) + 1:]
    assert _imports_of_folders(folder, above) == []


@pytest.mark.parametrize("module", FOUNDATION)
def test_the_core_foundation_imports_none_of_the_core_folders(module: str) -> None:
    assert _imports_of_folders(module, FOLDERS) == []
