"""End to end on local Spark: a sink's expectations flag, drop and quarantine rows in the
job that writes them, and the commit decision refuses an epoch over a rule's threshold.

The tables are real Iceberg tables in a SQLite catalog, read back with DuckDB.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Decision
from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from airflow_seatunnel_ckpt.spark import StageContext, StageSpec, run_stage
from tests.spark.conftest import OrdersPipeline, RunStage
from tests.tables import duckdb_iceberg_rows


def write_orders(ctx: StageContext, spark: Any) -> None:
    """The stage run here (by import path): the source's rows into the one sink."""
    ctx.sink("orders_table").write(ctx.source("orders").read())


def dedup_then_write(ctx: StageContext, spark: Any) -> None:
    """The stage run here (by import path): first order per customer ever, into the one sink."""
    ctx.sink("orders_table").write(ctx.key_set("customers").dedup(ctx.source("orders").read(), key="customer"))


def add_orders(orders: OrdersPipeline, name: str, ids: range, null_every: int = 0) -> list[int | None]:
    """A parquet input file of orders ``ids``; every ``null_every``-th one has a NULL id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    order_ids = [None if null_every and (i % null_every == 0) else i for i in ids]
    table = pa.table({"order_id": pa.array(order_ids, pa.int64()),
                      "customer": [f"c{i % 3}" for i in ids],
                      "amount": [float(i % 50) for i in ids]})
    orders.input_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, orders.input_dir / f"{name}.parquet")
    return order_ids


def catalog_of(orders: OrdersPipeline) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{orders.root}/catalog.db", "warehouse": f"file://{orders.root}/wh"}


def spec_with(orders: OrdersPipeline, run_id: str, expectations: dict[str, Any], **sink: Any) -> StageSpec:
    options = {"type": "iceberg", "table": "lake.orders", "catalog": catalog_of(orders), "catalog_name": "lake",
               "expectations": expectations, **sink}
    return orders.spec(run_id, stage="tests.spark.test_expectations_stage:write_orders",
                       sinks={"orders_table": options})


def table_rows(orders: OrdersPipeline, identifier: str) -> list[dict[str, Any]]:
    return duckdb_iceberg_rows(catalog_of(orders), identifier, "lake")


def id_present(max_fraction: float) -> dict[str, Any]:
    return {"id_present": {"expr": "order_id IS NOT NULL", "on_fail": "quarantine", "max_fraction": max_fraction}}


@pytest.mark.connect_slice("the Iceberg sink and its quarantine table; the rules' counts come back in the response")
@pytest.mark.spark
def test_quarantine_under_its_threshold_commits_kept_rows_and_quarantined_rows_in_one_epoch(
        run: RunStage, orders: OrdersPipeline) -> None:
    ids = add_orders(orders, "f1", range(1, 101), null_every=33)  # 3 of 100 NULL
    rules = {**id_present(0.05), "amount_positive": {"expr": "amount > 0", "on_fail": "drop"},
             "customer_known": {"expr": "customer IN ('c0', 'c1')", "on_fail": "warn"}}
    result = run(spec_with(orders, "run-1", rules, partition_by=["customer"]))
    counts = {e.name: (e.checked, e.failed) for m in result.manifests for e in m.expectations}
    dropped = sum(1 for i in range(1, 101) if i % 50 == 0)  # amount 0
    assert counts == {"id_present": (100, 3), "amount_positive": (100, dropped),
                      "customer_known": (100, sum(1 for i in range(1, 101) if i % 3 == 2))}
    orders.commit(result)

    kept = table_rows(orders, "lake.orders")
    quarantined = table_rows(orders, "lake.orders_quarantine")
    assert sorted(r["order_id"] for r in kept) == sorted(i for i in ids if i is not None and i % 50)
    assert len(quarantined) == 3 and all(r["order_id"] is None for r in quarantined)
    assert [list(r["_expectations_failed"])[0] for r in quarantined] == ["id_present"] * 3
    assert set(quarantined[0]) == {"order_id", "customer", "amount", "_expectations_failed"}
    # the same epoch, one commit: each table's one snapshot carries epoch 1
    sinks = {m.sink for m in result.manifests}
    assert sinks == {"orders_table", "orders_table.quarantine"}
    assert orders.pipeline.committed_epochs() == [1]


@pytest.mark.spark
def test_quarantine_over_its_threshold_aborts_the_epoch_and_leaves_both_tables_unchanged(
        spark: Any, orders: OrdersPipeline) -> None:
    add_orders(orders, "f1", range(1, 101), null_every=200)  # no NULL ids: commits
    orders.commit(run_stage(spec_with(orders, "run-1", id_present(0.01)), spark))
    before = sorted(r["order_id"] for r in table_rows(orders, "lake.orders"))
    assert len(before) == 100

    add_orders(orders, "f2", range(101, 201), null_every=33)  # 3% NULL ids, over 1%
    result = run_stage(spec_with(orders, "run-2", id_present(0.01)), spark)
    pipeline = orders.pipeline
    record = pipeline.decide(result.epoch, Decision.COMMIT, "test", "test")
    assert record.decision is Decision.ABORT
    assert ("expectation 'id_present' of sink 'orders_table': 3 of 100 rows failed (3.0%), over max_fraction 1.0%"
            in record.reason)
    pipeline.abort(result.epoch, record.reason)
    assert sorted(r["order_id"] for r in table_rows(orders, "lake.orders")) == before
    assert table_rows(orders, "lake.orders_quarantine") == []


@pytest.mark.connect_slice("a failed rule aborts the epoch from the server's counts")
@pytest.mark.spark
def test_a_fail_rule_that_fails_one_row_aborts_the_epoch(run: RunStage, orders: OrdersPipeline) -> None:
    add_orders(orders, "f1", range(1, 11))
    rules = {"small": {"expr": "amount < 10", "on_fail": "fail"}}
    result = run(spec_with(orders, "run-1", rules))
    record = orders.pipeline.decide(result.epoch, Decision.COMMIT, "test", "test")
    assert record.decision is Decision.ABORT
    assert "expectation 'small' of sink 'orders_table': 1 of 10 rows failed (10.0%), and its action is 'fail'" \
        in record.reason


@pytest.mark.connect_slice("a Connect DataFrame is analysed only when asked: the refusal must still come first")
@pytest.mark.spark
@pytest.mark.parametrize(("expr", "why"), [("amount >", "PARSE_SYNTAX_ERROR|Syntax error"),
                                           ("no_such_column > 0", "no_such_column"),
                                           ("amount + 1", "not boolean")])
def test_a_bad_expression_is_refused_before_any_output_is_written(
        run: RunStage, orders: OrdersPipeline, expr: str, why: str) -> None:
    add_orders(orders, "f1", range(1, 11))
    with pytest.raises(ConfigError, match=rf"sink 'orders_table': expectation 'rule'.*({why})"):
        run(spec_with(orders, "run-1", {"rule": {"expr": expr, "on_fail": "drop"}}))
    staged = list((orders.root / "store").rglob("*.parquet"))
    assert staged == []
    assert orders.pipeline.txlog.prepared(1) == {}


@pytest.mark.spark
def test_a_crash_between_prepare_and_commit_leaves_each_row_once_in_the_table_or_in_quarantine(
        spark: Any, orders: OrdersPipeline) -> None:
    ids = add_orders(orders, "f1", range(1, 101), null_every=33)
    # epoch 1: prepared, decided commit, then the committing task died before publishing
    first = run_stage(spec_with(orders, "run-1", id_present(0.05)), spark)
    assert orders.pipeline.decide(first.epoch, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    recover(orders.pipeline, dry_run=False)  # rolls the decided epoch forward
    # epoch 2: prepared, never decided (the DAG run died); recovery aborts it once it timed out
    ids += add_orders(orders, "f2", range(101, 201), null_every=33)
    second = run_stage(spec_with(orders, "run-2", id_present(0.05)), spark)
    recover(orders.pipeline, dry_run=False, now=time.time() + 10 * orders.pipeline.config.prepared_timeout_s)
    assert orders.pipeline.state(second.epoch) is EpochState.ABORTED
    # the next run reads the aborted epoch's input again
    orders.commit(run_stage(spec_with(orders, "run-3", id_present(0.05)), spark))

    kept = [r["order_id"] for r in table_rows(orders, "lake.orders")]
    quarantined = table_rows(orders, "lake.orders_quarantine")
    assert sorted(kept) == sorted(i for i in ids if i is not None)
    assert len(quarantined) == sum(1 for i in ids if i is None) == 6


def test_declaration_refuses_an_unknown_rule_key_and_action_with_a_hint() -> None:
    from airflow_seatunnel_ckpt.spark.declaration import EntryDeclaration

    def declare(rules: Any) -> None:
        EntryDeclaration.check("sink", "orders", {"path": "/tmp/x", "expectations": rules}, where="DAG 'd'")

    with pytest.raises(ConfigError, match=r"rule 'ok': unknown key\(s\) \['on_fial'\].*did you mean 'on_fail'"):
        declare({"ok": {"expr": "a > 0", "on_fial": "drop"}})
    with pytest.raises(ConfigError, match=r"on_fail must be one of .* got 'quarantin'.*did you mean 'quarantine'"):
        declare({"ok": {"expr": "a > 0", "on_fail": "quarantin"}})
    with pytest.raises(ConfigError, match=r"max_fraction must be a number in 0..1"):
        declare({"ok": {"expr": "a > 0", "max_fraction": 5}})
    with pytest.raises(ConfigError, match=r"max_rows must be a non-negative integer"):
        declare({"ok": {"expr": "a > 0", "max_rows": -1}})
    with pytest.raises(ConfigError, match=r"needs 'expr'"):
        declare({"ok": {"on_fail": "drop"}})
    with pytest.raises(ConfigError, match=r"unknown option 'expectation' \(did you mean 'expectations'\?\)"):
        EntryDeclaration.check("sink", "orders", {"path": "/tmp/x", "expectation": {}}, where="DAG 'd'")
    declare({"ok": {"expr": "a > 0", "on_fail": "quarantine", "max_fraction": 0.05, "max_rows": 10}})


def test_manifest_expectations_round_trip_and_are_absent_when_none(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.models import ExpectationResult, SinkManifest

    plain = SinkManifest("s", "file:///t", "st", [], 3)
    assert "expectations" not in plain.to_dict()
    assert SinkManifest.from_dict(plain.to_dict()) == plain
    measured = SinkManifest("s", "file:///t", "st", [], 3,
                            expectations=(ExpectationResult("ok", "a > 0", "drop", 5, 2, 0.5, None),))
    assert SinkManifest.from_dict(measured.to_dict()) == measured


@pytest.mark.spark
def test_a_drop_rule_count_shows_in_the_cli_on_the_page_and_in_the_openlineage_facets(
        spark: Any, orders: OrdersPipeline, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from airflow_seatunnel_ckpt.cli import main
    from airflow_seatunnel_ckpt.lineage.epoch import commit_lineage

    add_orders(orders, "f1", range(1, 101))
    out = f"file://{orders.root / 'out' / 'orders'}"
    rules = {"amount_positive": {"expr": "amount > 0", "on_fail": "drop"}}
    spec = orders.spec("run-1", stage="tests.spark.test_expectations_stage:write_orders",
                       sinks={"orders_table": {"path": out, "expectations": rules}})
    result = run_stage(spec, spark)
    orders.commit(result)
    assert len(orders.published("orders")) == 98  # amount 0 for ids 50 and 100

    store = orders.store["storage_url"]
    assert main(["--store", store, "show", "orders", "1"]) == 0
    text = capsys.readouterr().out
    assert "expectation orders_table.amount_positive (drop): 2 of 100 rows failed (2.0%)" in text
    assert main(["--store", store, "--json", "epochs", "orders"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert [(e["rule"], e["checked"], e["failed"], e["on_fail"]) for e in entry["expectations"]] == [
        ("amount_positive", 100, 2, "drop")]

    lineage = commit_lineage(pipeline_name="orders", sink_targets={}, pipeline=orders.pipeline, run_id="run-1")
    [output] = lineage.outputs
    [assertion] = output.facets["dataQualityAssertions"].assertions
    assert (assertion.assertion, assertion.success, assertion.actual, assertion.content) == (
        "amount_positive", False, "2", "amount > 0")
    assert assertion.params["checked"] == 100
    assert output.facets["dataQualityMetrics"].rowCount == 100

    # The Checkpoints page: the epoch's row and the chart of each rule's failing fraction.
    from airflow_seatunnel_ckpt.core import CheckpointStore
    from airflow_seatunnel_ckpt.plugins.app import _templates
    from airflow_seatunnel_ckpt.plugins.charts import epoch_points, pipeline_charts
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    [row] = pipeline_view(CheckpointStore.from_url(store), "orders").epochs
    html = _templates.get_template("_epochs.html").render(rows=[row], actions=False, base="")
    assert "orders_table.amount_positive 2.0% (2/100)" in html
    [chart] = [c for c in pipeline_charts(epoch_points(orders.pipeline)) if c.title.startswith("expectations")]
    assert 'data-rule="orders_table.amount_positive"' in chart.svg
    assert "orders_table.amount_positive, epoch 1 (COMMITTED): 2.0% failed" in chart.svg


@pytest.mark.spark
def test_quarantine_after_a_keyed_state_sees_each_row_once(spark: Any, orders: OrdersPipeline) -> None:
    add_orders(orders, "f1", range(1, 31))  # customers c0, c1, c2, ten orders each
    rules = {"big": {"expr": "amount >= 100", "on_fail": "quarantine"}}  # every amount is < 50

    def spec(run_id: str) -> StageSpec:
        return orders.spec(run_id, stage="tests.spark.test_expectations_stage:dedup_then_write",
                           sinks={"orders_table": {"path": f"file://{orders.root / 'out' / 'orders'}",
                                                   "expectations": rules}})

    first = run_stage(spec("run-1"), spark)
    orders.commit(first)
    [main] = [m for m in first.manifests if m.sink == "orders_table"]
    [quarantine] = [m for m in first.manifests if m.sink == "orders_table.quarantine"]
    assert (main.rows, quarantine.rows, main.expectations[0].failed) == (0, 3, 3)
    import pyarrow.parquet as pq

    rows = [r for f in sorted((orders.root / "out" / "orders_quarantine").glob("epoch=*/*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    assert sorted(r["customer"] for r in rows) == ["c0", "c1", "c2"]
    add_orders(orders, "f2", range(31, 61))  # the same customers: nothing new
    second = run_stage(spec("run-2"), spark)
    assert sum(m.rows for m in second.manifests) == 0


@pytest.mark.spark
def test_a_csv_sink_quarantines_into_json_files_beside_it(spark: Any, orders: OrdersPipeline) -> None:
    import json

    ids = add_orders(orders, "f1", range(1, 21), null_every=7)  # 7 and 14 NULL
    out = orders.root / "out" / "orders"
    spec = orders.spec("run-1", stage="tests.spark.test_expectations_stage:write_orders",
                       sinks={"orders_table": {"path": f"file://{out}", "format": "csv",
                                               "options": {"header": "true"}, "expectations": id_present(0.5)}})
    result = run_stage(spec, spark)
    orders.commit(result)
    kept = [line.split(",")[0] for f in sorted(out.glob("epoch=*/*.csv")) for line in f.read_text().splitlines()[1:]]
    quarantined = [json.loads(line) for f in sorted((orders.root / "out" / "orders_quarantine").glob("epoch=*/*.json"))
                   for line in f.read_text().splitlines()]
    assert sorted(int(i) for i in kept) == sorted(i for i in ids if i is not None)
    assert [(q.get("order_id"), q["_expectations_failed"]) for q in quarantined] == [(None, ["id_present"])] * 2


@pytest.mark.spark
def test_a_delta_sink_quarantines_into_a_delta_table_beside_it(spark: Any, orders: OrdersPipeline) -> None:
    from tests.tables import duckdb_delta_rows

    ids = add_orders(orders, "f1", range(1, 51), null_every=10)  # 5 NULL ids
    uri = f"file://{orders.root / 'delta' / 'orders'}"
    spec = orders.spec("run-1", stage="tests.spark.test_expectations_stage:write_orders",
                       sinks={"orders_table": {"type": "delta", "path": uri, "expectations": id_present(0.2)}})
    orders.commit(run_stage(spec, spark))
    kept = duckdb_delta_rows(uri, "order_id")
    quarantined = duckdb_delta_rows(f"{uri}_quarantine", "amount")
    assert [r[0] for r in kept] == sorted(i for i in ids if i is not None)
    assert [(r[0], list(r[-1])) for r in quarantined] == [(None, ["id_present"])] * 5


#: Fails with CAST_INVALID_INPUT under ANSI for customers c0 and c2 ('c0' is no integer); c1 becomes 1.
CAST_RULE = "CAST(regexp_replace(customer, 'c1', '1') AS INT) > 0"


@pytest.mark.spark
def test_a_rule_that_raises_at_run_time_fails_that_row_instead_of_the_stage(
        spark: Any, orders: OrdersPipeline) -> None:
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"  # Spark 4's default: a bad cast raises
    add_orders(orders, "f1", range(1, 31))
    not_c1 = sum(1 for i in range(1, 31) if i % 3 != 1)
    rules = {"numeric_customer": {"expr": CAST_RULE, "on_fail": "warn"},
             "ratio": {"expr": "100 / (CAST(amount AS INT) % 10) > 0", "on_fail": "drop"}}  # x0: / 0
    result = run_stage(spec_with(orders, "run-1", rules), spark)
    counts = {e.name: (e.checked, e.failed) for m in result.manifests for e in m.expectations}
    assert counts == {"numeric_customer": (30, not_c1), "ratio": (30, 3)}
    orders.commit(result)
    assert sorted(r["order_id"] for r in table_rows(orders, "lake.orders")) == [i for i in range(1, 31) if i % 10]
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"  # the session's setting is left as it was

    # The same through a writer the staged writer does not serve (observed counts, a quarantine job).
    add_orders(orders, "f2", range(31, 41))
    out = orders.root / "out" / "orders"
    spec = orders.spec("run-2", stage="tests.spark.test_expectations_stage:write_orders",
                       sinks={"orders_table": {"path": f"file://{out}", "format": "csv", "options": {"header": "true"},
                                               "expectations": {"numeric_customer": {"expr": CAST_RULE,
                                                                                     "on_fail": "quarantine"}}}})
    result = run_stage(spec, spark)
    orders.commit(result)
    kept = [int(line.split(",")[0]) for f in sorted(out.glob("epoch=*/*.csv"))
            for line in f.read_text().splitlines()[1:]]
    quarantined = [line for f in sorted((orders.root / "out" / "orders_quarantine").glob("epoch=*/*.json"))
                   for line in f.read_text().splitlines()]
    assert sorted(kept) == [i for i in range(31, 41) if i % 3 == 1]
    assert len(quarantined) == sum(1 for i in range(31, 41) if i % 3 != 1)
