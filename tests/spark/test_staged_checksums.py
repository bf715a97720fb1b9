"""Staged Parquet carries the CRC32C its executors computed as they wrote it.

The driver lists the staging once and reads no output byte to build the manifest; the
checksums are those of the bytes the executors produced, so a staged file damaged
between the write and the manifest is refused by the commit decision instead of being
recorded as it is now. The output is read back by pyarrow and DuckDB, which know
nothing of this project.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import crc32c
import duckdb
import pyarrow.dataset as ds
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
from airflow_seatunnel_ckpt.core.errors import NotPreparedError
from airflow_seatunnel_ckpt.core.protocol.staging import FILES_LIST
from airflow_seatunnel_ckpt.spark.sinks.files import FileSink

pytestmark = [pytest.mark.spark]


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "tenant": ["a", "b/c", None][i % 3], "amount": i * 1.5} for i in range(n)]


def _stage(spark: Any, tmp_path: Path, partition_by: list[str]) -> tuple[Any, int, Any, str]:
    p = CheckpointStore(CheckpointConfig.from_mapping({"storage_url": f"file://{tmp_path}/store"})).pipeline("crc")
    epoch = p.begin("run-1").epoch
    sink = FileSink("orders", f"file://{tmp_path}/target", partition_by=partition_by)
    sink.bind(p.staging_url(epoch, 1, "orders"), p.storage.storage_options)
    df = spark.createDataFrame(_rows(300)).repartition(3)
    assert sink.write(df) == 300
    return p, epoch, sink, p.staging_path(epoch, 1, "orders")


def test_staged_parquet_checksums_come_from_the_executors_that_wrote_the_files(spark: Any, tmp_path: Path) -> None:
    p, epoch, sink, staging = _stage(spark, tmp_path, ["tenant"])
    written = json.loads(p.storage.read(f"{staging}/{FILES_LIST}"))["files"]
    manifest = p.manifest_for_staged(epoch, 1, "orders", sink.target_url, sink.rows)
    assert {(f.path, f.size, f.crc32c) for f in manifest.files} == {
        (f["path"], f["size"], f["crc32c"]) for f in written}
    # Each recorded CRC32C is that of the bytes on disk, computed here independently.
    root = Path(p.storage.full_path(staging))
    for f in manifest.files:
        assert crc32c.crc32c((root / f.path).read_bytes()) == f.crc32c
    # Laid out as Spark lays out partitioned Parquet (escaped values, the null partition).
    assert {f.path.split("/")[0] for f in manifest.files} == {
        "tenant=a", "tenant=b%2Fc", "tenant=__HIVE_DEFAULT_PARTITION__"}
    table = ds.dataset(str(root), format="parquet", partitioning="hive",
                       exclude_invalid_files=True).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(300))
    read_back = duckdb.sql(
        f"SELECT count(*), sum(amount) FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true)").fetchone()
    assert read_back == (300, sum(r["amount"] for r in _rows(300)))
    # Spark reads it back as its own output.
    assert spark.read.parquet(str(root)).filter("tenant = 'b/c'").count() == 100


def test_a_staged_file_damaged_before_the_manifest_is_refused_by_the_commit_decision(
    spark: Any, tmp_path: Path
) -> None:
    p, epoch, sink, staging = _stage(spark, tmp_path, [])
    first = sorted(Path(p.storage.full_path(staging)).glob("*.parquet"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only a checksum of the written bytes can tell
    first.write_bytes(bytes(data))
    manifest = p.manifest_for_staged(epoch, 1, "orders", sink.target_url, sink.rows)
    p.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[manifest], base=p.restore_point())
    with pytest.raises(NotPreparedError, match=first.name):
        p.decide(epoch, Decision.COMMIT, "ok", by="test")


def test_a_file_not_committed_by_the_writer_job_is_not_staged_output(spark: Any, tmp_path: Path) -> None:
    # What a failed task attempt leaves behind: a data file no committed task reported.
    p, epoch, sink, staging = _stage(spark, tmp_path, [])
    p.storage.write_atomic(f"{staging}/part-99999-failed-attempt.snappy.parquet", b"PAR1 partial")
    manifest = p.manifest_for_staged(epoch, 1, "orders", sink.target_url, sink.rows)
    assert "part-99999-failed-attempt.snappy.parquet" not in {f.path for f in manifest.files}
    assert len(manifest.files) == 3


@pytest.mark.s3
def test_on_s3_the_executors_checksum_is_the_one_the_store_verified_and_keeps(
    spark: Any, moto_server: Any, s3_bucket: str
) -> None:
    # Each staged object is one PUT carrying the executor's CRC32C, which S3 checks on
    # arrival and returns with HEAD: both sides of the manifest agree without a read.
    config = CheckpointConfig.from_mapping({"storage_url": f"{s3_bucket}/store",
                                            "storage_options": moto_server.storage_options})
    p = CheckpointStore(config).pipeline("crc")
    epoch = p.begin("run-1").epoch
    sink = FileSink("orders", f"{s3_bucket}/target")
    sink.bind(p.staging_url(epoch, 1, "orders"), p.storage.storage_options)
    assert sink.write(spark.createDataFrame(_rows(90)).repartition(2)) == 90
    manifest = p.manifest_for_staged(epoch, 1, "orders", sink.target_url, sink.rows)
    assert len(manifest.files) == 2
    for f in manifest.files:
        path = f"{manifest.staging}/{f.path}"
        assert p.storage.stored_checksum(path) == f.crc32c
        assert crc32c.crc32c(p.storage.read(path)) == f.crc32c


def test_a_task_writes_row_groups_of_many_arrow_batches(spark: Any, tmp_path: Path) -> None:
    """Spark hands the writer batches of ``arrow.maxRecordsPerBatch`` rows; a row group per
    batch would make files of many tiny row groups. Partitioned output still starts a file
    per partition value."""
    import pyarrow.parquet as pq

    p = CheckpointStore(CheckpointConfig.from_mapping({"storage_url": f"file://{tmp_path}/store"})).pipeline("rg")
    epoch = p.begin("run-1").epoch
    sink = FileSink("events", f"file://{tmp_path}/target", partition_by=["tenant"])
    sink.bind(p.staging_url(epoch, 1, "events"), p.storage.storage_options)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        df = spark.range(30_000).selectExpr("id", "IF(id < 25000, 'big', 'small') AS tenant").coalesce(1)
        assert sink.write(df) == 30_000
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    root = Path(p.storage.full_path(p.staging_path(epoch, 1, "events")))
    files = {f.parent.name: pq.ParquetFile(f).metadata for f in root.rglob("*.parquet")}
    assert {name: (m.num_rows, m.num_row_groups) for name, m in files.items()} == {
        "tenant=big": (25_000, 1), "tenant=small": (5_000, 1)}
