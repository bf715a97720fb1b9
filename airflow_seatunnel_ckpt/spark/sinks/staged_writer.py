"""Staging Parquet with each file's CRC32C computed by the executor that writes it.

A Python data source writer encodes the executor's Arrow batches with pyarrow, checksums the bytes as it stores each
file (one atomic write, a single PUT carrying the CRC32C) and returns ``(path, size, CRC32C)``; the job commit -- only
tasks Spark committed -- writes them to ``<staging>/_seatunnel_files.json`` (:data:`core.protocol.staging.FILES_LIST`),
the authoritative file list, so the driver reads no data and a failed task's file is not output. Used by
:class:`~airflow_seatunnel_ckpt.spark.sinks.files.FileSink` for Parquet with at most ``compression`` and partition types
of :func:`supported_partition_type`.

With ``expectation_rules`` it applies a sink's expectations itself: a per-row failure mask, counts per rule, the rows
removed left out and the quarantined ones staged in ``quarantine_path``; the counts go with the file list
(:func:`expectation_counts`; docs/EXPECTATIONS.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from airflow_seatunnel_ckpt.core.protocol.expectations import REMOVING
from airflow_seatunnel_ckpt.core.protocol.staging import FILES_LIST
from airflow_seatunnel_ckpt.spark.session import freeze_worker_heap

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.storage import Storage

NAME = "seatunnel_staged_parquet"
#: A staged file is closed and the next one started once it holds this many bytes.
ROLL_BYTES = 64 * 1024 * 1024
#: Rows are buffered into row groups of up to this many bytes (of Arrow data) or rows, as Spark's writer fills
#: ``parquet.block.size``: a row group per Arrow batch (10,000 rows) would make files of many tiny row groups.
ROW_GROUP_BYTES = 32 * 1024 * 1024
ROW_GROUP_ROWS = 1_048_576
#: Spark's directory name for a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: The option carrying the store's fsspec options: its name matches Spark's default
#: ``spark.redaction.regex`` (``secret``), so the plan and the UI show it redacted.
OPTIONS_KEY = "secret.storage_options"
# Characters Spark escapes in partition directory names (ExternalCatalogUtils.escapePathName).
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(1, 32)}


def supported_partition_type(type_name: str) -> bool:
    """Whether a partition column of this Spark type (``simpleString``) is named here exactly as Spark names it."""
    return type_name in ("string", "tinyint", "smallint", "int", "bigint", "boolean", "date")


def partition_dir_value(value: Any) -> str:
    """A partition value as Spark writes it in a directory name (``col=<this>``)."""
    if value is None:
        return NULL_PARTITION
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if text == "":
        return NULL_PARTITION  # Spark writes an empty string as the null partition too
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


@dataclass
class StagedFiles(WriterCommitMessage):
    """One task's commit message: the files it stored, relative to the staging directory (and, when the rows are split,
    the quarantined rows' files, relative to theirs)."""

    files: list[dict[str, Any]] = field(default_factory=list)
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    #: The expectations' counts of the task's rows (see :func:`expectation_counts`).
    counts: dict[str, int] = field(default_factory=dict)


class StagedParquetSource(DataSource):
    """``df.write.format("seatunnel_staged_parquet").option("path", <staging URL>)``."""

    @classmethod
    def name(cls) -> str:
        """The format name to write with."""
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> StagedParquetWriter:
        """The writer of one job (``overwrite`` is moot: every attempt stages into a new directory)."""
        return StagedParquetWriter(dict(self.options))


class StagedParquetWriter(DataSourceArrowWriter):
    """Writes a task's batches as Parquet files into the staging directory, checksumming each."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = options["path"]
        self.storage_options = json.loads(options.get(OPTIONS_KEY) or "{}")
        self.partition_by = json.loads(options.get("partition_by") or "[]")
        self.compression = COMPRESSIONS[(options.get("compression") or "snappy").lower()]
        #: ``[mask column, bit, rule name, action]`` per expectation: a row fails the rule when the bit is set in
        #: its mask column (never null). Rows failing a ``quarantine`` rule go to ``quarantine_path``: their
        #: ``quarantine_columns`` and ``failed_column`` (the rules they broke, named here from the masks).
        self.expectation_rules: list[list[Any]] = json.loads(options.get("expectation_rules") or "[]")
        self.quarantine_url = options.get("quarantine_path") or None
        self.quarantine_columns: list[str] = json.loads(options.get("quarantine_columns") or "[]")
        self.failed_column = options.get("failed_column") or "_expectations_failed"

    def write(self, iterator: Iterator[Any]) -> StagedFiles:
        """Store this task's rows; runs on an executor."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        freeze_worker_heap()

        storage = staging_storage(self.url, self.storage_options)
        context = TaskContext.get()
        task = f"{context.partitionId():05d}" if context is not None else "00000"
        # Unique per task attempt: a retried task never overwrites a file a reader of the
        # first attempt's commit message could be pointed at.
        token = uuid.uuid4().hex[:12]
        stored: list[dict[str, Any]] = []
        current: tuple[str, pa.BufferOutputStream, pq.ParquetWriter] | None = None
        rules = _TaskExpectations(self, task, token) if self.expectation_rules else None
        written = 0  # rows in the current file

        def close() -> None:
            nonlocal current
            if current is None:
                return
            path, sink, writer = current
            writer.close()
            current = None
            if rules is not None and not written:
                return  # the rules removed every row meant for it: no file
            stored.append(_store_file(storage, path, sink.getvalue()))

        def open_file(directory: str, schema: pa.Schema) -> None:
            nonlocal current, written
            name = _file_name(task, token, len(stored), self.compression)
            path = f"{directory}/{name}" if directory else name
            sink = pa.BufferOutputStream()
            if rules is not None:
                schema = rules.kept_schema(schema)
            current = (path, sink, pq.ParquetWriter(sink, schema, compression=self.compression))
            written = 0

        directory = None
        buffered: list[pa.Table] = []
        buffered_rows = buffered_bytes = 0

        def write_buffered() -> None:
            nonlocal buffered, buffered_rows, buffered_bytes, written
            if buffered:
                assert current is not None
                rows = pa.concat_tables(buffered)
                if rules is not None:  # once per row group: the split costs little per row
                    rows = rules.take(rows)
                if rows.num_rows:
                    current[2].write_table(rows, row_group_size=ROW_GROUP_ROWS)
                    written += rows.num_rows
            buffered, buffered_rows, buffered_bytes = [], 0, 0

        for batch in iterator:
            table = pa.Table.from_batches([batch])
            for part_dir, rows in self._by_partition(table):
                if current is not None and part_dir != directory:
                    write_buffered()
                    close()
                if current is None:
                    open_file(part_dir, rows.schema)
                    directory = part_dir
                buffered.append(rows)
                buffered_rows += rows.num_rows
                buffered_bytes += rows.nbytes
                if buffered_rows >= ROW_GROUP_ROWS or buffered_bytes >= ROW_GROUP_BYTES:
                    write_buffered()
                    assert current is not None
                    if current[1].tell() >= ROLL_BYTES:
                        close()
        write_buffered()
        close()
        if rules is None:
            return StagedFiles(stored)
        return StagedFiles(stored, rules.quarantine.finish() if rules.quarantine is not None else [], rules.counts)

    def _by_partition(self, table: Any) -> Iterator[tuple[str, Any]]:
        """``(directory, rows without the partition columns)`` for each run of equal partition values (the task's rows
        are sorted by them)."""
        if not self.partition_by:
            yield "", table
            return
        import numpy as np
        import pyarrow.compute as pc

        n = table.num_rows
        columns = [table.column(c) for c in self.partition_by]
        data = table.drop_columns(self.partition_by)
        changed = np.zeros(max(n - 1, 0), dtype=bool)
        for col in columns:
            if n < 2:
                break
            a, b = col.slice(0, n - 1), col.slice(1)
            differs = pc.or_(pc.xor(pc.is_null(a), pc.is_null(b)), pc.fill_null(pc.not_equal(a, b), False))
            changed |= differs.to_numpy(zero_copy_only=False)
        starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
        for start, end in zip(starts, [*starts[1:], n], strict=True):
            directory = "/".join(f"{quote_name(c)}={partition_dir_value(col[start].as_py())}"
                                 for c, col in zip(self.partition_by, columns, strict=True))
            yield directory, data.slice(start, end - start)

    def commit(self, messages: list[Any]) -> None:
        """The job commit: list exactly the committed tasks' files in the staging directory."""
        files = sorted((f for m in messages if m is not None for f in m.files), key=lambda f: f["path"])
        listed: dict[str, Any] = {"files": files}
        if self.expectation_rules:  # only the committed tasks' counts: a retried task counts once
            counts: dict[str, int] = {}
            for m in messages:
                for key, n in (m.counts if m is not None else {}).items():
                    counts[key] = counts.get(key, 0) + n
            listed[COUNTS_KEY] = counts
        self._list(self.url, listed)
        if self.quarantine_url:
            files = sorted((f for m in messages if m is not None for f in m.quarantined), key=lambda f: f["path"])
            self._list(self.quarantine_url, {"files": files})

    def _list(self, url: str, listed: dict[str, Any]) -> None:
        """Write ``listed`` as the :data:`FILES_LIST` of the staging directory ``url``."""
        payload = json.dumps(listed, separators=(",", ":")).encode()
        staging_storage(url, self.storage_options).write_atomic(FILES_LIST, payload)


#: The key of :data:`FILES_LIST` holding the expectations' counts (``checked``,
#: ``failed_<i>`` per rule, ``quarantined``, ``kept``).
COUNTS_KEY = "expectations"


def staging_storage(url: str, storage_options: Mapping[str, Any]) -> Storage:
    """The store of a staging directory, opened without the conditional-create probe (the writer only stores whole
    files, and a probe per new staging root would cost a dozen synced writes)."""
    from airflow_seatunnel_ckpt.core.storage import open_storage

    return open_storage(url, storage_options, probe=False)


def expectation_counts(url: str, storage_options: Mapping[str, Any]) -> dict[str, int]:
    """The expectations' counts the job commit listed in ``url``'s :data:`FILES_LIST`."""
    listed = json.loads(staging_storage(url, storage_options).read(FILES_LIST))
    return {str(k): int(v) for k, v in listed.get(COUNTS_KEY, {}).items()}


class _TaskExpectations:
    """A sink's expectations applied to one task's batches: each rule's failures counted, the rows a ``drop`` or
    ``quarantine`` rule removes left out, the quarantined ones handed to :class:`_QuarantineFiles` (runs on an
    executor)."""

    def __init__(self, writer: StagedParquetWriter, task: str, token: str) -> None:
        rules = writer.expectation_rules
        #: Per mask column: the bits of the rules removing a row, of the quarantining ones,
        #: and ``(bit, rule index)`` of each of its rules.
        self.masks: dict[str, tuple[int, int, list[tuple[int, int]]]] = {}
        for i, (column, bit, _name, action) in enumerate(rules):
            removing, quarantining, bits = self.masks.get(column, (0, 0, []))
            self.masks[column] = (removing | (bit if action in REMOVING else 0),
                                  quarantining | (bit if action == "quarantine" else 0), [*bits, (bit, i)])
        self.quarantine = _QuarantineFiles(writer, task, token) if writer.quarantine_url else None
        self.counts = {"checked": 0, "quarantined": 0, "kept": 0, **{f"failed_{i}": 0 for i in range(len(rules))}}

    def kept_schema(self, schema: Any) -> Any:
        """``schema`` without the masks: the schema of the rows :meth:`take` keeps."""
        for name in self.masks:
            schema = schema.remove(schema.get_field_index(name))
        return schema

    def take(self, table: Any) -> Any:
        """Count ``table``'s failures; the rows the sink keeps, without the masks (each mask scanned once for the
        failing rows; those are taken by position)."""
        import numpy as np
        import pyarrow as pa

        n = table.num_rows
        self.counts["checked"] += n
        removed: list[Any] = []
        quarantined: list[Any] = []
        for column, (removing, quarantining, bits) in self.masks.items():
            mask = table.column(column).to_numpy()  # never null: a rule's NULL is a failure
            failing = np.flatnonzero(mask)
            if not failing.size:
                continue  # no row of the batch failed any of these rules
            failed = mask[failing]
            for bit, i in bits:
                self.counts[f"failed_{i}"] += int(np.count_nonzero(failed & bit))
            if removing:
                removed.append(failing[(failed & removing) != 0])
            if quarantining:
                quarantined.append(failing[(failed & quarantining) != 0])
        held = _positions(quarantined)
        if held.size and self.quarantine is not None:
            self.counts["quarantined"] += int(held.size)
            self.quarantine.add(table.take(pa.array(held)))
        table = table.drop_columns(list(self.masks))  # before the filter: it copies every column it keeps
        out = _positions(removed)
        if out.size:
            keep = np.ones(n, dtype=bool)
            keep[out] = False
            table = table.filter(pa.array(keep))
        self.counts["kept"] += table.num_rows
        return table


def _positions(parts: list[Any]) -> Any:
    """The sorted, distinct row positions in ``parts`` (sorted position arrays, one per mask)."""
    import numpy as np

    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))


class _QuarantineFiles:
    """The rows a task quarantines: buffered, stored as Parquet files of up to :data:`ROLL_BYTES`, each with its CRC32C
    (runs on an executor)."""

    def __init__(self, writer: StagedParquetWriter, task: str, token: str) -> None:
        assert writer.quarantine_url is not None
        self.writer, self.task, self.token = writer, task, token
        self.storage = staging_storage(writer.quarantine_url, writer.storage_options)
        self.buffered: list[Any] = []
        self.bytes = 0
        self.stored: list[dict[str, Any]] = []

    def add(self, rows: Any) -> None:
        """Buffer quarantined ``rows`` (with their masks), storing a file once enough are buffered."""
        self.buffered.append(self._with_failed(rows))
        self.bytes += rows.nbytes
        if self.bytes >= ROLL_BYTES:
            self._store()

    def _with_failed(self, rows: Any) -> Any:
        """``rows``' quarantine columns and the names of the rules each one broke (in the rules' order), built
        column-wise: a quarantine may hold most of a task's rows."""
        import numpy as np
        import pyarrow as pa

        w = self.writer
        masks = {column: rows.column(column).to_numpy() for column in {r[0] for r in w.expectation_rules}}
        broke = np.stack([(masks[column] & bit) != 0 for column, bit, _name, _action in w.expectation_rules], axis=1)
        offsets = np.concatenate([[0], np.cumsum(broke.sum(axis=1))]).astype(np.int32)
        names = pa.array([r[2] for r in w.expectation_rules], pa.string()).take(pa.array(np.nonzero(broke)[1]))
        failed = pa.ListArray.from_arrays(pa.array(offsets), names)
        return rows.select(w.quarantine_columns).append_column(w.failed_column, failed)

    def _store(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.buffered:
            return
        w = self.writer
        sink = pa.BufferOutputStream()
        pq.write_table(pa.concat_tables(self.buffered), sink, compression=w.compression, row_group_size=ROW_GROUP_ROWS)
        path = _file_name(self.task, self.token, len(self.stored), w.compression)
        self.stored.append(_store_file(self.storage, path, sink.getvalue()))
        self.buffered, self.bytes = [], 0

    def finish(self) -> list[dict[str, Any]]:
        """Store what is left; the files stored."""
        self._store()
        return self.stored


def _file_name(task: str, token: str, index: int, compression: str) -> str:
    """The name of a task attempt's ``index``-th staged file (Spark's ``part-`` naming)."""
    codec = "" if compression == "none" else f".{compression}"
    return f"part-{task}-{token}-{index:04d}{codec}.parquet"


def _store_file(storage: Storage, path: str, data: Any) -> dict[str, Any]:
    """Store ``data`` (a pyarrow buffer) at ``path`` with one atomic write; its file-list entry."""
    from airflow_seatunnel_ckpt.core.codec import crc32c

    storage.write_atomic(path, memoryview(data))
    return {"path": path, "size": data.size, "crc32c": crc32c(memoryview(data))}


def quote_name(column: str) -> str:
    """A partition column's name as Spark writes it in a directory name."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in column)


#: Spark's parquet ``compression`` values and pyarrow's names for them.
COMPRESSIONS = {"none": "none", "uncompressed": "none", "snappy": "snappy", "gzip": "gzip", "zstd": "zstd",
                "lz4_raw": "lz4", "brotli": "brotli"}
