"""The package's layers, checked from its source (docs/ARCHITECTURE.md, the map).

* the core imports neither Airflow nor PySpark, anywhere (lazy imports included);
* storage, the bottom of the core, imports nothing of the protocol built on it;
* the sinks never read the transaction log (the pipeline passes its answer in the request);
* the core's folders are layered: ``state/`` imports nothing of ``protocol/`` or ``ops/``,
  ``protocol/`` nothing of ``ops/``, and the foundation (errors, config, codec, layout,
  models) none of them;
* no two modules import each other, directly or round a longer cycle (lazy and
  ``TYPE_CHECKING`` imports included: a cycle hidden in a function is still a cycle);
* every module imports on its own, in a fresh interpreter;
* every folder of the package has a row in :data:`LAYERS` (what it must not import), so a
  new folder cannot arrive without a rule: ``spark/`` imports no Airflow, no sensor or
  trigger imports an operator, the hooks import no task, the core's sinks do not read the
  transaction log.
* the core reads no orchestrator's environment and knows no Spark deployment: the
  runtimes (in-process, ``spark-submit``, Connect) are the Airflow side's.
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

#: The folders of the core, bottom up: a folder imports nothing of the folders above it.
#: (The top-level foundation -- errors, config, codec, layout, models -- imports none of them.)
FOLDERS = ("state", "protocol", "ops")
FOUNDATION = ("errors", "config", "codec", "layout", "models")


#: Every folder of the package (``"."`` is its top level) -> what it must not import: package
#: folders (``"spark"`` is ``airflow_seatunnel_ckpt.spark`` and below) or other top-level
#: packages (``"airflow"``). A folder is also bound by the rows of the folders it is in.
_AIRFLOW_SIDE = ("hooks", "operators", "sensors", "triggers", "plugins", "lineage")
LAYERS: dict[str, tuple[str, ...]] = {
    ".": (),
    "core": ("airflow", "pyspark", "spark", *_AIRFLOW_SIDE),
    "core/ops": (),
    "core/protocol": ("core/ops",),
    "core/state": ("core/protocol", "core/ops"),
    "core/storage": ("core/protocol", "core/state", "core/ops", "core/store", "core/sinks", "core/sources"),
    "core/sinks": ("core/ops",),
    "core/sources": ("core/ops",),
    "spark": ("airflow", *_AIRFLOW_SIDE),
    "spark/sinks": (),
    "spark/sources": (),
    "spark/state": (),
    "hooks": ("operators", "sensors", "triggers", "plugins"),
    "triggers": ("operators", "sensors", "plugins"),
    "sensors": ("operators", "plugins"),
    "lineage": ("hooks", "operators", "sensors", "triggers", "plugins"),
    "operators": ("plugins",),
    "plugins": (),
}


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


#: What only a runtime may know: Airflow's task environment, Spark masters and deploy modes.
RUNTIME_KNOWLEDGE = ("AIRFLOW_CTX_", "spark://", "deploy_mode", "standalone")


def test_the_core_reads_no_task_environment_and_knows_no_spark_deployment() -> None:
    offenders = [
        f"{name}:{number} mentions {word!r}"
        for name, path in MODULES.items() if name.startswith(f"{PACKAGE}.core")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for word in RUNTIME_KNOWLEDGE if word in line
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


#: Imports each module in a process whose package modules are exactly what a fresh import of
#: the module's parent package loads: a fork of the process that imported that package. A
#: fresh ``import a.b.c`` imports ``a``, then ``a.b``, then ``a.b.c``, so this is the same as
#: a fresh interpreter, without running ``a.b`` (``core``: some 40 modules) again for each of
#: its modules. Third-party modules are loaded once, first (they are not what is checked).
_IMPORT_EACH = """
import gc, importlib, json, os, sys, traceback
names, results = json.loads(sys.argv[1]), sys.argv[2]
package = names[0].partition(".")[0]

def forget():
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]

def parent(name):
    while "." in name:
        name = name.rpartition(".")[0]
        if name in names:
            return name
    return ""

def record(name, error):
    with open(results, "a", encoding="utf-8") as out:
        out.write(json.dumps([name, error]) + "\\n")

def import_children(of):
    gc.freeze()  # a collection in a fork would otherwise copy every page of the heap it walks
    for name in [n for n in names if parent(n) == of]:
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(name)
                record(name, None)
                import_children(name)
            except BaseException:
                record(name, traceback.format_exc(limit=3))
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

for name in names:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
forget()
import_children("")
"""


@pytest.mark.timeout(300)
def test_every_module_imports_on_its_own(tmp_path: Path) -> None:
    names = sorted(MODULES)
    results = tmp_path / "imports.jsonl"
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(names), str(results)],
                          capture_output=True, text=True, cwd=ROOT.parent, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = dict(json.loads(line) for line in results.read_text().splitlines())
    # A module whose parent package failed was never tried: the package's failure names it.
    assert {k: v for k, v in outcome.items() if v} == {}, "\n".join(f"{k}:\n{v}" for k, v in outcome.items() if v)
    assert sorted(outcome) == names, f"no outcome for {sorted(set(names) - set(outcome))} (its process died)"


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


@pytest.mark.parametrize("module", FOUNDATION)
def test_the_core_foundation_imports_none_of_the_core_folders(module: str) -> None:
    assert _imports_of_folders(module, FOLDERS) == []


def _folder(path: Path) -> str:
    return "/".join(path.relative_to(ROOT).parts[:-1]) or "."


def _forbidden(folder: str) -> list[str]:
    """The rows of ``folder`` and of every folder it is in, as module-name prefixes."""
    parts = folder.split("/") if folder != "." else []
    rows = [row for i in range(len(parts) + 1) for row in LAYERS.get("/".join(parts[:i]) or ".", ())]
    return [row if row in ("airflow", "pyspark") else f"{PACKAGE}.{row.replace('/', '.')}" for row in rows]


def test_every_folder_of_the_package_has_a_row_in_the_layer_table() -> None:
    folders = {_folder(p) for p in ROOT.rglob("*.py")}
    assert sorted(folders - set(LAYERS)) == [], "add the folder to LAYERS with what it must not import"
    assert sorted(set(LAYERS) - folders) == [], "LAYERS names a folder the package no longer has"


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_a_folder_imports_nothing_its_layer_forbids(folder: str) -> None:
    forbidden = _forbidden(folder)
    offenders = [
        f"{name}:{line} imports {target}"
        for name, path in MODULES.items() if _folder(path) == folder
        for target, line in imported(path) if any(target == f or target.startswith(f + ".") for f in forbidden)
    ]
    assert offenders == []


def test_the_core_sinks_never_read_the_transaction_log() -> None:
    txlog = f"{PACKAGE}.core.protocol.txlog"
    offenders = [
        f"{name}:{line} imports {target}"
        for name, path in MODULES.items() if _folder(path) == "core/sinks"
        for target, line in imported(path) if target == txlog or target.startswith(txlog + ".")
    ]
    assert offenders == []


#: What only a classic (py4j) SparkSession has: Spark Connect's client has no JVM.
CLASSIC_ONLY_NAMES = {"_jsparkSession", "_jvm", "_jsc", "_jdf", "_jo", "sparkContext", "SparkFiles", "SparkContext"}
#: The one module that may use them, loaded only for a classic session (``spark.session.is_classic``).
CLASSIC_MODULE = f"{PACKAGE}.spark.classic"


def used_names(path: Path) -> Iterator[tuple[str, int]]:
    """Every attribute, name and imported name ``path``'s code uses (not its comments or docstrings)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            yield node.attr, node.lineno
        elif isinstance(node, ast.Name):
            yield node.id, node.lineno
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                yield alias.name.rpartition(".")[2], node.lineno


def test_only_the_classic_module_reaches_into_the_drivers_jvm() -> None:
    """A stage runs through Spark Connect too: nothing on its path may need the driver's JVM."""
    assert CLASSIC_MODULE in MODULES
    offenders = [
        f"{name}:{line} uses {used}"
        for name, path in MODULES.items() if name != CLASSIC_MODULE
        for used, line in used_names(path) if used in CLASSIC_ONLY_NAMES
    ]
    assert offenders == []


# -- CONNECT: the Airflow providers' hooks through their public API only ------------------
#: The providers' hook classes the package builds on; their private members change without notice.
PROVIDER_HOOKS = ("airflow.providers.apache.spark.hooks.spark_submit:SparkSubmitHook",
                  "airflow.providers.apache.spark.hooks.spark_connect:SparkConnectHook")


def provider_private_members() -> dict[str, set[str]]:
    """Each provider hook's class name -> its private members (methods and ``self._...`` attributes)."""
    import importlib
    import inspect

    found: dict[str, set[str]] = {}
    for target in PROVIDER_HOOKS:
        module, _, name = target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        members = {m for m in dir(cls) if m.startswith("_") and not m.startswith("__")}
        for node in ast.walk(ast.parse(inspect.getsource(cls))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                members.add(node.attr)
        # What every class has (BaseHook's and LoggingMixin's own) is not the hook's.
        found[name] = members - {m for m in dir(object) if m.startswith("_")}
    return found


def test_nothing_relies_on_private_members_of_the_providers_hooks() -> None:
    """A provider release may rename its hooks' internals: the package subclasses none and uses none.

    ``self._x`` in the package's own classes is theirs (none subclasses a provider hook);
    any other ``<something>._x`` naming a hook's private member is a use of it.
    """
    private = provider_private_members()
    hooks = set(private)
    names = set().union(*private.values())
    offenders = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                offenders += [f"{module}:{node.lineno} subclasses {base.id if isinstance(base, ast.Name) else ''}"
                              for base in node.bases if isinstance(base, ast.Name) and base.id in hooks]
            elif (isinstance(node, ast.Attribute) and node.attr in names
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                offenders.append(f"{module}:{node.lineno} uses {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and node.module and ".providers." in node.module:
                offenders += [f"{module}:{node.lineno} imports {alias.name} from {node.module}"
                              for alias in node.names if alias.name.startswith("_")]
    assert offenders == []
