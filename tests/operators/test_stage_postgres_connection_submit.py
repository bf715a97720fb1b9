"""PostgreSQL sources named by an Airflow connection (``postgres_conn_id``) in a stage run through
``spark-submit``: the task resolves the connection, the driver gets a conninfo without the
password and the password in a private libpq password file, and every row is committed once.

Real components: the embedded PostgreSQL server (the test's role accepted only with its
password, not on trust as the rest of the server), ``spark-submit`` with ``local[1]``, the
detached launcher, the store and the trigger.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, Decision, EpochState
from airflow_seatunnel_ckpt.core.protocol.lease import judge_submission, read_submission, submitted_attempts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.context import StageContext
    from tests.postgres_server import PostgresServer

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: The connection's password: looked for in every file and command line the submission leaves
#: (with the two characters a password file escapes).
PASSWORD = "pw:of\\the-shop-db-7f3a"
#: The password as it is written, and as it is written in JSON (a spec, a plan, a record).
PASSWORD_FORMS = (PASSWORD, json.dumps(PASSWORD)[1:-1])
#: Folder of the markers the stage leaves and waits for (set per test).
MARKERS_ENV = "SEATUNNEL_TEST_PG_MARKERS"


def copy_when_released(ctx: StageContext, spark: SparkSession) -> None:
    """Record that the driver started, wait for ``release``, then stage both sources' rows."""
    markers = Path(os.environ[MARKERS_ENV])
    (markers / "started").write_text(str(os.getpid()))
    deadline = time.monotonic() + 300
    while not (markers / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    ctx.sink("orders_out").write(ctx.source("orders").read())
    ctx.sink("changes_out").write(ctx.source("changes").read())


@pytest.fixture
def shop(postgres_server: PostgresServer, postgres_db: str, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[psycopg.Connection]:
    """The test's database with ``orders`` (ids 1, 2), readable by a role that must give its password,
    and the Airflow connections ``shop_pg`` (that role) and ``spark_local`` as ``AIRFLOW_CONN_*``."""
    from psycopg.conninfo import conninfo_to_dict

    dbname, role = conninfo_to_dict(postgres_db)["dbname"], f"src_{uuid.uuid4().hex[:10]}"
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{PASSWORD}'")
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int)")
    db.execute("INSERT INTO orders VALUES (1, 10), (2, 20)")
    db.execute(f"ALTER TABLE orders OWNER TO {role}")
    db.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO {role}')  # its publication
    # The server trusts loopback; for this database and role it asks for the password first.
    hba = Path(db.execute("SHOW hba_file").fetchone()[0])
    before = hba.read_text()
    hba.write_text(f"host {dbname} {role} 127.0.0.1/32 scram-sha-256\n{before}")
    db.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=postgres_server.host, port=postgres_server.port, dbname=dbname, user=role,
                        connect_timeout=10).close()
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_PG", json.dumps({
        "conn_type": "postgres", "host": postgres_server.host, "port": postgres_server.port, "login": role,
        "password": PASSWORD, "schema": dbname, "extra": {"sslmode": "disable"}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    # The driver imports this module from the repository root (CI runs pytest without PYTHONPATH).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(MARKERS_ENV, str(markers))
    try:
        yield db
    finally:
        hba.write_text(before)
        db.execute("SELECT pg_reload_conf()")
        db.close()


def pg_stage(tmp_path: Path, pg_conn_id: str = "shop_pg", **kwargs: Any) -> Any:
    """The stage task: ``orders`` by an incremental query and ``changes`` by CDC, both through ``pg_conn_id``;
    through ``spark-submit`` to ``local[1]`` unless ``kwargs`` say otherwise."""
    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator
    from tests.operators.test_stage_detached_submit import small_driver

    runtime = {"conn_id": "spark_local", "spark_conf": small_driver(), **kwargs}
    return SparkStageOperator(
        task_id="ingest", pipeline="shop", storage_url=f"file://{tmp_path}/store",
        stage=f"{__name__}:copy_when_released", poll_interval=0.5,
        sources={"orders": {"type": "postgres_query", "postgres_conn_id": pg_conn_id, "table": "public.orders",
                            "incremental_column": "id"},
                 "changes": {"type": "postgres_cdc", "postgres_conn_id": pg_conn_id, "slot": "shop_slot",
                             "publication": "shop_pub", "tables": ["public.orders"]}},
        sinks={"orders_out": {"type": "file", "path": f"file://{tmp_path}/orders"},
               "changes_out": {"type": "file", "path": f"file://{tmp_path}/changes"}},
        **runtime)


def context_for(run_id: str, try_number: int = 1) -> dict[str, Any]:
    from tests.operators.test_stage_detached_submit import context_of

    return {**context_of(try_number), "run_id": run_id}


def commit(tmp_path: Path, epoch: int) -> None:
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("shop")
    pipeline.decide(epoch, Decision.COMMIT, "test", "test")
    pipeline.commit(epoch)


def published(tmp_path: Path, sink: str, epoch: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return [r for f in sorted((tmp_path / sink).glob(f"epoch={epoch}/*.parquet")) for r in pq.read_table(f).to_pylist()]


def holds(text: str, forms: tuple[str, ...] = PASSWORD_FORMS) -> bool:
    return any(form in text for form in forms)


def files_holding(root: Path, *forms: str) -> list[str]:
    """The files under ``root`` whose bytes, or framed documents' payloads, contain one of ``forms``."""
    from tests.hooks.test_kafka_connection import readable

    return [str(p) for p in root.rglob("*") if p.is_file() and any(f.encode() in readable(p) for f in forms)]


def test_postgres_sources_named_by_a_connection_commit_every_row_once_and_the_password_is_only_in_a_private_file(
        airflow_home: Path, tmp_path: Path, shop: psycopg.Connection) -> None:
    """Epoch 1 deferred (the submission is looked at while its driver runs), epoch 2 waited on in the task.

    One pipeline for both: each ``spark-submit`` costs a driver JVM, and what the password
    checks look at (the running submission's processes and files) is the same in either epoch.
    """
    import psutil

    from airflow_seatunnel_ckpt.hooks.spark_submit import SPEC_NAME
    from tests.core.sources.test_postgres_cdc import flushed
    from tests.operators.test_stage_detached_submit import context_of, deferred, fire, wait_until

    markers = Path(os.environ[MARKERS_ENV])
    stage = pg_stage(tmp_path, deferrable=True)
    trigger = deferred(stage, 1)
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("shop")
    wait_until(lambda: (markers / "started").exists() or judge_submission(pipeline, 1, "ingest", 1).outcome.done,
               what="the driver to start")
    assert (markers / "started").exists(), judge_submission(pipeline, 1, "ingest", 1).message
    record = read_submission(pipeline, 1, "ingest", 1)
    plan_file = Path(psutil.Process(record.launcher_pid).cmdline()[-1])
    workdir = plan_file.parent
    # The driver, spark-submit and the launcher: the password in none of their command lines, and in no
    # variable of their environments but the test's own AIRFLOW_CONN_SHOP_PG, which they inherit.
    group = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == record.launcher_pid:
                group.append((process.cmdline(), process.environ()))
        except (OSError, psutil.Error):  # gone, or a zombie: nothing of it runs
            pass
    assert len(group) >= 3
    for cmdline, environ in group:
        assert not holds(" ".join(cmdline))
        assert {k for k, v in environ.items() if holds(v)} <= {"AIRFLOW_CONN_SHOP_PG"}
    spec_text, plan_text = (workdir / SPEC_NAME).read_text(), plan_file.read_text()
    assert not holds(spec_text) and not holds(plan_text)
    # The driver has the connection as a conninfo without the password, and a password file only this user reads.
    given = json.loads(spec_text)["connections"]["shop_pg"]
    passfile = Path(given["passfile"])
    assert passfile.parent == workdir and stat.S_IMODE(passfile.stat().st_mode) == 0o600
    escaped = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
    assert passfile.read_text() == f"*:*:*:*:{escaped}\n" and "password" not in given["conninfo"]

    (markers / "release").touch()
    event = fire(trigger)
    assert event["outcome"] == "prepared", event
    first = stage.execute_complete(context_of(1), event)
    assert first["rows"] == 4  # 2 rows by query, 2 snapshot rows by CDC
    # The password file goes with the submission's private directory, which the launcher removes as it exits.
    wait_until(lambda: not workdir.exists(), 60, "the launcher to remove its private directory")
    commit(tmp_path, first["epoch"])
    shop.execute("INSERT INTO orders VALUES (3, 30)")
    shop.execute("UPDATE orders SET amount = 11 WHERE id = 1")
    flushed(shop)
    second = pg_stage(tmp_path, deferrable=False).execute(context_for("run-2"))
    commit(tmp_path, second["epoch"])

    assert (first["epoch"], second["epoch"]) == (1, 2)
    assert sorted(r["id"] for r in published(tmp_path, "orders", 1)) == [1, 2]
    assert sorted(r["id"] for r in published(tmp_path, "orders", 2)) == [3]
    assert sorted((r["_op"], r["id"], r["amount"]) for r in published(tmp_path, "changes", 1)) == [
        ("insert", 1, 10), ("insert", 2, 20)]
    assert sorted((r["_op"], r["id"], r["amount"]) for r in published(tmp_path, "changes", 2)) == [
        ("insert", 3, 30), ("update", 1, 11)]
    assert [pipeline.state(e) for e in (1, 2)] == [EpochState.COMMITTED, EpochState.COMMITTED]
    # The store pins the connection's name, never what it resolves to (its role, its password).
    role = json.loads(os.environ["AIRFLOW_CONN_SHOP_PG"])["login"]
    assert files_holding(tmp_path / "store", "shop_pg")
    assert files_holding(tmp_path / "store", *PASSWORD_FORMS) == files_holding(tmp_path / "store", role) == []


def test_a_postgres_source_whose_connection_is_missing_fails_the_stage_before_anything_is_submitted(
        airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    with pytest.raises(AirflowFailException, match=r"postgres_query source 'orders'.*postgres_conn_id 'no_such_pg' "
                                                   r"is not an Airflow connection here.*AIRFLOW_CONN_"):
        pg_stage(tmp_path, "no_such_pg", deferrable=False).execute(context_for("run-1"))
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("shop")
    assert submitted_attempts(pipeline, 1, "ingest") == []
    assert pipeline.state(1) is EpochState.OPEN  # not decided: the branch aborts it


@pytest.mark.timeout(600)
def test_a_deferrable_connect_stage_reads_postgres_sources_named_by_a_connection_in_its_detached_driver(
        connect_server: str, airflow_home: Path, tmp_path: Path, shop: psycopg.Connection) -> None:
    """The other driver outside the task's process: a deferrable Spark Connect stage's driver module
    gets the connection from the task the same way, and the epoch commits every row once."""
    from tests.operators.test_stage_detached_submit import context_of, deferred, fire

    (Path(os.environ[MARKERS_ENV]) / "release").touch()
    stage = pg_stage(tmp_path, deferrable=True, conn_id=None, spark_remote=connect_server, spark_conf={})
    event = fire(deferred(stage, 1))
    assert event["outcome"] == "prepared", event
    result = stage.execute_complete(context_of(1), event)
    commit(tmp_path, result["epoch"])
    assert sorted(r["id"] for r in published(tmp_path, "orders", 1)) == [1, 2]
    assert sorted((r["_op"], r["id"]) for r in published(tmp_path, "changes", 1)) == [("insert", 1), ("insert", 2)]
