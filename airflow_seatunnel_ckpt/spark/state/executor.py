"""Executor side of keyed state: what runs inside ``mapInArrow``, one task per key group.

Pure functions over Arrow batches plus the loading and writing of one key group's parts.
A task receives the rows of exactly one key group (the driver repartitions by key into
``key_groups`` partitions), loads that key group's chain straight from the checkpoint
store, streams its result on, writes the key group's new part at the end of its input
and reports the part through the update's accumulator. Nothing of the state passes
through the driver.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.checkpoint import key_array, read_chain, write_arrow_part
from airflow_seatunnel_ckpt.core.models import PartRef
from airflow_seatunnel_ckpt.spark.state.reports import PartReport
from airflow_seatunnel_ckpt.spark.state.settings import (
    DEFAULT_CHUNK_ROWS,
    KEY_GROUP_COLUMN,
    Aggregate,
    StateError,
    StateSettings,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.accumulators import Accumulator


def load_key_group(settings: StateSettings, key_group: int) -> pa.Table | None:
    """The key group's restored state, or None when it has none yet."""
    chain = settings.chain(key_group)
    if not chain:
        return None
    return read_chain(settings.restore_from.open(), chain, list(settings.key_columns))


def write_key_group(settings: StateSettings, key_group: int, table: pa.Table, full: bool) -> PartRef:
    """Write ``table`` as the key group's new part, under a name no other task uses."""
    chain = settings.chain(key_group)
    return write_arrow_part(
        settings.store.open(),
        settings.part_path(key_group, secrets.token_hex(6)),
        table,
        epoch=settings.epoch,
        key_group=key_group,
        delta=not full,
        base_epoch=None if full else chain[-1].epoch,
        level=settings.policy.compression_level,
        compression=settings.policy.compression,
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


def _task_partition() -> int:
    """The partition index Spark runs this task under (0 outside a task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _report(
    accumulator: Accumulator[list[PartReport]],
    key_group: int,
    partition: int,
    rows: int,
    changed: int,
    part: PartRef | None,
) -> None:
    report = PartReport(key_group, rows, changed, aligned=key_group == partition, part=part)
    accumulator.add([report])


def _sorted_by_keys(table: pa.Table, key_cols: list[str]) -> pa.Table:
    """``table`` in key order, so that a part's bytes do not depend on the order rows arrived in."""
    return table.sort_by([(c, "ascending") for c in key_cols]) if table.num_rows else table


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
    settings: StateSettings,
    accumulator: Accumulator[list[PartReport]],
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Executor side of :meth:`KeySet.dedup` for one key group (one task).

    Yields the rows whose key is neither in the restored key set nor earlier in this
    epoch's input (first occurrence wins), then writes the new keys as the key group's
    part and reports it.
    """
    import pyarrow as pa

    partition = _task_partition()
    key_cols = list(settings.key_columns)
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
        _refuse_null_keys(batch, key_cols, settings.name)
        if key_group is None:
            key_group = _batch_key_group(batch, None)
            restored = load_key_group(settings, key_group)
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
        restored = load_key_group(settings, key_group) if settings.policy.force_full else None
    new_keys = pa.concat_tables(new_tables) if new_tables else None
    ref: PartRef | None = None
    if new_keys is not None or (settings.policy.force_full and restored is not None):
        full = settings.must_write_full(key_group)
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
        ref = write_key_group(settings, key_group, _sorted_by_keys(table, key_cols), full)
    changed = 0 if new_keys is None else new_keys.num_rows
    _report(accumulator, key_group, partition, rows_in, changed, ref)


def _merge_values(old: Any, new: Any, how: Aggregate) -> Any:
    """A key's running value: its restored value ``old`` combined with this epoch's ``new``."""
    import pyarrow.compute as pc

    if how in (Aggregate.SUM, Aggregate.COUNT):
        return pc.coalesce(pc.add(old, new), new, old)
    if how == Aggregate.MIN:
        return pc.min_element_wise(old, new, skip_nulls=True)
    return pc.max_element_wise(old, new, skip_nulls=True)


def _null_key_message(state: str, column: str) -> str:
    # The driver recognises this text (see null_key_error) and names the input files.
    return (f"keyed state {state!r}: key column {column!r} holds nulls; "
            "drop or fill null keys before updating the state")


def _refuse_null_keys(table: pa.Table | pa.RecordBatch, key_cols: Sequence[str], state: str) -> None:
    """A null key is refused, in both state kinds: a key set would fold every row with a
    null key into one (rows silently lost), a key -> value state would sum them into one."""
    for name in key_cols:
        if table.column(name).null_count:
            raise StateError(_null_key_message(state, name))


_NULL_KEY = re.compile(r"keyed state '([^']+)': key column '([^']+)' holds nulls")


def null_key_error(exc: BaseException) -> tuple[str, str] | None:
    """``(state, column)`` if ``exc`` (as Spark raised it on the driver, wrapping the
    executor's error) is the null-key error of :func:`merge_partition`, else None."""
    match = _NULL_KEY.search(str(exc))
    return (match.group(1), match.group(2)) if match else None


def merge_partition(
    batches: Iterator[pa.RecordBatch],
    *,
    settings: StateSettings,
    aggregates: Mapping[str, Aggregate],
    accumulator: Accumulator[list[PartReport]],
) -> Iterator[pa.RecordBatch]:
    """Executor side of :meth:`KeyValueState.aggregate` for one key group (one task).

    The input holds this epoch's partial aggregate per key; each is merged into the key's
    restored value, the merged rows are yielded and written as the key group's part.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    partition = _task_partition()
    key_cols = list(settings.key_columns)
    key_group: int | None = None
    tables = []
    for batch in batches:
        if batch.num_rows:
            key_group = _batch_key_group(batch, key_group)
            tables.append(pa.Table.from_batches([batch]).drop_columns([KEY_GROUP_COLUMN]))
    if key_group is None:  # no input: the partition index is the key group
        key_group = partition
    restored = load_key_group(settings, key_group) if tables or settings.policy.force_full else None
    ref: PartRef | None = None
    changed = 0
    if tables:
        partial = pa.concat_tables(tables)
        _refuse_null_keys(partial, key_cols, settings.name)
        merged = partial
        if restored is not None and restored.num_rows:
            old = restored.rename_columns(
                [c if c in key_cols else f"{c}__old" for c in restored.column_names]
            )
            joined = partial.join(old, keys=key_cols, join_type="left outer", use_threads=False)
            columns = {c: joined.column(c) for c in key_cols}
            for name, how in aggregates.items():
                if f"{name}__old" not in joined.column_names:  # a new aggregate column: empty so far
                    columns[name] = joined.column(name)
                    continue
                value = _merge_values(joined.column(f"{name}__old"), joined.column(name), how)
                columns[name] = value.cast(partial.schema.field(name).type)
            merged = pa.table(columns).select(partial.column_names).cast(partial.schema)
        changed = merged.num_rows
        yield from merged.to_batches()
        full = settings.must_write_full(key_group)
        if full and restored is not None and restored.num_rows:
            keep = pc.invert(
                pc.is_in(key_array(restored, key_cols), value_set=key_array(merged, key_cols))
            )
            kept = restored.filter(keep)
            for field in merged.schema:  # a new aggregate column is null for the keys kept as they were
                if field.name not in kept.column_names:
                    kept = kept.append_column(field.name, pa.nulls(kept.num_rows, field.type))
            part = pa.concat_tables([kept.select(merged.column_names).cast(merged.schema), merged])
        else:
            part = merged
        ref = write_key_group(settings, key_group, _sorted_by_keys(part, key_cols), full)
    elif settings.policy.force_full and restored is not None:
        ref = write_key_group(settings, key_group, _sorted_by_keys(restored, key_cols), True)
    rows = sum(t.num_rows for t in tables)
    _report(accumulator, key_group, partition, rows, changed, ref)


def read_partition(
    batches: Iterator[pa.RecordBatch], *, settings: StateSettings
) -> Iterator[pa.RecordBatch]:
    """Executor side of ``snapshot()``: stream the restored state of the key groups listed."""
    for batch in batches:
        for key_group in batch.column(0).to_pylist():
            table = load_key_group(settings, int(key_group))
            if table is not None:
                yield from table.to_batches()
