"""What each source gives the contract suite (its context), and the epochs that read it.

A :class:`SourceContext` knows one connector: its options (by default; or the most permissive
ones it has, for the promises that hold whatever the options allow a normal epoch to skip), how new input
holding given ids arrives, how that input goes away (files deleted, a topic deleted and
created again) and how it is replaced under the same identity (a file rewritten under its
name, a table dropped and created again, a topic re-created). Input is written with the
format's own libraries (pyarrow, pyiceberg, deltalake, the Kafka producer), never with
this package; an upstream pipeline's output is written by :class:`tests.contract.sinks.Epochs`.

:class:`Reads` runs a downstream pipeline whose one stage copies the source's ids into a
file sink, through the Spark stage runtime (``run_stage``, ``replay_stage``), and reads the
sink back as a reader must (:class:`tests.contract.sinks.FileContext`).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, Pipeline
from airflow_seatunnel_ckpt.spark import StageContext, StageResult, StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.replay import ReplayResult, replay_stage
from tests.contract.sinks import APPEND, Epochs, FileContext

if TYPE_CHECKING:
    from tests.kafka_broker import KafkaBroker

IDS = pa.schema([("id", pa.int64())])
COPY = "tests.contract.sources:copy_ids"
COPY_THEN_FAIL = "tests.contract.sources:copy_ids_then_fail"


class InjectedFailure(RuntimeError):
    """The stage dies after staging its output (the attempt is retried)."""


def copy_ids(ctx: StageContext, spark: Any) -> None:
    """The epoch's input ids into the sink ``out`` (a Kafka record's value is its id)."""
    from pyspark.sql import functions as F

    new = ctx.source("events").read()
    ids = (new.select(F.col("value").cast("string").cast("long").alias("id")) if "value" in new.columns
           else new.select("id"))
    ctx.sink("out").write(ids)


def copy_ids_then_fail(ctx: StageContext, spark: Any) -> None:
    """Stage the epoch's input, then die before the epoch is prepared."""
    copy_ids(ctx, spark)
    raise InjectedFailure(f"killed after staging epoch {ctx.epoch} attempt {ctx.attempt}")


class SourceContext:
    """One source connector's part of the contract suite (subclassed per connector)."""

    #: The connector's name in test ids.
    name: ClassVar[str] = ""

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        self.root = root
        self.request = request

    def options(self, permissive: bool) -> dict[str, Any]:
        """The source's options in the stage spec; ``permissive``: those that let a normal epoch skip
        or re-read changed input."""
        raise NotImplementedError

    def add(self, ids: Sequence[int]) -> None:
        """New input holding one row (record) per id."""
        raise NotImplementedError

    def remove(self) -> None:
        """Every input added so far is gone."""
        raise NotImplementedError

    def replace(self) -> None:
        """The input added so far is replaced, under the same identity (name), by other rows."""
        raise NotImplementedError

    def by_connection(self, secret: str) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
        """The source's options naming an Airflow connection instead of giving its address, the
        connection's id, and the connection (``AIRFLOW_CONN_<ID>`` JSON) carrying ``secret`` as its
        credential; None for a source that takes no connection."""
        return None


class FileSourceContext(SourceContext):
    """Parquet files in a directory; a file changed under its name is read again on request."""

    name = "files"

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(root, request)
        self.dir = root / "in"
        self.dir.mkdir(parents=True)
        self.files: list[Path] = []

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "file", "path": f"file://{self.dir}", "format": "parquet",
                **({"on_change": "reread"} if permissive else {})}

    def add(self, ids: Sequence[int]) -> None:
        path = self.dir / f"part-{len(self.files):04d}.parquet"
        tmp = self.dir / f".{path.name}.tmp"  # whole or not at all, as a writer should
        pq.write_table(pa.table({"id": list(ids)}, schema=IDS), tmp)
        tmp.rename(path)
        self.files.append(path)

    def remove(self) -> None:
        for path in self.files:
            path.unlink()

    def replace(self) -> None:
        for path in self.files:
            ids = pq.read_table(path).column("id").to_pylist()
            pq.write_table(pa.table({"id": [i + 1000 for i in ids] + [999]}, schema=IDS), path)


class IcebergSourceContext(SourceContext):
    """An Iceberg table in a pyiceberg SQL catalog on SQLite, appended to."""

    name = "iceberg"
    IDENT = "bronze.events"

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(root, request)
        self.catalog_props = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/wh"}
        catalog = self.catalog()
        catalog.create_namespace("bronze")
        catalog.create_table(self.IDENT, schema=IDS)

    def catalog(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog("bronze", **{k: v for k, v in self.catalog_props.items() if k != "type"})

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "iceberg", "table": self.IDENT, "catalog": self.catalog_props, "catalog_name": "bronze",
                **({"skip_overwrites": True, "skip_deletes": True} if permissive else {})}

    def add(self, ids: Sequence[int]) -> None:
        self.catalog().load_table(self.IDENT).append(pa.table({"id": list(ids)}, schema=IDS))

    def remove(self) -> None:
        """Older snapshots expired and the data files no snapshot keeps deleted, after the rows were deleted."""
        table = self.catalog().load_table(self.IDENT)
        files = [task.file.file_path for task in table.scan().plan_files()]
        table.delete("id >= 0")
        table = self.catalog().load_table(self.IDENT)
        current = table.current_snapshot()
        older = [s.snapshot_id for s in table.snapshots() if current is None or s.snapshot_id != current.snapshot_id]
        if older:
            table.maintenance.expire_snapshots().by_ids(older).commit()
        for path in files:  # what an orphan-file cleanup does to files no snapshot names
            Path(path.removeprefix("file://")).unlink(missing_ok=True)

    def replace(self) -> None:
        """The table dropped and created again under its name, with other rows."""
        catalog = self.catalog()
        ids = sorted(catalog.load_table(self.IDENT).scan().to_arrow().column("id").to_pylist())
        catalog.drop_table(self.IDENT)
        shutil.rmtree(self.root / "wh", ignore_errors=True)
        catalog.create_table(self.IDENT, schema=IDS).append(pa.table({"id": [i + 1000 for i in ids]}, schema=IDS))


class DeltaSourceContext(SourceContext):
    """A Delta table on the local disk, appended to."""

    name = "delta"

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(root, request)
        self.uri = str(root / "bronze" / "events")

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "delta", "path": self.uri, **({"skip_change_commits": True} if permissive else {})}

    def add(self, ids: Sequence[int]) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, pa.table({"id": list(ids)}, schema=IDS), mode="append")

    def remove(self) -> None:
        """Every row deleted, and the files no version after that needs vacuumed."""
        from deltalake import DeltaTable

        table = DeltaTable(self.uri)
        table.delete("id >= 0")
        DeltaTable(self.uri).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    def replace(self) -> None:
        """The table removed and written again at the same path, with other rows."""
        from deltalake import DeltaTable, write_deltalake

        ids = sorted(DeltaTable(self.uri).to_pyarrow_table().column("id").to_pylist())
        shutil.rmtree(self.uri)
        write_deltalake(self.uri, pa.table({"id": [i + 1000 for i in ids]}, schema=IDS))


class PipelineOutputContext(SourceContext):
    """Another pipeline's file sink target: each upstream epoch is new input."""

    name = "pipeline_output"

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(root, request)
        self.upstream = Epochs(FileContext(root / "upstream"), APPEND, name="upstream")

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "pipeline_output", "path": self.upstream.context.target_url(),
                **({"skip_replays": True} if permissive else {})}

    def add(self, ids: Sequence[int]) -> None:
        self.upstream.run(ids)

    def _files(self) -> list[Path]:
        out = self.upstream.context.root / "out"
        return sorted(f for f in out.glob("epoch=*/*.parquet"))

    def remove(self) -> None:
        for path in self._files():
            path.unlink()

    def replace(self) -> None:
        for path in self._files():
            rows = pq.read_table(path)
            more = pa.table({"id": [999], "region": ["EU"], "amount": [0.0]}, schema=rows.schema)
            pq.write_table(pa.concat_tables([rows, more]), path)


class KafkaSourceContext(SourceContext):
    """A topic of two partitions on the session's broker; a record's value is its id."""

    name = "kafka"

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(root, request)
        self.broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        self.topic = f"events-{uuid.uuid4().hex[:8]}"
        self.broker.create_topic(self.topic, 2)
        self.produced: list[int] = []

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "kafka", "bootstrap_servers": self.broker.bootstrap_servers, "topics": [self.topic],
                **({"fail_on_data_loss": False} if permissive else {})}

    def by_connection(self, secret: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
        options = self.options(permissive=False)
        del options["bootstrap_servers"]
        extra = {"bootstrap.servers": self.broker.bootstrap_servers, "sasl.password": secret}
        return {**options, "kafka_conn_id": "contract_kafka"}, "contract_kafka", {"conn_type": "kafka", "extra": extra}

    def add(self, ids: Sequence[int]) -> None:
        self.broker.produce(self.topic, [(i % 2, b"k%d" % i, b"%d" % i) for i in ids])
        self.produced += ids

    def remove(self) -> None:
        """The topic deleted and created again, empty (every record it held is gone)."""
        self.broker.delete_topic(self.topic)
        self.broker.create_topic(self.topic, 2)

    def replace(self) -> None:
        """The topic deleted and created again with as many records, other ids, at the same offsets."""
        self.remove()
        self.broker.produce(self.topic, [(i % 2, b"k%d" % i, b"%d" % (i + 1000)) for i in self.produced])


# -- CDCOPS: the PostgreSQL sources, each in a database of its own on the session's server -------------
class PostgresQuerySourceContext(SourceContext):
    """A PostgreSQL table read by its growing ``id`` (``postgres_query``)."""

    name = "postgres_query"

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(root, request)
        self.conninfo: str = request.getfixturevalue("postgres_db")
        self.create()

    def sql(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def create(self) -> None:
        self.sql("CREATE TABLE events (id bigint PRIMARY KEY)")

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "postgres_query", "conninfo": self.conninfo, "table": "public.events",
                "incremental_column": "id"}

    def by_connection(self, secret: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
        from psycopg.conninfo import conninfo_to_dict

        options, address = self.options(permissive=False), conninfo_to_dict(self.conninfo)
        del options["conninfo"]
        # (the session's server trusts its local clients: the password travels, it is not checked)
        connection = {"conn_type": "postgres", "host": address.get("host"), "port": int(address.get("port") or 5432),
                      "login": address.get("user"), "password": secret, "schema": address.get("dbname")}
        return {**options, "postgres_conn_id": "contract_pg"}, "contract_pg", connection

    def add(self, ids: Sequence[int]) -> None:
        self.sql(*(f"INSERT INTO events VALUES ({int(i)})" for i in ids))

    def remove(self) -> None:
        """Every row deleted."""
        self.sql("DELETE FROM events")

    def replace(self) -> None:
        """The table dropped and created again under its name, with other rows."""
        self.sql("DROP TABLE events", "CREATE TABLE events (id bigint PRIMARY KEY)",
                 "INSERT INTO events SELECT g + 1000 FROM generate_series(1, 2) g")


class PostgresCdcSourceContext(PostgresQuerySourceContext):
    """A PostgreSQL table's changes through a logical replication slot (``postgres_cdc``); its ids are
    inserts (the rows before the first epoch: its snapshot)."""

    name = "postgres_cdc"

    def create(self) -> None:
        self.slot = f"contract_{uuid.uuid4().hex[:8]}"
        super().create()

    def options(self, permissive: bool) -> dict[str, Any]:
        return {"type": "postgres_cdc", "conninfo": self.conninfo, "slot": self.slot, "publication": self.slot,
                "tables": ["public.events"]}

    def add(self, ids: Sequence[int]) -> None:
        import psycopg

        from tests.core.sources.test_postgres_cdc import flushed

        super().add(ids)
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            flushed(conn)  # decoding sees only flushed WAL

    def remove(self) -> None:
        """The slot dropped: every change it held is gone."""
        self.sql(f"SELECT pg_drop_replication_slot('{self.slot}')")

    def replace(self) -> None:
        """The slot dropped and created again under its name, and other rows in the table."""
        self.remove()
        self.sql(f"SELECT pg_create_logical_replication_slot('{self.slot}', 'pgoutput')", "DELETE FROM events",
                 "INSERT INTO events SELECT g + 1000 FROM generate_series(1, 2) g")


SOURCES: dict[str, type[SourceContext]] = {c.name: c for c in (
    FileSourceContext, IcebergSourceContext, DeltaSourceContext, PipelineOutputContext, KafkaSourceContext,
    PostgresQuerySourceContext, PostgresCdcSourceContext)}


class Reads:
    """A downstream pipeline reading ``context``'s source (with its ``permissive`` options or not)
    into a file sink, one stage per epoch."""

    def __init__(self, context: SourceContext, spark: Any, permissive: bool = False,
                 options: dict[str, Any] | None = None) -> None:
        self.context = context
        self.spark = spark
        self.permissive = permissive
        self.options = options  # instead of the context's
        self.root = context.root / "downstream"
        self.out = FileContext(self.root)
        self.runs = 0

    @property
    def store(self) -> dict[str, Any]:
        return {"storage_url": f"file://{self.root / 'store'}"}

    @property
    def pipeline(self) -> Pipeline:
        return CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("events")

    def spec(self, run_id: str, attempt: int = 1, stage: str = COPY) -> StageSpec:
        from airflow_seatunnel_ckpt.hooks.kafka import with_kafka_connections

        # The sources as the stage task hands them to the stage (a Kafka connection read in the task).
        sources = with_kafka_connections({"events": self.options or self.context.options(self.permissive)})
        return StageSpec(pipeline="events", participant="ingest", run_id=run_id, attempt=attempt, stage=stage,
                         sources=sources,
                         sinks={"out": {"type": "file", "path": self.out.target_url()}}, store=self.store,
                         key_groups=2)

    def next_run(self) -> str:
        self.runs += 1
        return f"run-{self.runs}"

    def attempt(self, run_id: str, attempt: int = 1, stage: str = COPY) -> StageResult:
        """Run one attempt of ``run_id``'s stage (prepared, undecided)."""
        return run_stage(self.spec(run_id, attempt, stage), self.spark)

    def epoch(self, run_id: str | None = None, attempt: int = 1, decision: Decision = Decision.COMMIT) -> int:
        """One epoch's stage, then the decision (and, for commit, the commit)."""
        result = self.attempt(run_id or self.next_run(), attempt)
        pipeline = self.pipeline
        if decision is Decision.ABORT:
            pipeline.abort(result.epoch, "the contract suite aborts it", by="contract")
            return result.epoch
        assert pipeline.decide(result.epoch, Decision.COMMIT, "all prepared", "contract").decision is Decision.COMMIT
        pipeline.commit(result.epoch)
        return result.epoch

    def fail_after_staging(self, run_id: str) -> None:
        """Attempt 1 of ``run_id`` pins its input, stages it and dies before it is prepared."""
        with pytest.raises(InjectedFailure):
            self.attempt(run_id, 1, COPY_THEN_FAIL)

    def replay(self, from_epoch: int) -> ReplayResult:
        return replay_stage(self.spec("replay"), from_epoch, reason="contract", by="contract", spark=self.spark)

    def ids(self) -> list[int]:
        """Every id the sink holds now, sorted (an id read twice appears twice)."""
        return sorted(i for table in self.out.current() for i in table.column("id").to_pylist())


__all__ = ["SOURCES", "Reads", "SourceContext"]
