"""Keyed state on executors: a key set for de-duplication and a key -> value map.

How one update works (the design measured in ``bench/bench_spark_stage.py``):

1. The input is repartitioned by the key into exactly ``key_groups`` partitions.
   Spark's hash partitioning puts a row in partition ``pmod(hash(key), G)`` -- the same
   JVM expression that defines the key group -- so partition ``g`` holds key group
   ``g`` and nothing else (checked on every row).
2. One ``mapInArrow`` task per key group loads the key group's chain (full part +
   deltas) straight from the checkpoint store, filters or merges the rows, streams the
   result on, and at the end of its input writes the key group's new part: a delta with
   only the changed keys, or a full part when the core's chain bound says so. Nothing
   of the state passes through the driver.
3. The task reports the part's reference (path, size, CRC32C) through a Spark
   accumulator -- a few hundred bytes per key group -- which Spark merges only for tasks
   that succeed. A key group with no changes reports none and keeps its previous chain
   (incremental checkpoints: unchanged key groups are not rewritten).

The update runs when the stage's output is computed (normally by a sink write), so the
data makes one pass. Part names carry the attempt *and* a per-task token, so a retried,
speculative or repeated evaluation never overwrites a part another evaluation reported;
the runner keeps one report per key group and removes the other parts.
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.checkpoint import (
    key_array,
    needs_full,
    read_chain,
    write_arrow_part,
)
from airflow_seatunnel_ckpt.core.codec import Codec
from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.core.models import OperatorState, PartRef
from airflow_seatunnel_ckpt.core.storage import open_storage

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.accumulators import Accumulator
    from pyspark.sql import DataFrame, SparkSession

#: What a task reports through the accumulator, one entry per key group.
Report = dict[str, Any]

log = logging.getLogger(__name__)

#: Column holding the key group while rows travel to their task.
KEY_GROUP_COLUMN = "__key_group"
#: Rows a key-set task de-duplicates in one go (bounds its memory; more rows are
#: processed in further chunks against everything seen so far).
DEFAULT_CHUNK_ROWS = 1_000_000
#: Merge functions a key -> value state applies to a key's previous value.
AGGREGATES = ("sum", "count", "min", "max")


class StateError(CheckpointError):
    """Keyed state cannot be used as asked (wrong key columns, key groups changed, ...)."""


# -- reports from executors ------------------------------------------------------------


class ReportList(AccumulatorParam[list[Report]]):
    """Accumulates the tasks' part reports (Spark merges only successful tasks' updates)."""

    def zero(self, value: list[Report]) -> list[Report]:
        """An empty report list."""
        return []

    def addInPlace(self, value1: list[Report], value2: list[Report]) -> list[Report]:
        """Append the reports of one task."""
        value1.extend(value2)
        return value1


# -- what an executor task needs (pickled into the closure) ------------------------------


@dataclass(frozen=True)
class StateTarget:
    """Everything a task needs to read a key group's chain and write its next part.

    Small and picklable: URLs, options and part references, never state contents.
    """

    operator: str
    state_kind: str
    key_columns: tuple[str, ...]
    key_groups: int
    epoch: int
    attempt: int
    store_url: str  #: the pipeline root the new parts are written to
    store_options: Mapping[str, Any] = field(repr=False)
    restore_url: str | None  #: the pipeline root the restored chains live in
    restore_options: Mapping[str, Any] = field(repr=False)
    chains: Mapping[int, tuple[PartRef, ...]]
    incremental: bool
    full_checkpoint_interval: int
    compression_level: int
    compression: str
    force_full: bool = False  #: restored from another store: write every key group in full

    def part_path(self, key_group: int, token: str) -> str:
        """The new part's path below the pipeline root (attempt- and task-unique)."""
        return layout.part_path(self.epoch, "operators", self.operator, key_group, self.attempt, token)

    def load(self, key_group: int) -> pa.Table | None:
        """The key group's restored state, or None when it has none yet."""
        chain = list(self.chains.get(key_group, ()))
        if not chain or self.restore_url is None:
            return None
        storage = open_storage(self.restore_url, self.restore_options)
        return read_chain(storage, chain, list(self.key_columns))

    def must_write_full(self, key_group: int) -> bool:
        """Whether this epoch's part of ``key_group`` must be a full part (chain bound)."""
        return self.force_full or needs_full(
            list(self.chains.get(key_group, ())), self.incremental, self.full_checkpoint_interval
        )

    def write(self, key_group: int, table: pa.Table, full: bool) -> PartRef:
        """Write ``table`` as the key group's new part (on an executor)."""
        storage = open_storage(self.store_url, self.store_options)
        chain = list(self.chains.get(key_group, ()))
        return write_arrow_part(
            storage,
            self.part_path(key_group, secrets.token_hex(6)),
            table,
            epoch=self.epoch,
            key_group=key_group,
            delta=not full,
            base_epoch=None if full else chain[-1].epoch,
            level=self.compression_level,
            compression=Codec.ZSTD if self.compression == "zstd" else Codec.LZ4,
        )


def _batch_key_group(batch: pa.RecordBatch, seen: int | None) -> int:
    """The one key group of a batch's rows (and of the task's earlier batches)."""
    import pyarrow.compute as pc

    groups = batch.column(batch.schema.get_field_index(KEY_GROUP_COLUMN))
    low, high = (v.as_py() for v in pc.min_max(groups).values())
    if low != high or (seen is not None and low != seen):
        groups_seen = sorted({low, high, seen} - {None})
        raise StateError(
            f"keyed state: one task received rows of key groups {groups_seen}; Spark did not "
            "keep the key-group partitioning of the state update"
        )
    return int(low)


def _report(
    target: StateTarget,
    key_group: int,
    partition: int,
    rows: int,
    changed: int,
    ref: PartRef | None,
) -> list[Report]:
    # ``aligned`` is False when Spark ran the task under another partition index than its
    # key group (e.g. a ``coalesce`` after the update); the runner then distrusts the
    # reports of empty tasks, whose key group is only known from that index.
    return [
        {
            "operator": target.operator,
            "key_group": key_group,
            "rows": rows,
            "changed": changed,
            "empty": rows == 0,
            "aligned": key_group == partition,
            "ref": ref.to_dict() if ref else None,
        }
    ]


def _first_unseen(keys: pa.Array | pa.ChunkedArray, known: pa.Array | None) -> pa.Array:
    """Positions (ascending) of the first occurrence of each key not in ``known``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    positions = pa.table({"k": keys, "i": np.arange(len(keys), dtype=np.int64)})
    firsts = positions.group_by("k", use_threads=False).aggregate([("i", "min")]).column("i_min")
    firsts = firsts.combine_chunks().sort()
    if known is not None and len(known):
        fresh = pc.invert(pc.is_in(pc.take(keys, firsts), value_set=known))
        firsts = firsts.filter(fresh)
    return firsts


def dedup_partition(
    batches: Iterator[pa.RecordBatch],
    *,
    target: StateTarget,
    accumulator: Accumulator[list[Report]],
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Executor side of :meth:`KeySet.dedup` for one key group (one task).

    Yields the rows whose key is neither in the restored key set nor earlier in this
    epoch's input (first occurrence wins), then writes the new keys as the key group's
    part and reports it.
    """
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    key_cols = list(target.key_columns)
    key_group: int | None = None
    restored: pa.Table | None = None
    known: pa.Array | None = None
    new_tables: list[pa.Table] = []
    pending: list[pa.RecordBatch] = []
    pending_rows = rows_in = 0

    def flush() -> Iterator[pa.RecordBatch]:
        nonlocal known, pending, pending_rows
        if not pending:
            return
        table = pa.Table.from_batches(pending)
        pending, pending_rows = [], 0
        keys = key_array(table, key_cols)
        fresh = table.take(_first_unseen(keys, known)).drop_columns([KEY_GROUP_COLUMN])
        if fresh.num_rows:
            new_tables.append(fresh.select(key_cols))
            added = key_array(fresh, key_cols).combine_chunks()
            known = added if known is None else pa.concat_arrays([known, added.cast(known.type)])
            yield from fresh.to_batches()

    for batch in batches:
        if batch.num_rows == 0:
            continue
        if key_group is None:
            key_group = _batch_key_group(batch, None)
            restored = target.load(key_group)
            known = (
                key_array(restored, key_cols).combine_chunks() if restored is not None else None
            )
        else:
            _batch_key_group(batch, key_group)
        pending.append(batch)
        pending_rows += batch.num_rows
        rows_in += batch.num_rows
        if pending_rows >= chunk_rows:
            yield from flush()
    yield from flush()

    # Reached only when the whole input was consumed: a partial evaluation (limit, take)
    # reports nothing, so the runner evaluates again instead of keeping a partial part.
    if key_group is None:  # no input: the partition index is the key group
        key_group = partition
        restored = target.load(key_group) if target.force_full else None
    new_keys = pa.concat_tables(new_tables) if new_tables else None
    ref: PartRef | None = None
    if new_keys is not None or (target.force_full and restored is not None):
        full = target.must_write_full(key_group)
        if full:
            parts = [
                t
                for t in (restored.select(key_cols) if restored is not None else None, new_keys)
                if t is not None
            ]
            table = pa.concat_tables(parts, promote_options="default")
        else:
            assert new_keys is not None
            table = new_keys
        # Sorted, so that the part's bytes do not depend on the order rows arrived in.
        table = table.sort_by([(c, "ascending") for c in key_cols]) if table.num_rows else table
        ref = target.write(key_group, table, full)
    changed = 0 if new_keys is None else new_keys.num_rows
    accumulator.add(_report(target, key_group, partition, rows_in, changed, ref))


def _merge_values(old: Any, new: Any, how: str) -> Any:
    import pyarrow.compute as pc

    if how in ("sum", "count"):
        return pc.coalesce(pc.add(old, new), new, old)
    if how == "min":
        return pc.min_element_wise(old, new, skip_nulls=True)
    return pc.max_element_wise(old, new, skip_nulls=True)


def merge_partition(
    batches: Iterator[pa.RecordBatch],
    *,
    target: StateTarget,
    aggregates: Mapping[str, str],
    accumulator: Accumulator[list[Report]],
) -> Iterator[pa.RecordBatch]:
    """Executor side of :meth:`KeyValueState.aggregate` for one key group (one task).

    The input holds this epoch's partial aggregate per key; each is merged into the key's
    restored value, the merged rows are yielded and written as the key group's part.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    key_cols = list(target.key_columns)
    key_group: int | None = None
    tables = []
    for batch in batches:
        if batch.num_rows:
            key_group = _batch_key_group(batch, key_group)
            tables.append(pa.Table.from_batches([batch]).drop_columns([KEY_GROUP_COLUMN]))
    if key_group is None:  # no input: the partition index is the key group
        key_group = partition
    restored = target.load(key_group) if tables or target.force_full else None
    ref: PartRef | None = None
    changed = 0
    if tables:
        partial = pa.concat_tables(tables)
        for name in key_cols:
            if partial.column(name).null_count:
                raise StateError(
                    f"key -> value state {target.operator!r}: key column {name!r} holds nulls; "
                    "drop or fill null keys before aggregating"
                )
        merged = partial
        if restored is not None and restored.num_rows:
            old = restored.rename_columns(
                [c if c in key_cols else f"{c}__old" for c in restored.column_names]
            )
            joined = partial.join(old, keys=key_cols, join_type="left outer", use_threads=False)
            columns = {c: joined.column(c) for c in key_cols}
            for name, how in aggregates.items():
                value = _merge_values(joined.column(f"{name}__old"), joined.column(name), how)
                columns[name] = value.cast(partial.schema.field(name).type)
            merged = pa.table(columns).select(partial.column_names).cast(partial.schema)
        changed = merged.num_rows
        yield from merged.to_batches()
        full = target.must_write_full(key_group)
        if full and restored is not None and restored.num_rows:
            keep = pc.invert(
                pc.is_in(key_array(restored, key_cols), value_set=key_array(merged, key_cols))
            )
            part = pa.concat_tables([restored.filter(keep).cast(merged.schema), merged])
        else:
            part = merged
        part = part.sort_by([(c, "ascending") for c in key_cols])
        ref = target.write(key_group, part, full)
    elif target.force_full and restored is not None:
        ref = target.write(key_group, restored.sort_by([(c, "ascending") for c in key_cols]), True)
    rows = sum(t.num_rows for t in tables)
    accumulator.add(_report(target, key_group, partition, rows, changed, ref))


def read_partition(
    batches: Iterator[pa.RecordBatch], *, target: StateTarget
) -> Iterator[pa.RecordBatch]:
    """Executor side of ``snapshot()``: stream the restored state of the key groups listed."""
    for batch in batches:
        for key_group in batch.column(0).to_pylist():
            table = target.load(int(key_group))
            if table is not None:
                yield from table.to_batches()


# -- driver side ----------------------------------------------------------------------------


def _key_list(key: str | Sequence[str]) -> list[str]:
    keys = [key] if isinstance(key, str) else list(key)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(f"keyed state: key must be a column name or a list of them, got {key!r}")
    return keys


class KeyedState:
    """One named keyed state of a stage, restored from the last committed checkpoint.

    Created through :meth:`StageContext.key_set` / :meth:`StageContext.key_value`; the
    runner calls :meth:`finish` after the stage function returned.
    """

    state_kind = ""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        *,
        key_groups: int,
        epoch: int,
        attempt: int,
        store_url: str,
        store_options: Mapping[str, Any],
        restored: OperatorState | None,
        restore_url: str | None,
        restore_options: Mapping[str, Any],
        incremental: bool,
        full_checkpoint_interval: int,
        compression: str,
        compression_level: int,
        force_full: bool = False,
    ) -> None:
        self.spark = spark
        self.name = name
        self.key_groups = key_groups
        self.restored = restored
        self._target_args: dict[str, Any] = {
            "operator": name,
            "state_kind": self.state_kind,
            "key_groups": key_groups,
            "epoch": epoch,
            "attempt": attempt,
            "store_url": store_url,
            "store_options": dict(store_options),
            "restore_url": restore_url if restored else None,
            "restore_options": dict(restore_options),
            "chains": {k: tuple(v) for k, v in (restored.chains if restored else {}).items()},
            "incremental": incremental,
            "full_checkpoint_interval": full_checkpoint_interval,
            "compression": compression,
            "compression_level": compression_level,
            "force_full": force_full,
        }
        if restored is not None:
            if restored.key_groups != key_groups:
                raise StateError(
                    f"keyed state {name!r} was checkpointed with {restored.key_groups} key groups, "
                    f"the stage asks for {key_groups}; key groups are fixed for the life of a "
                    "pipeline's state -- "
                    f"run the stage with key_groups={restored.key_groups}"
                )
            if restored.state_kind != self.state_kind:
                raise StateError(
                    f"keyed state {name!r} is a {restored.state_kind} in the checkpoint, "
                    f"not a {self.state_kind}; use another name for a new state"
                )
        self._key_columns: list[str] | None = list(restored.key_columns) if restored else None
        self._accumulator: Accumulator[list[Report]] | None = None
        self._output: DataFrame | None = None
        self._input: DataFrame | None = None

    # -- helpers shared by both kinds ----------------------------------------------------
    def _target(self, key_columns: list[str]) -> StateTarget:
        return StateTarget(key_columns=tuple(key_columns), **self._target_args)

    def _bind(self, key: str | Sequence[str]) -> list[str]:
        keys = _key_list(key)
        if self._output is not None:
            raise StateError(
                f"keyed state {self.name!r} is already updated in this stage; update a state "
                "once per stage (union the inputs first)"
            )
        if self._key_columns is not None and keys != self._key_columns:
            raise StateError(
                f"keyed state {self.name!r} is keyed by {self._key_columns} in the checkpoint, "
                f"not {keys}"
            )
        self._key_columns = keys
        self._accumulator = self.spark.sparkContext.accumulator([], ReportList())
        return keys

    def _by_key_group(self, df: DataFrame, keys: list[str]) -> DataFrame:
        from pyspark.sql import functions as F

        missing = [k for k in keys if k not in df.columns]
        if missing:
            raise StateError(
                f"keyed state {self.name!r}: key column(s) {missing} not in the DataFrame "
                f"(columns: {df.columns})"
            )
        if KEY_GROUP_COLUMN in df.columns:
            raise StateError(
                f"keyed state {self.name!r}: the column name {KEY_GROUP_COLUMN!r} is reserved"
            )
        # repartition(G, keys) places a row in partition pmod(murmur3(keys), G): the key group.
        group = F.pmod(F.hash(*[F.col(k) for k in keys]), F.lit(self.key_groups)).cast("int")
        return df.repartition(self.key_groups, *keys).withColumn(KEY_GROUP_COLUMN, group)

    # -- runner side -----------------------------------------------------------------------
    @property
    def updated(self) -> bool:
        """Whether the stage updated this state."""
        return self._output is not None

    def finish(self) -> tuple[OperatorState | None, int]:
        """Collect the key groups' new parts into the operator's chains.

        Evaluates the update once more (without output) if some key group never reported,
        i.e. the stage did not consume the updated DataFrame completely. A key group whose
        only reports are untrusted (see :meth:`_reports`) or that still has none is
        checked against the input: with no input rows it is unchanged, otherwise the
        stage cannot prepare. Returns the new operator state (None if never restored nor
        updated) and the bytes of parts written.
        """
        if self._output is None or self._accumulator is None:
            return self.restored, 0
        reports, unsure = self._reports()
        if len(reports) < self.key_groups or unsure:
            log.info(
                "keyed state %s: %d of %d key groups reported; evaluating the update to completion",
                self.name,
                len(reports) - len(unsure),
                self.key_groups,
            )
            self._output.write.format("noop").mode("overwrite").save()
            reports, unsure = self._reports()
        missing = set(range(self.key_groups)) - set(reports)
        to_check = sorted(missing | unsure)
        if to_check:
            with_input = self._key_groups_with_input(to_check)
            if with_input:
                raise StateError(
                    f"keyed state {self.name!r}: key groups {with_input[:10]} have input but never "
                    "reported their part after a full evaluation; the stage cannot prepare"
                )
            # No input rows in these key groups (Spark may not even run a task over input
            # it can prove empty): they are unchanged.
            for g in to_check:
                reports[g] = {"key_group": g, "ref": None, "rows": 0, "changed": 0}
        chains: dict[int, list[PartRef]] = {}
        restored = self.restored.chains if self.restored else {}
        written = 0
        for key_group in range(self.key_groups):
            report = reports[key_group]
            if report["ref"] is None:
                if restored.get(key_group):
                    chains[key_group] = list(restored[key_group])
                continue
            ref = PartRef.from_dict(report["ref"])
            written += ref.size
            chains[key_group] = [ref] if ref.kind == "full" else [*restored.get(key_group, []), ref]
        self._remove_unreported_parts({r["ref"]["path"] for r in reports.values() if r["ref"]})
        assert self._key_columns is not None
        state = OperatorState(self.key_groups, list(self._key_columns), chains, self.state_kind)
        return state, written

    def _reports(self) -> tuple[dict[int, Report], set[int]]:
        """One report per key group, and the key groups whose report is untrusted.

        Several evaluations may report a key group; any report of a task that had input
        is correct (the same input and restored state give the same keys). A task without
        input knows its key group only from its partition index, which is trustworthy
        unless some task ran under an index that is not its key group.
        """
        assert self._accumulator is not None
        with_rows: dict[int, Report] = {}
        without_rows: dict[int, Report] = {}
        aligned = True
        for report in self._accumulator.value:
            target = without_rows if report.get("empty") else with_rows
            target.setdefault(int(report["key_group"]), report)
            aligned = aligned and bool(report.get("aligned", True))
        chosen = {**without_rows, **with_rows}
        unsure = set() if aligned else set(without_rows) - set(with_rows)
        return chosen, unsure

    def _key_groups_with_input(self, key_groups: list[int]) -> list[int]:
        """Which of ``key_groups`` the update's input has rows in (reads the key columns)."""
        from pyspark.sql import functions as F

        assert self._input is not None and self._key_columns is not None
        group = F.pmod(F.hash(*[F.col(k) for k in self._key_columns]), F.lit(self.key_groups))
        found = (
            self._input.select(group.cast("int").alias("g"))
            .where(F.col("g").isin(key_groups))
            .distinct()
            .collect()
        )
        return sorted(int(row.g) for row in found)

    def _remove_unreported_parts(self, keep: set[str]) -> None:
        """Delete this attempt's parts no chosen report names (repeat evaluations, killed runs).

        Only ``part-<k>-<this attempt>-<token>`` files: another attempt's parts are never
        touched, whatever state that attempt is in.
        """
        args = self._target_args
        storage = open_storage(args["store_url"], args["store_options"])
        sample = layout.part_path(args["epoch"], "operators", self.name, 0, args["attempt"])
        folder = sample.rsplit("/", 1)[0]
        own = re.compile(rf"part-\d+-{int(args['attempt'])}-[0-9a-f]+")
        for info in storage.walk(folder):
            path = f"{folder}/{info.path}"
            if path not in keep and own.fullmatch(info.path):
                storage.delete(path)

    def snapshot(self, schema: Any = None) -> DataFrame:
        """The restored state (as of the last committed checkpoint), read on executors.

        ``schema`` (a DDL string or ``StructType``) is needed only when the state has no
        key groups yet; otherwise it is taken from one part's header.
        """
        from pyspark.sql.types import StructType

        target = self._target(self._key_columns or [])
        if schema is None:
            sample = next((g for g, chain in target.chains.items() if chain), None)
            if sample is None:
                raise StateError(
                    f"keyed state {self.name!r} is empty; pass the schema to snapshot()"
                )
            table = target.load(sample)
            assert table is not None
            from pyspark.sql.pandas.types import from_arrow_schema

            schema = from_arrow_schema(table.schema)
        if isinstance(schema, str):
            schema = StructType.fromDDL(schema)
        groups = self.spark.range(self.key_groups).repartition(min(self.key_groups, 64))
        return groups.mapInArrow(functools.partial(read_partition, target=target), schema)


class KeySet(KeyedState):
    """A set of keys seen by committed epochs, for exactly-once de-duplication."""

    state_kind = "key_set"

    def dedup(
        self, df: DataFrame, key: str | Sequence[str], chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> DataFrame:
        """Rows of ``df`` whose key no committed epoch has seen, one row per key.

        Among rows of this epoch with the same key the first one read is kept (like
        ``dropDuplicates``). The new keys become part of the state this epoch prepares.
        """
        keys = self._bind(key)
        target = self._target(keys)
        assert self._accumulator is not None
        fn = functools.partial(
            dedup_partition, target=target, accumulator=self._accumulator, chunk_rows=chunk_rows
        )
        self._input = df
        self._output = self._by_key_group(df, keys).mapInArrow(fn, df.schema)
        return self._output


class KeyValueState(KeyedState):
    """A key -> value map of running aggregates (sum, count, min, max) across epochs."""

    state_kind = "key_value"

    def aggregate(
        self, df: DataFrame, key: str | Sequence[str], aggregates: Mapping[str, tuple[str, str]]
    ) -> DataFrame:
        """Fold this epoch's rows into the running aggregates; returns the updated keys.

        ``aggregates`` maps an output column to ``(function, input column)``, e.g.
        ``{"total": ("sum", "amount"), "orders": ("count", "*")}``. The result has the key
        columns and the output columns, one row per key that changed this epoch, holding
        the running value over every committed epoch plus this one.
        """
        from pyspark.sql import functions as F

        keys = self._bind(key)
        exprs = []
        how: dict[str, str] = {}
        for name, spec in aggregates.items():
            if not isinstance(spec, (tuple, list)) or len(spec) != 2 or spec[0] not in AGGREGATES:
                raise ConfigError(
                    f"key -> value state {self.name!r}: aggregate {name!r} must be "
                    f"(function, column) with function one of {AGGREGATES}, got {spec!r}"
                )
            fn, column = spec
            if name in keys:
                raise ConfigError(
                    f"key -> value state {self.name!r}: output {name!r} is also a key column"
                )
            arg = F.lit(1) if column == "*" else F.col(column)
            exprs.append(getattr(F, fn)(arg).alias(name))
            how[name] = fn
        if not exprs:
            raise ConfigError(f"key -> value state {self.name!r}: give at least one aggregate")
        target = self._target(keys)
        assert self._accumulator is not None
        grouped = self._by_key_group(df, keys)
        partial = grouped.groupBy(*keys).agg(
            *exprs, F.first(KEY_GROUP_COLUMN).alias(KEY_GROUP_COLUMN)
        )
        out_schema = partial.drop(KEY_GROUP_COLUMN).schema
        fn_ = functools.partial(
            merge_partition, target=target, aggregates=how, accumulator=self._accumulator
        )
        self._input = df
        self._output = partial.mapInArrow(fn_, out_schema)
        return self._output
