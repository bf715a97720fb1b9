"""Driver side of keyed state: the API a stage uses and the reconciliation of task reports."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import secrets
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import OperatorState, PartRef
from airflow_seatunnel_ckpt.spark.state.executor import (
    dedup_keep,
    merge_partition,
    read_partition,
    state_schema,
)
from airflow_seatunnel_ckpt.spark.state.reports import PartReport, ReportFolder, choose_reports, next_chain
from airflow_seatunnel_ckpt.spark.state.settings import (
    DEFAULT_CHUNK_ROWS,
    KEY_GROUP_COLUMN,
    Aggregate,
    StateError,
    StateKind,
    StateSettings,
    starts_empty,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from airflow_seatunnel_ckpt.core.protocol.descriptor import StateDescriptor

log = logging.getLogger(__name__)

#: ``aggregate(mode=...)``: only the keys the epoch changed (a changelog).
CHANGES = "changes"
#: ``aggregate(mode=...)``: every key of the state, the current table.
SNAPSHOT = "snapshot"
#: Suffix and flag column names used while joining the restored state with the update.
_OLD = "__restored"
_CHANGED = "__changed_this_epoch"


def _key_list(key: str | Sequence[str]) -> list[str]:
    keys = [key] if isinstance(key, str) else list(key)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(f"keyed state: key must be a column name or a list of them, got {key!r}")
    return keys


def _key_group_of(keys: Sequence[str], key_groups: int) -> Column:
    """The key group of a row: ``pmod(murmur3(keys), G)``, as Spark's hash partitioning places it."""
    from pyspark.sql import functions as F

    return F.pmod(F.hash(*[F.col(k) for k in keys]), F.lit(key_groups)).cast("int")


class KeyedState:
    """One named keyed state of a stage, restored from the last committed checkpoint (made by ``ctx.key_set`` /
    ``ctx.key_value``; the runner calls :meth:`finish` after the stage function)."""

    kind: ClassVar[StateKind]

    def __init__(self, spark: SparkSession, settings: StateSettings) -> None:
        if settings.kind != self.kind:
            raise StateError(f"keyed state {settings.name!r}: settings of a {settings.kind} given to a "
                             f"{type(self).__name__} ({self.kind})")
        self.spark = spark
        self.settings = settings
        self._reports: ReportFolder | None = None
        self._output: DataFrame | None = None
        self._input: DataFrame | None = None
        #: The state's committed shape (its checkpoint's), checked by each update.
        self.recorded: StateDescriptor | None = None
        #: Where the recorded shape is kept (for error messages).
        self.recorded_where = ""
        #: Called with the state once an update is planned and its shape checked, before
        #: any Spark job runs: the runner's check of the stage's states as a whole (a
        #: rename in the code), so a refused stage has written nothing.
        self.before_update: Callable[[KeyedState], None] | None = None

    @property
    def name(self) -> str:
        """The state's name (its operator name in the checkpoint)."""
        return self.settings.name

    @property
    def key_groups(self) -> int:
        """The number of key groups the state is partitioned into."""
        return self.settings.key_groups

    @property
    def restored(self) -> OperatorState | None:
        """The state as of the last committed checkpoint (None if it has none)."""
        return self.settings.restored

    # -- shared by both kinds -------------------------------------------------------------
    def _bind(self, key: str | Sequence[str]) -> tuple[StateSettings, ReportFolder]:
        """Bind the state to its key columns for this stage's one update."""
        keys = _key_list(key)
        if self._output is not None:
            raise StateError(f"keyed state {self.name!r} is already updated in this stage; update a state "
                             "once per stage (union the inputs first)")
        self.settings = self.settings.bound_to(keys)
        self._reports = ReportFolder(self.settings.store, self.settings.reports_folder(secrets.token_hex(6)))
        return self.settings, self._reports

    def _by_key_group(self, df: DataFrame, keys: Sequence[str]) -> DataFrame:
        missing = [k for k in keys if k not in df.columns]
        if missing:
            raise StateError(f"keyed state {self.name!r}: key column(s) {missing} not in the DataFrame "
                             f"(columns: {df.columns})")
        if KEY_GROUP_COLUMN in df.columns:
            raise StateError(f"keyed state {self.name!r}: the column name {KEY_GROUP_COLUMN!r} is reserved")
        # repartition(G, keys) places a row in partition pmod(murmur3(keys), G): the key group.
        group = _key_group_of(keys, self.key_groups)
        return df.repartition(self.key_groups, *keys).withColumn(KEY_GROUP_COLUMN, group)

    def shape(self) -> StateDescriptor | None:
        """The state's shape as this stage's update gives it (None before the update)."""
        from airflow_seatunnel_ckpt.core.protocol.descriptor import StateDescriptor

        if self._output is None or not self.settings.key_columns:
            return None
        keys = list(self.settings.key_columns)
        aggregates = getattr(self, "aggregates", None)
        if aggregates:  # key -> value: the keys and the aggregate columns it returns
            fields = list(self._output.schema.fields)
        else:  # key set: the key columns
            assert self._input is not None
            fields = [f for f in self._input.schema.fields if f.name in keys]
        return StateDescriptor(self.kind.value, keys, self.key_groups, dict(aggregates) if aggregates else None,
                               [{"name": f.name, "type": f.dataType.simpleString()} for f in fields])

    def _check_shape(self) -> None:
        """Refuse an update whose shape differs from the committed one, before anything runs."""
        from airflow_seatunnel_ckpt.core.protocol.descriptor import state_changes

        now = self.shape()
        if self.recorded is None or now is None:
            return
        changes = state_changes(self.recorded, now)
        if changes.refused:
            self._output = None  # the update never happened: nothing is checkpointed for it
            raise StateError(
                f"keyed state {self.name!r} differs from its committed shape ({self.recorded_where}): "
                f"{'; '.join(changes.refused)}. Applying it to the stored values would corrupt them. "
                f"Way out: restore the stage's previous definition; or start the state over with "
                f"`seatunnel-ckpt state reset {self.settings.pipeline} {self.name}`, or give the new definition "
                f"a new state name and `seatunnel-ckpt state drop {self.settings.pipeline} {self.name}` once it "
                f"is no longer needed -- {starts_empty(self.kind)}")
        if changes.compatible:
            log.info("keyed state %s: compatible change accepted: %s", self.name, "; ".join(changes.compatible))

    def _planned(self) -> None:
        """The update is planned (nothing ran yet): check its shape, then the stage's states."""
        self._check_shape()
        if self.before_update is not None:
            try:
                self.before_update(self)
            except Exception:
                self._output = None  # refused: nothing is checkpointed for it
                raise

    # -- runner side -----------------------------------------------------------------------
    @property
    def updated(self) -> bool:
        """Whether the stage updated this state."""
        return self._output is not None

    def finish(self) -> tuple[OperatorState | None, int]:
        """Collect the key groups' new parts into the operator's chains; the new operator state (None if never restored
        nor updated) and the bytes written.

        A key group that never reported (the stage did not consume the update completely) is evaluated to completion;
        one still without a trusted report (:func:`choose_reports`) is unchanged only if it has no input rows, else the
        stage cannot prepare.
        """
        if self._output is None or self._reports is None:
            return self.restored, 0
        reports, unsure = choose_reports(self._reports.read())
        if len(reports) < self.key_groups or unsure:
            log.info("keyed state %s: %d of %d key groups reported; evaluating the update to completion", self.name,
                     len(reports) - len(unsure), self.key_groups)
            self._output.write.format("noop").mode("overwrite").save()
            reports, unsure = choose_reports(self._reports.read())
        missing = set(range(self.key_groups)) - set(reports)
        to_check = sorted(missing | unsure)
        if to_check:
            with_input = self._key_groups_with_input(to_check)
            if with_input:
                raise StateError(f"keyed state {self.name!r}: key groups {with_input[:10]} have input but never "
                                 "reported their part after a full evaluation; the stage cannot prepare")
            # No input rows in these key groups (Spark may not even run a task over input
            # it can prove empty): they are unchanged.
            for g in to_check:
                reports[g] = PartReport(g, rows=0, changed=0)
        chains, written = self._next_chains(reports)
        self._remove_unreported_parts({p.path for r in reports.values() for p in r.parts})
        self._reports.remove()  # read into the chains; the epoch's staging goes with the epoch anyway
        # The shape goes with the chains: the next run restoring them is held to it, on
        # every path (run_stage alone, spark-submit, Airflow).
        shape = self.shape()
        state = OperatorState(self.key_groups, list(self.settings.key_columns), chains, self.kind.value,
                              shape.state_shape if shape is not None else None)
        return state, written

    def _next_chains(self, reports: Mapping[int, PartReport]) -> tuple[dict[int, list[PartRef]], int]:
        """Each key group's chain after this epoch (:func:`next_chain`: a key group without a part keeps its restored
        chain) and the bytes of the parts added."""
        chains: dict[int, list[PartRef]] = {}
        restored = self.settings.chains
        min_epoch = self.settings.min_epoch
        written = 0
        for key_group in range(self.key_groups):
            report = reports[key_group]
            written += sum(p.size for p in report.parts)
            chain = next_chain(list(restored.get(key_group, [])), report, min_epoch)
            if chain:
                chains[key_group] = chain
        return chains, written

    def _key_groups_with_input(self, key_groups: list[int]) -> list[int]:
        """Which of ``key_groups`` the update's input has rows in (reads the key columns)."""
        from pyspark.sql import functions as F

        assert self._input is not None
        group = _key_group_of(self.settings.key_columns, self.key_groups)
        found = (self._input.select(group.alias("g"))
                 .where(F.col("g").isin(key_groups))
                 .distinct()
                 .collect())
        return sorted(int(row.g) for row in found)

    def _remove_unreported_parts(self, keep: set[str]) -> None:
        """Delete this attempt's parts (``part-<k>-<attempt>-<token>``) no chosen report names; another attempt's parts
        are never touched."""
        storage = self.settings.store.open()
        folder = self.settings.parts_folder
        own = re.compile(rf"part-\d+-{int(self.settings.attempt)}-[0-9a-f]+")
        for info in storage.walk(folder):
            path = f"{folder}/{info.path}"
            if path not in keep and own.fullmatch(info.path):
                storage.delete(path)

    def snapshot(self, schema: Any = None) -> DataFrame:
        """The state's whole current content, one row per key, read on executors.

        Before the stage's update: as of the last committed checkpoint; after it: plus this epoch's changes, what the
        epoch commits (write it to a ``mode: snapshot`` sink for a table of the current state). ``schema`` (DDL or
        ``StructType``) is needed only for a state without committed content read before its update.
        """
        restored = self._restored_frame(schema)
        if self._output is None:
            return restored
        return self._with_changes(restored)

    def _restored_frame(self, schema: Any) -> DataFrame:
        """The restored state as a DataFrame (each task streams some key groups' chains)."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        settings = self.settings
        if schema is None:
            schema = self._state_schema()
        if isinstance(schema, str):
            schema = StructType.fromDDL(schema)
        groups = self.spark.range(self.key_groups).repartition(min(self.key_groups, 64))
        read = functools.partial(read_partition, settings=settings, schema=to_arrow_schema(schema))
        return groups.mapInArrow(read, schema)

    def _state_schema(self) -> Any:
        """The columns of the state: the update's (a new aggregate column reads NULL for stored keys), else the
        committed shape's, else a committed part's."""
        if self._output is not None:  # a key set's output has every column of its input: only the keys are state
            keys = self.settings.key_columns
            return (self._output if getattr(self, "aggregates", None) else self._output.select(*keys)).schema
        settings = self.settings
        recorded = self._recorded_schema()
        if recorded is not None:
            return recorded
        sample = next((g for g, chain in settings.chains.items() if chain), None)
        if sample is not None:
            from pyspark.sql.pandas.types import from_arrow_schema

            return from_arrow_schema(state_schema(settings, sample))
        raise StateError(f"keyed state {self.name!r} has no committed content yet and this stage has not "
                         "updated it, so its columns are unknown: call snapshot() after the update "
                         "(aggregate/dedup), or pass snapshot(schema=...) with the state's columns")

    def _recorded_schema(self) -> Any:
        """The state's columns as its committed shape records them (None if not recorded)."""
        from pyspark.errors import PySparkException
        from pyspark.sql.types import StructType

        shape = self.restored.shape if self.restored is not None else None
        if shape is None or not shape.schema:
            return None
        try:
            return StructType.fromDDL(", ".join(f"`{c['name']}` {c['type']}" for c in shape.schema))
        except PySparkException:  # a type name DDL does not take: the parts tell the columns
            log.info("keyed state %s: recorded columns %s are not DDL; reading them from a part",
                     self.name, shape.schema)
            return None

    def _with_changes(self, restored: DataFrame) -> DataFrame:
        """``restored`` with this stage's update applied (references the update once)."""
        raise NotImplementedError


class KeySet(KeyedState):
    """A set of keys seen by committed epochs, for exactly-once de-duplication."""

    kind = StateKind.KEY_SET

    def dedup(self, df: DataFrame, key: str | Sequence[str], chunk_rows: int = DEFAULT_CHUNK_ROWS,
              ttl_epochs: int | None = None) -> DataFrame:
        """Rows of ``df`` whose key no committed epoch has seen, one row per key (the first one read, like
        ``dropDuplicates``); the new keys join the state. ``ttl_epochs`` forgets a key that many epochs after the epoch
        that last wrote it (a de-duplication window)."""
        if ttl_epochs is not None and (isinstance(ttl_epochs, bool) or not isinstance(ttl_epochs, int)
                                       or ttl_epochs < 1):
            raise ConfigError(f"key set {self.name!r}: ttl_epochs must be a positive integer or None, "
                              f"got {ttl_epochs!r}")
        settings, reports = self._bind(key)
        settings = self.settings = dataclasses.replace(settings, ttl_epochs=ttl_epochs)
        from pyspark.sql import functions as F

        # A scalar Arrow iterator UDF over the keys only, as a filter: the rows stay in the
        # JVM and only the key columns travel to Python and a boolean back (``mapInArrow``
        # would ship every column both ways). Non-deterministic, so that Spark neither
        # evaluates it twice nor moves a later filter below it (every input key must reach
        # the state, whatever the stage does with the rows afterwards).
        if not hasattr(F, "arrow_udf"):
            import pyspark

            raise StateError(f"key set {self.name!r}: de-duplication needs PySpark 4.1 or later (Arrow UDFs); the "
                             f"stage runs PySpark {pyspark.__version__}: upgrade Spark where the stage's driver runs")
        with warnings.catch_warnings():  # a partial has no type hints to infer the UDF type from
            warnings.simplefilter("ignore", UserWarning)
            keep = F.arrow_udf(functools.partial(dedup_keep, settings=settings, reports=reports,
                                                 chunk_rows=chunk_rows),
                               "boolean", F.ArrowUDFType.SCALAR_ITER).asNondeterministic()
        self._input = df
        columns = [F.col(c) for c in (*settings.key_columns, KEY_GROUP_COLUMN)]
        self._output = (self._by_key_group(df, settings.key_columns)
                        .filter(keep(*columns)).drop(KEY_GROUP_COLUMN))
        self._planned()
        return self._output

    def _with_changes(self, restored: DataFrame) -> DataFrame:
        # The update yields only keys the restored set does not hold: a union is the new set.
        assert self._output is not None
        return restored.unionByName(self._output.select(*self.settings.key_columns))


class KeyValueState(KeyedState):
    """A key -> value map of running aggregates (sum, count, min, max) across epochs."""

    kind = StateKind.KEY_VALUE

    def aggregate(self, df: DataFrame, key: str | Sequence[str], aggregates: Mapping[str, tuple[str, str]],
                  mode: str = CHANGES) -> DataFrame:
        """Fold this epoch's rows into the running aggregates.

        ``aggregates`` maps an output column to ``(function, input column)`` (functions of :class:`Aggregate`), e.g.
        ``{"total": ("sum", "amount"), "orders": ("count", "*")}``. The result has the key and output columns, each
        key's running value over every committed epoch plus this one; ``mode`` says which keys:

        * ``"changes"`` (default): the keys this epoch changed, a changelog (for an ``append`` sink; newest epoch wins).
        * ``"snapshot"``: every key (as :meth:`snapshot`), the current table (for a ``mode: snapshot`` sink).
        """
        from pyspark.sql import functions as F

        if mode not in (CHANGES, SNAPSHOT):
            raise ConfigError(f"key -> value state {self.name!r}: mode must be {CHANGES!r} (the keys changed this "
                              f"epoch) or {SNAPSHOT!r} (every key: the current state), got {mode!r}")
        settings, reports = self._bind(key)
        exprs = []
        how: dict[str, Aggregate] = {}
        for name, spec in aggregates.items():
            function = self._aggregate_of(name, spec)
            if name in settings.key_columns:
                raise ConfigError(f"key -> value state {self.name!r}: output {name!r} is also a key column")
            column = spec[1]
            arg = F.lit(1) if column == "*" else F.col(column)
            exprs.append(getattr(F, function.value)(arg).alias(name))
            how[name] = function
        if not exprs:
            raise ConfigError(f"key -> value state {self.name!r}: give at least one aggregate")
        self.aggregates = {name: [function.value, str(aggregates[name][1])] for name, function in how.items()}
        grouped = self._by_key_group(df, settings.key_columns)
        partial = grouped.groupBy(*settings.key_columns).agg(
            *exprs, F.first(KEY_GROUP_COLUMN).alias(KEY_GROUP_COLUMN)
        )
        out_schema = partial.drop(KEY_GROUP_COLUMN).schema
        fn = functools.partial(merge_partition, settings=settings, aggregates=how, reports=reports)
        self._input = df
        self._output = partial.mapInArrow(fn, out_schema)
        self._planned()
        return self._output if mode == CHANGES else self.snapshot()

    def _with_changes(self, restored: DataFrame) -> DataFrame:
        """Every restored key, with this epoch's merged values where it changed (one full outer join: the update is
        evaluated once)."""
        from pyspark.sql import functions as F

        assert self._output is not None
        keys = list(self.settings.key_columns)
        values = [c for c in self._output.columns if c not in keys]
        old = restored.select(*keys, *[F.col(v).alias(f"{v}{_OLD}") for v in values])
        new = self._output.withColumn(_CHANGED, F.lit(True))
        joined = old.join(new, on=keys, how="full_outer")
        changed = F.col(_CHANGED).isNotNull()
        return joined.select(*keys,
                             *[F.when(changed, F.col(v)).otherwise(F.col(f"{v}{_OLD}")).alias(v) for v in values])

    def _aggregate_of(self, name: str, spec: Any) -> Aggregate:
        """The aggregate function of an ``(function, column)`` spec, checked."""
        if isinstance(spec, (tuple, list)) and len(spec) == 2:
            try:
                return Aggregate(spec[0])
            except ValueError:
                pass
        raise ConfigError(f"key -> value state {self.name!r}: aggregate {name!r} must be "
                          f"(function, column) with function one of {tuple(a.value for a in Aggregate)}, "
                          f"got {spec!r}")
