"""Recovery's view of every sink, through the contract (``held_epoch``).

A commit killed just after the sink's own commit (the table commit, the file target's
publish) but before the transaction log's ``committed`` leaves the epoch COMMITTING while
its target already holds it. The recovery DAG settles it: it asks the sink which epoch its
target holds, acknowledges an epoch the target holds without committing it again (its
report says so), and commits one the target does not hold. Nothing is published twice, no
sink's URL is taken for a store ("protocol not supported"), and the next epoch runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryReport, RecoveryStep, recover
from tests.contract.sinks import APPEND, CONTEXTS, SNAPSHOT, Epochs, FileContext, context_of, epoch_rows


def target_files(context: FileContext) -> dict[str, tuple[int, bytes]]:
    """Every file below a file sink's target: its modification time and bytes."""
    return {str(f.relative_to(context.path)): (f.stat().st_mtime_ns, f.read_bytes())
            for f in sorted(context.path.rglob("*")) if f.is_file()}


def finish_commit(report: RecoveryReport, epoch: int) -> str:
    """The reason of the recovery report's roll-forward of ``epoch`` (it must have succeeded)."""
    found = [a for a in report.actions if a.epoch == epoch and a.action is RecoveryStep.FINISH_COMMIT]
    assert len(found) == 1 and found[0].done and not found[0].error, report.to_dict()
    return found[0].reason


def decided_after_two_epochs(connector: str, tmp_path: Path,
                             request: pytest.FixtureRequest) -> tuple[Any, Epochs, int, Any]:
    """The connector's context with two committed epochs and a third prepared and decided commit:
    ``(context, epochs, the third epoch, its staged manifest)``."""
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, APPEND)
    epochs.run([1, 2])
    epoch, staged = epochs.prepare(lambda e: epoch_rows([3, 4], e))
    assert epochs.decide(epoch).decision.value == "commit"
    return context, epochs, epoch, staged


@pytest.mark.parametrize("connector", sorted(CONTEXTS))
def test_recovery_settles_an_epoch_its_sink_already_holds_without_committing_it_again(
        tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, connector: str) -> None:
    context, epochs, epoch, staged = decided_after_two_epochs(connector, tmp_path, request)
    reports: list[RecoveryReport] = []
    before: dict[str, tuple[int, bytes]] = {}

    def recovery() -> None:
        before.update(target_files(context) if isinstance(context, FileContext) else {})
        with caplog.at_level(logging.WARNING):
            reports.append(recover(epochs.open(), dry_run=False))

    epochs.commit(lambda: epochs.pipeline.commit(epoch), recovery, "after")

    epochs.settled(epoch, [3, 4], staged)
    assert context.rows() == epochs.states[-1]
    for label, found in context.history():
        assert found in epochs.states, f"{label} holds {found}, not the target after a whole epoch"
    if isinstance(context, FileContext):  # not even its _SUCCESS written again
        assert target_files(context) == before
    assert f"sink(s) ['orders'] already held epoch {epoch}" in finish_commit(reports[0], epoch)
    assert [p.how for p in epochs.pipeline.txlog.read_published(epoch) or []] == ["already"]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [], warned  # e.g. no "protocol 'iceberg' is not supported"
    epochs.run([5])
    assert context.rows() == epochs.states[-1]


@pytest.mark.parametrize("connector", sorted(CONTEXTS))
def test_recovery_commits_an_epoch_its_sink_does_not_hold_yet(
        tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, connector: str) -> None:
    context, epochs, epoch, staged = decided_after_two_epochs(connector, tmp_path, request)
    reports: list[RecoveryReport] = []

    def recovery() -> None:
        with caplog.at_level(logging.WARNING):
            reports.append(recover(epochs.open(), dry_run=False))

    epochs.commit(lambda: epochs.pipeline.commit(epoch), recovery, "before")

    epochs.settled(epoch, [3, 4], staged)
    assert context.rows() == epochs.states[-1]
    assert "already held" not in finish_commit(reports[0], epoch)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [], warned
    epochs.run([5])
    assert context.rows() == epochs.states[-1]


def test_recovery_finishes_a_snapshot_whose_directory_is_published_but_not_yet_the_current_one(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A file target holds a snapshot epoch only once its commit made it ``_LATEST`` and removed the older one."""
    context = context_of("files", tmp_path, request)
    assert isinstance(context, FileContext)
    epochs = Epochs(context, SNAPSHOT)
    epochs.run([1, 2])
    epoch, staged = epochs.prepare(lambda e: epoch_rows([3, 4], e))
    assert epochs.decide(epoch).decision.value == "commit"

    epochs.commit(lambda: epochs.pipeline.commit(epoch),
                  lambda: recover(epochs.open(), dry_run=False), "after")  # killed before its _LATEST

    epochs.settled(epoch, [3, 4], staged)
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    assert context.rows() == epochs.states[-1]
    assert sorted(n for n in os.listdir(context.path) if n.startswith("epoch=")) == [f"epoch={epoch}"]
