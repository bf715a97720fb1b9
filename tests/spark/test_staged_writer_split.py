"""The staged writer's split of a task's rows by the expectations' failure masks, at its edges:
nothing removed, everything removed, most rows removed, a row removed by a ``drop`` and a
``quarantine`` rule at once, rules in two masks, and row groups cut in the middle of a run of
removed rows. Run as an executor runs it (``write`` over Arrow batches, then the job commit)
into real staging directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core.protocol.expectations import FAILED_COLUMN
from airflow_seatunnel_ckpt.core.protocol.staging import FILES_LIST
from airflow_seatunnel_ckpt.spark.expectations import RULES_PER_MASK, mask_of
from airflow_seatunnel_ckpt.spark.sinks import staged_writer

#: (rule index, action): a warn rule, a drop rule, a quarantine rule, and a rule in the second mask.
RULES = [(0, "warn"), (1, "drop"), (2, "quarantine"), (RULES_PER_MASK, "drop")]


def split(root: Path, failed: list[set[int]], batch: int = 4) -> tuple[list[int], list[tuple[int, list[str]]],
                                                                       dict[str, int], int]:
    """Write rows ``0..n-1`` where row ``i`` fails the rules ``failed[i]``; the ids staged, the
    quarantined ``(id, rules broken)``, the counts listed and the number of staged files."""
    columns = sorted({mask_of(i)[0] for i, _ in RULES})
    masks = {c: [sum(mask_of(i)[1] for i in rules if mask_of(i)[0] == c) for rules in failed] for c in columns}
    table = pa.table({"id": pa.array(range(len(failed)), pa.int64()),
                      **{c: pa.array(v, pa.int8() if c == columns[0] else pa.int64()) for c, v in masks.items()}})
    options = {"path": f"file://{root}/sink", "quarantine_path": f"file://{root}/quarantine",
               "expectation_rules": json.dumps([[*mask_of(i), f"rule_{i}", action] for i, action in RULES]),
               "quarantine_columns": json.dumps(["id"]), "failed_column": FAILED_COLUMN}
    writer = staged_writer.StagedParquetWriter(options)
    writer.commit([writer.write(iter(table.to_batches(max_chunksize=batch)))])

    def rows(directory: Path) -> tuple[list[dict[str, Any]], int]:
        listed = json.loads((directory / FILES_LIST).read_bytes())
        files = listed["files"]
        return [r for f in files for r in pq.read_table(directory / f["path"]).to_pylist()], len(files)

    kept, files = rows(root / "sink")
    held, _ = rows(root / "quarantine")
    assert all(set(r) == {"id"} for r in kept)  # no mask column is staged
    return ([r["id"] for r in kept], [(r["id"], r[FAILED_COLUMN]) for r in held],
            staged_writer.expectation_counts(f"file://{root}/sink", {}), files)


def counts(checked: int, quarantined: int, kept: int, *failed: int) -> dict[str, int]:
    return {"checked": checked, "quarantined": quarantined, "kept": kept,
            **{f"failed_{i}": n for i, n in enumerate(failed)}}


@pytest.fixture(autouse=True)
def small_row_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of 6 rows, so a task's rows are split in several row groups (batches of 4)."""
    monkeypatch.setattr(staged_writer, "ROW_GROUP_ROWS", 6)


def test_only_warn_failures_keep_every_row_and_count_each_rule(tmp_path: Path) -> None:
    kept, held, listed, _ = split(tmp_path, [{0} if i % 3 == 0 else set() for i in range(20)])
    assert kept == list(range(20)) and held == []
    assert listed == counts(20, 0, 20, 7, 0, 0, 0)


def test_every_row_removed_stages_no_file_and_counts_every_failure(tmp_path: Path) -> None:
    failed = [{1} if i % 2 else {2, RULES_PER_MASK} for i in range(14)]
    kept, held, listed, files = split(tmp_path, failed)
    assert kept == [] and files == 0
    assert held == [(i, ["rule_2", f"rule_{RULES_PER_MASK}"]) for i in range(0, 14, 2)]
    assert listed == counts(14, 7, 0, 0, 7, 7, 7)


def test_most_rows_removed_across_row_groups_keep_the_rest_in_order(tmp_path: Path) -> None:
    # removed runs cross the 6-row row groups and the 4-row batches
    failed = [set() if i in (0, 5, 6, 11, 17, 23) else ({1} if i % 2 else {2}) for i in range(24)]
    kept, held, listed, _ = split(tmp_path, failed)
    assert kept == [0, 5, 6, 11, 17, 23]
    assert held == [(i, ["rule_2"]) for i in range(24) if i not in kept and i % 2 == 0]
    assert listed == counts(24, 10, 6, 0, 8, 10, 0)


def test_a_row_failing_a_drop_and_a_quarantine_rule_is_quarantined_once_with_both_names(tmp_path: Path) -> None:
    failed = [set(), {0, 1, 2}, {1, 2, RULES_PER_MASK}, {RULES_PER_MASK}, {2}, set()]
    kept, held, listed, _ = split(tmp_path, failed)
    assert kept == [0, 5]
    assert held == [(1, ["rule_0", "rule_1", "rule_2"]), (2, ["rule_1", "rule_2", f"rule_{RULES_PER_MASK}"]),
                    (4, ["rule_2"])]
    assert listed == counts(6, 3, 2, 1, 2, 3, 2)


def test_rows_removed_by_rules_of_different_masks_are_removed_once(tmp_path: Path) -> None:
    failed = [{1, RULES_PER_MASK} if i == 3 else ({RULES_PER_MASK} if i == 7 else ({1} if i == 8 else set()))
              for i in range(10)]
    kept, held, listed, _ = split(tmp_path, failed)
    assert kept == [0, 1, 2, 4, 5, 6, 9] and held == []
    assert listed == counts(10, 0, 7, 0, 2, 0, 2)


def test_a_task_its_quarantine_and_the_job_commit_open_their_staging_without_a_store_probe(tmp_path: Path) -> None:
    """Every attempt stages into new directories; a conditional-create probe of each (a dozen
    synced creates per task, commit and quarantine) would be paid by every epoch."""
    from airflow_seatunnel_ckpt.core.storage import registry

    registry.forget_probes()
    split(tmp_path, [{2} if i % 5 == 0 else set() for i in range(12)])
    assert registry._probed == set()
