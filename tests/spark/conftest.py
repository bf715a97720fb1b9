"""Helpers for the Spark runtime tests: order files in, published rows out, and the runtime
a stage runs on (``runtime``: a classic session of this process, or Spark Connect)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, Pipeline
from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, run_stage

#: Key groups used by the tests: equal to the shared session's shuffle partitions.
KEY_GROUPS = 4


def order_row(order_id: int) -> dict[str, Any]:
    """The one row an order id always maps to (repeats are exact duplicates)."""
    return {"order_id": order_id, "customer": f"c{order_id % 3}", "amount": float(order_id)}


@dataclass
class OrdersPipeline:
    """An input directory, two sink targets and a checkpoint store under ``root``."""

    root: Path
    name: str = "orders"
    participant: str = "ingest"

    @property
    def input_dir(self) -> Path:
        return self.root / "in"

    @property
    def store(self) -> dict[str, Any]:
        return {"storage_url": f"file://{self.root / 'store'}", "full_checkpoint_interval": 3}

    @property
    def pipeline(self) -> Pipeline:
        return CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline(self.name)

    def add_file(self, name: str, order_ids: Iterable[int]) -> Path:
        """Write a parquet input file (atomically: readers never see half of it)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.input_dir.mkdir(parents=True, exist_ok=True)
        rows = [order_row(i) for i in order_ids]
        table = pa.Table.from_pylist(
            rows,
            schema=pa.schema(
                [("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64())]
            ),
        )
        tmp = self.input_dir / f".{name}.tmp"
        pq.write_table(table, tmp)
        final = self.input_dir / f"{name}.parquet"
        tmp.rename(final)
        return final

    def spec(
        self,
        run_id: str,
        attempt: int = 1,
        stage: str = "tests.spark.stages:dedup_orders",
        **overrides: Any,
    ) -> StageSpec:
        fields: dict[str, Any] = {
            "pipeline": self.name,
            "participant": self.participant,
            "run_id": run_id,
            "attempt": attempt,
            "stage": stage,
            "sources": {
                "orders": {"type": "file", "path": f"file://{self.input_dir}", "format": "parquet"}
            },
            "sinks": {
                "orders_table": {"type": "file", "path": f"file://{self.root / 'out' / 'orders'}"},
                "customer_totals": {
                    "type": "file",
                    "path": f"file://{self.root / 'out' / 'totals'}",
                },
            },
            "store": self.store,
            "key_groups": KEY_GROUPS,
        }
        fields.update(overrides)
        return StageSpec(**fields)

    def commit(self, result: StageResult) -> Any:
        """Decide commit and publish, as the Airflow commit task would."""
        decision = self.pipeline.decide(result.epoch, Decision.COMMIT, "test", "test")
        assert decision.decision is Decision.COMMIT
        return self.pipeline.commit(result.epoch)

    def published(self, sink: str = "orders") -> list[dict[str, Any]]:
        """Every row published to a sink target (all epochs)."""
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = []
        for f in sorted((self.root / "out" / sink).glob("epoch=*/*.parquet")):
            rows += pq.read_table(f).to_pylist()
        return rows

    def published_files(self, sink: str = "orders") -> list[str]:
        return sorted(p.name for p in (self.root / "out" / sink).glob("epoch=*/*.parquet"))


@pytest.fixture
def orders(tmp_path: Path) -> OrdersPipeline:
    """A fresh orders pipeline under the test's temporary directory."""
    return OrdersPipeline(tmp_path)


@pytest.fixture
def published_ids(orders: OrdersPipeline) -> Callable[[], list[int]]:
    """Sorted order ids published to the orders sink so far."""
    return lambda: sorted(r["order_id"] for r in orders.published())


#: The runtimes the parametrised stage tests run on: the session of this process (the
#: ``spark`` fixture) and Spark Connect (the ``connect_server`` fixture; the stage builds its
#: own session from ``StageSpec.remote``, as a worker without a JVM does). Every run takes the
#: classic runtime; a Connect run is in the default run only for a test marked
#: ``connect_slice`` (tests/connect_slice.py).
RUNTIMES = ("classic", "connect")

#: Runs a stage spec on the test's runtime: ``run(spec, **run_stage_keywords)``.
RunStage = Callable[..., StageResult]


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """The runtime of a parametrised stage test."""
    return str(request.param)


@pytest.fixture
def run(runtime: str, request: pytest.FixtureRequest) -> RunStage:
    """:func:`run_stage` on the test's runtime: with the shared session, or through the
    Spark Connect server (the spec names it in ``remote``)."""
    if runtime == "classic":
        spark = request.getfixturevalue("spark")
        return lambda spec, **kwargs: run_stage(spec, spark, **kwargs)
    url = request.getfixturevalue("connect_server")
    return lambda spec, **kwargs: run_stage(spec.replace(remote=url), **kwargs)


# The Connect slice (which parametrised Connect runs the default run takes): tests/connect_slice.py.
