"""A Parquet sink with more rules than one failure mask holds (63): every rule is counted
and acts on its rows, whichever mask column carries it, in the job that writes the sink."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.protocol.staging import FILES_LIST
from airflow_seatunnel_ckpt.spark.expectations import RULES_PER_MASK, mask_of
from airflow_seatunnel_ckpt.spark.sinks.files import FileSink


def staged_ids(directory: Path) -> list[int]:
    listed = json.loads((directory / FILES_LIST).read_bytes())
    return sorted(i for f in listed["files"] for i in pq.read_table(directory / f["path"]).column("id").to_pylist())


def test_rules_past_the_first_mask_count_their_failures_and_drop_and_quarantine_their_rows(
        spark: Any, tmp_path: Path) -> None:
    rules: dict[str, Any] = {f"holds_{i}": {"expr": "id >= 0"} for i in range(RULES_PER_MASK + 5)}
    rules[f"holds_{RULES_PER_MASK - 1}"] = {"expr": "id < 80"}  # the last bit of the first mask: warns on 20
    rules[f"holds_{RULES_PER_MASK}"] = {"expr": "id % 10 <> 3", "on_fail": "drop"}  # the second mask's first
    rules[f"holds_{RULES_PER_MASK + 4}"] = {"expr": "id % 25 <> 0", "on_fail": "quarantine"}
    assert mask_of(RULES_PER_MASK - 1)[0] != mask_of(RULES_PER_MASK)[0]
    sink = FileSink("out", f"file://{tmp_path}/out", expectations=rules)
    sink.bind(f"file://{tmp_path}/staged")
    quarantine = FileSink("out.quarantine", f"file://{tmp_path}/out_quarantine")
    quarantine.bind(f"file://{tmp_path}/staged_quarantine")
    sink.quarantine = quarantine

    kept = sink.write(spark.range(100))

    dropped, held = {i for i in range(100) if i % 10 == 3}, {i for i in range(100) if i % 25 == 0}
    assert staged_ids(tmp_path / "staged") == sorted(set(range(100)) - dropped - held)
    assert kept == 100 - len(dropped | held)
    assert staged_ids(tmp_path / "staged_quarantine") == sorted(held)
    failed = {r.name: r.failed for r in sink.expectation_results}
    assert failed == {**dict.fromkeys(rules, 0), f"holds_{RULES_PER_MASK - 1}": 20,
                      f"holds_{RULES_PER_MASK}": len(dropped), f"holds_{RULES_PER_MASK + 4}": len(held)}
    assert {r.checked for r in sink.expectation_results} == {100}


def sink_with(tmp_path: Path, rules: dict[str, Any]) -> FileSink:
    sink = FileSink("out", f"file://{tmp_path}/out", expectations=rules)
    sink.bind(f"file://{tmp_path}/staged")
    return sink


def test_masks_built_as_sql_keep_each_rule_on_its_own(spark: Any, tmp_path: Path) -> None:
    """The masks are one SQL expression; a rule's trailing comment ends with the rule, and a
    rule typed NULL (which CASE WHEN refuses) fails every row instead of refusing the sink."""
    sink = sink_with(tmp_path, {"not_three": {"expr": "id % 10 <> 3 -- the threes go", "on_fail": "drop"},
                                "unknown": {"expr": "NULL", "on_fail": "warn"},
                                "small": {"expr": "id < 90", "on_fail": "warn"}})

    kept = sink.write(spark.range(100))

    assert kept == 90
    assert staged_ids(tmp_path / "staged") == [i for i in range(100) if i % 10 != 3]
    assert {r.name: r.failed for r in sink.expectation_results} == {"not_three": 10, "unknown": 100, "small": 10}


@pytest.mark.parametrize("expr", ["id > 0) OR (id < 5", "true) THEN 0 ELSE 0 END AS x, (CASE WHEN (true"])
def test_a_rule_that_parses_only_inside_the_mask_sql_is_refused(spark: Any, tmp_path: Path, expr: str) -> None:
    sink = sink_with(tmp_path, {"ok": {"expr": "id >= 0"}, "odd": {"expr": expr, "on_fail": "drop"}})

    with pytest.raises(ConfigError, match=r"sink 'out': expectation 'odd'.*cannot be evaluated"):
        sink.write(spark.range(10))
    assert not (tmp_path / "staged").exists()
