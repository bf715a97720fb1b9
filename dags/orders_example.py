"""The example pipeline, end to end: ``python dags/orders_example.py``.

Runs the example DAG ``dags/orders_pipeline.py`` for several consecutive hours with
Airflow's ``dag.test()`` (every task in this process, metadata in SQLite) inside a
throwaway ``AIRFLOW_HOME``, each hour with a new order file, then prints what every
epoch committed and checks the Iceberg table holds each input order exactly once.

This module also holds the example's pieces the DAG imports: the order-file generator
and the PySpark stage. It lives in the DAGs folder, beside the DAG, and is imported as
the top-level module ``orders_example``: Airflow puts the DAGs folder on ``sys.path`` of
every task, so the stage is ``"orders_example:dedup_orders"``; run through
``spark-submit``, the stage task ships this file with ``--py-files``. It imports neither
Airflow nor PySpark at module level, so the environment can be set before Airflow reads
its configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark import StageContext

PIPELINE = "orders"
SOURCE = "orders"
SINK = "orders_table"
#: The Iceberg table the example commits each epoch into (namespace.name).
TABLE = "shop.orders"
#: First logical date of the example (hour 0 of the generated data).
START = datetime(2026, 1, 1, tzinfo=UTC)
#: The folder of this file: the repository's ``dags/``.
REPO_DAGS = Path(__file__).resolve().parent


def example_dir() -> str:
    """Root of the example's input and table (the store is the provider's default store)."""
    return os.environ.get("SEATUNNEL_CKPT_EXAMPLE_DIR") or os.path.join(
        os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "seatunnel-ckpt-example")


def iceberg_catalog(base: str | None = None) -> dict[str, str]:
    """The example's Iceberg catalog: SQL on SQLite with a local warehouse, below its data.

    A sink that names no catalog uses the same kind of catalog under ``$AIRFLOW_HOME``;
    the example keeps its own beside its data, so that each run of it is separate.
    """
    warehouse = os.path.join(os.path.abspath(base or example_dir()), "warehouse")
    return {"type": "sql", "uri": f"sqlite:///{warehouse}/catalog.db", "warehouse": f"file://{warehouse}"}


def published_order_ids(base: str | None = None) -> list[str]:
    """Order ids of every row of the orders table, as any Iceberg reader sees it (pyiceberg)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        # The name is part of a SQL catalog's rows: the sink's catalog_name ("default").
        table = load_catalog("default", **iceberg_catalog(base)).load_table(TABLE)
    except (NoSuchTableError, NoSuchNamespaceError):
        return []  # no epoch committed yet
    return table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()


# -- the source system ---------------------------------------------------------------------

def _order(hour: int, index: int) -> dict[str, Any]:
    """Order ``index`` of ``hour``: always the same content, however often it is sent."""
    rng = random.Random(hour * 100_003 + index)
    placed = START + timedelta(hours=hour, seconds=rng.randrange(3600))
    return {
        "order_id": f"ORD-{hour:05d}-{index:04d}",
        "customer_id": f"C{rng.randrange(500):04d}",
        "amount": round(rng.uniform(5, 500), 2),
        "order_ts": placed.isoformat(),
        "order_date": placed.date().isoformat(),
    }


def orders_of_hour(hour: int) -> list[dict[str, Any]]:
    """What the source system sends in ``hour``: new orders, plus re-sent ones.

    About 40-60 new orders; some orders of the previous hour are sent again (an upstream
    retry) and a few lines repeat within the file -- the duplicates the stage drops.
    """
    rng = random.Random(hour)
    fresh = [_order(hour, i) for i in range(40 + rng.randrange(21))]
    resent = []
    if hour > 0:
        previous = 40 + random.Random(hour - 1).randrange(21)
        resent = [_order(hour - 1, i) for i in rng.sample(range(previous), 8)]
    repeated = rng.sample(fresh, 3)
    lines = fresh + resent + repeated
    rng.shuffle(lines)
    return lines


def hour_of(logical_date: datetime) -> int:
    """Hours since :data:`START` (the generator's seed)."""
    return int((logical_date - START).total_seconds() // 3600)


def generate_orders(input_dir: str, logical_date: datetime) -> dict[str, Any]:
    """Write the order file of ``logical_date``'s hour (idempotent, atomic).

    Rewriting is skipped when the file exists: its content is a function of the hour,
    and a file a stage may already have consumed must never change under it.
    """
    hour = hour_of(logical_date)
    rows = orders_of_hour(hour)
    os.makedirs(input_dir, exist_ok=True)
    path = os.path.join(input_dir, f"orders-{logical_date:%Y%m%dT%H%M}.json")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=input_dir, prefix=".tmp-")
        with os.fdopen(fd, "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(tmp, path)
    return {"file": path, "lines": len(rows), "orders": len({r["order_id"] for r in rows})}


# -- the PySpark stage -------------------------------------------------------------------

def dedup_orders(ctx: StageContext, spark: SparkSession) -> None:
    """Stage every order not seen before into the orders table (keyed state: seen ids).

    ``dedup`` drops both orders an earlier epoch committed and repeats within this
    epoch's files (the first one read wins).
    """
    new = ctx.source(SOURCE).read()
    fresh = ctx.key_set("seen_orders").dedup(new, key="order_id")
    ctx.sink(SINK).write(fresh)


# -- running the example -----------------------------------------------------------------

def _configure_environment(work: Path, dags_folder: Path, verbose: bool) -> None:
    """Point Airflow at a throwaway home with SQLite; must run before Airflow is imported."""
    home = work / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* airflow_seatunnel_ckpt.*",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO" if verbose else "WARNING",
        "SEATUNNEL_CKPT_EXAMPLE_DIR": str(work / "data"),
        "SEATUNNEL_CKPT_STORE": "file://" + str(work / "data" / "checkpoints"),
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })


def _input_ids(input_dir: Path) -> set[str]:
    ids: set[str] = set()
    for path in sorted(input_dir.glob("orders-*.json")):
        ids.update(json.loads(line)["order_id"] for line in path.read_text().splitlines())
    return ids


def main(argv: list[str] | None = None) -> int:
    """Run the example DAG for ``--hours`` consecutive hours and report what committed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=int, default=4, help="DAG runs (hours) to run")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep everything here (default: a temporary directory, removed)")
    parser.add_argument("--dags-folder", type=Path, default=REPO_DAGS,
                        help="folder holding orders_pipeline.py (default: the repository's)")
    parser.add_argument("--verbose", action="store_true", help="show Airflow's task logs")
    args = parser.parse_args(argv)
    dag_file = args.dags_folder / "orders_pipeline.py"
    if not dag_file.is_file():
        parser.error(f"{dag_file} not found; pass --dags-folder pointing at the repository's dags/")

    work = args.workdir or Path(tempfile.mkdtemp(prefix="seatunnel-ckpt-example-"))
    _configure_environment(work.resolve(), args.dags_folder.resolve(), args.verbose)
    # As Airflow does for its tasks: the DAG file imports its sibling ``orders_example``.
    sys.path.insert(0, str(args.dags_folder.resolve()))
    try:
        return _run(args.hours, dag_file, work.resolve())
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _run(hours: int, dag_file: Path, work: Path) -> int:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    from airflow_seatunnel_ckpt.core import CheckpointStore

    print(f"AIRFLOW_HOME={os.environ['AIRFLOW_HOME']} (SQLite); data under {work / 'data'}")
    db.upgradedb()
    bag = DagBag(dag_folder=str(dag_file))
    if bag.import_errors:
        print(f"cannot import {dag_file}: {bag.import_errors}", file=sys.stderr)
        return 2
    dag = bag.get_dag("orders_pipeline")

    print(f"running {dag.dag_id} for {hours} hourly runs with dag.test() ...")
    runs = []
    for hour in range(hours):
        when = START + timedelta(hours=hour)
        dag_run = dag.test(logical_date=when, run_after=when)
        states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
        runs.append((dag_run.run_id, dag_run.state))
        tasks = " ".join(f"{task.split('.')[-1]}={state}" for task, state in sorted(states.items()))
        print(f"  {dag_run.run_id}: {dag_run.state}  {tasks}")

    store_url = os.environ["SEATUNNEL_CKPT_STORE"]
    pipeline = CheckpointStore.from_url(store_url).pipeline(PIPELINE)
    print(f"\nepochs of pipeline {PIPELINE!r} in {store_url}:")
    print(f"  {'epoch':>5}  {'state':<10} {'files':>5} {'rows':>6}  run")
    for status in pipeline.list_epochs():
        files = sum(p.files for p in status.published)
        rows = sum(p.rows for p in status.published)
        state = status.state.value
        print(f"  {status.epoch:>5}  {state:<10} {files:>5} {rows:>6}  {status.run_id}")

    data = work / "data"
    published = published_order_ids(str(data))
    unique_input = _input_ids(data / "input" / "orders")
    inputs = (data / "input" / "orders").glob("*.json")
    lines = sum(len(p.read_text().splitlines()) for p in inputs)
    print(f"\ninput: {lines} order lines, {len(unique_input)} unique orders")
    print(f"Iceberg table {TABLE} ({iceberg_catalog(str(data))['uri']}): {len(published)} rows, "
          f"{len(set(published))} unique orders")
    exact = len(published) == len(set(published)) and set(published) == unique_input
    ok = exact and all(state == "success" for _, state in runs)
    print("exactly once: " + ("yes" if exact else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
