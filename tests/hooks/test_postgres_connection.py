"""A PostgreSQL sink's credentials come from an Airflow Postgres connection, never the store."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.hooks import postgres_connection
from tests.core.sinks.test_postgres_sink import Epochs, expected, rows
from tests.postgres_server import PostgresServer


def test_postgres_conn_id_supplies_the_database_at_the_decision_and_the_commit(
        tmp_path: Path, postgres_server: PostgresServer, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dbname = conninfo_to_dict(postgres_db)["dbname"]
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("CREATE ROLE loader LOGIN PASSWORD 'the-secret-pw'")
        conn.execute("GRANT ALL ON SCHEMA public TO loader")
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE_PG", json.dumps({
        "conn_type": "postgres", "host": postgres_server.host, "port": postgres_server.port, "login": "loader",
        "password": "the-secret-pw", "schema": dbname,
        "extra": {"sslmode": "disable", "cursor": "dictcursor", "connect_timeout": 10}}))
    epochs = Epochs(tmp_path / "store", postgres_db)
    epochs.options = {"type": "postgres", "table": "public.orders", "postgres_conn_id": "warehouse_pg",
                      "create_table": True}
    epochs.run(rows([1, 2]))
    epochs.run(rows([3]))

    assert epochs.table() == expected([1, 2, 3])
    assert epochs.query("SELECT tableowner FROM pg_tables WHERE tablename = 'orders'") == [("loader",)]
    recorded = epochs.pipeline.txlog.prepared(1)["ingest"].sinks[0].table
    assert recorded is not None and recorded.postgres_conn_id == "warehouse_pg"
    assert "the-secret-pw" not in json.dumps(recorded.to_dict()) and recorded.conninfo == ""


def test_connection_fields_and_libpq_extras_become_the_conninfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DB", json.dumps({
        "conn_type": "postgres", "host": "db.example", "port": 5433, "login": "etl", "password": "p w",
        "schema": "sales", "extra": {"sslmode": "require", "cursor": "realdictcursor", "iam": False}}))
    found = conninfo_to_dict(postgres_connection.postgres_secrets({"type": "postgres",
                                                                   "postgres_conn_id": "db"})["conninfo"])
    assert found == {"host": "db.example", "port": "5433", "user": "etl", "password": "p w", "dbname": "sales",
                     "sslmode": "require"}
    assert postgres_connection.postgres_secrets({"type": "iceberg", "postgres_conn_id": "db"}) == {}


def test_a_missing_postgres_connection_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="postgres_conn_id 'no_such_db' is not an Airflow connection"):
        postgres_connection.postgres_secrets({"type": "postgres", "table": "public.t",
                                              "postgres_conn_id": "no_such_db"})


def test_a_postgres_sinks_target_is_an_asset_uri_the_postgres_provider_accepts() -> None:
    from airflow_seatunnel_ckpt.operators.commit import sink_asset
    from airflow_seatunnel_ckpt.spark.registry import SINKS

    by_conninfo = SINKS.build("o", {"type": "postgres", "table": "serving.orders",
                                          "conninfo": "host=db.example port=6432 dbname=shop user=etl"})
    by_url = SINKS.build("o", {"type": "postgres", "table": "orders", "conninfo": "postgresql://etl@db/shop"})
    by_conn = SINKS.build("o", {"type": "postgres", "table": "serving.orders", "postgres_conn_id": "warehouse"})

    assert sink_asset("p", "o", by_conninfo.target_url).uri == "postgres://db.example:6432/shop/serving/orders"
    assert sink_asset("p", "o", by_url.target_url).uri == "postgres://db:5432/shop/public/orders"
    assert sink_asset("p", "o", by_conn.target_url).uri == "postgres://warehouse:5432/default/serving/orders"


def test_postgres_conn_id_supplies_the_database_of_both_postgresql_sources_and_is_all_they_record(
        postgres_server: PostgresServer, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.core.options import checked
    from airflow_seatunnel_ckpt.core.sources.options import PostgresCdcSourceOptions, PostgresQuerySourceOptions
    from airflow_seatunnel_ckpt.core.sources.postgres_cdc import PostgresCdc
    from airflow_seatunnel_ckpt.core.sources.postgres_query import PostgresQuery
    from tests.core.sources.test_postgres_cdc import flushed, read

    dbname = conninfo_to_dict(postgres_db)["dbname"]
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("CREATE ROLE cdc_reader LOGIN REPLICATION PASSWORD 'the-source-pw'")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int)")
        conn.execute("INSERT INTO orders VALUES (1, 10)")
        conn.execute("ALTER TABLE orders OWNER TO cdc_reader")
        conn.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO cdc_reader')  # its publication
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_PG", json.dumps({
        "conn_type": "postgres", "host": postgres_server.host, "port": postgres_server.port, "login": "cdc_reader",
        "password": "the-source-pw", "schema": dbname, "extra": {"sslmode": "disable"}}))
    cdc = checked(PostgresCdcSourceOptions, {"type": "postgres_cdc", "postgres_conn_id": "shop_pg", "slot": "shop",
                                             "publication": "shop", "tables": ["public.orders"]}, "test")
    query = checked(PostgresQuerySourceOptions, {"type": "postgres_query", "postgres_conn_id": "shop_pg",
                                                 "table": "public.orders", "incremental_column": "id"}, "test")

    source = PostgresCdc(cdc, "postgres_cdc source 'shop'")
    first = source.plan([])
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        assert conn.execute("SELECT usename FROM pg_stat_activity WHERE application_name = "
                            "'seatunnel-ckpt-source' AND usename = 'cdc_reader'").fetchall()  # the exporter
        conn.execute("INSERT INTO orders VALUES (2, 20)")
        flushed(conn)
    second = source.plan([{"epoch": 1, "offsets": first}])
    assert [(c.op, c.values["id"]) for c in read(source, second)] == [("insert", "2")]
    reader = PostgresQuery(query, "postgres_query source 'shop'")
    with reader.connect() as conn:
        columns = reader.columns(conn)
    assert sorted(row[0] for row in reader.rows(reader.plan([]), columns)) == ["1", "2"]
    recorded = json.dumps([cdc.to_dict(), query.to_dict(), first, second])
    assert "the-source-pw" not in recorded and cdc.conninfo == query.conninfo == ""


def test_a_postgresql_source_names_one_connection_and_no_password() -> None:
    from airflow_seatunnel_ckpt.core.options import checked
    from airflow_seatunnel_ckpt.core.sources.options import PostgresQuerySourceOptions

    base = {"type": "postgres_query", "table": "public.orders", "incremental_column": "id"}
    with pytest.raises(ConfigError, match="postgres_conn_id .* or conninfo"):
        checked(PostgresQuerySourceOptions, base, "source 'shop'")
    with pytest.raises(ConfigError, match="one of them"):
        checked(PostgresQuerySourceOptions, {**base, "postgres_conn_id": "a", "conninfo": "host=db"}, "source 'shop'")
    with pytest.raises(ConfigError, match="holds a password.*postgres_conn_id"):
        checked(PostgresQuerySourceOptions, {**base, "conninfo": "host=db password=x"}, "source 'shop'")


def test_a_driver_outside_the_task_gets_each_source_connection_without_its_password_beside_a_password_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stat

    monkeypatch.setenv("AIRFLOW_CONN_SHOP", json.dumps({
        "conn_type": "postgres", "host": "db.example", "port": 5433, "login": "etl", "password": "a:b\\c",
        "schema": "sales", "extra": {"sslmode": "require"}}))
    monkeypatch.setenv("AIRFLOW_CONN_SECURE", json.dumps({
        "conn_type": "postgres", "host": "db.example", "login": "etl", "extra": {"sslpassword": "key-pass"}}))
    query = {"type": "postgres_query", "table": "public.orders", "incremental_column": "id"}
    given = postgres_connection.driver_connections({
        "orders": {**query, "postgres_conn_id": "shop"},
        "more": {**query, "postgres_conn_id": "shop", "table": "public.more"},  # one connection, one file
        "plain": {**query, "conninfo": "host=db.example dbname=sales"},
        "out": {"type": "postgres", "table": "public.t", "postgres_conn_id": "secure"},  # a sink: its tasks read it
    }, tmp_path)

    assert list(given) == ["shop"]
    assert conninfo_to_dict(given["shop"]["conninfo"]) == {"host": "db.example", "port": "5433", "user": "etl",
                                                           "dbname": "sales", "sslmode": "require"}
    passfile = Path(given["shop"]["passfile"])
    assert passfile.parent == tmp_path and stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert passfile.read_text() == "*:*:*:*:a\\:b\\\\c\n"  # ':' and '\' escaped as libpq reads them
    with pytest.raises(ConfigError, match="source 'orders': connection 'secure' has an sslpassword"):
        postgres_connection.driver_connections({"orders": {**query, "postgres_conn_id": "secure"}}, tmp_path)
    with pytest.raises(ConfigError, match="postgres_query source 'orders': its postgres_conn_id 'nope' is not an "
                                          "Airflow connection here.*where the stage task runs"):
        postgres_connection.driver_connections({"orders": {**query, "postgres_conn_id": "nope"}}, tmp_path)
