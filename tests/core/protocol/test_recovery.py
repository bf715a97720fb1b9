"""Recovery of unfinished epochs, restore-point fallbacks, retention and garbage collection."""

from __future__ import annotations

import os
import time

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, OperatorState, Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import ConfigError, CorruptCheckpointError, RecoveryError
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryStep, resolve_epoch
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX, Storage
from tests.core import faults
from tests.core.conftest import StoreSpec
from tests.core.epochs import (
    OPERATOR,
    Participant,
    at_once,
    expected_files,
    flip_byte,
    prepare_participant,
    published,
    restored_state,
    run_epoch,
    snapshot,
    stage,
    staging_left,
    write_keyed_state,
)

LATER = 10 * 24 * 3600.0


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


def damage_record(p: Pipeline, epoch: int, record: str) -> str:
    path = layout.record_path(epoch, record)
    flip_byte(p.storage, path)
    return path


# -- resolving unfinished epochs ----------------------------------------------------------


def test_recovery_finishes_publishing_a_committing_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")

    report = fast_spec.pipeline().recover(dry_run=False)

    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(epoch, "finish-commit", True)]
    assert p.state(epoch) is EpochState.COMMITTED
    assert published(p, "orders") == {epoch: expected_files([b"o1", b"o22"])}
    assert staging_left(p) == []


def test_recovery_finishes_the_cleanup_of_an_aborting_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant(changes={1: 1})).epoch
    p.decide(epoch, Decision.ABORT, "operator", by="test")

    report = fast_spec.pipeline().recover(dry_run=False)

    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(epoch, "finish-abort", True)]
    assert p.state(epoch) is EpochState.ABORTED
    assert staging_left(p) == []
    assert not p.storage.exists(layout.checkpoint_dir(epoch))
    assert published(p, "orders") == {}


@pytest.mark.parametrize("stage_reached", ["OPEN", "PREPARED"])
def test_recovery_aborts_an_undecided_epoch_past_the_prepared_timeout(fast_spec: StoreSpec, stage_reached: str) -> None:
    # OPEN without a lease times out lease_timeout_s after begin, PREPARED prepared_timeout_s
    # after its prepare (which here follows begin within milliseconds).
    p = fast_spec.pipeline(prepared_timeout_s=60, lease_timeout_s=60, lease_renew_s=10)
    epoch = p.begin("run-1").epoch
    stage(p, epoch, 1, "orders", [b"half written"])
    if stage_reached == "PREPARED":
        prepare_participant(p, "run-1", Participant(), epoch=epoch)
    assert p.state(epoch).value == stage_reached
    began = p.txlog.read_begin(epoch)
    assert began is not None

    fresh = p.recover(dry_run=False, now=began.created_at + 30)
    assert [(a.action, a.done) for a in fresh.actions] == [("wait", False)]
    assert p.state(epoch).value == stage_reached
    assert staging_left(p) != []

    late = p.recover(dry_run=False, now=began.created_at + 61)
    assert [(a.action, a.done) for a in late.actions] == [("abort-timeout", True)]
    assert p.state(epoch) is EpochState.ABORTED
    assert staging_left(p) == []
    assert p.begin("run-2").epoch == epoch + 1


def test_resolve_epoch_rolls_a_committing_epoch_forward_and_returns_the_commit(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_participant(p, "run-1", Participant()).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")

    resolution = resolve_epoch(p, epoch, by="test")

    assert (resolution.step, resolution.done, resolution.error) == (RecoveryStep.FINISH_COMMIT, True, "")
    assert resolution.state is EpochState.COMMITTING and resolution.result.epoch == epoch
    assert p.state(epoch) is EpochState.COMMITTED
    assert published(p, "orders") == {epoch: expected_files([b"o1", b"o22"])}
    again = resolve_epoch(p, epoch)
    assert (again.step, again.done) == (RecoveryStep.FINAL, False)


def test_resolve_epoch_waits_for_a_live_epoch_and_aborts_it_once_dead_in_the_name_of_its_caller(
        fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(prepared_timeout_s=60, lease_timeout_s=60, lease_renew_s=10)
    epoch = p.begin("run-1").epoch
    began = p.txlog.read_begin(epoch)
    assert began is not None

    alive = resolve_epoch(p, epoch, clock=lambda: began.created_at + 30, by="stage of run-2")
    assert alive.waits and alive.judged is not None and not alive.judged.dead
    assert "seatunnel-ckpt --store" in alive.reason and p.state(epoch) is EpochState.OPEN
    would = resolve_epoch(p, epoch, clock=lambda: began.created_at + 61, dry_run=True)
    assert (would.step, would.done) == (RecoveryStep.ABORT_TIMEOUT, False) and p.state(epoch) is EpochState.OPEN

    dead = resolve_epoch(p, epoch, clock=lambda: began.created_at + 61, by="stage of run-2")

    assert (dead.step, dead.done) == (RecoveryStep.ABORT_TIMEOUT, True)
    status = p.status(epoch)
    assert status.state is EpochState.ABORTED and status.decision is not None
    assert status.decision.by == "stage of run-2" and "no stage ever took its lease" in status.decision.reason


def test_resolve_epoch_aborts_an_epoch_whose_run_is_finished_and_reports_a_damaged_one(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    finished = p.begin("run-1").epoch
    asked: list[tuple[str, str]] = []

    def run_finished(run_id: str, dag_id: str) -> bool:
        asked.append((run_id, dag_id))
        return True

    resolution = resolve_epoch(p, finished, run_finished=run_finished)
    assert asked == [("run-1", "")]
    assert (resolution.step, resolution.done) == (RecoveryStep.ABORT_DEAD_OWNER, True)
    assert p.state(finished) is EpochState.ABORTED

    damaged = p.begin("run-2").epoch
    prepare_participant(p, "run-2", Participant(), epoch=damaged)
    damage_record(p, damaged, "prepared-ingest")
    p.storage.write_atomic(layout.record_path(damaged, "decision"), b"{not json")
    inspect = resolve_epoch(p, damaged)
    assert inspect.step is RecoveryStep.INSPECT and inspect.state is None and inspect.error


def test_recovery_lists_an_undecided_epochs_log_directory_once(
        fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state and the liveness judgement read one listing of the epoch's directory."""
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    listed: list[str] = []
    storage_type = type(p.storage)
    list_dir = storage_type.list_dir

    def recording(self: Storage, path: str = "") -> list[str]:
        listed.append(path)
        return list_dir(self, path)

    monkeypatch.setattr(storage_type, "list_dir", recording)

    assert resolve_epoch(p, epoch, dry_run=True).waits
    assert listed.count(layout.txlog_dir(epoch)) == 1, listed
    listed.clear()
    report = p.recover(dry_run=True)

    assert [(a.epoch, str(a.action)) for a in report.actions] == [(epoch, "wait")]
    # One more: listing the epochs looks into the newest one (an empty directory is no epoch).
    assert listed.count(layout.txlog_dir(epoch)) == 2, listed


def test_a_dry_run_reports_what_it_would_do_and_changes_nothing(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    epoch = prepare_participant(p, "run-2", Participant()).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    p.storage.write_atomic("_staging/epoch=77/attempt=1/orders/x", b"orphan")
    before = snapshot(fast_spec.storage())

    report = p.recover(dry_run=True)

    assert {(a.epoch, a.action) for a in report.actions} == {
        (2, "finish-commit"),
        (77, "drop-staging"),
    }
    assert not any(a.done for a in report.actions)
    assert snapshot(fast_spec.storage()) == before


def test_recovery_drops_orphan_staging_and_checkpoints_of_aborted_or_unknown_epochs(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    aborted = prepare_participant(p, "run-2", Participant()).epoch
    p.abort(aborted, "bad", by="test")
    open_epoch = p.begin("run-3").epoch
    stage(p, open_epoch, 1, "orders", [b"in flight"])
    # Leftovers: staging of a committed and of an unknown epoch, a checkpoint directory
    # of the aborted epoch (a losing commit decision wrote it late) and of an epoch the
    # log never heard of.
    p.storage.write_atomic("_staging/epoch=1/attempt=3/orders/late", b"x")
    p.storage.write_atomic("_staging/epoch=99/attempt=1/orders/x", b"x")
    p.storage.write_atomic(f"{layout.checkpoint_dir(aborted)}/_metadata", b"late")
    p.storage.write_atomic("checkpoint_50/operators/seen/part-0-1", b"x")

    report = p.recover(dry_run=False, now=time.time())

    assert report.errors == []
    assert p.storage.list_dir(layout.STAGING) == [f"epoch={open_epoch}"]
    assert p.checkpoints.epochs() == [1]
    assert p.state(open_epoch) is EpochState.OPEN
    assert p.restore_point().epoch == 1


def test_recovery_removes_temp_files_of_killed_writers_once_they_are_old(
    local_spec: StoreSpec,
) -> None:
    p = local_spec.pipeline(prepared_timeout_s=60)
    run_epoch(p, "run-1")
    old = p.storage.full_path(f"checkpoint_1/{TEMP_PREFIX}old")
    fresh = p.storage.full_path(f"_txlog/{TEMP_PREFIX}fresh")
    for path in (old, fresh):
        with open(path, "wb") as fh:
            fh.write(b"partial")
    os.utime(old, (time.time() - 3600, time.time() - 3600))

    p.recover(dry_run=False)

    assert not os.path.exists(old)
    assert os.path.exists(fresh)


def test_two_recoveries_at_once_reach_the_same_end_state(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    blobs = [bytes([i]) * (i + 1) for i in range(40)]
    epoch = prepare_participant(p, "run-2", Participant(sinks={"orders": blobs, "audit": [b"a"]})).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    p.storage.write_atomic("_staging/epoch=99/attempt=1/orders/x", b"orphan")
    outcomes = at_once([lambda: fast_spec.pipeline().recover(dry_run=False)] * 2)
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
    final = fast_spec.pipeline().recover(dry_run=False)
    assert final.actions == []
    assert p.state(epoch) is EpochState.COMMITTED
    assert published(p, "orders")[epoch] == expected_files(blobs)
    assert published(p, "audit")[epoch] == expected_files([b"a"])
    assert staging_left(p) == []


def test_recovery_reports_a_damaged_record_and_keeps_that_epochs_staging(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1")
    epoch = prepare_participant(p, "run-2", Participant()).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    damaged = damage_record(p, epoch, "decision")

    report = p.recover(dry_run=False, now=time.time() + LATER)

    assert [(a.epoch, a.action) for a in report.errors] == [(epoch, "inspect")]
    assert p.storage.describe_path(damaged) in report.errors[0].error
    assert staging_left(p) != [], "the staged output of a possibly committed epoch must survive"
    assert p.storage.exists(layout.checkpoint_dir(epoch))


def test_recovery_reports_a_damaged_begin_record_instead_of_failing(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    stage(p, epoch, 1, "orders", [b"x"])
    damage_record(p, epoch, "begin")

    report = p.recover(dry_run=False, now=time.time() + LATER)

    assert [a.epoch for a in report.errors] == [epoch]
    assert "begin" in report.errors[0].error
    assert staging_left(p) != []


# -- restore points and their fallbacks ---------------------------------------------------

HISTORY = [
    Participant(sinks={"orders": [b"e1"]}, changes={1: 1, 2: 2, 3: 3}, sources={"in": {"files": ["f1"]}}),
    Participant(sinks={"orders": [b"e2"]}, changes={2: 20, 4: 4}, sources={"in": {"files": ["f2"]}}),
    Participant(sinks={"orders": [b"e3"]}, changes={1: None, 5: 5}, sources={"in": {"files": ["f3"]}}),
]
STATES = [{1: 1, 2: 2, 3: 3}, {1: 1, 2: 20, 3: 3, 4: 4}, {2: 20, 3: 3, 4: 4, 5: 5}]
FILES = [["f1"], ["f2"], ["f3"]]


def committed_history(spec: StoreSpec, history: list[Participant] = HISTORY, **settings: object) -> Pipeline:
    p = spec.pipeline(**{"full_checkpoint_interval": 3, **settings})
    for i, participant in enumerate(history):
        run_epoch(p, f"run-{i + 1}", participant)
    return p


def newest_parts(p: Pipeline, epoch: int, kind: str) -> list[str]:
    """Paths of the parts checkpoint ``epoch`` itself wrote for ``kind`` (sources/operators)."""
    meta = p.checkpoints.read_metadata(epoch)
    parts = (
        [q for op in meta.operators.values() for q in op.parts()]
        if kind == "operators"
        else [q for s in meta.sources.values() for q in s.chain]
    )
    return [q.path for q in parts if q.epoch == epoch]


def test_the_restore_point_is_the_newest_committed_checkpoint(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec)
    # Epoch 4 completed its _metadata, then its decision never came: not committed.
    prepare_participant(p, "run-4", Participant(changes={9: 9}))
    p._complete_checkpoint(4, None)
    assert p.checkpoints.has_metadata(4)

    point = p.restore_point()

    assert (point.epoch, point.how) == (3, "primary")
    assert restored_state(point) == STATES[2]
    assert [e["offsets"]["files"] for e in point.source_entries("in")] == FILES


def test_a_deep_restore_point_checks_parts_without_decompressing_them(
        fast_spec: StoreSpec, decompressed: list[str]) -> None:
    """A retried stage's deep check reads every part and checks its checksums and frame --
    any damage in place changes a CRC32C -- but leaves decompressing to the reads that use it."""
    p = committed_history(fast_spec)
    parts = [part.path for op in p.checkpoints.read_metadata(3).operators.values() for part in op.parts()]
    assert parts
    assert p.restore_point(deep=True).epoch == 3
    assert not [path for path in decompressed if any(path.endswith(part) for part in parts)]
    flip_byte(p.storage, parts[0])  # a part no fallback can replace: damage found and named
    with pytest.raises(RecoveryError, match=parts[0].rsplit("/", 1)[-1]):
        p.restore_point(deep=True)


def test_an_empty_pipeline_restores_empty_state(fast_spec: StoreSpec) -> None:
    point = fast_spec.pipeline().restore_point()
    assert (point.epoch, point.how, point.operators) == (None, "empty", {})


def test_damaged_metadata_falls_back_to_a_rebuild_from_the_log(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec)
    flip_byte(p.storage, layout.metadata_path(3))

    point = p.restore_point()

    assert (point.epoch, point.how) == (3, "rebuilt-from-log")
    assert point.skipped and point.skipped[0].path == p.storage.describe_path(layout.metadata_path(3))
    assert restored_state(point) == STATES[2]
    assert [e["offsets"]["files"] for e in point.source_entries("in")] == FILES
    # The next epoch writes a full source part from the rebuilt history and commits.
    run_epoch(p, "run-4", Participant(changes={6: 6}, sources={"in": {"files": ["f4"]}}))
    after = p.restore_point()
    assert (after.epoch, after.how) == (4, "primary")
    assert restored_state(after) == {**STATES[2], 6: 6}
    assert [e["offsets"]["files"] for e in after.source_entries("in")] == [*FILES, ["f4"]]


def test_a_damaged_source_part_falls_back_to_a_rebuild_from_the_log(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec)
    (victim,) = newest_parts(p, 3, "sources")
    flip_byte(p.storage, victim)

    point = p.restore_point()

    assert (point.epoch, point.how) == (3, "rebuilt-from-log")
    assert point.skipped[0].path == p.storage.describe_path(victim)
    assert restored_state(point) == STATES[2]
    assert [e["offsets"]["files"] for e in point.source_entries("in")] == FILES


def test_a_damaged_operator_part_falls_back_to_the_secondary_replica(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, secondary_url=fast_spec.sub_url("replica"))
    victim = newest_parts(p, 3, "operators")[0]
    flip_byte(p.storage, victim)

    point = p.restore_point()

    assert (point.epoch, point.how) == (3, "secondary")
    assert point.storage is not None and point.storage.url.startswith(fast_spec.sub_url("replica"))
    assert restored_state(point) == STATES[2]
    assert [e["offsets"]["files"] for e in point.source_entries("in")] == FILES


def test_a_crash_while_replicating_never_leaves_a_replica_that_claims_to_be_complete(
    local_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Local: the replica is written file by file (memory and S3 copy inside the store).
    plan = faults.install(monkeypatch)
    p = committed_history(local_spec, HISTORY[:1], secondary_url=local_spec.sub_url("replica"))
    replica = local_spec.storage("replica").child(p.name)
    epoch = prepare_participant(p, "run-2", HISTORY[1]).epoch
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    plan.arm(10**6)
    p.commit(epoch)
    replica_writes = [i for i, what in enumerate(plan.trace, 1) if "write_atomic(checkpoint_2" in what]
    assert replica_writes
    for n in replica_writes:
        # Undo the replica of epoch 2 and the commit's acknowledgement, then crash at n.
        replica.delete(layout.checkpoint_dir(epoch), recursive=True)
        p.storage.delete(layout.record_path(epoch, "committed"))
        plan.arm(n)
        with pytest.raises(faults.SimulatedCrash):
            p.commit(epoch)
        plan.disarm()
        if replica.exists(layout.metadata_path(epoch)):
            assert p.checkpoints.verify(epoch, storage=replica) == []
    p.commit(epoch)
    assert p.checkpoints.verify(epoch, storage=replica) == []


def test_a_damaged_operator_part_without_a_safe_fallback_stops_with_the_way_out(
    fast_spec: StoreSpec,
) -> None:
    p = committed_history(fast_spec)
    victim = newest_parts(p, 3, "operators")[0]
    flip_byte(p.storage, victim)
    before = snapshot(fast_spec.storage())

    with pytest.raises(RecoveryError) as info:
        p.restore_point()

    message = str(info.value)
    assert p.storage.describe_path(victim) in message
    assert "epoch 3" in message
    assert "Way out" in message and "backup" in message and "secondary_url" in message
    assert snapshot(fast_spec.storage()) == before


def test_an_older_checkpoint_is_used_only_when_the_epochs_after_it_published_nothing(
    fast_spec: StoreSpec,
) -> None:
    quiet = [
        HISTORY[0],
        Participant(sinks={}, changes={2: 20, 4: 4}, sources={"in": {"files": ["f2"]}}),
        Participant(sinks={}, changes={1: None, 5: 5}, sources={"in": {"files": ["f3"]}}),
    ]
    p = committed_history(fast_spec, quiet)
    flip_byte(p.storage, newest_parts(p, 3, "operators")[0])

    point = p.restore_point()

    assert (point.epoch, point.how) == (2, "older")
    assert restored_state(point) == STATES[1]
    assert point.skipped


def test_with_fallback_disabled_a_damaged_checkpoint_stops_at_once(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, fallback_enabled=False)
    flip_byte(p.storage, layout.metadata_path(3))
    with pytest.raises(RecoveryError, match="fallback is disabled"):
        p.restore_point()


# -- retention ----------------------------------------------------------------------------

LONG = [
    Participant(sinks={"orders": [bytes([i])]}, changes=changes, sources={"in": {"i": i}})
    for i, changes in enumerate([{0: 0, 1: 1, 2: 2, 3: 3}, {1: 11}, {2: 22}, {5: 5}, {1: 111}, {6: 6, 0: None}, {7: 7}])
]
LONG_STATE = {1: 111, 2: 22, 3: 3, 5: 5, 6: 6, 7: 7}


def test_retention_keeps_the_newest_n_and_every_part_they_reference(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, LONG)
    referenced = {q.path for e in (6, 7) for q in p.checkpoints.read_metadata(e).parts()}
    assert any(not path.startswith(("checkpoint_6/", "checkpoint_7/")) for path in referenced)

    report = p.retain(max_retain=2)

    assert report.kept == [6, 7]
    assert report.removed_checkpoints == [1, 2, 3, 4, 5]
    assert report.kept_for_reference > 0
    left = {f"{d}/{f.path}" for d in map(layout.checkpoint_dir, p.checkpoints.epochs()) for f in p.storage.walk(d)}
    assert left - referenced == {f for f in left if f.startswith(("checkpoint_6/", "checkpoint_7/"))} - referenced
    assert referenced <= left
    point = p.restore_point()
    assert (point.epoch, point.how) == (7, "primary")
    assert restored_state(point) == LONG_STATE
    assert len(point.source_entries("in")) == len(LONG)
    assert published(p, "orders").keys() == set(range(1, 8)), "retention never touches output"


def test_retention_always_keeps_the_newest_committed_checkpoint(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, LONG[:3])
    epoch = prepare_participant(p, "run-4", Participant(changes={9: 9})).epoch

    report = p.retain(max_retain=1)

    assert report.kept == [3]
    assert p.checkpoints.epochs() == [1, 2, 3, epoch], "older dirs keep their referenced parts"
    assert p.checkpoints.verify(3) == []
    assert p.storage.exists(layout.checkpoint_dir(epoch)), "an unfinished epoch's parts stay"
    assert restored_state(p.restore_point()) == {0: 0, 1: 11, 2: 22, 3: 3}
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    p.commit(epoch)
    assert restored_state(p.restore_point()) == {0: 0, 1: 11, 2: 22, 3: 3, 9: 9}


def test_retention_keeps_parts_an_unfinished_epoch_still_references(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, LONG[:3], full_checkpoint_interval=1)
    # The in-flight epoch 4 restored from checkpoint 1 (an "older" fallback) and chains a
    # delta onto checkpoint 1's part of key group 0, which no newer checkpoint references.
    base = p.checkpoints.read_metadata(1).operators[OPERATOR]
    chains = {g: list(chain) for g, chain in base.chains.items()}
    epoch = p.begin("run-4").epoch
    only_in_1 = [
        q
        for chain in chains.values()
        for q in chain
        if q.path not in {r.path for r in p.checkpoints.read_metadata(3).parts()}
    ]
    assert only_in_1
    p.prepare(
        epoch,
        "ingest",
        1,
        run_id="run-4",
        sinks=[],
        operators={OPERATOR: OperatorState(base.key_groups, ["k"], chains, base.state_kind)},
    )

    p.retain(max_retain=1)

    for ref in only_in_1:
        assert p.storage.exists(ref.path), ref.path
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    assert p.checkpoints.verify(epoch) == []


def test_retention_removes_the_parts_of_a_losing_attempt_from_a_kept_checkpoint(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, LONG[:2])
    epoch = p.begin("run-3").epoch
    base = p.restore_point()
    # Attempt 1 wrote its keyed state and was killed before it prepared; attempt 2 won.
    write_keyed_state(p.storage, epoch, 1, base.operators[OPERATOR], base.storage, {2: 2, 8: 8})
    p.storage.write_atomic(f"{layout.checkpoint_dir(epoch)}/operators/{OPERATOR}/{TEMP_PREFIX}debris", b"x")
    prepare_participant(p, "run-3", Participant(changes={2: 22, 9: 9}, sources={"in": {"i": 3}}), attempt=2, base=base,
                        epoch=epoch)
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    p.commit(epoch)
    root = layout.checkpoint_dir(epoch)
    needed = {q.path for q in p.checkpoints.read_metadata(epoch).parts()} | {layout.metadata_path(epoch)}
    losing = sorted({f"{root}/{f.path}" for f in p.storage.walk(root, include_temp=True)} - needed)
    assert len(losing) == 3 and all("-1" in path or TEMP_PREFIX in path for path in losing), losing

    preview = p.retain(max_retain=3, dry_run=True)
    assert sorted(preview.removed_unreferenced) == losing
    assert all(p.storage.exists(path) for path in losing)

    report = p.retain(max_retain=3)
    assert sorted(report.removed_unreferenced) == losing
    assert not any(p.storage.exists(path) for path in losing)
    assert p.checkpoints.verify(epoch) == [] and p.storage.exists(layout.source_meta_path(epoch, "in"))
    assert restored_state(p.restore_point()) == {0: 0, 1: 11, 2: 22, 3: 3, 9: 9}
    assert p.retain(max_retain=3).removed_unreferenced == []


def test_retention_in_a_dry_run_removes_nothing(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, LONG[:4])
    before = snapshot(fast_spec.storage())
    report = p.retain(max_retain=1, dry_run=True)
    assert report.removed_checkpoints == [1, 2, 3]
    assert snapshot(fast_spec.storage()) == before


def test_retention_removes_nothing_when_a_kept_checkpoint_cannot_be_read(
    fast_spec: StoreSpec,
) -> None:
    p = committed_history(fast_spec, LONG[:4])
    flip_byte(p.storage, layout.metadata_path(4))
    before = snapshot(fast_spec.storage())
    report = p.retain(max_retain=1)
    assert "damaged _metadata" in report.note
    assert report.removed_checkpoints == []
    assert snapshot(fast_spec.storage()) == before


def test_retention_refuses_to_keep_fewer_than_one_checkpoint(fast_spec: StoreSpec) -> None:
    p = committed_history(fast_spec, LONG[:2])
    for bad in (0, -1, True):
        with pytest.raises(ConfigError, match="max_retain"):
            p.retain(max_retain=bad)  # type: ignore[arg-type]
    assert p.checkpoints.epochs() == [1, 2]


def test_an_older_checkpoint_removed_by_retention_is_never_a_fallback(fast_spec: StoreSpec) -> None:
    quiet = [HISTORY[0], *(Participant(sinks={}, changes={10 + i: i}) for i in range(3))]
    p = committed_history(fast_spec, quiet)
    p.retain(max_retain=1)
    flip_byte(p.storage, newest_parts(p, 4, "operators")[0])
    with pytest.raises(RecoveryError):
        p.restore_point()
    with pytest.raises(CorruptCheckpointError):
        p.checkpoints.read_metadata(2)
