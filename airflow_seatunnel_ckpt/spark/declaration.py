"""A stage as a DAG declares it -- checked when the DAG is parsed, without Spark.

:class:`StageDeclaration` is the typed form of a stage operator's arguments, so a mistake is an import error of the DAG
file; each entry is checked through its type's options model (or its factory's parameters), templated values once
rendered. Nothing here imports PySpark, opens a store or touches the network.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.core.layout import validate_name
from airflow_seatunnel_ckpt.core.options import Options
from airflow_seatunnel_ckpt.core.protocol.expectations import parse_expectations
from airflow_seatunnel_ckpt.core.storage.registry import backend_for
from airflow_seatunnel_ckpt.spark.ddl import checked_schema
from airflow_seatunnel_ckpt.spark.registry import REGISTRIES

#: ``package.module:function`` (the function may be a dotted attribute path, ``Class.method``).
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
STAGE_PATH = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")

#: Module names the Spark driver of ``spark-submit`` cannot import: a script run as a
#: program, and the names Airflow gives the DAG files it parses.
_UNIMPORTABLE_MODULE_PREFIXES = ("__main__", "unusual_prefix_")


def is_templated(value: Any) -> bool:
    """Whether ``value`` (or anything inside it) holds a Jinja template, rendered only at run time."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(is_templated(k) or is_templated(v) for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return any(is_templated(v) for v in value)
    return False


def stage_import_path(stage: Any, *, where: str, importable: bool) -> str:
    """The ``"module:function"`` path of ``stage`` (an import path, or the function itself); with ``importable`` a
    lambda, nested function or DAG file's function is refused (the driver is another process)."""
    if isinstance(stage, str):
        if not is_templated(stage) and not STAGE_PATH.match(stage):
            raise ConfigError(f"{where}: stage {stage!r} is not an import path of the form 'package.module:function' "
                              "(e.g. 'my_pipelines.orders:dedup_orders'); pass that string, or the function itself")
        if not is_templated(stage):
            _check_module_defines(stage, where)
        return stage
    if not callable(stage):
        raise ConfigError(f"{where}: stage must be a function or its import path 'package.module:function', "
                          f"got {type(stage).__name__} {stage!r}")
    module = getattr(stage, "__module__", None)
    qualname = getattr(stage, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ConfigError(f"{where}: stage {stage!r} has no module and name to import it by; pass a function "
                          "defined with 'def' at the top level of a module")
    path = f"{module}:{qualname}"
    if importable:
        problem = None
        if "<lambda>" in qualname:
            problem = "is a lambda"
        elif "<locals>" in qualname:
            problem = "is defined inside another function"
        elif module.startswith(_UNIMPORTABLE_MODULE_PREFIXES):
            problem = f"is defined in {module!r} (a DAG file or script), which the driver cannot import"
        if problem:
            raise ConfigError(
                f"{where}: stage function {qualname!r} {problem}; a stage run through spark-submit (conn_id) "
                "is imported by the Spark driver from its module path. Define it with 'def' at the top level "
                "of a module on the driver's Python path (your package, or a file shipped with "
                "spark_submit_kwargs={'py_files': ...}) and pass the function or its 'module:function' path"
            )
    return path


def _module_source(module: str) -> str | None:
    """The path of ``module``'s source file on ``sys.path``, found without importing anything (an import could import
    PySpark, or run the user's code, on every parse); None if absent."""
    parts = module.split(".")
    for root in sys.path or ["."]:
        base = os.path.join(root or ".", *parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """Names a module defines at its top level (None: it may define names we cannot see)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if node.name == "__getattr__":
                    return False  # names made up on access
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if isinstance(node, ast.For):
                    names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
                if not all(visit(block) for block in blocks):
                    return False
            elif isinstance(node, ast.Expr) and "globals" in ast.dump(node):
                return False  # globals()[...] = ...: names set dynamically
        return True

    return names if visit(tree.body) else None


def _check_module_defines(stage: str, where: str) -> None:
    """Refuse ``module:function`` when the module's source, read without importing it, clearly defines no ``function``.
    A module not on this process's path (shipped to the Spark driver only), or one that makes names dynamically, is left
    to run time."""
    module, _, attribute = stage.partition(":")
    first = attribute.split(".", 1)[0]
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, first):
        return
    path = _module_source(module)
    if path is None:
        return
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return  # the import at run time reports it with Python's own message
    defined = _top_level_names(tree)
    if defined is None or first in defined:
        return
    functions = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    close = difflib.get_close_matches(first, sorted(defined), n=1)
    raise ConfigError(f"{where}: stage {stage!r}: module {module!r} ({path}) defines no {first!r}"
                      + (f"; did you mean {close[0]!r}?" if close else "")
                      + f" Its functions: {functions or 'none'}. Fix the stage's 'module:function' path")


@dataclass(frozen=True)
class EntryDeclaration:
    """One source or sink of a stage: its kind, name, type and options as written; ``typed``: checked through the type's
    model (None without one, or while a value is templated)."""

    kind: str
    name: str
    type: str
    options: Mapping[str, Any]
    typed: Options | None = None

    @property
    def spec_options(self) -> Options | Mapping[str, Any]:
        """What the stage spec carries: the typed options when there are any."""
        return self.typed if self.typed is not None else self.options

    @classmethod
    def check(cls, kind: str, name: Any, options: Any, *, where: str) -> EntryDeclaration:
        """Check the entry once, through its options model; templated values are checked once rendered."""
        try:
            validate_name(name, f"{kind} name")
        except CheckpointError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"{where}: {kind} {name!r} must be a mapping of options such as "
                f"{{'type': 'file', 'path': ..., 'format': 'parquet'}}, got {type(options).__name__} {options!r}"
            )
        registry = REGISTRIES[kind]
        type_name = options.get("type", "file")
        if is_templated(type_name):
            return cls(kind, name, str(type_name), dict(options))
        try:
            typed = registry.check(name, options, unchecked={k for k, v in options.items() if is_templated(v)})
            schema = options.get("schema")
            if kind == "source" and registry.is_builtin(type_name) and schema is not None and not is_templated(schema):
                checked_schema(schema, f"source {name!r}")  # Spark would parse it only when the stage reads
            path = options.get("path")
            if kind == "sink" and isinstance(path, str) and "://" in path and not is_templated(path):
                backend_for(path.split("://", 1)[0].lower())  # commit must be able to publish there
            rules = options.get("expectations")
            if kind == "sink" and registry.is_builtin(type_name) and not is_templated(rules):
                parse_expectations(name, rules)  # the rules' own keys and actions (docs/EXPECTATIONS.md)
        except CheckpointError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        return cls(kind, name, str(type_name), dict(options), typed)


@dataclass(frozen=True)
class StageDeclaration:
    """A stage's arguments as a DAG declares them, checked; ``stage`` is the ``"module:function"`` path."""

    participant: str
    stage: str
    sources: tuple[EntryDeclaration, ...]
    sinks: tuple[EntryDeclaration, ...]

    @classmethod
    def check(cls, *, participant: str, stage: str | Callable[..., Any], sources: Any, sinks: Any, importable: bool,
              where: str) -> StageDeclaration:
        """Check every argument; ConfigError naming ``where`` (the task), the entry, what is wrong and the way out
        (``importable``: the stage runs in another process)."""
        path = stage_import_path(stage, where=where, importable=importable)
        entries: dict[str, tuple[EntryDeclaration, ...]] = {}
        for kind, given in (("source", sources), ("sink", sinks)):
            if not isinstance(given, Mapping):
                raise ConfigError(
                    f"{where}: {kind}s must be a mapping of {kind} name -> options, got {type(given).__name__}"
                )
            entries[kind] = tuple(EntryDeclaration.check(kind, name, options, where=where)
                                  for name, options in given.items())
        return cls(participant, path, entries["source"], entries["sink"])
