"""Sources and sinks by type: the registries a stage spec's ``sources`` and ``sinks`` entries are built from.

``{"type": "file", ...}`` (the default) reads the files no committed epoch consumed
(:mod:`.file_source`, which also holds the :class:`Source` interface) or publishes
``<target>/epoch=<e>/`` directories (:mod:`.file_sink`, with the :class:`Sink` interface).
``"iceberg"`` and ``"delta"`` read the data files appended to a table since the last
committed epoch, ``"pipeline_output"`` another pipeline's committed file-sink epochs
(:mod:`.table_sources`), ``"kafka"`` the records produced since the last committed epoch
(:mod:`.kafka_source`). ``"iceberg"``, ``"delta"`` and ``"postgres"`` sinks commit each
epoch into a table (:mod:`.table_sinks`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark.sinks.files import FileSink, Sink
from airflow_seatunnel_ckpt.spark.sinks.tables import DeltaSink, IcebergSink, PostgresSink
from airflow_seatunnel_ckpt.spark.sources.base import Source
from airflow_seatunnel_ckpt.spark.sources.files import FileSource
from airflow_seatunnel_ckpt.spark.sources.kafka import KafkaSource
from airflow_seatunnel_ckpt.spark.sources.tables import DeltaSource, IcebergSource, PipelineOutputSource

T = TypeVar("T")


class Registry(Generic[T]):
    """Builds ``{"type": name, **options}`` entries of a stage spec as ``factory(name, **options)``."""

    def __init__(self, kind: str, builtin: Mapping[str, Callable[..., T]]) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = dict(builtin)
        #: Built-in types check their values when constructed and do no I/O doing so.
        self._builtin = frozenset(builtin)

    def register(self, type_name: str, factory: Callable[..., T]) -> None:
        """Make ``{"type": type_name, ...}`` build with ``factory(name, **options)``."""
        self._factories[type_name] = factory

    @property
    def types(self) -> list[str]:
        """The registered type names, sorted."""
        return sorted(self._factories)

    def factory(self, name: str, type_name: str) -> Callable[..., T]:
        """The factory of ``type_name``; ConfigError naming the known types and the way out."""
        factory = self._factories.get(type_name)
        if factory is None:
            raise ConfigError(
                f"{self.kind} {name!r}: unknown type {type_name!r}; known types: {self.types}. A custom "
                f"type must be registered with register_{self.kind}({type_name!r}, factory) in a module "
                f"that the DAG file imports, so that it is known when the DAG is parsed"
            )
        return factory

    def is_builtin(self, type_name: str) -> bool:
        """Whether ``type_name`` is one of the package's own types (cheap, I/O-free constructor)."""
        return type_name in self._builtin and self._factories.get(type_name) is not None

    def check_keys(self, name: str, options: Mapping[str, Any]) -> None:
        """Refuse unknown and missing options of the entry ``name``, without building it.

        The options a type takes are its factory's keyword parameters (after the name), so
        a type added with :meth:`register` is checked the same way as a built-in one.
        """
        opts = dict(options)
        type_name = opts.pop("type", "file")
        factory = self.factory(name, type_name)
        try:
            params = list(inspect.signature(factory).parameters.values())[1:]  # after the name
        except (TypeError, ValueError):  # no introspectable signature: trust the factory
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return
        takes = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)]
        unknown = sorted(set(opts) - set(takes))
        if unknown:
            hints = [f"{m[0]!r} for {u!r}" for u in unknown
                     if (m := difflib.get_close_matches(u, takes, n=1))]
            raise ConfigError(
                f"{self.kind} {name!r} (type {type_name!r}): unknown option(s) {unknown}; it takes "
                f"{sorted(['type', *takes])}" + (f" (did you mean {', '.join(hints)}?)" if hints else "")
            )
        missing = sorted(p.name for p in params if p.default is inspect.Parameter.empty
                         and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                         and p.name not in opts)
        if missing:
            raise ConfigError(f"{self.kind} {name!r} (type {type_name!r}): missing required option(s) {missing}")

    def build(self, name: str, options: Mapping[str, Any]) -> T:
        """Build the entry ``name`` that ``options`` describe (default type ``file``)."""
        opts = dict(options)
        type_name = opts.pop("type", "file")
        factory = self.factory(name, type_name)
        try:
            return factory(name, **opts)
        except TypeError as exc:
            raise ConfigError(f"{self.kind} {name!r}: bad options {sorted(opts)}: {exc}") from exc


SOURCES: Registry[Source] = Registry("source", {"file": FileSource, "iceberg": IcebergSource, "delta": DeltaSource,
                                                "pipeline_output": PipelineOutputSource, "kafka": KafkaSource})
SINKS: Registry[Sink] = Registry("sink", {"file": FileSink, "iceberg": IcebergSink, "delta": DeltaSink,
                                          "postgres": PostgresSink})
#: Both registries by kind, for checks that only know the kind.
REGISTRIES: dict[str, Registry[Any]] = {"source": SOURCES, "sink": SINKS}


def register_source(type_name: str, factory: Callable[..., Source]) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a source as ``factory(name, **options)``."""
    SOURCES.register(type_name, factory)


def source_from_options(name: str, options: Mapping[str, Any]) -> Source:
    """Build the source a stage spec describes."""
    return SOURCES.build(name, options)


def register_sink(type_name: str, factory: Callable[..., Sink]) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a sink as ``factory(name, **options)``."""
    SINKS.register(type_name, factory)


def sink_from_options(name: str, options: Mapping[str, Any]) -> Sink:
    """Build the sink a stage spec describes."""
    return SINKS.build(name, options)
