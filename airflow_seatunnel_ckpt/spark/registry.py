"""Sources and sinks by type: the registries a stage spec's ``sources`` and ``sinks`` entries are built from.

Each connector is imported when a spec first builds one (:class:`~airflow_seatunnel_ckpt.core.registry.Registry`):
checking a DAG's entries needs only their options models.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import Options, problem
from airflow_seatunnel_ckpt.core.options import parse as parse_options
from airflow_seatunnel_ckpt.core.registry import Registry

if TYPE_CHECKING:  # the connectors are imported when a stage spec builds one, not when a DAG is parsed
    from airflow_seatunnel_ckpt.spark.sinks.files import Sink
    from airflow_seatunnel_ckpt.spark.sources.base import Source

T = TypeVar("T")
_SPARK = "airflow_seatunnel_ckpt.spark"


class ConnectorRegistry(Registry[Callable[..., T]]):
    """Builds ``{"type": name, **options}`` entries of a stage spec as ``factory(name, **options)``, checked through the
    type's options model, else against its factory's keyword parameters."""

    def __init__(self, kind: str, builtin: Mapping[str, str], *, extras: Mapping[str, str], options: str) -> None:
        super().__init__(kind, builtin, extras=extras, options=options, unknown=self._unknown_type)

    def _unknown_type(self, type_name: str, known: list[str]) -> str:
        return (f"unknown type {type_name!r}; known types: {known}. A custom type must be registered with "
                f"register_{self.kind}({type_name!r}, factory) in a module that the DAG file imports, so that it "
                "is known when the DAG is parsed")

    def factory(self, name: str, type_name: str) -> Callable[..., T]:
        """The factory of ``type_name``; ConfigError naming the entry, the known types and the way out."""
        try:
            return self.get(type_name)
        except ConfigError as exc:
            raise ConfigError(f"{self.kind} {name!r}: {exc}") from exc

    def check(self, name: str, options: Mapping[str, Any], unchecked: Collection[str] = ()) -> Options | None:
        """The entry ``name``'s options checked: its typed options, or None (a type without a model, or values left
        ``unchecked``: templates, checked again once rendered); ConfigError for an unknown type or option (with the
        nearest valid name), a missing one or a wrong value. A type without a model is checked against its factory's
        parameters (a built-in one is built: its constructor does no I/O)."""
        type_name = options.get("type", "file")
        model = self.options_model(type_name) if type_name in self else None
        if model is None:
            self.check_keys(name, options)
            if self.is_builtin(type_name) and not unchecked:
                self.build(name, options)
            return None
        if not unchecked:
            return parse_options(self.kind, name, options, {type_name: model})
        data = {"type": type_name, **{k: v for k, v in options.items() if k not in unchecked}}
        try:
            model.model_validate(data)
        except ValidationError as exc:
            problems = [problem(model, e) for e in exc.errors(include_url=False)
                        if not (e["loc"] and e["loc"][0] in unchecked)]
            if problems:
                raise ConfigError(f"{self.kind} {name!r} (type {type_name!r}): {'; '.join(problems)}") from None
        return None

    def check_keys(self, name: str, options: Mapping[str, Any]) -> None:
        """Refuse unknown and missing options of the entry ``name`` from its factory's signature."""
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

    def build(self, name: str, options: Mapping[str, Any] | Options) -> T:
        """Build the entry ``name`` that ``options`` describe (default type ``file``; typed options as they are)."""
        opts = options.to_dict() if isinstance(options, Options) else dict(options)
        type_name = opts.pop("type", "file")
        factory = self.factory(name, type_name)
        try:
            return factory(name, **opts)
        except TypeError as exc:
            raise ConfigError(f"{self.kind} {name!r}: bad options {sorted(opts)}: {exc}") from exc


SOURCES: ConnectorRegistry[Source] = ConnectorRegistry(
    "source", {"file": f"{_SPARK}.sources.files:FileSource", "iceberg": f"{_SPARK}.sources.tables:IcebergSource",
               "delta": f"{_SPARK}.sources.tables:DeltaSource",
               "pipeline_output": f"{_SPARK}.sources.tables:PipelineOutputSource",
               "kafka": f"{_SPARK}.sources.kafka:KafkaSource",
               "postgres_cdc": f"{_SPARK}.sources.postgres:PostgresCdcSource",
               "postgres_query": f"{_SPARK}.sources.postgres:PostgresQuerySource"},
    extras={"delta": "delta", "kafka": "kafka", "postgres_cdc": "postgres", "postgres_query": "postgres"},
    options="airflow_seatunnel_ckpt.core.sources.options:SOURCE_OPTIONS")
SINKS: ConnectorRegistry[Sink] = ConnectorRegistry(
    "sink", {"file": f"{_SPARK}.sinks.files:FileSink", "iceberg": f"{_SPARK}.sinks.tables:IcebergSink",
             "delta": f"{_SPARK}.sinks.tables:DeltaSink", "postgres": f"{_SPARK}.sinks.tables:PostgresSink"},
    extras={"delta": "delta", "postgres": "postgres"}, options="airflow_seatunnel_ckpt.core.sinks.options:SINK_OPTIONS")
#: Both registries by kind, for checks that only know the kind.
REGISTRIES: dict[str, ConnectorRegistry[Any]] = {"source": SOURCES, "sink": SINKS}


def register_source(type_name: str, factory: Callable[..., Source], options: type[Options] | None = None) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a source as ``factory(name, **options)``, its options
    checked by the ``options`` model (else against ``factory``'s keyword parameters) when the DAG is parsed."""
    SOURCES.register(type_name, factory, options)


def register_sink(type_name: str, factory: Callable[..., Sink], options: type[Options] | None = None) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a sink as ``factory(name, **options)``, its options
    checked by the ``options`` model (else against ``factory``'s keyword parameters) when the DAG is parsed."""
    SINKS.register(type_name, factory, options)

