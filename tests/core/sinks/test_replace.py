"""``replace`` in the sink contract: a replay's commit goes to the connector's ``replace``.

A sink type registered with a ``commit`` only (:func:`core.sinks.register_table_format`)
has said nothing about replays: its commit may not know ``request.replaces`` and would add
the replayed rows next to the replaced ones. A replay into it is refused at its decision,
the target unchanged, and the pipeline's next epoch commits. Registered with a
``replace`` as well, the replay's commit is that function's.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core.models import PublishedSink
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from airflow_seatunnel_ckpt.core.sinks import CONNECTORS, SinkCommit, register_table_format, staged_rows
from tests.contract.sinks import APPEND, Epochs, Rows, SinkContext, rows_of


class LedgerContext(SinkContext):
    """A sink type of a user's: each epoch's rows one Parquet file ``<root>/ledger/<epoch>.parquet``."""

    name = "ledger"
    modes = frozenset({APPEND})
    partitioned = False

    def options(self, mode: str) -> dict[str, Any]:
        return {"type": "ledger", "path": str(self.root / "ledger")}

    def target_url(self) -> str:
        return f"ledger://{self.root}/ledger"

    def rows(self) -> Rows:
        folder = self.root / "ledger"
        return sorted(r for f in sorted(folder.glob("*.parquet")) for r in rows_of(pq.read_table(f))) \
            if folder.exists() else []


def ledger_commit(request: SinkCommit) -> PublishedSink:
    """Write the epoch's staged rows as ``<epoch>.parquet`` (idempotent: the same name each time)."""
    folder = Path(str(request.table["path"]))  # type: ignore[index]
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    pq.write_table(staged_rows(request), buf)
    (folder / f"{request.epoch}.parquet").write_bytes(buf.getvalue())
    return PublishedSink(request.sink.sink, request.sink.target_url, str(folder), 1, request.sink.rows, 0, "copied")


def ledger_replace(request: SinkCommit) -> PublishedSink:
    """A replay: the replaced epochs' files removed, the replay's written (good enough for a test's sink)."""
    for epoch in request.replaces:
        (Path(str(request.table["path"])) / f"{epoch}.parquet").unlink(missing_ok=True)  # type: ignore[index]
    return ledger_commit(request)


@pytest.fixture
def registered() -> Iterator[None]:
    yield
    CONNECTORS._registered.pop("ledger", None)  # (the registry has no public way to forget one)


def test_a_replay_into_a_sink_type_without_replace_is_refused_at_its_decision_and_the_next_epoch_commits(
        tmp_path: Path, registered: None) -> None:
    register_table_format("ledger", ledger_commit)
    epochs = Epochs(LedgerContext(tmp_path), APPEND)
    epochs.run([1, 2])
    epochs.run([3, 4])
    before = epochs.context.rows()

    with pytest.raises(ReplayError, match=r"sink type 'ledger' has no replace"):
        epochs.replay(2)

    assert epochs.context.rows() == before, "the refused replay changed the target"
    epochs.run([5])
    assert epochs.context.rows() == epochs.states[-1]


def test_a_replay_into_a_sink_type_with_replace_commits_through_it(tmp_path: Path, registered: None) -> None:
    register_table_format("ledger", ledger_commit, replace=ledger_replace)
    epochs = Epochs(LedgerContext(tmp_path), APPEND)
    epochs.run([1, 2])
    epochs.run([3, 4])

    epochs.replay(2)

    assert epochs.context.rows() == epochs.states[-1]
    assert sorted(row[0] for row in epochs.context.rows()) == [1, 2, 3, 4]
