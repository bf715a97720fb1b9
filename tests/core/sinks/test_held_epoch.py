"""Recovery's view of a sink through the contract: the newest epoch its target holds, for every sink type."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core.errors import TableOwnershipError
from airflow_seatunnel_ckpt.core.models import SinkManifest
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink, held_epoch
from airflow_seatunnel_ckpt.core.sinks.files import EPOCHS, EpochsPointer, target_of
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import run_epoch
from tests.core.sinks.test_delta_sink import by_country, request, stage
from tests.core.sinks.test_iceberg_sink import Lake, eu_us
from tests.core.sinks.test_postgres_sink import Epochs, rows


def manifest_of(pipeline: Pipeline, epoch: int) -> SinkManifest:
    records = pipeline.txlog.winning_records(epoch)
    assert records is not None
    return records[0].sinks[0]


def test_a_file_targets_held_epoch_is_its_newest_complete_epoch_directory(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline()
    first = run_epoch(p, "run-1")
    assert held_epoch(p.sink_commit(first + 1, manifest_of(p, first))) == first
    second = run_epoch(p, "run-2")
    assert held_epoch(p.sink_commit(second + 1, manifest_of(p, second))) == second


def test_a_delta_tables_held_epoch_is_its_application_transaction(store: Storage, table_uri: str) -> None:
    first = stage(store, 1, by_country(1, DE=[1]), uri=table_uri)
    assert held_epoch(request(store, 1, first)) is None, "no table yet"
    commit_sink(request(store, 1, first))
    commit_sink(request(store, 2, stage(store, 2, by_country(2, FR=[2]), uri=table_uri)))
    assert held_epoch(request(store, 3, first)) == 2
    other = SinkCommit("payments", "file:///store", 3, first, store, 0, store_id=request(store, 1, first).store_id)
    with pytest.raises(TableOwnershipError, match="belongs to pipeline 'orders'"):
        held_epoch(other)


def test_an_iceberg_tables_held_epoch_is_its_marker(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    manifest = lake.stage(1, eu_us([1], [2]))
    assert held_epoch(lake.request(1, manifest)) is None
    commit_sink(lake.request(1, manifest))
    assert held_epoch(lake.request(2, manifest)) == 1


def test_a_postgres_tables_held_epoch_is_its_marker_row(tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True)
    epoch = epochs.run(rows([1, 2]))
    assert held_epoch(epochs.pipeline.sink_commit(epoch + 1, manifest_of(epochs.pipeline, epoch))) == epoch


def test_a_file_target_holds_a_replay_only_once_its_replaced_directories_are_removed(local_spec: StoreSpec) -> None:
    """A replay killed after its swap and before it removed the replaced directories is not held: recovery
    commits it again, which removes them (an epoch held is acknowledged without a commit)."""
    p = local_spec.pipeline()
    first = run_epoch(p, "run-1")
    second = run_epoch(p, "run-2")
    request = p.sink_commit(second + 1, manifest_of(p, second))
    target = target_of(request)
    replay = f"epoch={second + 1}"
    target.write_atomic(f"{replay}/part-00000.bin", b"new")
    target.write_atomic(f"{replay}/_SUCCESS", b"{}")
    replaced = (f"epoch={first}", f"epoch={second}")
    target.write_atomic(EPOCHS, EpochsPointer(2, frozenset(replaced), {replay: replaced}).to_bytes())
    assert held_epoch(request) is None, "the swap is done, the replaced directories are still there"
    for name in replaced:
        target.delete(name, recursive=True)
    assert held_epoch(request) == second + 1
