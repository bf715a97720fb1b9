"""Transaction log and two-phase commit: epochs, one decision, fencing, idempotence, crashes."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import (
    DecisionConflictError,
    EpochNotFoundError,
    FencedAttemptError,
    NotPreparedError,
    PendingEpochError,
)
from airflow_seatunnel_ckpt.core.models import BeginRecord
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX
from tests.core import faults
from tests.core.conftest import StoreSpec, forget
from tests.core.epochs import (
    Participant,
    at_once,
    expected_files,
    prepare_participant,
    published,
    records,
    restored_state,
    run_epoch,
    stage,
    staging_left,
    success_marker,
    target_url,
)


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated crashes are process deaths, not power cuts: durability syncs only cost time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


# -- begin: epoch allocation --------------------------------------------------------------


def test_every_task_of_a_run_gets_the_same_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    first = p.begin("manual__2024-01-01T00:00:00+00:00")
    again = fast_spec.pipeline().begin("manual__2024-01-01T00:00:00+00:00")
    assert first == again
    assert first.epoch == 1
    assert p.epoch_for_run("manual__2024-01-01T00:00:00+00:00") == 1
    assert p.epoch_for_run("never-ran") is None


def test_successive_runs_get_consecutive_epochs(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epochs = [run_epoch(p, f"run-{i}") for i in range(3)]
    assert epochs == [1, 2, 3]
    assert p.epochs() == [1, 2, 3]
    assert p.committed_epochs() == [1, 2, 3]


def test_begin_finishes_the_run_index_after_a_crash_between_record_and_index(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    # The begin record of epoch 2 was created, then the process died before indexing it.
    record = BeginRecord(2, "run-2", time.time())
    p.txlog._write_once(layout.record_path(2, "begin"), record.to_dict())
    assert p.storage.list_dir(layout.run_index_dir("run-2")) == []

    assert p.epoch_for_run("run-2") == 2
    assert fast_spec.pipeline().begin("run-2") == record
    assert p.storage.list_dir(layout.run_index_dir("run-2")) == ["000000000002"]
    assert p.epochs() == [1, 2]


def test_a_new_run_cannot_begin_while_an_earlier_epoch_is_undecided(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    prepare_participant(p, "run-2", Participant())

    with pytest.raises(PendingEpochError) as info:
        p.begin("run-3")
    assert info.value.epoch == 2
    assert "run-2" in str(info.value) and "PREPARED" in str(info.value)
    assert "recover" in str(info.value)
    assert p.begin("run-2").epoch == 2, "the owner of the pending epoch still gets it"


def test_concurrent_begins_of_one_run_agree_on_one_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    results: list[int] = []
    barrier = threading.Barrier(6)

    def begin() -> None:
        barrier.wait()
        results.append(fast_spec.pipeline().begin("run-2").epoch)

    threads = [threading.Thread(target=begin) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [2] * 6
    assert p.epochs() == [1, 2]


def test_concurrent_begins_of_different_runs_allocate_one_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    won: list[int] = []
    pending: list[int] = []
    barrier = threading.Barrier(5)

    def begin(i: int) -> None:
        barrier.wait()
        try:
            won.append(fast_spec.pipeline().begin(f"run-{i}").epoch)
        except PendingEpochError as exc:
            pending.append(exc.epoch)

    threads = [threading.Thread(target=begin, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won == [1]
    assert pending == [1] * 4
    assert p.epochs() == [1]


def test_a_cleared_run_whose_epoch_was_aborted_gets_a_new_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    p.abort(epoch, "stage failed", by="test")

    again = p.begin("run-1")

    assert again.epoch == epoch + 1
    assert p.epoch_for_run("run-1") == epoch + 1
    assert p.begin("run-1").epoch == epoch + 1
    assert p.state(epoch) is EpochState.ABORTED


def test_the_epoch_state_follows_the_records_written(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    assert p.state(epoch) is EpochState.OPEN
    prepare_participant(p, "run-1", Participant(), epoch=epoch)
    assert p.state(epoch) is EpochState.PREPARED
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    assert p.state(epoch) is EpochState.COMMITTING
    p.commit(epoch)
    assert p.state(epoch) is EpochState.COMMITTED

    other = p.begin("run-2").epoch
    p.decide(other, Decision.ABORT, "bad input", by="test")
    assert p.state(other) is EpochState.ABORTING
    p.abort(other, "bad input", by="test")
    assert p.state(other) is EpochState.ABORTED
    with pytest.raises(EpochNotFoundError):
        p.state(99)


# -- prepare: fencing ---------------------------------------------------------------------


def test_prepare_is_idempotent_for_the_same_attempt(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    first = prepare_participant(p, "run-1", Participant())
    manifests = first.sinks
    again = fast_spec.pipeline().prepare(
        first.epoch, "ingest", 1, run_id="run-1", sinks=manifests, operators=first.operators
    )
    assert again == first


def test_a_stale_attempt_cannot_prepare_over_the_winner(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    winner = prepare_participant(p, "run-1", Participant(sinks={"orders": [b"winner"]}), attempt=2)
    with pytest.raises(FencedAttemptError, match="attempt 2"):
        prepare_participant(p, "run-1", Participant(sinks={"orders": [b"zombie"]}), attempt=1)
    assert p.txlog.read_prepared(winner.epoch, "ingest") == winner

    p.decide(winner.epoch, Decision.COMMIT, "ok", by="test")
    p.commit(winner.epoch)
    assert published(p, "orders") == {winner.epoch: expected_files([b"winner"])}
    assert staging_left(p) == []


def test_racing_attempts_prepare_exactly_one_winner(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    base = p.restore_point()
    outcomes: dict[int, str] = {}
    barrier = threading.Barrier(4)

    def attempt(a: int) -> None:
        pipeline = fast_spec.pipeline()
        barrier.wait()
        try:
            prepare_participant(
                pipeline,
                "run-1",
                Participant(sinks={"orders": [f"a{a}".encode()]}),
                attempt=a,
                base=base,
                epoch=epoch,
            )
            outcomes[a] = "won"
        except FencedAttemptError:
            outcomes[a] = "fenced"

    threads = [threading.Thread(target=attempt, args=(a,)) for a in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [a for a, o in outcomes.items() if o == "won"]
    assert len(winners) == 1
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    p.commit(epoch)
    assert published(p, "orders") == {epoch: expected_files([f"a{winners[0]}".encode()])}


def test_a_late_prepare_after_abort_is_fenced(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    p.abort(epoch, "timed out", by="test")
    with pytest.raises(FencedAttemptError, match="already decided"):
        prepare_participant(p, "run-1", Participant(), epoch=epoch)
    assert p.txlog.read_prepared(epoch, "ingest") is None
    assert p.state(epoch) is EpochState.ABORTED


def test_a_late_participant_after_the_commit_decision_is_fenced_and_not_published(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    with pytest.raises(FencedAttemptError):
        prepare_participant(p, "run-1", Participant("late", sinks={"late": [b"x"]}), epoch=epoch)
    p.commit(epoch)
    assert published(p, "late") == {}


def test_prepare_refuses_staging_outside_its_own_attempt(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    stage(p, epoch, 2, "orders", [b"x"])
    manifest = p.manifest_for_staged(epoch, 2, "orders", target_url(p, "orders"), 1)
    with pytest.raises(FencedAttemptError, match="outside attempt 1"):
        p.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[manifest])


def test_prepare_refuses_an_epoch_of_another_run(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    with pytest.raises(FencedAttemptError, match="belongs to run 'run-1'"):
        p.prepare(epoch, "ingest", 1, run_id="run-2", sinks=[])
    with pytest.raises(EpochNotFoundError):
        p.prepare(epoch + 1, "ingest", 1, run_id="run-1", sinks=[])


def test_prepare_refuses_a_manifest_whose_files_are_not_staged(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    stage(p, epoch, 1, "orders", [b"abc", b"def"])
    manifest = p.manifest_for_staged(epoch, 1, "orders", target_url(p, "orders"), 2)
    p.storage.delete(f"{manifest.staging}/part-00001.bin")
    with pytest.raises(NotPreparedError, match="part-00001.bin"):
        p.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[manifest])
    assert p.state(epoch) is EpochState.OPEN


# -- decide -------------------------------------------------------------------------------


def test_commit_and_abort_racing_in_threads_leave_exactly_one_decision(
    fast_spec: StoreSpec,
) -> None:
    for round_ in range(5):
        p = fast_spec.pipeline(f"race{round_}")
        epoch = prepare_participant(p, "run-1", Participant()).epoch

        def commit(pipeline: Pipeline = p, epoch: int = epoch) -> str:
            return pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="c").decision.value

        def abort(pipeline: Pipeline = p, epoch: int = epoch) -> str:
            try:
                pipeline.abort(epoch, "operator said so", by="a")
            except DecisionConflictError:
                return "commit"
            return "abort"

        # Any other outcome (an exception, e.g. a cleanup failing on the loser's late
        # files) makes the set below differ from the one decision.
        outcomes = at_once([commit, abort] * 3)
        decision = p.txlog.read_decision(epoch)
        assert decision is not None
        assert set(outcomes) == {decision.decision.value}, outcomes
        if decision.decision is Decision.COMMIT:
            p.commit(epoch)
            assert published(p, "orders") == {epoch: expected_files([b"o1", b"o22"])}
        else:
            with pytest.raises(DecisionConflictError):
                p.commit(epoch)
            p.abort(epoch, "finish", by="test")
            assert published(p, "orders") == {}
        assert staging_left(p) == []
        assert p.state(epoch).final


def test_a_commit_whose_verification_loses_the_staging_to_a_winning_abort_returns_the_abort(
    fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The branch task's deep check has read a staged file's size; the abort task wins the
    # decision and removes the staging before the checksum opens the file.
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    original = type(p.storage).checksum
    aborted = []

    def checksum(self: object, path: str) -> int:
        if not aborted:
            aborted.append(fast_spec.pipeline().abort(epoch, "upstream failed", by="abort task"))
        return original(self, path)  # type: ignore[arg-type]

    monkeypatch.setattr(type(p.storage), "checksum", checksum)
    decided = p.decide(epoch, Decision.COMMIT, "all prepared", by="branch")
    assert aborted and decided.decision is Decision.ABORT and decided.by == "abort task"
    monkeypatch.undo()
    p.abort(epoch, "follow the decision", by="branch")
    assert p.state(epoch) is EpochState.ABORTED
    assert staging_left(p) == [] and published(p, "orders") == {}


def test_decide_returns_the_existing_decision_instead_of_a_second_one(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    first = p.decide(epoch, Decision.ABORT, "first", by="one")
    second = p.decide(epoch, Decision.COMMIT, "second", by="two")
    assert second == first
    assert records(p, epoch).count("decision") == 1


def test_commit_decision_needs_every_named_participant_prepared(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    with pytest.raises(NotPreparedError, match="enrich"):
        p.decide(epoch, Decision.COMMIT, "ok", by="test", participants=["ingest", "enrich"])
    assert p.txlog.read_decision(epoch) is None
    assert not p.checkpoints.has_metadata(epoch)
    empty = p.begin("run-1").epoch
    assert empty == epoch


def test_commit_decision_refuses_staged_output_that_no_longer_verifies(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    record = prepare_participant(p, "run-1", Participant())
    sink = record.sinks[0]
    p.storage.write_atomic(f"{sink.staging}/{sink.files[0].path}", b"tampered, longer than before")
    with pytest.raises(NotPreparedError, match="abort the epoch"):
        p.decide(record.epoch, Decision.COMMIT, "ok", by="test")
    assert p.txlog.read_decision(record.epoch) is None


def test_the_commit_decision_completes_the_checkpoint_first(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    record = prepare_participant(p, "run-1", Participant(changes={1: 1}, sources={"in": {"f": 1}}))
    decision = p.decide(record.epoch, Decision.COMMIT, "ok", by="test")
    meta = p.checkpoints.read_metadata(record.epoch)
    assert decision.participants == meta.participants == {"ingest": 1}
    assert set(meta.sinks) == {"orders"}
    assert p.checkpoints.verify(record.epoch) == []
    assert p.storage.exists(layout.sink_marker_path(record.epoch, "orders"))
    assert p.storage.exists(layout.source_meta_path(record.epoch, "in"))


# -- commit / abort -----------------------------------------------------------------------


def test_commit_publishes_every_sink_with_a_success_summary(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = run_epoch(p, "run-1", Participant(sinks={"orders": [b"a", b"bb"], "audit": [b"ccc"]}))
    assert published(p, "orders") == {epoch: expected_files([b"a", b"bb"])}
    assert published(p, "audit") == {epoch: expected_files([b"ccc"])}
    target = p.target_storage(target_url(p, "orders"))
    summary = json.loads(target.read(f"epoch={epoch}/_SUCCESS"))
    assert summary["epoch"] == epoch and summary["rows"] == 2 and summary["bytes"] == 3
    assert [f["path"] for f in summary["files"]] == ["part-00000.bin", "part-00001.bin"]
    status = p.status(epoch)
    assert {s.sink: s.rows for s in status.published} == {"orders": 2, "audit": 1}
    assert staging_left(p) == []


def test_commit_is_idempotent(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = run_epoch(p, "run-1")
    again = fast_spec.pipeline().commit(epoch)
    assert again.already_committed
    assert again.rows == 2
    assert published(p, "orders") == {epoch: expected_files([b"o1", b"o22"])}


def test_commit_refuses_an_undecided_or_abort_decided_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    with pytest.raises(NotPreparedError, match="undecided"):
        p.commit(epoch)
    p.abort(epoch, "bad", by="test")
    with pytest.raises(DecisionConflictError, match="decided abort"):
        p.commit(epoch)
    assert published(p, "orders") == {}


def test_abort_is_idempotent_and_removes_staging_and_the_uncommitted_checkpoint(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant(changes={1: 1})).epoch
    assert p.storage.exists(layout.checkpoint_dir(epoch))
    first = p.abort(epoch, "bad input", by="test")
    second = fast_spec.pipeline().abort(epoch, "again", by="other")
    assert first == second
    assert p.state(epoch) is EpochState.ABORTED
    assert staging_left(p) == []
    assert not p.storage.exists(layout.checkpoint_dir(epoch))


def test_abort_refuses_a_commit_decided_epoch_and_commit_still_rolls_forward(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    with pytest.raises(DecisionConflictError, match="already decided commit"):
        p.abort(epoch, "too late", by="test")
    assert staging_left(p) != []
    p.commit(epoch)
    assert published(p, "orders") == {epoch: expected_files([b"o1", b"o22"])}


# -- crash at every storage mutation ------------------------------------------------------

FIRST = (
    Participant("ingest", {"orders": [b"first"]}, {1: 1, 3: 3}, {"in": {"files": ["f1"]}}),
    Participant("enrich", {"customers": [b"c-first"]}, None, {"crm": {"offset": 1}}),
)
SECOND = (
    Participant("ingest", {"orders": [b"o1", b"o22"]}, {1: 10, 3: None, 5: 50}, {"in": {"files": ["f2"]}}),
    Participant("enrich", {"customers": [b"c333"]}, None, {"crm": {"offset": 2}}),
)
THIRD = (
    Participant("ingest", {"orders": [b"third"]}, {7: 7}, {"in": {"files": ["f3"]}}),
    Participant("enrich", {"customers": [b"c-third"]}, None, {"crm": {"offset": 3}}),
)
STATE_AFTER_FIRST = {1: 1, 3: 3}
STATE_AFTER_SECOND = {1: 10, 5: 50}
LATER = 10 * 24 * 3600.0


@dataclass
class World:
    """A store with epoch 1 committed and epoch 2 ("run-2") brought to some stage."""

    spec: StoreSpec

    def pipeline(self) -> Pipeline:
        return self.spec.pipeline(full_checkpoint_interval=3)


def prepare(p: Pipeline, participant: Participant, attempt: int = 1) -> None:
    epoch = p.begin("run-2").epoch
    try:
        prepare_participant(p, "run-2", participant, attempt=attempt, epoch=epoch)
    except FencedAttemptError:
        # A retry (next attempt) of a participant whose earlier attempt already prepared
        # is fenced; the earlier attempt's output is the one that counts.
        assert p.txlog.read_prepared(epoch, participant.name) is not None


def bring_epoch_2_to(p: Pipeline, stage: str) -> None:
    """What has happened to epoch 2 before the step under test."""
    stages = ["nothing", "begun", "one-prepared", "prepared", "decided"]
    reached = stages.index(stage)
    if reached >= 1:
        p.begin("run-2")
    if reached >= 2:
        prepare(p, SECOND[0])
    if reached >= 3:
        prepare(p, SECOND[1])
    if reached >= 4:
        p.decide(p.begin("run-2").epoch, Decision.COMMIT, "all prepared", by="test")


def finish_commit(p: Pipeline) -> None:
    """The normal path to a committed epoch 2 from wherever it is (a retried DAG run)."""
    prepare(p, SECOND[0], attempt=2)
    prepare(p, SECOND[1], attempt=2)
    epoch = p.begin("run-2").epoch
    p.decide(epoch, Decision.COMMIT, "all prepared", by="retry")
    p.commit(epoch)


def finish_abort(p: Pipeline) -> None:
    # Not ``begin("run-2")``: once epoch 2 is decided abort, its run would get a new epoch.
    p.abort(2, "retry of the abort", by="retry")


def recover_later(p: Pipeline) -> None:
    report = p.recover(dry_run=False, now=time.time() + LATER)
    assert report.errors == [], [a.to_dict() for a in report.errors]


@dataclass(frozen=True)
class Step:
    """One protocol step to crash, the stage it starts from and how a retry resumes it."""

    before: str
    run: Callable[[Pipeline], object]
    retry: Callable[[Pipeline], object]
    outcome_after_retry: EpochState


STEPS: dict[str, Step] = {
    "begin": Step("nothing", lambda p: p.begin("run-2"), finish_commit, EpochState.COMMITTED),
    "prepare-first": Step("begun", lambda p: prepare(p, SECOND[0]), finish_commit, EpochState.COMMITTED),
    "prepare-second": Step("one-prepared", lambda p: prepare(p, SECOND[1]), finish_commit, EpochState.COMMITTED),
    "decide-commit": Step(
        "prepared",
        lambda p: p.decide(2, Decision.COMMIT, "ok", by="test"),
        finish_commit,
        EpochState.COMMITTED,
    ),
    "commit": Step("decided", lambda p: p.commit(2), finish_commit, EpochState.COMMITTED),
    "abort": Step("prepared", lambda p: p.abort(2, "bad input", by="test"), finish_abort, EpochState.ABORTED),
    "recover-committing": Step("decided", recover_later, recover_later, EpochState.COMMITTED),
    "recover-timed-out": Step("prepared", recover_later, recover_later, EpochState.ABORTED),
}


def second_epoch(p: Pipeline) -> int | None:
    """The epoch run-2 got, if it got one (a crash may come before its ``begin`` record)."""
    return p.epoch_for_run("run-2")


def check_invariants(world: World, allowed: set[EpochState | None]) -> None:
    p = world.pipeline()
    epochs = p.epochs()
    assert epochs[0] == 1
    states = {e: p.state(e) for e in epochs}
    assert all(s.final for s in states.values()), states
    second = second_epoch(p)
    outcome = states[second] if second is not None else None
    assert outcome in allowed, f"run-2 ended {outcome}, expected one of {allowed}"
    if outcome is EpochState.COMMITTED:
        assert second is not None
        decision = p.txlog.read_decision(second)
        assert decision is not None and decision.decision is Decision.COMMIT
    # Exactly once, all or nothing across both sinks.
    committed = [e for e, s in states.items() if s is EpochState.COMMITTED]
    for sink, first, then in (("orders", FIRST[0], SECOND[0]), ("customers", FIRST[1], SECOND[1])):
        blobs_by_epoch = {1: first.sinks[sink]}
        if second is not None:
            blobs_by_epoch[second] = then.sinks[sink]
        out = published(p, sink)
        assert set(out) == set(committed), (sink, sorted(out), committed)
        for epoch, files in out.items():
            assert files == expected_files(blobs_by_epoch[epoch]), (sink, epoch)
            assert success_marker(p, sink, epoch)
    assert staging_left(p) == []
    temp = [f.path for f in p.storage.walk("", include_temp=True) if TEMP_PREFIX in f.path]
    assert temp == []
    for epoch, state in states.items():
        if state is EpochState.ABORTED:
            assert not p.storage.exists(layout.checkpoint_dir(epoch))
    point = p.restore_point()
    assert point.how == "primary"
    assert point.epoch == max(committed)
    expected = STATE_AFTER_SECOND if outcome is EpochState.COMMITTED else STATE_AFTER_FIRST
    assert restored_state(point) == expected
    entries = point.source_entries("in")
    assert [e["offsets"]["files"] for e in entries] == [["f1"], ["f2"]][: len(committed)]


def check_and_continue(world: World, allowed: set[EpochState | None]) -> None:
    """Invariants now, then one more epoch runs normally and exactly once too."""
    check_invariants(world, allowed)
    p = world.pipeline()
    epoch = run_epoch(p, "run-3", *THIRD)
    assert published(p, "orders")[epoch] == expected_files([b"third"])
    assert published(p, "customers")[epoch] == expected_files([b"c-third"])
    point = p.restore_point()
    assert point.epoch == epoch
    second = second_epoch(p)
    second_committed = second is not None and p.state(second) is EpochState.COMMITTED
    expected = STATE_AFTER_SECOND if second_committed else STATE_AFTER_FIRST
    assert restored_state(point) == {**expected, 7: 7}


@pytest.fixture
def crash_plan(monkeypatch: pytest.MonkeyPatch) -> faults.CrashPlan:
    return faults.install(monkeypatch)


@pytest.fixture
def new_world(fast_spec: StoreSpec, tmp_path: Path) -> Iterator[Callable[[str], World]]:
    """Worlds on the test's backend, each in a fresh root, epoch 1 committed."""

    made: list[World] = []

    def make(stage: str) -> World:
        for old in made:
            forget(old.spec)
        if fast_spec.backend == "file":
            root = tmp_path / uuid.uuid4().hex
            spec = StoreSpec("file", f"file://{root}")
        else:
            spec = StoreSpec("memory", f"memory://crash-{uuid.uuid4().hex}")
        world = World(spec)
        made.append(world)
        p = world.pipeline()
        run_epoch(p, "run-1", *FIRST)
        bring_epoch_2_to(p, stage)
        return world

    yield make


@pytest.mark.crash
@pytest.mark.parametrize("resume", ["retry", "recover"])
@pytest.mark.parametrize("step_name", sorted(STEPS))
def test_a_crash_at_any_storage_mutation_keeps_every_invariant(
    crash_plan: faults.CrashPlan, new_world: Callable[[str], World], step_name: str, resume: str
) -> None:
    step = STEPS[step_name]
    allowed_after_crash: set[EpochState | None]
    if resume == "retry":
        allowed_after_crash = {step.outcome_after_retry}
    else:
        # The recovery DAG aborts what was not decided yet and rolls decided epochs forward.
        allowed_after_crash = {EpochState.COMMITTED, EpochState.ABORTED}
    if step_name == "begin" and resume == "recover":
        allowed_after_crash = allowed_after_crash | {None}  # crashed before the begin record

    def resume_step(world: World) -> None:
        p = world.pipeline()
        if resume == "retry":
            step.retry(p)
        else:
            recover_later(p)

    def check(world: World, crashed: bool) -> None:
        if not crashed:
            # The step ran to completion: finish the epoch the way its DAG would.
            p = world.pipeline()
            if step.outcome_after_retry is EpochState.COMMITTED and p.state(2) is not EpochState.COMMITTED:
                finish_commit(p)
        check_and_continue(world, allowed_after_crash if crashed else {step.outcome_after_retry})

    run = faults.crash_at_every_mutation(
        crash_plan,
        lambda n: new_world(step.before),
        lambda w: step.run(w.pipeline()),
        resume_step,
        check,
    )
    assert run.crash_points >= 1


@pytest.mark.crash
def test_a_crash_mid_retention_keeps_every_needed_part(
    crash_plan: faults.CrashPlan, fast_spec: StoreSpec, tmp_path: Path
) -> None:
    history = [{1: 1, 2: 2}, {1: 11}, {3: 3}, {2: None}, {4: 4, 1: 111}, {5: 5}]
    expected = {1: 111, 3: 3, 4: 4, 5: 5}

    made: list[World] = []

    def setup(n: int) -> World:
        for old in made:
            forget(old.spec)
        if fast_spec.backend == "file":
            spec = StoreSpec("file", f"file://{tmp_path}/retain-{n}")
        else:
            spec = StoreSpec("memory", f"memory://retain-{uuid.uuid4().hex}")
        world = World(spec)
        made.append(world)
        for i, changes in enumerate(history):
            run_epoch(world.pipeline(), f"run-{i}", Participant(changes=changes, sources={"in": {"i": i}}))
        return world

    def check(world: World, crashed: bool) -> None:
        p = world.pipeline()
        point = p.restore_point()
        assert (point.how, point.epoch) == ("primary", len(history))
        assert restored_state(point) == expected
        assert len(point.source_entries("in")) == len(history)
        for epoch in (len(history) - 1, len(history)):
            assert p.checkpoints.verify(epoch) == []
        for epoch in range(1, len(history) - 1):
            assert not p.checkpoints.has_metadata(epoch)

    run = faults.crash_at_every_mutation(
        crash_plan,
        setup,
        lambda w: w.pipeline().retain(max_retain=2),
        lambda w: w.pipeline().retain(max_retain=2),
        check,
    )
    assert run.crash_points >= 2


@pytest.mark.s3
def test_the_whole_protocol_keeps_its_invariants_on_s3(crash_plan: faults.CrashPlan, s3_spec: StoreSpec) -> None:
    world = World(s3_spec)
    p = world.pipeline()
    run_epoch(p, "run-1", *FIRST)
    aborted = prepare_participant(p, "run-x", Participant(sinks={"orders": [b"never"]})).epoch
    p.abort(aborted, "bad input", by="test")
    bring_epoch_2_to(p, "decided")
    second = p.begin("run-2").epoch
    # Crash the commit before each of its mutations; the recovery DAG rolls it forward.
    for n in itertools.count(1):
        crash_plan.arm(n)
        try:
            world.pipeline().commit(second)
            break
        except faults.SimulatedCrash:
            pass
        finally:
            crash_plan.disarm()
        assert p.state(second) in (EpochState.COMMITTING, EpochState.COMMITTED)
    assert n > 3
    recover_later(world.pipeline())
    assert published(p, "orders") == {
        1: expected_files([b"first"]),
        second: expected_files([b"o1", b"o22"]),
    }
    assert published(p, "customers") == {
        1: expected_files([b"c-first"]),
        second: expected_files([b"c333"]),
    }
    assert staging_left(p) == []
    run_epoch(p, "run-3", *THIRD)
    p.retain(max_retain=1)
    point = world.pipeline().restore_point()
    assert (point.how, point.epoch) == ("primary", second + 1)
    assert restored_state(point) == {**STATE_AFTER_SECOND, 7: 7}


def test_held_back_counts_the_refused_epochs_since_the_newest_commit(local_spec: StoreSpec) -> None:
    from airflow_seatunnel_ckpt.core.protocol.pipeline import CHECK_FAILED, SINK_REFUSED, HeldBack

    p = local_spec.pipeline()
    prepare_participant(p, "run-1", Participant())
    p.decide(1, Decision.COMMIT, "ok")
    p.commit(1)
    assert p.held_back() is None
    for run, reason in (("run-2", f"{CHECK_FAILED}too few rows"), ("run-3", "upstream did not succeed: ingest"),
                        ("run-4", f"{SINK_REFUSED}sink 'totals': keys appear more than once")):
        epoch = p.begin(run).epoch
        p.abort(epoch, reason)
    p.begin("run-5")  # in flight: passed over

    # A dead attempt's abort (epoch 3) is not a refusal; the input stays held back since epoch 2.
    assert p.held_back() == HeldBack(since=2, runs=2, newest=4,
                                     reason=f"{SINK_REFUSED}sink 'totals': keys appear more than once")
    assert p.held_back().describe() == ("input held back since epoch 2 (2 runs); epoch 4: commit refused by a "
                                        "sink: sink 'totals': keys appear more than once")
    p.abort(5, "lease expired")
    prepare_participant(p, "run-6", Participant())
    p.decide(6, Decision.COMMIT, "ok")
    assert p.held_back() is None  # decided commit: the input moves on
