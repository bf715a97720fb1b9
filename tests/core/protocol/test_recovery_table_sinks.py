"""Recovery over a pipeline whose sinks are tables: it asks each sink what it may clean.

An Iceberg table (``iceberg://<catalog>/<table>``) and a PostgreSQL table
(``postgres://<host>:<port>/<database>/<schema>/<table>``) are named by URLs that are no
store: recovery must neither open them as stores nor warn that their protocol is not
supported, and must still sweep the pipeline's own store. Real components: a SQLite
Iceberg catalog with a local warehouse, the session's PostgreSQL server.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, layout
from airflow_seatunnel_ckpt.core.models import SinkManifest
from airflow_seatunnel_ckpt.core.options import checked
from airflow_seatunnel_ckpt.core.protocol import settled
from airflow_seatunnel_ckpt.core.sinks.options import PostgresSinkOptions
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX
from tests.core.sinks.test_iceberg_sink import Lake, eu

TOTALS = pa.schema([("customer", pa.string()), ("total", pa.float64())])


def postgres_totals(lake: Lake, epoch: int, dsn: str) -> SinkManifest:
    """Stage one Parquet file of sink ``totals`` (a PostgreSQL table); its manifest."""
    p = lake.pipeline
    buf = io.BytesIO()
    pq.write_table(pa.table({"customer": [f"c{epoch}"], "total": [float(epoch)]}, schema=TOTALS), buf)
    p.storage.write_atomic(f"{p.staging_path(epoch, 1, 'totals')}/part-00000.parquet", buf.getvalue())
    options = {"type": "postgres", "table": "public.customer_totals", "conninfo": dsn, "create_table": True}
    target = checked(PostgresSinkOptions, options, "sink 'totals'").target_url()
    manifest = p.manifest_for_staged(epoch, 1, "totals", target, 1)
    return dataclasses.replace(manifest, table=options)


def test_recovery_over_iceberg_and_postgres_sinks_warns_of_no_store_and_sweeps_its_own(
        tmp_path: Path, postgres_db: str, caplog: pytest.LogCaptureFixture) -> None:
    lake = Lake(tmp_path)
    p = lake.pipeline
    epochs = settled.MIN_ADVANCE  # enough final epochs for recovery to settle (and sweep) them
    for n in range(1, epochs + 1):
        epoch = p.begin(f"run-{n}").epoch
        sinks = [lake.stage(epoch, eu([n])), postgres_totals(lake, epoch, postgres_db)]
        p.prepare(epoch, "ingest", 1, run_id=f"run-{n}", sinks=sinks)
        assert p.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
        p.commit(epoch)
    assert {s.target_url.split("://")[0] for s in p.txlog.read_published(1) or []} == {"iceberg", "postgres"}
    # What killed writers leave behind: a temp file in a committed epoch's log, staging of no epoch.
    stale = p.storage.full_path(f"{layout.txlog_dir(1)}/{TEMP_PREFIX}record")
    with open(stale, "wb") as fh:
        fh.write(b"partial")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    p.storage.write_atomic(f"{layout.staging_dir(99, 1, 'orders')}/part-00000.parquet", b"orphan")

    with caplog.at_level(logging.WARNING):
        p.recover(dry_run=False)

    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [], warned  # no "cannot sweep sink ... protocol 'iceberg' is not supported"
    assert not os.path.exists(stale)
    assert p.storage.list_dir(layout.STAGING) == []
    assert p.txlog.settled.read().record.watermark == epochs  # every epoch settled, swept first
    assert all(p.state(e) is EpochState.COMMITTED for e in range(1, epochs + 1))
