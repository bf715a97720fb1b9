"""OpenLineage: the stage and commit tasks' datasets and run facet, Spark parent-job info, asset URIs.

Events are captured the way a deployment would write them: the OpenLineage provider's
own listener with the file transport, enabled for one test at a time (see
:func:`openlineage_events`); every other test runs with OpenLineage disabled, as Airflow
does when no transport is configured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.context import StageContext

pytestmark = pytest.mark.airflow

PARENT_RUN_KEY = "spark.openlineage.parentRunId"


def stamp_parent_run(ctx: StageContext, spark: SparkSession) -> None:
    """A stage that writes what Spark was told its OpenLineage parent run is, beside each order.

    Runs in the ``spark-submit`` driver: the column shows that the stage task's parent-job
    information reached the Spark application's configuration.
    """
    from pyspark.sql import functions as F

    orders = ctx.source("orders").read()
    ctx.sink("stamped").write(orders.withColumn("parent_run_id", F.lit(spark.conf.get(PARENT_RUN_KEY, ""))))
    ctx.sink("orders_table").write(orders.select("order_id", "amount"))


@pytest.fixture
def openlineage_events(airflow_home: Path, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Turn OpenLineage on for this test only: the provider's listener, the file transport.

    Airflow registers the provider's listener when its plugins load, and only if a
    transport is configured; the test process loaded them with none (OpenLineage off), so
    the listener is registered here and unregistered afterwards. Emission runs in a thread
    (``execute_in_thread``) rather than a fork of the test process. Returns a reader of
    the events written so far.
    """
    from airflow.listeners.listener import get_listener_manager as scheduler_listener_manager
    from airflow.providers.openlineage.plugins.listener import OpenLineageListener
    from airflow.sdk.listener import get_listener_manager

    # Both listener managers load the plugins once per process; loaded now, with no transport,
    # they leave OpenLineage's own listener out. Loaded after the transport is set, they would
    # register it for every later test of the session.
    manager = get_listener_manager()
    scheduler_listener_manager()
    events_file = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(events_file), "append": True}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD", "True")
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "lineage-test")
    listener = OpenLineageListener()  # its own client, built from the transport above
    manager.add_listener(listener)

    def read() -> list[dict[str, Any]]:
        if not events_file.exists():
            return []
        return [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]

    try:
        yield read
    finally:
        manager.pm.unregister(listener)


def events_of(events: list[dict[str, Any]], job: str) -> dict[str, dict[str, Any]]:
    """``eventType -> event`` of one job (``<dag_id>.<task_id>``), each type emitted exactly once."""
    mine = [e for e in events if e["job"]["name"] == job]
    assert len({e["eventType"] for e in mine}) == len(mine), f"repeated events of {job} (two listeners?)"
    return {e["eventType"]: e for e in mine}


def by_name(datasets: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(namespace, name) -> dataset`` of an event's inputs or outputs."""
    return {(d["namespace"], d["name"]): d for d in datasets}


_WITHOUT_OPENLINEAGE = """
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        # the client, and every module of the provider but the metadata Airflow's discovery reads
        provider = name.startswith("airflow.providers.openlineage.") and not name.endswith(".get_provider_info")
        if name.split(".")[0] == "openlineage" or provider:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NotInstalled())
import os
os.environ["AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO"] = "True"
from airflow_seatunnel_ckpt.operators.commit import CommitEpochOperator
from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator
from airflow_seatunnel_ckpt.lineage import facets
from airflow_seatunnel_ckpt.lineage.epoch import with_openlineage_spark_properties
assert facets.CheckpointEpochRunFacet is None
assert facets.EpochFacts(pipeline="p").run_facets() == {}
assert with_openlineage_spark_properties({"spark.x": "1"}, {}) == {"spark.x": "1"}
print("ok")
"""


def test_the_provider_imports_and_submits_without_the_openlineage_packages(airflow_home: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _WITHOUT_OPENLINEAGE], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


# -- the facet methods ------------------------------------------------------------------------

def test_stage_start_reports_declared_sources_and_sinks_with_openlineage_names(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.lineage.facets import RUN_FACET_KEY
    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    task = SparkStageOperator(
        task_id="ingest", pipeline="orders", storage_url=f"file://{tmp_path}/store",
        stage="airflow_seatunnel_ckpt.spark.runner:run_stage",
        sources={"files": {"type": "file", "path": f"{tmp_path}/in/", "format": "json"},
                 "upstream": {"type": "iceberg", "table": "bronze.orders", "catalog": catalog,
                              "catalog_name": "lake"},
                 "changes": {"type": "delta", "path": "s3://raw-bucket/delta/orders"}},
        sinks={"out": {"type": "file", "path": "s3a://user:secret@out-bucket/orders/", "format": "json"},
               "table": {"type": "iceberg", "table": "silver.orders", "catalog": catalog,
                         "catalog_name": "lake"},
               "delta": {"type": "delta", "path": f"file://{tmp_path}/delta"}})

    lineage = task.get_openlineage_facets_on_start()

    assert sorted((d.namespace, d.name) for d in lineage.inputs) == sorted([
        ("file", f"{tmp_path}/in"), ("iceberg://lake", "bronze.orders"), ("s3://raw-bucket", "delta/orders")])
    outputs = {(d.namespace, d.name): d for d in lineage.outputs}
    assert sorted(outputs) == sorted([("s3://out-bucket", "orders"), ("iceberg://lake", "silver.orders"),
                                      ("file", f"{tmp_path}/delta")])
    iceberg = outputs[("iceberg://lake", "silver.orders")].facets
    assert iceberg["catalog"].framework == "iceberg" and iceberg["catalog"].name == "lake"
    assert iceberg["catalog"].warehouseUri == f"file://{tmp_path}/wh"
    assert iceberg["storage"].storageLayer == "iceberg"
    assert outputs[("file", f"{tmp_path}/delta")].facets["storage"].storageLayer == "delta"
    facet = lineage.run_facets[RUN_FACET_KEY]
    assert (facet.pipeline, facet.participant, facet.epoch, facet.decision) == ("orders", "ingest", None, None)
    assert "secret" not in json.dumps([d.namespace + d.name for d in lineage.outputs])


def test_stage_reports_the_recorded_offsets_once_prepared_and_the_declared_datasets_before(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core import CheckpointStore
    from airflow_seatunnel_ckpt.lineage.facets import RUN_FACET_KEY
    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    store_url, target = f"file://{tmp_path}/store", f"file://{tmp_path}/out"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    task = SparkStageOperator(
        task_id="ingest", pipeline="orders", storage_url=store_url,
        stage="airflow_seatunnel_ckpt.spark.runner:run_stage",
        sources={"files": {"type": "file", "path": f"{tmp_path}/in", "format": "json"},
                 "upstream": {"type": "iceberg", "table": "bronze.orders", "catalog": catalog}},
        sinks={"out": {"type": "file", "path": target, "format": "json"}})
    pipeline = CheckpointStore.from_url(store_url).pipeline("orders")
    epoch = pipeline.begin("manual__1").epoch
    ti = SimpleNamespace(run_id="manual__1", dag_id="", try_number=3, task_id="ingest")

    failed = task.get_openlineage_facets_on_failure(ti)  # begun, never prepared: a try that died

    assert [d.inputFacets for d in failed.inputs] == [{}, {}]
    assert [(d.name, d.outputFacets) for d in failed.outputs] == [(f"{tmp_path}/out", {})]
    facet = failed.run_facets[RUN_FACET_KEY]
    assert (facet.epoch, facet.attempt, facet.state) == (epoch, 3, "OPEN")

    staging = pipeline.staging_path(epoch, 2, "out")
    pipeline.storage.write_atomic(f"{staging}/part-0.jsonl", b'{"a": 1}\n')
    manifest = pipeline.manifest_for_staged(epoch, 2, "out", target, 1, fmt="json")
    pipeline.prepare(epoch, "ingest", 2, run_id="manual__1", sinks=[manifest], sources={
        "files": {"files": ["a.json", "b.json"],
                  "identity": {"a.json": {"size": 10, "mtime": 1.0}, "b.json": {"size": 5, "mtime": 2.0}}},
        "upstream": {"snapshot_id": 123, "after_snapshot_id": None,
                     "files": [{"path": f"{tmp_path}/wh/x.parquet", "size": 100, "records": 7}]}})

    done = task.get_openlineage_facets_on_complete(ti)

    inputs = {d.name: d for d in done.inputs}
    files = inputs[f"{tmp_path}/in"].inputFacets["inputStatistics"]
    assert (files.fileCount, files.size, files.rowCount) == (2, 15, None)
    table = inputs["bronze.orders"]
    stats = table.inputFacets["inputStatistics"]
    assert (stats.fileCount, stats.size, stats.rowCount) == (1, 100, 7)
    assert table.facets["version"].datasetVersion == "123"
    [output] = done.outputs
    assert output.outputFacets["outputStatistics"].rowCount == 1
    facet = done.run_facets[RUN_FACET_KEY]
    assert (facet.epoch, facet.attempt, facet.state) == (epoch, 2, "PREPARED")  # the attempt that prepared


def test_commit_complete_reports_what_each_sink_published_and_the_decision(tmp_path: Path) -> None:
    from openlineage.client.serde import Serde

    from airflow_seatunnel_ckpt.core import CheckpointStore
    from airflow_seatunnel_ckpt.core.models import Decision
    from airflow_seatunnel_ckpt.lineage.facets import RUN_FACET_KEY
    from airflow_seatunnel_ckpt.operators.commit import CommitEpochOperator, sink_asset

    store_url, target = f"file://{tmp_path}/store", f"file://{tmp_path}/table"
    pipeline = CheckpointStore.from_url(store_url).pipeline("orders")
    run_id = "manual__1"
    epoch = pipeline.begin(run_id).epoch
    staging = pipeline.staging_path(epoch, 2, "orders_table")
    pipeline.storage.write_atomic(f"{staging}/part-0.jsonl", b'{"a": 1}\n{"a": 2}\n')
    pipeline.storage.write_atomic(f"{staging}/part-1.jsonl", b'{"a": 3}\n')
    manifest = pipeline.manifest_for_staged(epoch, 2, "orders_table", target, 3, fmt="json")
    pipeline.prepare(epoch, "ingest", 2, run_id=run_id, sinks=[manifest])
    pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    pipeline.commit(epoch)
    task = CommitEpochOperator(task_id="commit", pipeline="orders", storage_url=store_url,
                               sink_assets={"orders_table": sink_asset("orders", "orders_table", target)})
    # The listener hands over the finished task instance; only its identity is read.
    ti = SimpleNamespace(run_id=run_id, dag_id="", try_number=1, task_id="commit")

    started, done = task.get_openlineage_facets_on_start(), task.get_openlineage_facets_on_complete(ti)

    assert [(d.namespace, d.name) for d in started.outputs] == [("file", f"{tmp_path}/table")]
    assert started.outputs[0].outputFacets == {}
    [output] = done.outputs
    assert (output.namespace, output.name) == ("file", f"{tmp_path}/table")
    stats = output.outputFacets["outputStatistics"]
    assert (stats.rowCount, stats.fileCount, stats.size) == (3, 2, len(b'{"a": 1}\n{"a": 2}\n{"a": 3}\n'))
    facet = done.run_facets[RUN_FACET_KEY]
    assert (facet.pipeline, facet.epoch, facet.decision, facet.state, facet.attempts) == (
        "orders", epoch, "commit", "COMMITTED", {"ingest": 2})
    assert json.loads(Serde.to_json(facet))["_schemaURL"].endswith(
        "CheckpointEpochRunFacet.json#/$defs/CheckpointEpochRunFacet")


def test_run_facet_schema_ships_with_the_package_and_describes_the_facet() -> None:
    from airflow_seatunnel_ckpt.lineage import facets

    schema = json.loads((Path(facets.__file__).parent / "CheckpointEpochRunFacet.json").read_text())
    fields = schema["$defs"]["CheckpointEpochRunFacet"]["allOf"][1]["properties"]
    assert set(fields) == {f.name for f in facets.CheckpointEpochRunFacet.__attrs_attrs__
                           if not f.name.startswith("_")}
    assert facets.SCHEMA_URL.split("#")[0] == schema["$id"]


@pytest.mark.parametrize(("url", "namespace", "name"), [
    ("file:///data/orders/", "file", "/data/orders"),
    ("/data//orders/./x", "file", "/data/orders/x"),
    ("s3://bucket/a/b/", "s3://bucket", "a/b"),
    ("s3a://key:secret@bucket/a", "s3://bucket", "a"),
    ("gs://bucket/k", "gs://bucket", "k"),
    ("hdfs://nn:8020/warehouse/t", "hdfs://nn:8020", "/warehouse/t"),
    ("iceberg://default/sales.orders", "iceberg://default", "sales.orders"),
])
def test_dataset_names_follow_openlineage_naming(url: str, namespace: str, name: str) -> None:
    from airflow_seatunnel_ckpt.lineage.naming import dataset_name

    assert (dataset_name(url).namespace, dataset_name(url).name) == (namespace, name)


# -- parent-job information for spark-submit --------------------------------------------------

def test_parent_job_information_is_added_only_when_enabled_and_never_overrides(
        monkeypatch: pytest.MonkeyPatch, airflow_home: Path) -> None:
    from airflow_seatunnel_ckpt.lineage.epoch import with_openlineage_spark_properties

    monkeypatch.delenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", raising=False)
    assert with_openlineage_spark_properties({"spark.x": "1"}, {}) == {"spark.x": "1"}
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "True")
    mine = {"spark.openlineage.parentRunId": "set-by-the-user"}
    assert with_openlineage_spark_properties(mine, {}) == mine  # the user's own keys win


# -- events through a DAG run -----------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.slow
def test_epoch_dag_emits_datasets_statistics_run_facet_and_spark_parent_run(
        openlineage_events: Callable[[], list[dict[str, Any]]], run_at: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One epoch through ``spark-submit`` (local[1]) with OpenLineage on: what each task reported."""
    import pyarrow.json as pj
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.core import CheckpointStore
    from airflow_seatunnel_ckpt.lineage.facets import RUN_FACET_KEY
    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch
    from tests.conftest import FAST_JVM_OPTIONS  # here: the driver imports this module for its stage
    from tests.epoch_test_dags import START, task_states
    from tests.tables import duckdb_iceberg_rows

    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "True")
    # The stage function lives in this test module: spark-submit's driver imports it from
    # the repository root, which pytest puts on this process's sys.path only.
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    inputs, stamped = tmp_path / "input", tmp_path / "stamped"
    inputs.mkdir()
    for n in range(2):
        (inputs / f"orders-{n}.json").write_text(
            "".join(json.dumps({"order_id": f"o{n}-{i}", "amount": i}) + "\n" for i in range(3)))
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    store_url = f"file://{tmp_path}/store"
    with DAG("lineage_epoch", schedule=None, start_date=START, catchup=False) as dag:
        checkpointed_epoch(
            "orders", pipeline="orders", storage_url=store_url,
            stages={"ingest": {
                "stage": f"{__name__}:stamp_parent_run",
                "sources": {"orders": {"type": "file", "path": f"file://{inputs}", "format": "json"}},
                "sinks": {"stamped": {"type": "file", "path": f"file://{stamped}", "format": "json"},
                          "orders_table": {"type": "iceberg", "table": "lineage.orders", "catalog": catalog}},
                "conn_id": "spark_local",
                "spark_conf": {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                               "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                               # a driver of one short stage: the JVM flags that halve its start-up
                               "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS},
            }},
            sensor={"poke_interval": 0.5, "timeout": 300},
        )
    run = run_at(dag, START)
    assert run.state == "success", task_states(run)
    events = openlineage_events()

    stage, commit = events_of(events, "lineage_epoch.orders.ingest"), events_of(events, "lineage_epoch.orders.commit")
    assert {"START", "COMPLETE"} <= set(stage) and {"START", "COMPLETE"} <= set(commit)
    source = ("file", str(inputs))
    file_sink, table = ("file", str(stamped)), ("iceberg://default", "lineage.orders")
    # START: what the task declares, before the epoch is known.
    assert set(by_name(stage["START"]["inputs"])) == {source}
    assert set(by_name(stage["START"]["outputs"])) == {file_sink, table}
    assert stage["START"]["run"]["facets"][RUN_FACET_KEY]["pipeline"] == "orders"
    # COMPLETE: what the epoch's prepared record says was read and staged.
    read = by_name(stage["COMPLETE"]["inputs"])[source]["inputFacets"]["inputStatistics"]
    assert (read["fileCount"], read["size"]) == (2, sum(p.stat().st_size for p in inputs.iterdir()))
    staged = by_name(stage["COMPLETE"]["outputs"])
    assert staged[file_sink]["outputFacets"]["outputStatistics"]["rowCount"] == 6
    assert staged[table]["outputFacets"]["outputStatistics"]["rowCount"] == 6
    assert staged[table]["facets"]["catalog"]["warehouseUri"] == f"file://{tmp_path}/wh"
    ran = stage["COMPLETE"]["run"]["facets"][RUN_FACET_KEY]
    assert (ran["epoch"], ran["attempt"], ran["state"], ran["participant"]) == (1, 1, "PREPARED", "ingest")
    # The commit: the epoch's inputs, what each sink published, the decision.
    assert set(by_name(commit["COMPLETE"]["inputs"])) == {source}
    published = by_name(commit["COMPLETE"]["outputs"])
    committed = commit["COMPLETE"]["run"]["facets"][RUN_FACET_KEY]
    assert (committed["epoch"], committed["decision"], committed["state"], committed["attempts"]) == (
        1, "commit", "COMMITTED", {"ingest": 1})
    # Independent readers agree with the reported counts.
    pipeline = CheckpointStore.from_url(store_url).pipeline("orders")
    assert pipeline.status(1).state.value == "COMMITTED"
    files = sorted(stamped.glob("epoch=1/**/part-*"))
    rows = [r for f in files for r in pj.read_json(f).to_pylist()]
    stats = published[file_sink]["outputFacets"]["outputStatistics"]
    assert (stats["rowCount"], stats["fileCount"]) == (len(rows), len(files))
    table_rows = duckdb_iceberg_rows(catalog, "lineage.orders")
    assert published[table]["outputFacets"]["outputStatistics"]["rowCount"] == len(table_rows) == 6
    # The Spark application was told the stage task's OpenLineage run as its parent.
    assert {r["parent_run_id"] for r in rows} == {stage["COMPLETE"]["run"]["runId"]}


# -- iceberg:// asset URIs ---------------------------------------------------------------------

def test_iceberg_asset_uris_are_normalised_refused_when_malformed_and_converted_to_the_same_dataset(
        airflow_home: Path) -> None:
    from airflow.sdk import Asset
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from airflow_seatunnel_ckpt.lineage.assets import create_asset
    from airflow_seatunnel_ckpt.lineage.naming import dataset_name

    manager = ProvidersManagerTaskRuntime()
    assert {"iceberg"} <= set(manager.asset_uri_handlers)
    assert manager.asset_factories["iceberg"] is create_asset
    # file:// stays common-io's (the file and Delta sinks' tables): not replaced by this provider.
    assert manager.asset_uri_handlers["file"].__module__.startswith("airflow.providers.common.io")

    asset = Asset(uri="iceberg://default/sales.orders/?x=1#f")
    assert asset.uri == "iceberg://default/sales.orders"
    assert create_asset(table="sales.orders").uri == asset.uri
    with pytest.raises(ValueError, match=r"<namespace>\.<table>"):
        Asset(uri="iceberg://default/orders")
    with pytest.raises(ValueError, match="names no catalog"):
        Asset(uri="iceberg:///sales.orders")
    converted = manager.asset_to_openlineage_converters["iceberg"](asset, None)
    expected = dataset_name("iceberg://default/sales.orders")
    assert (converted.namespace, converted.name) == (expected.namespace, expected.name)


# -- OpenLineage stays off for everything else ----------------------------------------------

def test_openlineage_is_off_and_no_listener_runs_without_a_transport(airflow_home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.openlineage import conf
    from airflow.providers.openlineage.plugins.listener import OpenLineageListener
    from airflow.sdk.listener import get_listener_manager

    for name in ("TRANSPORT", "CONFIG_PATH", "DISABLED"):
        monkeypatch.delenv(f"AIRFLOW__OPENLINEAGE__{name}", raising=False)
    monkeypatch.delenv("OPENLINEAGE_URL", raising=False)
    assert conf.is_disabled()
    # Last in this module: the tests above that turned it on left no listener behind.
    plugins = get_listener_manager().pm.get_plugins()
    assert not [p for p in plugins if isinstance(p, OpenLineageListener)]
