"""Replay of a pipeline whose sinks are files: the replay's epoch directory swapped in through ``_EPOCHS``.

The orders pipeline of :mod:`tests.spark.test_replay` writes a ``changes`` file sink of
orders (partitioned by customer) and a ``snapshot`` file sink of totals. Replaying it
with the fixed stage must give what a fresh run gives (DuckDB count and checksum over the
documented read path), a reader polling that path must see only the old total or the new
one, a kill at each step must leave the old epochs or the new ones and a second replay
must finish, and a downstream ``pipeline_output`` source must read every row once.

The kill campaign runs a fixed slice in CI, one crash point of each kind: before the
decision (the replay is aborted by recovery and run again), right before the atomic switch
of ``_EPOCHS`` (decided, readers still see the old epochs; the second replay resumes and
switches) and after it (readers see the new epochs; the second replay resumes and removes the
old directories). ``RELIABILITY_FULL=1`` runs every crash point of :data:`CRASH_POINTS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import Decision
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from airflow_seatunnel_ckpt.core.sinks.files import LATEST, current_epoch_dirs, read_epochs_pointer
from airflow_seatunnel_ckpt.core.storage import open_storage
from airflow_seatunnel_ckpt.spark import StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.sources.files import SourceError
from tests.conftest import FULL_CAMPAIGNS
from tests.core import faults
from tests.spark.conftest import OrdersPipeline
from tests.spark.test_replay import (
    Lake,
    crash_then_finish_replay,
    order_ids,
    replay_while_polling,
    restored_worlds,
    state_rows,
)
from tests.tables import duckdb_connection

pytestmark = pytest.mark.spark


def current_files(url: str) -> tuple[int, list[str]]:
    """The documented read path of a ``changes`` file sink: the version of ``_EPOCHS`` and the data files of
    the current epoch directories."""
    target = open_storage(url)
    version, dirs = current_epoch_dirs(target)
    files = [target.full_path(f"{d}/{f.path}") for d in dirs for f in target.walk(d)
             if not any(part.startswith(("_", ".")) for part in f.path.split("/"))]
    return version, files


def read_sink(url: str) -> pa.Table:
    """Read a ``changes`` file sink as documented: its current files, read again if ``_EPOCHS`` changed meanwhile."""
    target = open_storage(url)
    while True:
        version, files = current_files(url)
        try:
            tables = [pq.read_table(f) for f in files]
        except (FileNotFoundError, OSError):  # removed after a swap: the version moved on
            continue
        if read_epochs_pointer(target).version == version:
            return pa.concat_tables(tables) if tables else pa.table({"amount": pa.array([], pa.float64())})


class FileLake(Lake):
    """The orders pipeline with file sinks: orders (changes, by customer) and totals (snapshot)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, "file")
        self.orders_url = f"file://{root / 'out' / 'orders'}"
        self.totals_url = f"file://{root / 'out' / 'totals'}"

    def sinks(self) -> dict[str, dict[str, Any]]:
        return {"orders_table": {"type": "file", "path": self.orders_url, "partition_by": ["customer"]},
                "customer_totals": {"type": "file", "path": self.totals_url, "mode": "snapshot"}}

    def scan(self, table: str, query: str) -> list[tuple[Any, ...]]:
        con = duckdb_connection()
        if table == "orders":
            files = current_files(self.orders_url)[1]
        else:
            root = self.totals_url.removeprefix("file://")
            files = [str(p) for p in Path(root, (Path(root) / LATEST).read_text().strip()).rglob("*.parquet")]
        con.execute(f"CREATE TEMP VIEW t AS SELECT * FROM read_parquet({files!r}, hive_partitioning = true)")
        return con.execute(query).fetchall()

    def total_amount(self) -> float:
        rows = read_sink(self.orders_url)
        return float(pa.compute.sum(rows.column("amount")).as_py() or 0.0)

    def epoch_dirs(self) -> list[str]:
        return sorted(p.name for p in Path(self.orders_url.removeprefix("file://")).glob("epoch=*"))


def test_file_sink_replay_equals_a_fresh_run_and_a_reader_of_the_documented_path_sees_old_or_new(
        spark: Any, tmp_path: Path) -> None:
    epochs, start = 3, 2  # one epoch kept, two replayed into one directory
    lake = FileLake(tmp_path / "lake")
    lake.run(spark, range(1, epochs + 1), "buggy")
    fresh = FileLake(tmp_path / "fresh")
    fresh.run(spark, range(1, start), "buggy")
    fresh.run(spark, range(start, epochs + 1), "fixed")
    early = {d: sorted(p.name for p in (Path(lake.orders_url[7:]) / d).rglob("*.parquet"))
             for d in ("epoch=1",)}
    old_total, new_total = lake.total_amount(), fresh.total_amount()
    assert old_total != new_total

    result, seen = replay_while_polling(spark, lake, start)

    assert (result.replayed, result.replaced, result.epoch) == ([2, 3], [2, 3], 4)
    assert seen <= {old_total, new_total} and new_total in seen | {lake.total_amount()}
    assert lake.orders_summary() == fresh.orders_summary()
    assert lake.totals() == fresh.totals()
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)
    # epoch 1 keeps its very files; 2-3 are gone; the replay's directory has the layout of any epoch's
    assert lake.epoch_dirs() == ["epoch=1", "epoch=4"]
    assert {d: sorted(p.name for p in (Path(lake.orders_url[7:]) / d).rglob("*.parquet")) for d in early} == early
    assert sorted(p.parent.name for p in (Path(lake.orders_url[7:]) / "epoch=4").rglob("*.parquet")) \
        == sorted(p.parent.name for p in (Path(fresh.orders_url[7:])).glob("epoch=[23]/*/*.parquet"))
    assert read_epochs_pointer(open_storage(lake.orders_url)).replaced_by == {"epoch=4": ("epoch=2", "epoch=3")}
    # once the replay committed, a plain reader of the whole directory (Spark) reads the same rows
    assert spark.read.parquet(lake.orders_url[7:]).count() == lake.orders_summary()[0]

    lake.run(spark, range(epochs + 1, epochs + 2), "fixed")  # the next epoch runs normally
    fresh.run(spark, range(epochs + 1, epochs + 2), "fixed")
    assert lake.epoch_dirs() == ["epoch=1", "epoch=4", "epoch=5"]
    assert lake.orders_summary() == fresh.orders_summary()
    assert lake.totals() == fresh.totals()


def test_snapshot_file_sink_is_refused_before_the_newest_epoch_with_the_way_out(spark: Any, tmp_path: Path) -> None:
    lake = FileLake(tmp_path / "lake")
    lake.run(spark, range(1, 3), "buggy")
    with pytest.raises(ReplayError, match="sink 'customer_totals' cannot be replayed atomically: it is a snapshot "
                                          "sink.*omit --to-epoch"):
        lake.replay(spark, 1, to_epoch=1)
    assert lake.pipeline.epochs() == [1, 2]


#: Crash right before the n-th (``#n``, default the first) storage write whose description holds this text:
#: before the decision; then the steps of the file sink's swap: hide the new directory, copy the second
#: replayed epoch's files in, the swap, the removal of the old directories; the committed record. (Every
#: single write of the swap is a crash point in tests/core/ops/test_replay_files.py.)
CRASH_POINTS = ("/decision", "(_EPOCHS)", "(epoch=3/customer=", "(_EPOCHS)#2", "delete(epoch=2)", "/committed")
#: The CI slice: one crash point of each kind (undecided; decided, before the switch; after the switch).
CI_CRASH_POINTS = ("/decision", "(_EPOCHS)#2", "delete(epoch=2)")


def test_a_file_sink_replay_killed_at_each_step_leaves_old_or_new_and_a_second_replay_finishes(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = faults.install(monkeypatch)

    worlds = restored_worlds(tmp_path / "world", FileLake, lambda lake: lake.run(spark, range(1, 3), "buggy"))
    measured = next(worlds)
    old = measured.total_amount()
    plan.arm(10**9)  # count, never crash: where each step's first write falls
    measured.replay(spark, 1)
    trace = list(plan.trace)
    plan.disarm()
    new = measured.total_amount()
    assert old != new
    want = measured.orders_summary()

    for point in CRASH_POINTS if FULL_CAMPAIGNS else CI_CRASH_POINTS:
        text, _, nth = point.partition("#")
        hits = [i for i, what in enumerate(trace, start=1) if text in what]
        n = hits[int(nth or 1) - 1]
        lake = next(worlds)
        crash_then_finish_replay(spark, lake, plan, n, (old, new), point)
        assert lake.orders_summary() == want, point
        assert lake.epoch_dirs() == [f"epoch={lake.pipeline.last_committed_epoch()}"], point


def test_a_downstream_pipeline_output_source_reads_each_row_once_across_a_replay(spark: Any, tmp_path: Path) -> None:
    lake = FileLake(tmp_path / "lake")
    down_root = tmp_path / "down"

    def downstream(run: int, **options: Any) -> Any:
        spec = StageSpec(pipeline="copy", participant="copy", run_id=f"run-{run}", attempt=1,
                         stage="tests.spark.test_replay_files:copy_orders",
                         sources={"orders": {"type": "pipeline_output", "path": lake.orders_url, **options}},
                         sinks={"out": {"type": "file", "path": f"file://{down_root / 'out'}"}},
                         store={"storage_url": f"file://{down_root / 'store'}"}, key_groups=4)
        pipeline = OrdersPipeline(down_root, name="copy").pipeline
        try:
            result = run_stage(spec, spark)
        except SourceError:
            pipeline.abort(pipeline.epochs()[-1], "the source refused the epoch", by="test")
            raise
        assert pipeline.decide(result.epoch, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
        pipeline.commit(result.epoch)
        return result

    def copied() -> list[int]:
        files = (down_root / "out").rglob("*.parquet")
        return sorted(i for f in files for i in pq.read_table(f)["order_id"].to_pylist())

    lake.run(spark, range(1, 3), "buggy")
    downstream(1)  # reads epochs 1 and 2
    lake.replay(spark, 2)  # replaces epoch 2, which the downstream already read
    with pytest.raises(SourceError, match=r"upstream epoch 3 is a replay that replaced \['epoch=2'\].*skip_replays"):
        downstream(2)
    downstream(3, skip_replays=True)  # passes over the replay: nothing read twice
    lake.run(spark, range(3, 4), "fixed")
    downstream(4, skip_replays=True)
    want = sorted({i for e in range(1, 4) for i in order_ids(e)})
    assert copied() == want

    # a downstream that starts after the replay reads epoch 1, the replay's directory and epoch 4: each row once
    down_root = tmp_path / "down2"
    downstream(1)
    assert copied() == want


def copy_orders(ctx: Any, spark: Any) -> None:
    """The downstream stage: copy the upstream's orders."""
    ctx.sink("out").write(ctx.source("orders").read().select("order_id", "amount"))


def test_a_replay_whose_input_file_was_rewritten_since_is_refused_before_anything_is_written(
        spark: Any, tmp_path: Path) -> None:
    lake = FileLake(tmp_path / "lake")
    lake.run(spark, range(1, 3), "buggy")
    before = lake.orders_summary()
    lake.orders.add_file("f02", [900, 901])  # epoch 2's input, same name, other rows

    with pytest.raises(ReplayError, match=r"epoch 2's input is not all there.*f02\.parquet.*changed since"):
        lake.replay(spark, 2)
    assert lake.pipeline.epochs() == [1, 2]  # refused before its epoch began
    assert lake.orders_summary() == before
