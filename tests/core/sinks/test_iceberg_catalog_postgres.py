"""The Iceberg sink with its SQL catalog on PostgreSQL (pyiceberg's SqlCatalog, ``postgresql+psycopg``)."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.catalog import load_catalog

from airflow_seatunnel_ckpt.core.sinks import commit_sink
from tests.core.epochs import at_once
from tests.core.sinks.test_iceberg_sink import IDENT, Lake, eu_us, scan_ids
from tests.postgres_server import PostgresServer


def test_an_iceberg_sql_catalog_on_postgres_commits_each_epoch_once(tmp_path: Path,
                                                                    postgres_server: PostgresServer) -> None:
    database = postgres_server.create_database()
    try:
        catalog = {"type": "sql", "uri": postgres_server.url(database), "warehouse": f"file://{tmp_path}/warehouse"}
        lake = Lake(tmp_path, catalog=catalog)
        lake.run_epoch("run-1", eu_us([1, 2], [3]))
        epoch = lake.pipeline.begin("run-2").epoch
        manifest = lake.stage(epoch, eu_us([4], [5, 6]))
        lake.pipeline.prepare(epoch, "ingest", 1, run_id="run-2", sinks=[manifest])
        lake.pipeline.decide(epoch, lake.pipeline.txlog.read_decision(1).decision, "all prepared", by="test")
        outcomes = at_once([lambda: commit_sink(lake.request(epoch, manifest)),
                            lambda: commit_sink(lake.request(epoch, manifest))])
        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes

        loaded = load_catalog("lake", **catalog)
        assert scan_ids(loaded.load_table(IDENT)) == [1, 2, 3, 4, 5, 6]
        assert len(list(loaded.load_table(IDENT).snapshots())) == 2
        loaded.engine.dispose()  # type: ignore[attr-defined]
    finally:
        postgres_server.drop_database(database)
