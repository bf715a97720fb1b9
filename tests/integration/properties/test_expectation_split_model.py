"""A sink's expectations as the staged writer applies them, over any rules and rows.

The writer (:mod:`airflow_seatunnel_ckpt.spark.sinks.staged_writer`) gets each row with its rules'
flags packed into failure masks (:func:`~airflow_seatunnel_ckpt.spark.expectations.mask_of`),
in batches of any size, and is run here as an executor runs it (its ``write`` over
the task's Arrow batches, then the job commit), into real staging directories. For any set
of rules (warn, drop, quarantine, fail) and any flags:

* every row is in the sink's output or in its quarantine, never both; it is in neither only
  when a ``drop`` rule (and no ``quarantine`` rule) removed it;
* a quarantined row names exactly the rules it broke;
* the counts the job commit lists are the rows checked, each rule's failures, the rows
  quarantined and the rows kept, as read back from the staged files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.core.protocol.expectations import ACTIONS, FAILED_COLUMN, REMOVING
from airflow_seatunnel_ckpt.core.protocol.staging import FILES_LIST

pytestmark = pytest.mark.properties


@st.composite
def epochs(draw: st.DrawFn) -> tuple[list[str], list[list[bool]], list[int]]:
    """Rule actions, each row's flags (true: the rule holds) and the batch sizes."""
    actions = draw(st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=4))
    rows = draw(st.integers(0, 60))
    flags = draw(st.lists(st.lists(st.booleans(), min_size=len(actions), max_size=len(actions)),
                          min_size=rows, max_size=rows))
    sizes: list[int] = []
    while sum(sizes) < rows:
        sizes.append(draw(st.integers(1, rows - sum(sizes))))
    return actions, flags, sizes


def _read(directory: Path) -> list[dict[str, object]]:
    listed = json.loads((directory / FILES_LIST).read_bytes())
    return [row for f in listed["files"] for row in pq.read_table(directory / f["path"]).to_pylist()]


@given(epochs())
@settings(max_examples=60, deadline=None, derandomize=True)
def test_every_row_is_kept_or_quarantined_once_and_the_counts_match(
        tmp_path_factory: pytest.TempPathFactory, epoch: tuple[list[str], list[list[bool]], list[int]]) -> None:
    from airflow_seatunnel_ckpt.spark.expectations import mask_of
    from airflow_seatunnel_ckpt.spark.sinks.staged_writer import StagedParquetWriter, expectation_counts

    actions, flags, sizes = epoch
    root = tmp_path_factory.mktemp("split")
    names = [f"rule_{i}" for i in range(len(actions))]
    masks = [mask_of(i) for i in range(len(actions))]
    quarantines = "quarantine" in actions
    options = {"path": f"file://{root}/sink", "expectation_rules": json.dumps(
        [[*m, n, a] for m, n, a in zip(masks, names, actions, strict=True)]),
        "quarantine_columns": json.dumps(["id"]), "failed_column": FAILED_COLUMN}
    if quarantines:
        options["quarantine_path"] = f"file://{root}/quarantine"
    column = masks[0][0]  # up to 4 rules: one mask
    failed = [sum(bit for (_c, bit), ok in zip(masks, row, strict=True) if not ok) for row in flags]
    table = pa.table({"id": list(range(len(flags))), column: failed},
                     schema=pa.schema([("id", pa.int64()), (column, pa.int8())]))
    batches, start = [], 0
    for size in sizes:
        batches += table.slice(start, size).to_batches()
        start += size

    writer = StagedParquetWriter(options)
    writer.commit([writer.write(iter(batches))])

    def broke(row: list[bool]) -> list[str]:
        return [n for n, ok in zip(names, row, strict=True) if not ok]

    def removed(row: list[bool]) -> bool:
        return any(not ok and a in REMOVING for ok, a in zip(row, actions, strict=True))

    def quarantined(row: list[bool]) -> bool:
        return any(not ok and a == "quarantine" for ok, a in zip(row, actions, strict=True))

    output = _read(root / "sink")
    kept = [r["id"] for r in output]
    assert sorted(kept) == [i for i, row in enumerate(flags) if not removed(row)]
    assert all(set(r) == {"id"} for r in output)  # no mask column is written
    held = _read(root / "quarantine") if quarantines else []
    assert sorted((r["id"], r[FAILED_COLUMN]) for r in held) == [
        (i, broke(row)) for i, row in enumerate(flags) if quarantined(row)]
    assert not set(kept) & {r["id"] for r in held}
    counts = expectation_counts(f"file://{root}/sink", {})
    assert counts == {"checked": len(flags), "quarantined": len(held), "kept": len(kept),
                      **{f"failed_{i}": sum(1 for row in flags if not row[i]) for i in range(len(actions))}}
