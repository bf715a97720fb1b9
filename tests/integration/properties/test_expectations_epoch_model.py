"""Expectations over whole epochs: every input row once in the sink or in its quarantine, or
dropped and counted, and the next epoch still runs.

Each example runs epochs of an orders pipeline on local Spark whose Parquet sink (staged by
the staged writer, which applies the rules in its own job) carries three rules: a
``quarantine`` rule on the id, a ``drop`` rule on the amount and a ``warn`` rule on the
customer (one that raises at run time for an unknown customer: a cast of text that is no
number, which must fail that row, not the stage). The rows of each epoch are drawn: any
mix of NULL ids, zero amounts and unknown customers, in any number. After each epoch's commit:

* the sink holds exactly the rows with an id and a positive amount, each once;
* the quarantine holds exactly the rows without an id (a row breaking both the id and the
  amount rule is quarantined, not dropped), each once, naming the rules it broke;
* the epoch's counts are each rule's failures among the epoch's rows;
* the epoch committed, and the next one runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.spark import StageContext, run_stage
from tests.integration.properties.settings import model_settings
from tests.spark.conftest import OrdersPipeline

pytestmark = pytest.mark.spark

#: c0 and c1 become numbers; casting 'c2' raises under ANSI mode, which must fail the row, not the stage.
KNOWN_CUSTOMER = "CAST(regexp_replace(regexp_replace(customer, 'c0', '0'), 'c1', '1') AS INT) >= 0"
RULES = {"id_present": {"expr": "order_id IS NOT NULL", "on_fail": "quarantine"},
         "amount_positive": {"expr": "amount > 0", "on_fail": "drop"},
         "customer_known": {"expr": KNOWN_CUSTOMER, "on_fail": "warn"}}

#: A row: (has an id, amount, customer number).
ROW = st.tuples(st.booleans(), st.sampled_from([0.0, 1.5, 7.0]), st.integers(0, 2))


def copy_orders(ctx: StageContext, spark: Any) -> None:
    """The stage run here (by import path): the epoch's new rows into the sink."""
    ctx.sink("orders_table").write(ctx.source("orders").read())


def rows_of(directory: Path) -> list[dict[str, Any]]:
    """Every row published under ``directory`` (all epochs)."""
    return [r for f in sorted(directory.glob("epoch=*/*.parquet")) for r in pq.read_table(f).to_pylist()]


@given(epochs=st.lists(st.lists(ROW, min_size=1, max_size=25), min_size=2, max_size=3))
@model_settings(fast_examples=2, fast_steps=1)
def test_every_row_lands_once_in_the_sink_or_its_quarantine_or_is_dropped_and_the_next_epoch_runs(
        spark: Any, tmp_path_factory: pytest.TempPathFactory, epochs: list[list[tuple[bool, float, int]]]) -> None:
    orders = OrdersPipeline(tmp_path_factory.mktemp("expectation-epochs"))
    out = orders.root / "out" / "orders"
    sinks = {"orders_table": {"type": "file", "path": f"file://{out}", "expectations": RULES}}
    seq = 0
    kept: list[int] = []
    held: list[int] = []
    for epoch, rows in enumerate(epochs, start=1):
        batch = []
        for has_id, amount, customer in rows:
            seq += 1
            batch.append({"seq": seq, "order_id": seq if has_id else None, "customer": f"c{customer}",
                          "amount": amount})
        orders.input_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(batch), orders.input_dir / f"f{epoch:02d}.parquet")

        result = run_stage(orders.spec(f"run-{epoch}", stage=f"{__name__}:copy_orders", sinks=sinks), spark)
        orders.commit(result)

        kept += [r["seq"] for r in batch if r["order_id"] is not None and r["amount"] > 0]
        held += [r["seq"] for r in batch if r["order_id"] is None]
        assert sorted(r["seq"] for r in rows_of(out)) == kept
        quarantined = rows_of(orders.root / "out" / "orders_quarantine")
        assert sorted(r["seq"] for r in quarantined) == held
        by_seq = {r["seq"]: r for r in batch}
        for r in quarantined:
            source = by_seq.get(r["seq"])
            if source is not None:  # this epoch's: the rules it broke, in the rules' order
                broke = ["id_present", *(["amount_positive"] if source["amount"] <= 0 else []),
                         *(["customer_known"] if source["customer"] == "c2" else [])]
                assert list(r["_expectations_failed"]) == broke
        counts = {e.name: (e.checked, e.failed) for m in result.manifests for e in m.expectations}
        assert counts == {"id_present": (len(batch), sum(r["order_id"] is None for r in batch)),
                          "amount_positive": (len(batch), sum(r["amount"] <= 0 for r in batch)),
                          "customer_known": (len(batch), sum(r["customer"] == "c2" for r in batch))}
        assert orders.pipeline.committed_epochs() == list(range(1, epoch + 1))
