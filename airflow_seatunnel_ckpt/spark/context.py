"""What a stage function is given: its epoch, its sources, sinks and keyed state."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_serializer

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark.session import is_classic
from airflow_seatunnel_ckpt.spark.sinks.files import Sink
from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError
from airflow_seatunnel_ckpt.spark.sources.files import FileSource
from airflow_seatunnel_ckpt.spark.state import KeyedState, KeySet, KeyValueState

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

T = TypeVar("T")
S = TypeVar("S", bound=KeyedState)


def _read_only(params: Any) -> Mapping[str, Any]:
    # A read-only copy of JSON data: the stage cannot change what later tasks see.
    return MappingProxyType(json.loads(json.dumps(dict(params or {}), default=str)))


class AirflowContext(BaseModel):
    """What the stage may know of the Airflow task that runs it: read-only, JSON-able, carried in the spec (no epoch, no
    try number: those are the runtime's; dates ``None`` for a run without them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    logical_date: datetime | None = None
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    params: Annotated[Mapping[str, Any], AfterValidator(_read_only)] = Field(default_factory=lambda: _read_only({}))

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
            if unknown:
                raise ConfigError(f"stage spec: unknown airflow_context field(s) {unknown}; "
                                  f"known: {list(type(self).model_fields)}") from None
            what = ".".join(str(p) for p in errors[0]["loc"])
            raise ConfigError(f"stage spec: airflow_context.{what} must be an ISO 8601 date-time, got "
                              f"{errors[0]['input']!r}" if "date" in what else
                              f"stage spec: airflow_context.{what}: {errors[0]['msg']}") from None

    @field_serializer("logical_date", "data_interval_start", "data_interval_end")
    def _iso(self, value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    @field_serializer("params")
    def _plain(self, value: Mapping[str, Any]) -> dict[str, Any]:
        return dict(value)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (dates as ISO 8601 strings)."""
        return self.model_dump()

    @classmethod
    def of_task(cls, context: Mapping[str, Any], task_id: str) -> AirflowContext:
        """The part of an Airflow task's ``context`` the stage sees (no try number)."""
        return cls(dag_id=getattr(context.get("dag"), "dag_id", None), task_id=task_id, run_id=context.get("run_id"),
                   logical_date=context.get("logical_date"), data_interval_start=context.get("data_interval_start"),
                   data_interval_end=context.get("data_interval_end"), params=dict(context.get("params") or {}))

    def task_instance(self, attempt: int) -> str | None:
        """``<dag>/<run>/<task>/<attempt>``, how a lease names the task it runs for (None outside Airflow)."""
        if not (self.dag_id and self.run_id and self.task_id):
            return None
        return f"{self.dag_id}/{self.run_id}/{self.task_id}/{attempt}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AirflowContext:
        """Parse :meth:`to_dict` output (empty or ``None``: run outside Airflow)."""
        return cls(**dict(data or {}))


class BoundSource:
    """A source with this epoch's offsets fixed: :meth:`read` returns only new input (``quarantine`` takes its rejected
    records; ``epoch`` is named in its errors)."""

    def __init__(self, spark: SparkSession, source: Source, offsets: Mapping[str, Any],
                 quarantine: Sink | None = None, epoch: int | None = None) -> None:
        self.spark = spark
        self.source = source
        self.offsets = dict(offsets)
        self.quarantine = quarantine
        self.epoch = epoch
        self.was_read = False
        self._counted: list[Observation] = []

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    def read(self) -> DataFrame:
        """This epoch's input: what no committed epoch consumed (the same on every retry), the rejected records staged
        into the quarantine sink if there is one."""
        self.was_read = True
        try:
            if self.quarantine is None or not isinstance(self.source, FileSource):
                return self._counting(self.source.read(self.spark, self.offsets))
            data, rejected = self.source.read_checked(self.spark, self.offsets)
            if rejected is not None and not self.quarantine.written:
                self.quarantine.write(rejected)
            return self._counting(data)
        except SourceError as exc:
            if self.epoch is None:
                raise
            raise SourceError(f"epoch {self.epoch}: {exc}") from exc

    def _counting(self, data: DataFrame) -> DataFrame:
        """``data`` with its rows counted by the first Spark action over it (an observed metric): a file source's only,
        since Spark pushes no filter through the counting step into a table scan."""
        if not isinstance(self.source, FileSource):
            return data
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        observation = Observation(f"source_{self.name}_{uuid.uuid4().hex[:8]}")
        self._counted.append(observation)
        return data.observe(observation, F.count(F.lit(1)).alias("rows"))

    @property
    def rows_kept(self) -> int | None:
        """Rows this source handed to the stage (the largest count over its reads), None if no action ran over them or
        it is not a file source."""
        classic = is_classic(self.spark)
        counts = []
        for observation in self._counted:
            try:
                if classic:
                    from airflow_seatunnel_ckpt.spark.classic import observed

                    if not observed(observation):  # get would block until an action ran
                        continue
                # Through Spark Connect the action's response fills it in ({} before).
                rows = observation.get.get("rows")
                if rows is not None:
                    counts.append(int(rows))
            except Exception:  # a failed action leaves no count
                continue
        return max(counts) if counts else None

    @property
    def consumed(self) -> dict[str, Any]:
        """The offsets this epoch consumed: the plan (with what the read counted, see ``Source.read_figures``) if the
        stage read it, else nothing (an unread source keeps its input for a later epoch)."""
        return {**self.source.read_figures(), **self.offsets} if self.was_read else {}


class StageContext:
    """The stage function's handle on its epoch: ``ctx.source(name).read()``, ``ctx.key_set(name)`` /
    ``ctx.key_value(name)``, ``ctx.sink(name).write(df)``, and the Airflow run (``ctx.logical_date``,
    ``ctx.data_interval_start`` / ``_end``, ``ctx.params``, ``ctx.airflow``)."""

    def __init__(self, spark: SparkSession, *, pipeline: str, participant: str, run_id: str, epoch: int, attempt: int,
                 restored_epoch: int | None, key_groups: int, sources: Mapping[str, BoundSource],
                 sinks: Mapping[str, Sink], state_factory: Callable[[str, type[KeyedState]], KeyedState],
                 airflow: AirflowContext | None = None) -> None:
        self.spark = spark
        self.pipeline = pipeline
        self.participant = participant
        self.run_id = run_id
        self.epoch = epoch
        self.attempt = attempt
        self.restored_epoch = restored_epoch
        self.key_groups = key_groups
        self._sources = dict(sources)
        self._sinks = dict(sinks)
        self._state_factory = state_factory
        self._states: dict[str, KeyedState] = {}
        #: The Airflow task that runs the stage (empty outside Airflow).
        self.airflow = airflow or AirflowContext(run_id=run_id)

    @property
    def logical_date(self) -> datetime | None:
        """The DAG run's logical date (``None`` outside Airflow or for a run without one)."""
        return self.airflow.logical_date

    @property
    def data_interval_start(self) -> datetime | None:
        """Start of the DAG run's data interval, if it has one."""
        return self.airflow.data_interval_start

    @property
    def data_interval_end(self) -> datetime | None:
        """End of the DAG run's data interval, if it has one."""
        return self.airflow.data_interval_end

    @property
    def params(self) -> Mapping[str, Any]:
        """The DAG run's params (read-only)."""
        return self.airflow.params

    def source(self, name: str) -> BoundSource:
        """The source ``name`` of the stage spec."""
        return _declared("source", self._sources, name)

    def sink(self, name: str) -> Sink:
        """The sink ``name`` of the stage spec (writes go to the attempt's staging)."""
        return _declared("sink", self._sinks, name)

    def key_set(self, name: str) -> KeySet:
        """The key set ``name`` (created empty on first use), for de-duplication."""
        return self._state(name, KeySet)

    def key_value(self, name: str) -> KeyValueState:
        """The key -> value state ``name`` (created empty on first use), for running aggregates."""
        return self._state(name, KeyValueState)

    def _state(self, name: str, kind: type[S]) -> S:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = self._state_factory(name, kind)
        if not isinstance(state, kind):
            raise ConfigError(f"state {name!r} is already used as a {state.kind} in this stage")
        return state

    @property
    def states(self) -> dict[str, KeyedState]:
        """Every keyed state the stage opened, by name."""
        return dict(self._states)

    @property
    def sinks(self) -> dict[str, Sink]:
        """Every sink of the stage, by name."""
        return dict(self._sinks)

    @property
    def sources(self) -> dict[str, BoundSource]:
        """Every source of the stage, by name."""
        return dict(self._sources)


def _declared(kind: str, declared: Mapping[str, T], name: str) -> T:
    """The ``kind`` (source or sink) ``name`` of the stage spec; ConfigError naming the declared ones if none."""
    try:
        return declared[name]
    except KeyError:
        raise ConfigError(f"stage has no {kind} {name!r}; the spec declares {sorted(declared)}") from None
