"""A Spark stage writing PostgreSQL sinks, committed by the epoch's commit, read back with psycopg.

The stage runs on local Spark with no JDBC driver; the commit loads the staged Parquet
with psycopg (COPY, or INSERT ... ON CONFLICT for an upsert) in one transaction with the
epoch's marker row.
"""

from __future__ import annotations

import psycopg
import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark.sinks.tables import PostgresSink
from tests.spark.conftest import OrdersPipeline, RunStage, order_row

pytestmark = [pytest.mark.spark]


@pytest.mark.connect_slice("the PostgreSQL sinks: staged by the server's tasks, loaded by the client")
def test_a_stage_writing_postgres_sinks_appends_orders_and_upserts_totals_once_per_epoch(
        run: RunStage, orders: OrdersPipeline, postgres_db: str) -> None:
    sinks = {"orders_table": {"type": "postgres", "table": "public.orders", "conninfo": postgres_db,
                              "create_table": True},
             "customer_totals": {"type": "postgres", "table": "public.totals", "conninfo": postgres_db,
                                 "mode": "upsert", "merge_keys": ["customer"], "create_table": True}}
    seen: set[int] = set()
    for n, ids in enumerate([[1, 2, 3, 3], [3, 4, 5]], start=1):
        orders.add_file(f"f{n}", ids)
        seen |= set(ids)
        result = run(orders.spec(f"run-{n}", stage="tests.spark.stages:dedup_and_totals", sinks=sinks))
        orders.commit(result)
    again = orders.pipeline.commit(result.epoch)  # the commit task retried: nothing twice

    assert again.already_committed
    with psycopg.connect(postgres_db) as conn:
        found = conn.execute("SELECT order_id, customer, amount FROM orders ORDER BY order_id").fetchall()
        totals = conn.execute("SELECT customer, total, orders FROM totals ORDER BY customer").fetchall()
        marks = conn.execute("SELECT sink, epoch FROM seatunnel_ckpt_epochs ORDER BY sink, epoch").fetchall()
    assert found == [tuple(order_row(i).values()) for i in sorted(seen)]
    want: dict[str, list[float]] = {}
    for i in seen:
        want.setdefault(order_row(i)["customer"], []).append(float(i))
    assert totals == [(c, sum(v), len(v)) for c, v in sorted(want.items())]
    assert marks == [("customer_totals", 1), ("customer_totals", 2), ("orders_table", 1), ("orders_table", 2)]


def test_a_postgres_sink_with_a_password_in_its_options_is_refused_when_built() -> None:
    with pytest.raises(ConfigError, match="postgres sink 'o': conninfo holds a password"):
        PostgresSink("o", "public.t", conninfo="host=db password=x")
    with pytest.raises(ConfigError, match="mode 'upsert' needs merge_keys"):
        PostgresSink("o", "public.t", postgres_conn_id="db", mode="upsert")
    assert PostgresSink("o", "t", postgres_conn_id="db").table.table == "public.t"


def test_a_postgres_sinks_epoch_column_and_timeouts_are_recorded_when_built_from_a_stage_spec() -> None:
    from airflow_seatunnel_ckpt.spark.registry import SINKS

    sink = SINKS.build("o", {"type": "postgres", "table": "t", "postgres_conn_id": "db",
                             "epoch_column": "_seatunnel_epoch", "lock_timeout_s": 5})
    assert sink.table.epoch_column == "_seatunnel_epoch" and sink.table.lock_timeout_s == 5.0
    with pytest.raises(ConfigError, match="option 'statement_timeout_s'"):
        SINKS.build("o", {"type": "postgres", "table": "t", "postgres_conn_id": "db", "statement_timeout_s": 0})
