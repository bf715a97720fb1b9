"""What a stage function is given: its epoch, its sources, sinks and keyed state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark.sinks import Sink
from airflow_seatunnel_ckpt.spark.sources import Source
from airflow_seatunnel_ckpt.spark.state import KeyedState, KeySet, KeyValueState

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class BoundSource:
    """A source with this epoch's offsets fixed: :meth:`read` returns only new input."""

    def __init__(self, spark: SparkSession, source: Source, offsets: Mapping[str, Any]) -> None:
        self.spark = spark
        self.source = source
        self.offsets = dict(offsets)
        self.was_read = False

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    def read(self) -> DataFrame:
        """This epoch's input: what no committed epoch consumed (the same on every retry)."""
        self.was_read = True
        return self.source.read(self.spark, self.offsets)

    @property
    def consumed(self) -> dict[str, Any]:
        """The offsets this epoch consumed: the plan if the stage read it, else nothing
        (an unread source keeps its input for a later epoch)."""
        return dict(self.offsets) if self.was_read else {}


class StageContext:
    """The stage function's handle on its epoch.

    ``ctx.source(name).read()`` gives only new input, ``ctx.key_set(name)`` and
    ``ctx.key_value(name)`` give keyed state restored from the last committed checkpoint,
    ``ctx.sink(name).write(df)`` stages output. Everything else (epoch, restore,
    checkpoint parts, manifests, the prepared record) is the runner's job.
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        pipeline: str,
        participant: str,
        run_id: str,
        epoch: int,
        attempt: int,
        restored_epoch: int | None,
        key_groups: int,
        sources: Mapping[str, BoundSource],
        sinks: Mapping[str, Sink],
        state_factory: Callable[[str, type[KeyedState]], KeyedState],
    ) -> None:
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

    def source(self, name: str) -> BoundSource:
        """The source ``name`` of the stage spec."""
        try:
            return self._sources[name]
        except KeyError:
            raise ConfigError(
                f"stage has no source {name!r}; the spec declares {sorted(self._sources)}"
            ) from None

    def sink(self, name: str) -> Sink:
        """The sink ``name`` of the stage spec (writes go to the attempt's staging)."""
        try:
            return self._sinks[name]
        except KeyError:
            raise ConfigError(
                f"stage has no sink {name!r}; the spec declares {sorted(self._sinks)}"
            ) from None

    def key_set(self, name: str) -> KeySet:
        """The key set ``name`` (created empty on first use), for de-duplication."""
        state = self._state(name, KeySet)
        assert isinstance(state, KeySet)
        return state

    def key_value(self, name: str) -> KeyValueState:
        """The key -> value state ``name`` (created empty on first use), for running aggregates."""
        state = self._state(name, KeyValueState)
        assert isinstance(state, KeyValueState)
        return state

    def _state(self, name: str, kind: type[KeyedState]) -> KeyedState:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = self._state_factory(name, kind)
        if not isinstance(state, kind):
            raise ConfigError(
                f"state {name!r} is already used as a {state.state_kind} in this stage"
            )
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
