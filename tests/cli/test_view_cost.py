"""The views read O(what they show): ``epochs --last``, ``show``, ``pipelines``, the Checkpoints
page and its charts make the same store calls, and are handed the same names by listings, at a
long history as at a short one.

A history is written record by record as the protocol leaves it (``tests/core/protocol/
test_settled_log.py``), settled by a recovery run, with real epochs above the watermark (two
committed, one still OPEN). Calls are counted on the ``Storage`` classes (every backend goes
through them), never timed; a listing's names count too, since one listing of a directory that
grows with the history costs one request per thousand names on S3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.cli import main
from airflow_seatunnel_ckpt.core import CheckpointStore, Pipeline, layout
from airflow_seatunnel_ckpt.core.protocol import epoch_index
from airflow_seatunnel_ckpt.plugins import charts, overview
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, flip_byte, prepare_participant, run_epoch
from tests.core.protocol.test_settled_log import count_store_calls, newest_settled, real_epoch, settled_history

#: The two history sizes compared (settled epochs below the real ones); a multiple of 7 apart,
#: so that the newest 30 hold as many aborted epochs (every 7th) in both.
SHORT, LONG = 42, 420


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every public store call by name, and ``names listed``: what the listings returned."""
    return count_store_calls(monkeypatch, names_listed=True)


def history(spec: StoreSpec, settled: int) -> int:
    """``settled`` final epochs and three real ones, settled; then two committed and one OPEN above
    (returned: the newest epoch)."""
    p = spec.pipeline()
    settled_history(p, settled)
    for i in range(3):
        real_epoch(p, f"settled-{i}")
    p.recover(dry_run=False)
    assert newest_settled(p) == settled + 3
    for i in range(2):
        real_epoch(p, f"above-{i}")
    return p.begin("open").epoch


def _store(spec: StoreSpec) -> CheckpointStore:
    return CheckpointStore.from_url(spec.sub_url("store"), spec.options)


def _cli(spec: StoreSpec, *args: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--store", spec.sub_url("store"), *args]) == 0


#: Each view, given the store and its newest epoch.
VIEWS: dict[str, Callable[[StoreSpec, int], object]] = {
    "epochs --last 5": lambda spec, _: _cli(spec, "epochs", "orders", "--last", "5"),
    "show <newest>": lambda spec, newest: _cli(spec, "show", "orders", str(newest)),
    "pipelines": lambda spec, _: _cli(spec, "pipelines"),
    "verify --last 5": lambda spec, _: _cli(spec, "verify", "orders", "--last", "5"),
    "the page": lambda spec, _: overview.pipeline_view(_store(spec), "orders"),
    "the charts": lambda spec, _: charts.epoch_points(_store(spec).pipeline("orders")),
    "the store's summary": lambda spec, _: overview.pipelines_summary(_store(spec)),
}


@pytest.mark.parametrize("backend", ["file", "memory"])
def test_every_view_reads_as_much_at_a_long_history_as_at_a_short_one(
        backend: str, tmp_path: Path, reads: Counter[str]) -> None:
    """Before, each view listed ``_txlog`` to find the newest epochs: a name per epoch ever run."""
    costs: dict[int, dict[str, dict[str, int]]] = {}
    for size in (SHORT, LONG):
        spec = (StoreSpec("file", f"file://{tmp_path}/{size}") if backend == "file"
                else StoreSpec("memory", f"memory://views-{uuid.uuid4().hex}"))
        newest = history(spec, size)
        costs[size] = {}
        for view, show in VIEWS.items():
            reads.clear()
            show(spec, newest)
            costs[size][view] = dict(reads)

    for view in VIEWS:
        assert costs[LONG][view] == costs[SHORT][view], (view, costs[SHORT][view], costs[LONG][view])


# -- the epoch index: the newest settled epochs from a few segments -------------------------


def indexed_history(spec: StoreSpec, epochs: int = 40) -> Pipeline:
    """``epochs`` real epochs (each writing a different number of rows with keyed state, every
    fifth aborted after it prepared), settled by recovery; one committed and one OPEN above."""
    p = spec.pipeline()
    for i in range(1, epochs + 1):
        work = Participant(sinks={"orders": [b"o"] * (i % 4 + 1)}, changes={i % 3: i})
        if i % 5:
            run_epoch(p, f"run-{i}", work)
            continue
        epoch = p.begin(f"run-{i}").epoch
        prepare_participant(p, f"run-{i}", work, base=p.restore_point(), epoch=epoch)
        p.abort(epoch, "bad input", by="test")
    p.recover(dry_run=False)
    assert newest_settled(p) == epochs
    run_epoch(p, "above", Participant())
    p.begin("open")
    return p


def shown(spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> tuple[str, str, list[Any], list[Any]]:
    """What ``epochs --last 30`` prints (table and JSON), the page's rows and the charts' points."""
    capsys.readouterr()
    main(["--store", spec.sub_url("store"), "epochs", "orders", "--last", "30"])
    main(["--store", spec.sub_url("store"), "--json", "epochs", "orders", "--last", "30"])
    table_and_json = capsys.readouterr().out
    table, _, as_json = table_and_json.partition("\n[")
    # (an OPEN epoch's lease age changes from one look to the next)
    view = overview.pipeline_view(_store(spec), "orders", last=30)
    rows = [dataclasses.replace(row, lease="") for row in view.epochs]
    points = charts.epoch_points(_store(spec).pipeline("orders"), 30)
    return table, as_json, rows, points


def test_the_newest_settled_epochs_are_read_from_a_few_index_segments(
        local_spec: StoreSpec, reads: Counter[str]) -> None:
    """Before, ``epochs --last 30`` read every shown epoch's records: a listing and 3-4 reads each."""
    indexed_history(local_spec)
    reads.clear()
    _cli(local_spec, "epochs", "orders", "--last", "30")

    # Listed: the descriptor, the settled record, the two epochs above it and the empty directory
    # after them, then those two to read their states. Read: the settled record, one index
    # segment and the records of the two epochs above the watermark (4 + 1).
    assert reads["list_dir"] <= 7, dict(reads)
    assert reads["read"] <= 7, dict(reads)


def test_the_views_show_the_same_from_the_index_as_from_the_records(
        local_spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> None:
    """The index is a summary, never the truth: without it, or with a damaged segment, the views
    read the records and show the same."""
    p = indexed_history(local_spec)
    segment = layout.record_path(40, epoch_index.INDEX_RECORD)
    assert p.storage.exists(segment)
    from_index = shown(local_spec, capsys)

    flip_byte(p.storage, segment)
    from_damaged = shown(local_spec, capsys)
    for epoch in range(1, 41):
        with contextlib.suppress(FileNotFoundError):
            p.storage.delete(layout.record_path(epoch, epoch_index.INDEX_RECORD))
    from_records = shown(local_spec, capsys)

    assert from_index == from_records
    assert from_damaged == from_records
    table, _, rows, points = from_records
    assert "ABORTED" in table and "COMMITTED" in table and "OPEN" in table
    assert any(row.checkpoint_bytes for row in rows) and any(point.commit_s is not None for point in points)


def test_verify_names_a_damaged_index_segment_as_one_that_can_be_deleted(
        local_spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> None:
    p = indexed_history(local_spec)
    segment = layout.record_path(40, epoch_index.INDEX_RECORD)
    flip_byte(p.storage, segment)
    capsys.readouterr()

    assert main(["--store", local_spec.sub_url("store"), "verify", "orders", "40"]) == 1
    out = capsys.readouterr().out
    assert f"{segment}: checksum mismatch" in out
    assert "segment of the epoch index" in out and "this file can be deleted" in out
