"""The PostgreSQL sources through the stage runtime (``run_stage`` on the shared local Spark session)
into a file sink: typed rows, positions from committed epochs, refusals before the prepare."""

from __future__ import annotations

import datetime as dt
import json
import random
import string
import struct
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.replay import replay_stage
from airflow_seatunnel_ckpt.spark.sources.files import SourceError

pytestmark = pytest.mark.spark


def copy(ctx: Any, spark: Any) -> None:
    """The epoch's rows into ``out``."""
    ctx.sink("out").write(ctx.source("db").read())


class DbPipeline:
    def __init__(self, root: Path, source: dict[str, Any]) -> None:
        self.root, self.source, self.runs = root, source, 0
        self.store = {"storage_url": f"file://{root}/store"}

    def spec(self, run_id: str) -> StageSpec:
        return StageSpec(pipeline="db", participant="ingest", run_id=run_id, attempt=1, stage=f"{__name__}:copy",
                         sources={"db": self.source}, sinks={"out": {"type": "file", "path": f"file://{self.root}/out"}},
                         store=self.store, key_groups=2)

    def epoch(self, spark: Any) -> StageResult:
        self.runs += 1
        result = run_stage(self.spec(f"run-{self.runs}"), spark)
        pipeline = CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("db")
        pipeline.decide(result.epoch, Decision.COMMIT, "test", "test")
        pipeline.commit(result.epoch)
        return result

    def store_pipeline(self) -> Any:
        return CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("db")

    def rows(self, epoch: int) -> list[dict[str, Any]]:
        files = sorted((self.root / "out").glob(f"epoch={epoch}/*.parquet"))
        return [r for f in files for r in pq.read_table(f).to_pylist()]


def wait_flushed(conn: psycopg.Connection) -> None:
    from tests.core.sources.test_postgres_cdc import flushed

    flushed(conn)


def test_query_epochs_read_new_rows_once_with_their_types(spark: Any, tmp_path: Path, postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), at timestamptz NOT NULL)")
    db.execute("INSERT INTO orders VALUES (1, 1.50, '2026-01-01 00:00+00'), (2, 2.25, '2026-01-02 00:00+00')")
    lake = DbPipeline(tmp_path, {"type": "postgres_query", "conninfo": postgres_db, "table": "public.orders",
                                 "incremental_column": "at"})
    first = lake.epoch(spark)
    rows = sorted(lake.rows(first.epoch), key=lambda r: r["id"])
    assert [(r["id"], r["amount"]) for r in rows] == [(1, Decimal("1.50")), (2, Decimal("2.25"))]
    assert rows[1]["at"].replace(tzinfo=dt.UTC) == dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    db.execute("INSERT INTO orders VALUES (3, 3, '2026-01-02 00:00+00'), (4, 4, '2026-01-03 00:00+00')")
    second = lake.epoch(spark)
    assert sorted(r["id"] for r in lake.rows(second.epoch)) == [3, 4]  # 3 shares the first epoch's last value


def test_a_dropped_slot_fails_the_epoch_before_its_prepare_and_a_snapshot_epoch_is_not_replayed(
        spark: Any, tmp_path: Path, postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO orders VALUES (1, 1.50)")
    lake = DbPipeline(tmp_path, {"type": "postgres_cdc", "conninfo": postgres_db, "slot": "orders_slot",
                                 "publication": "orders_pub", "tables": ["public.orders"]})
    first = lake.epoch(spark)
    assert [(r["_op"], r["id"], r["amount"]) for r in lake.rows(first.epoch)] == [("insert", 1, Decimal("1.50"))]
    db.execute("UPDATE orders SET amount = 2 WHERE id = 1")
    wait_flushed(db)
    second = lake.epoch(spark)
    ((row,),) = [lake.rows(second.epoch)]
    assert (row["_op"], row["id"], row["amount"], row["_table"]) == ("update", 1, Decimal("2.00"), "public.orders")
    assert row["_lsn"] >= first.sources["db"]["end"] and row["_xid"] > 0 and row["_commit_ts"] is not None
    with pytest.raises(ReplayError, match="snapshot exported when its slot was created"):
        replay_stage(lake.spec("replay"), first.epoch, reason="test", by="test", spark=spark)
    db.execute("SELECT pg_drop_replication_slot('orders_slot')")
    db.execute("UPDATE orders SET amount = 3 WHERE id = 1")
    with pytest.raises(SourceError, match=r"the replication slot 'orders_slot' is gone .*a new snapshot"):
        lake.epoch(spark)
    pipeline = CheckpointStore(CheckpointConfig.from_mapping(lake.store)).pipeline("db")
    assert all(pipeline.state(e) is not EpochState.PREPARED for e in pipeline.txlog.epochs())


#: Attempt 1 of run-1 in a process of its own: it begins the epoch, pins its plan (creating the slot and
#: exporting the snapshot) and exits before it reads, taking the exported snapshot with it.
PLAN_AND_DIE = """
import json, sys
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.spark.sources.postgres import PostgresCdcSource
store, options = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pipeline = CheckpointStore(CheckpointConfig.from_mapping(store)).pipeline("db")
epoch = pipeline.begin("run-1").epoch
source = PostgresCdcSource("db", **{k: v for k, v in options.items() if k != "type"})
base = pipeline.restore_point()
print(json.dumps(pipeline.pin_inputs(epoch, "ingest", 1, lambda: {"db": source.plan_from(base, epoch)})["db"]))
"""


def test_a_first_epoch_planned_in_another_process_is_retried_here_with_a_new_snapshot_every_row_once(
        spark: Any, tmp_path: Path, postgres_db: str) -> None:
    import json
    import os
    import subprocess
    import sys

    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO orders VALUES (1, 1), (2, 2)")
    lake = DbPipeline(tmp_path, {"type": "postgres_cdc", "conninfo": postgres_db, "slot": "orders_slot",
                                 "publication": "orders_pub", "tables": ["public.orders"]})
    planned = subprocess.run([sys.executable, "-c", PLAN_AND_DIE, json.dumps(lake.store), json.dumps(lake.source)],
                             env={**os.environ, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True,
                             timeout=120, check=True)
    pinned = json.loads(planned.stdout.splitlines()[-1])
    assert pinned["snapshot"]
    # Changes after the first plan, before its retry: the retry's new snapshot holds them, the stream after it not.
    db.execute("INSERT INTO orders VALUES (3, 3)")
    db.execute("UPDATE orders SET amount = 10 WHERE id = 1")
    db.execute("DELETE FROM orders WHERE id = 2")
    wait_flushed(db)

    retried = run_stage(lake.spec("run-1").replace(attempt=2), spark)
    pipeline = lake.store_pipeline()
    assert retried.epoch == 1 and pipeline.decide(1, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    pipeline.commit(1)
    consumed = pipeline.txlog.read_prepared(1, "ingest").sources["db"].offsets
    assert consumed["start"] >= pinned["end"] and consumed["snapshot"] != pinned["snapshot"]
    assert sorted((r["_op"], r["id"], r["amount"]) for r in lake.rows(1)) == [
        ("insert", 1, Decimal("10.00")), ("insert", 3, Decimal("3.00"))]
    db.execute("INSERT INTO orders VALUES (4, 4)")
    wait_flushed(db)
    lake.runs = 1
    second = lake.epoch(spark)
    assert [(r["_op"], r["id"]) for r in lake.rows(second.epoch)] == [("insert", 4)]  # nothing of epoch 1 again


def cdc_epochs(spark: Any, root: Path, postgres_db: str) -> DbPipeline:
    """Pipeline ``db``: epoch 1 reads the snapshot of ``orders`` (2 rows), epoch 2 its changes (2 inserts,
    1 update, 1 delete), both committed through a real stage into a file sink."""
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO orders VALUES (1, 1.50), (2, 2.50)")
    lake = DbPipeline(root, {"type": "postgres_cdc", "conninfo": postgres_db, "slot": "orders_slot",
                             "publication": "orders_pub", "tables": ["public.orders"]})
    lake.epoch(spark)
    db.execute("INSERT INTO orders VALUES (3, 3), (4, 4)")
    db.execute("UPDATE orders SET amount = 5 WHERE id = 1")
    db.execute("DELETE FROM orders WHERE id = 2")
    wait_flushed(db)
    lake.epoch(spark)
    return lake


# -- every type at volume, on both runtimes ----------------------------------------------------------------
TYPED = ("CREATE TABLE typed (id int PRIMARY KEY, flag boolean, small int2, big int8, ratio float4, dbl float8, "
         "amount numeric(12,3), exact numeric, note text, code char(4), label varchar(12), blob bytea, day date, "
         "at_local timestamp, at timestamptz, ident uuid, doc jsonb, big_text text)")
TYPED_COLUMNS = ["id", "flag", "small", "big", "ratio", "dbl", "amount", "exact", "note", "code", "label", "blob",
                 "day", "at_local", "at", "ident", "doc", "big_text"]


def typed_row(key: int, rng: random.Random) -> tuple[list[Any], list[Any]]:
    """A row of ``typed``: the values inserted, and the values the change rows give (None: NULL)."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    ratio = maybe(rng.choice([0.1, 1.5, -2.25, 3.4e38, float("inf"), rng.uniform(-1e3, 1e3)]))
    amount = maybe(Decimal(rng.randint(-10 ** 11, 10 ** 11)).scaleb(-3))
    exact = maybe(f"{rng.randint(0, 10 ** 20)}.{rng.randint(0, 999):03d}00")
    note = maybe("".join(rng.choice("aé中😀'\"\\\n ,;") for _ in range(rng.randint(0, 12))))
    code = maybe("".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 4))))
    offset = dt.timezone(dt.timedelta(minutes=rng.randint(-12 * 60, 14 * 60)))
    at = maybe(dt.datetime(2000, 1, 1, tzinfo=offset) + dt.timedelta(microseconds=rng.randint(-10 ** 15, 10 ** 15)))
    ident = maybe(uuid.UUID(int=rng.getrandbits(128)))
    big_text = "".join(rng.choices(string.ascii_letters, k=20000)) if rng.random() < 0.05 else maybe("short")
    inserted = [key, maybe(rng.random() < 0.5), maybe(rng.randint(-32768, 32767)),
                maybe(rng.randint(-2 ** 63, 2 ** 63 - 1)), ratio, maybe(rng.uniform(-1e6, 1e6)), amount, exact, note,
                code, maybe(str(rng.randint(0, 10 ** 10))), maybe(rng.randbytes(rng.randint(0, 20))),
                maybe(dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-20000, 40000))),
                maybe(dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=rng.randint(-10 ** 15, 10 ** 15))),
                at, ident, maybe({"a": key, "b": note}), big_text]
    given = list(inserted)
    given[4] = None if ratio is None else struct.unpack("f", struct.pack("f", ratio))[0]  # real: a float32
    given[9] = None if code is None else code.ljust(4)  # char(4): blank-padded
    given[15] = None if ident is None else str(ident)
    given[16] = None if inserted[16] is None else json.dumps(inserted[16], ensure_ascii=False)
    return inserted, given


@pytest.mark.connect_slice("the change rows go to Spark as one Arrow table: a Connect session's local relation")
def test_a_cdc_read_of_thousands_of_changes_gives_every_type_as_postgresql_wrote_it(
        runtime: str, postgres_db: str, request: pytest.FixtureRequest) -> None:
    """Every value of every type (NULLs, char(n) blanks, bytea, offsets of timestamptz, unchanged TOAST,
    key updates as a delete and an update), in a snapshot and in an epoch of some 4,000 changes, comes
    out of the source's DataFrame as PostgreSQL wrote it, on the classic runtime and through Connect."""
    from airflow_seatunnel_ckpt.spark.sources.postgres import PostgresCdcSource

    session = request.getfixturevalue("spark" if runtime == "classic" else "connect_spark")
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute(TYPED)
    rng = random.Random(32)
    rows = {key: typed_row(key, rng) for key in range(1, 3001)}
    insert = f"INSERT INTO typed VALUES ({', '.join(['%s'] * len(TYPED_COLUMNS))})"

    def load(keys: list[int]) -> None:
        with db.transaction(), db.cursor() as cur:
            cur.executemany(insert, [[psycopg.types.json.Jsonb(v) if i == 16 and v is not None else v
                                      for i, v in enumerate(rows[k][0])] for k in keys])

    load(list(range(1, 501)))  # before the slot: the first epoch's snapshot
    source = PostgresCdcSource("db", type="postgres_cdc", conninfo=postgres_db, slot="typed_slot",
                               publication="typed_pub", tables=["public.typed"])
    first = source.plan([])
    expected = [("insert", *rows[k][1], None) for k in range(1, 501)]

    def read(offsets: dict[str, Any]) -> list[tuple[Any, ...]]:
        table = source.read(session, offsets).toArrow()
        return [(r["_op"], *(r[c] for c in TYPED_COLUMNS),
                 None if r["_unchanged_toast"] is None else tuple(r["_unchanged_toast"])) for r in table.to_pylist()]

    assert Counter(read(first)) == Counter(expected)  # the snapshot's rows
    for start in range(501, 3001, 500):
        load(list(range(start, start + 500)))
        expected += [("insert", *rows[k][1], None) for k in range(start, start + 500)]
    for key in range(1, 3001, 5):  # updates that leave big_text as it is: unchanged TOAST when stored out of line
        db.execute("UPDATE typed SET flag = NOT flag, note = %s WHERE id = %s", (f"updated {key}", key))
        given = rows[key][1]
        given[1], given[8] = None if given[1] is None else not given[1], f"updated {key}"
        toasted = given[17] is not None and len(given[17]) > 1000
        expected.append(("update", *given[:17], None if toasted else given[17], ("big_text",) if toasted else None))
    keys = set(rows)
    for key in range(2, 3001, 97):  # an update of the key: a delete of the old key, then the update
        db.execute("UPDATE typed SET id = %s WHERE id = %s", (key + 100000, key))
        keys = (keys - {key}) | {key + 100000}
        expected.append(("delete", key, *[None] * 17, None))
        toasted = rows[key][1][17] is not None and len(rows[key][1][17]) > 1000
        expected.append(("update", key + 100000, *rows[key][1][1:17], None if toasted else rows[key][1][17],
                         ("big_text",) if toasted else None))
    db.execute("DELETE FROM typed WHERE id % 7 = 3")
    expected += [("delete", k, *[None] * 17, None) for k in keys if k % 7 == 3]
    wait_flushed(db)
    second = source.plan([{"epoch": 1, "offsets": first}])
    got = read(second)
    assert len(got) == len(expected) - 500 and Counter(got) == Counter(expected[500:])
    assert source.read_figures() == {"changes": dict(Counter(op for op, *_ in expected[500:]))}
    assert any(e[-1] == ("big_text",) for e in expected) and any(e[-2] == "short" for e in expected)
