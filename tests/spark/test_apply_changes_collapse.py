"""The Spark side of apply_changes: each epoch's change rows collapse to the last change per key."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.sinks.options import ApplyChanges
from airflow_seatunnel_ckpt.spark.sinks.tables import last_change_per_key

pytestmark = pytest.mark.spark


def test_with_deletes_ignored_the_change_before_a_delete_is_the_keys_last(spark: Any) -> None:
    rows = [(1, 10, "insert", 5, 1), (1, 11, "update", 6, 1), (1, None, "delete", 7, 1), (2, 20, "delete", 7, 2)]
    df = spark.createDataFrame(rows, "id int, v int, _op string, _lsn bigint, _seq int")

    kept = last_change_per_key(df, ApplyChanges(keys=["id"], deletes=False), "test sink")

    assert sorted(tuple(r) for r in kept.collect()) == [(1, 11, "update", 6, 1)]
    collapsed = last_change_per_key(df, ApplyChanges(keys=["id"]), "test sink")
    assert sorted(tuple(r) for r in collapsed.collect()) == [(1, None, "delete", 7, 1), (2, 20, "delete", 7, 2)]
