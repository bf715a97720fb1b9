"""Executor side of keyed state: what runs in the tasks, one task per key group (load its chain, stream the result,
write and report the new part)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_seatunnel_ckpt.core.models import PartRef
from airflow_seatunnel_ckpt.core.state.checkpoint import TOMBSTONE, read_chain
from airflow_seatunnel_ckpt.core.state.run_chain import (
    compaction_cap,
    conform,
    live_runs,
    lookup,
    merge_sorted,
    merged_schema,
    plan_compaction,
)
from airflow_seatunnel_ckpt.core.state.runs import EPOCH_COLUMN, RunReader, sort_keys, write_run
from airflow_seatunnel_ckpt.spark.session import freeze_worker_heap
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

    from airflow_seatunnel_ckpt.spark.state.reports import ReportFolder


def load_key_group(settings: StateSettings, key_group: int) -> pa.Table | None:
    """The key group's whole restored state (snapshot, schema), or None when it has none yet."""
    chain = live_runs(settings.chain(key_group), settings.min_epoch)
    if not chain:
        return None
    return read_chain(settings.restore_from.open(), chain, list(settings.key_columns))


def state_schema(settings: StateSettings, key_group: int) -> pa.Schema:
    """The state's columns, from the newest part of ``key_group``'s chain (its index only)."""
    ref = settings.chain(key_group)[-1]
    schema = RunReader(settings.restore_from.open(), ref, list(settings.key_columns)).schema
    for internal in (EPOCH_COLUMN, TOMBSTONE):
        if internal in schema.names:
            schema = schema.remove(schema.get_field_index(internal))
    return schema


def lookup_keys(settings: StateSettings, key_group: int, keys: pa.Array) -> tuple[Any, pa.Table | None, int]:
    """``core.state.run_chain.lookup`` of unique ``keys`` in ``key_group``'s restored chain."""
    return lookup(settings.restore_from.open(), settings.chain(key_group), list(settings.key_columns), keys,
                  min_epoch=settings.min_epoch)


def _sorted_by_keys(table: pa.Table, key_cols: list[str]) -> pa.Table:
    """``table`` in run order (see ``core.state.runs.sort_keys``)."""
    import pyarrow.compute as pc

    return table.take(pc.sort_indices(sort_keys(table, key_cols))) if table.num_rows else table


class Written(NamedTuple):
    """What :func:`write_key_group` wrote (see :class:`PartReport` for the fields)."""

    part: PartRef | None = None
    replaces: int = 0
    read: int = 0
    merged: PartRef | None = None
    merge_start: int = 0
    merge_end: int = 0


def write_key_group(settings: StateSettings, key_group: int, table: pa.Table | None) -> Written:
    """Write the epoch's changed rows of ``key_group`` as a new run and compact when due.

    A compaction merges a window of neighbouring runs into one within the epoch's merge budget
    (``core.state.run_chain.compaction_cap``); a chain that must be written in full (or holds parts read whole) becomes
    one FULL run.
    """
    chain = settings.chain(key_group)
    store = settings.store.open()
    key_cols = list(settings.key_columns)
    policy = settings.policy
    if table is not None and table.num_rows:
        table = _sorted_by_keys(table, key_cols)
    else:
        table = None
    if chain and (settings.must_write_full(key_group) or any(r.index is None for r in chain)):
        # A chain of parts read whole (no run index) becomes one run on its first change,
        # once: lookups in it would otherwise read it whole every epoch.
        return _merge(settings, key_group, chain, 0, table)
    ref: PartRef | None = None
    if table is not None:
        ref = write_run(store, settings.part_path(key_group, secrets.token_hex(6)), [table], key_cols, table.schema,
                        epoch=settings.epoch, key_group=key_group,
                        delta=bool(chain), base_epoch=chain[-1].epoch if chain else None,
                        block_rows=policy.block_rows, level=policy.compression_level,
                        compression=policy.compression)
    cap = compaction_cap(settings.chains, settings.key_groups, key_group, settings.epoch,
                         budget=policy.compaction_budget, turns=policy.compaction_turns, floor=policy.compaction_floor,
                         changes=ref.size if ref is not None else 0, min_epoch=settings.min_epoch)
    sizes = [r.size for r in chain] + ([ref.size] if ref is not None else [])
    window = plan_compaction(sizes, cap, policy.fanout, soft_runs=2 * policy.fanout)
    if window is None:
        return Written(ref)
    start, end = window
    if ref is not None and end == len(sizes):
        # The window ends with the new run: the merge takes the changes from memory and
        # replaces the chain's newest runs (the new run's file is left unreported).
        return _merge(settings, key_group, chain[start:], start, table, base=chain[start - 1] if start else None)
    merged = _merge(settings, key_group, chain[start:end], start, None, base=chain[start - 1] if start else None)
    return Written(ref, 0, merged.read, merged.part, start, end)


def _merge(settings: StateSettings, key_group: int, runs: list[PartRef], start: int, table: pa.Table | None,
           base: PartRef | None = None) -> Written:
    """Merge ``runs`` (the chain's from ``start`` on) and ``table`` into one run: with ``table`` it replaces the whole
    chain (``replaces``), without it takes ``runs``' place; from the first run it is FULL (no tombstones or expired
    rows), else DELTA."""
    policy = settings.policy
    key_cols = list(settings.key_columns)
    restore = settings.restore_from.open()
    readers = [RunReader(restore, r, key_cols) for r in live_runs(runs, settings.min_epoch)]
    sources = [reader.blocks() for reader in readers] + ([iter([table])] if table is not None else [])
    epochs = [r.ref.epoch for r in readers] + ([settings.epoch] if table is not None else [])
    schemas = [r.schema for r in readers] + ([table.schema] if table is not None else [])
    if not sources:  # every merged run expired and nothing new: nothing left of them
        return Written(None, len(runs), 0)
    schema = merged_schema(schemas, drop_tombstones=start == 0)
    part = write_run(
        settings.store.open(), settings.part_path(key_group, secrets.token_hex(6)),
        merge_sorted(sources, key_cols, schema, epochs=epochs, drop_dead=start == 0, min_epoch=settings.min_epoch),
        key_cols, schema, epoch=settings.epoch, key_group=key_group, delta=start > 0,
        base_epoch=base.epoch if base is not None else None, block_rows=policy.block_rows,
        level=policy.compression_level, compression=policy.compression)
    return Written(part, len(runs), sum(r.bytes_read for r in readers))


def _batch_key_group(batch: pa.RecordBatch, seen: int | None) -> int:
    """The one key group of a batch's rows (and of the task's earlier batches)."""
    import pyarrow.compute as pc

    groups = batch.column(batch.schema.get_field_index(KEY_GROUP_COLUMN))
    low, high = (v.as_py() for v in pc.min_max(groups).values())
    if low != high or (seen is not None and low != seen):
        groups_seen = sorted({low, high, seen} - {None})
        raise StateError(f"keyed state: one task received rows of key groups {groups_seen}; Spark did not "
                         "keep the key-group partitioning of the state update")
    return int(low)


def _task_partition() -> int:
    """The partition index Spark runs this task under (0 outside a task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _report(reports: ReportFolder, key_group: int, partition: int, rows: int, changed: int, written: Written,
            read: int) -> None:
    report = PartReport(key_group, rows, changed, aligned=key_group == partition, part=written.part,
                        replaces=written.replaces, read=read + written.read, merged=written.merged,
                        merge_start=written.merge_start, merge_end=written.merge_end)
    reports.add([report])


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


def dedup_keep(batches: Iterator[tuple[pa.Array, ...]], *, settings: StateSettings, reports: ReportFolder,
               chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[pa.Array]:
    """Executor side of :meth:`KeySet.dedup` for one key group (one task).

    A scalar Arrow iterator UDF over the key columns and the key-group column: yields, per row in order, whether its key
    is neither live in the restored set (looked up in the runs, never loaded) nor earlier in this epoch; at the end of
    its input it writes and reports the new keys' run.
    """
    import numpy as np
    import pyarrow as pa

    freeze_worker_heap()
    partition = _task_partition()
    key_cols = list(settings.key_columns)
    names = [*key_cols, KEY_GROUP_COLUMN]
    key_group: int | None = None
    known: pa.Array | None = None  #: this epoch's new keys so far (bounded by the input)
    new_tables: list[pa.Table] = []
    pending: list[pa.RecordBatch] = []
    pending_rows = rows_in = read = 0

    def flush() -> Iterator[pa.Array]:
        nonlocal known, pending, pending_rows, read
        if not pending:
            return
        assert key_group is not None
        table = pa.Table.from_batches(pending)
        pending, pending_rows = [], 0
        keys = sort_keys(table, key_cols)
        firsts = _first_unseen(keys, known)
        found, _, bytes_read = lookup_keys(settings, key_group, keys.take(firsts))
        read += bytes_read
        fresh_mask = np.ones(len(firsts), dtype=bool)
        fresh_mask[found] = False
        fresh_at = firsts.filter(pa.array(fresh_mask))
        keep = np.zeros(table.num_rows, dtype=bool)
        keep[fresh_at.to_numpy()] = True
        if len(fresh_at):
            stored = table.take(fresh_at).select(key_cols)
            if settings.ttl_epochs is not None:
                epochs = np.full(stored.num_rows, settings.epoch, np.int64)
                stored = stored.append_column(EPOCH_COLUMN, pa.array(epochs))
            new_tables.append(stored)
            added = sort_keys(stored, key_cols)
            known = added if known is None else pa.concat_arrays([known, added.cast(known.type)])
        yield pa.array(keep)

    for columns in batches:
        batch = pa.RecordBatch.from_arrays(list(columns), names=names)
        if batch.num_rows == 0:
            yield pa.array(np.zeros(0, dtype=bool))
            continue
        _refuse_null_keys(batch, key_cols, settings.name)
        key_group = _batch_key_group(batch, key_group)
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
    new_keys = pa.concat_tables(new_tables) if new_tables else None
    written = Written()
    if new_keys is not None or (settings.policy.force_full and settings.chain(key_group)):
        written = write_key_group(settings, key_group, new_keys)
    changed = 0 if new_keys is None else new_keys.num_rows
    _report(reports, key_group, partition, rows_in, changed, written, read)


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
    """A null key is refused, in both state kinds: a key set would fold every row with a null key into one (rows
    silently lost), a key -> value state would sum them into one."""
    for name in key_cols:
        if table.column(name).null_count:
            raise StateError(_null_key_message(state, name))


_NULL_KEY = re.compile(r"keyed state '([^']+)': key column '([^']+)' holds nulls")


def null_key_error(exc: BaseException) -> tuple[str, str] | None:
    """``(state, column)`` if ``exc`` (as Spark raised it on the driver, wrapping the executor's error) is the null-key
    error of :func:`merge_partition`, else None."""
    match = _NULL_KEY.search(str(exc))
    return (match.group(1), match.group(2)) if match else None


def merge_partition(batches: Iterator[pa.RecordBatch], *, settings: StateSettings,
                    aggregates: Mapping[str, Aggregate], reports: ReportFolder) -> Iterator[pa.RecordBatch]:
    """Executor side of :meth:`KeyValueState.aggregate` for one key group (one task): the restored values of the epoch's
    keys are looked up, merged, yielded and written as the new run."""
    import numpy as np
    import pyarrow as pa

    freeze_worker_heap()
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
    written = Written()
    changed = read = 0
    if tables:
        partial = pa.concat_tables(tables)
        _refuse_null_keys(partial, key_cols, settings.name)
        found, old, read = lookup_keys(settings, key_group, sort_keys(partial, key_cols))
        merged = partial
        if old is not None:
            at = np.full(partial.num_rows, -1, dtype=np.int64)
            at[found] = np.arange(len(found))
            take = pa.array(at, mask=at < 0)
            columns = {c: partial.column(c) for c in key_cols}
            for name, how in aggregates.items():
                if name not in old.column_names:  # a new aggregate column: empty so far
                    columns[name] = partial.column(name)
                    continue
                stored = old.column(name).take(take).cast(partial.schema.field(name).type)  # widened since
                value = _merge_values(stored, partial.column(name), how)
                columns[name] = value.cast(partial.schema.field(name).type)
            merged = pa.table(columns).select(partial.column_names).cast(partial.schema)
        changed = merged.num_rows
        yield from merged.to_batches()
        written = write_key_group(settings, key_group, merged)
    elif settings.policy.force_full and settings.chain(key_group):
        written = write_key_group(settings, key_group, None)
    rows = sum(t.num_rows for t in tables)
    _report(reports, key_group, partition, rows, changed, written, read)


def read_partition(batches: Iterator[pa.RecordBatch], *, settings: StateSettings,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Executor side of ``snapshot()``: stream the listed key groups' restored state in ``schema``'s columns (null where
    a part lacks one)."""
    freeze_worker_heap()
    for batch in batches:
        for key_group in batch.column(0).to_pylist():
            table = load_key_group(settings, int(key_group))
            if table is not None:
                yield from conform(table, schema).to_batches()
