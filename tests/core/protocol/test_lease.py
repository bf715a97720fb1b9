"""Stage leases: a running stage is never aborted, a dead one is, and only the store's clock counts.

Timeouts are shortened to half a second (renewal every 0.1 s) and recovery runs for real, in a
loop beside the "stage" (a thread holding a :class:`LeaseKeeper`, as ``run_stage`` does).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import ConfigError, PendingEpochError
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, Liveness, liveness, read_lease, store_now
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryAction, recover
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, expected_files, prepare_participant, published, stage

SHORT = {"lease_timeout_s": 0.5, "lease_renew_s": 0.1, "prepared_timeout_s": 0.5}


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


@contextmanager
def recovery_beside(spec: StoreSpec, **settings: Any) -> Iterator[list[RecoveryAction]]:
    """Run ``recover(dry_run=False)`` in a loop (a fresh process's view each time) until the block ends."""
    actions: list[RecoveryAction] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                actions.extend(recover(spec.pipeline(**settings), dry_run=False).actions)
                stop.wait(0.05)
        except BaseException as exc:  # surfaced below: a crashing recovery fails the test
            failures.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield actions
    finally:
        stop.set()
        thread.join(30)
    assert not failures, failures


def aborts(actions: list[RecoveryAction]) -> list[RecoveryAction]:
    return [a for a in actions if a.action.startswith("abort") and a.done]


def keeper(p: Pipeline, epoch: int, participant: str = "ingest", attempt: int = 1) -> LeaseKeeper:
    return LeaseKeeper.for_pipeline(p, epoch, participant, attempt)


# -- a running stage is never aborted -----------------------------------------------------

def test_a_stage_longer_than_every_timeout_commits_with_recovery_running_beside_it(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    with recovery_beside(fast_spec, **SHORT) as actions:
        with keeper(p, epoch):
            stage(p, epoch, 1, "orders", [b"o1"])
            time.sleep(1.75)  # > lease_timeout_s and > prepared_timeout_s, counted from begin
            assert p.state(epoch) is EpochState.OPEN, [a.to_dict() for a in actions]
            prepare_participant(p, "run-1", Participant(), epoch=epoch)
        p.decide(epoch, Decision.COMMIT, "all prepared", by="test")
        p.commit(epoch)
        time.sleep(0.15)  # recovery keeps running over the committed epoch

    assert aborts(actions) == []
    assert any(a.action == "wait" for a in actions)
    assert p.state(epoch) is EpochState.COMMITTED
    assert published(p, "orders") == {epoch: expected_files([b"o1", b"o22"])}


def test_the_lease_is_renewed_with_a_new_generation_and_stops_when_the_stage_ends(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    with keeper(p, epoch, attempt=2) as held:
        time.sleep(0.35)
        during = read_lease(p.storage, epoch, "ingest")
    assert during is not None and during.generation >= 3
    assert (during.epoch, during.participant, during.attempt) == (epoch, "ingest", 2)
    assert during.holder["pid"] > 0 and during.holder["host"]
    ended = read_lease(p.storage, epoch, "ingest")
    time.sleep(0.25)
    assert read_lease(p.storage, epoch, "ingest") == ended  # nothing renews after the block
    assert ended is not None and ended.generation == held.generation


def test_a_failed_renewal_neither_kills_the_stage_nor_stops_the_next_one(
    fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    real = type(p.storage).write_atomic
    broken = {"left": 2}

    def flaky(self: Storage, path: str, data: Any) -> int:
        if path.endswith(layout.lease_path(epoch, "ingest")) and broken["left"] > 0 and broken.get("armed"):
            broken["left"] -= 1
            raise OSError("store unavailable")
        return real(self, path, data)

    monkeypatch.setattr(type(p.storage), "write_atomic", flaky)
    with keeper(p, epoch) as held:
        broken["armed"] = 1
        time.sleep(0.6)
    assert broken["left"] == 0 and held.failures == 2
    lease = read_lease(p.storage, epoch, "ingest")
    assert lease is not None and lease.generation == held.generation >= 3


# -- a dead stage is aborted --------------------------------------------------------------

def test_recovery_aborts_an_epoch_within_the_lease_timeout_after_its_stage_died(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    stage(p, epoch, 1, "orders", [b"half"])
    held = keeper(p, epoch).__enter__()
    time.sleep(0.25)
    held.stop()  # the driver process died: nobody renews any more
    died = time.monotonic()
    with recovery_beside(fast_spec, **SHORT) as actions:
        while p.state(epoch) is not EpochState.ABORTED and time.monotonic() - died < 10:
            time.sleep(0.02)
    took = time.monotonic() - died

    assert p.state(epoch) is EpochState.ABORTED
    # Not before the lease expired (its last renewal was at most one renewal interval before
    # the stop); within the timeout plus one recovery run after it.
    assert SHORT["lease_timeout_s"] - SHORT["lease_renew_s"] <= took <= SHORT["lease_timeout_s"] + 1.0, took
    [done] = aborts(actions)
    assert done.action == "abort-timeout" and "lease of 'ingest'" in done.reason and "DEAD" in done.reason
    assert p.begin("run-2").epoch == epoch + 1


def test_an_open_epoch_that_never_took_a_lease_expires_from_its_begin(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    assert liveness(p, epoch).liveness is Liveness.ALIVE
    time.sleep(0.55)
    judged = liveness(p, epoch)
    assert judged.liveness is Liveness.EXPIRED and "no stage ever took its lease" in judged.reason


def test_a_prepared_epoch_times_out_from_its_prepare_not_from_its_begin(fast_spec: StoreSpec) -> None:
    settings = {**SHORT, "lease_timeout_s": 1.5, "lease_renew_s": 0.1, "prepared_timeout_s": 0.5}
    p = fast_spec.pipeline(**settings)
    epoch = p.begin("run-1").epoch
    with keeper(p, epoch):
        time.sleep(0.75)  # the stage runs longer than prepared_timeout_s
        prepare_participant(p, "run-1", Participant(), epoch=epoch)

    fresh = recover(fast_spec.pipeline(**settings), dry_run=False)
    assert [(a.action, a.done) for a in fresh.actions] == [("wait", False)], fresh.to_dict()
    assert "within timeout" in fresh.actions[0].reason
    time.sleep(0.6)
    late = recover(fast_spec.pipeline(**settings), dry_run=False)
    assert [(a.action, a.done) for a in late.actions] == [("abort-timeout", True)], late.to_dict()
    assert "prepared" in late.actions[0].reason and p.state(epoch) is EpochState.ABORTED


def test_an_epoch_whose_owning_run_finished_is_dead_even_with_a_live_lease(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    asked: list[tuple[str, str]] = []

    def finished(answer: bool | None) -> Callable[[str, str], bool | None]:
        def ask(run_id: str, dag_id: str) -> bool | None:
            asked.append((run_id, dag_id))
            return answer
        return ask

    with keeper(p, epoch):
        for answer in (None, False):
            report = recover(p, dry_run=False, run_finished=finished(answer))
            assert [a.action for a in report.actions] == ["wait"]
        report = recover(p, dry_run=False, run_finished=finished(True))
    assert [(a.action, a.done) for a in report.actions] == [("abort-dead-owner", True)]
    assert "run 'run-1'" in report.actions[0].reason
    assert asked == [("run-1", "")] * 3
    assert p.state(epoch) is EpochState.ABORTED


def test_a_prepared_epoch_of_a_finished_run_is_aborted_but_a_commit_decision_rolls_forward(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline(**SHORT)
    undecided = prepare_participant(p, "run-1", Participant()).epoch  # run marked failed before the branch
    report = recover(p, dry_run=False, run_finished=lambda run_id, dag_id: True)
    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(undecided, "abort-dead-owner", True)]

    decided = prepare_participant(p, "run-2", Participant()).epoch
    p.decide(decided, Decision.COMMIT, "all prepared", by="test")
    report = recover(p, dry_run=False, run_finished=lambda run_id, dag_id: True)
    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(decided, "finish-commit", True)]
    assert p.state(decided) is EpochState.COMMITTED


def test_an_orchestrator_that_cannot_answer_counts_as_unknown(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch

    def broken(run_id: str, dag_id: str) -> bool | None:
        raise RuntimeError("API server unreachable")

    report = recover(p, dry_run=False, run_finished=broken)
    assert [a.action for a in report.actions] == ["wait"]
    assert p.state(epoch) is EpochState.OPEN


# -- the store's clock, never the observer's ----------------------------------------------

@pytest.mark.parametrize("skew_s", [-365 * 24 * 3600.0, 365 * 24 * 3600.0])
def test_the_observers_wall_clock_does_not_change_the_judgement(
    fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch, skew_s: float,
) -> None:
    p = fast_spec.pipeline(**SHORT)
    dead = p.begin("run-1").epoch
    time.sleep(0.6)  # never took a lease: dead by the store's clock
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() + skew_s)  # the observer's clock is a year off
        judged = liveness(p, dead)
        assert judged.liveness is Liveness.EXPIRED, judged.describe()
        assert SHORT["lease_timeout_s"] < judged.age_s < 30  # type: ignore[operator]
        report = recover(fast_spec.pipeline(**SHORT), dry_run=False)
    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(dead, "abort-timeout", True)]

    alive = p.begin("run-2").epoch
    with keeper(p, alive):
        time.sleep(0.6)
        with monkeypatch.context() as m:
            m.setattr(time, "time", lambda: real() + skew_s)
            judged = liveness(p, alive)
            assert judged.liveness is Liveness.ALIVE, judged.describe()
            report = recover(fast_spec.pipeline(**SHORT), dry_run=False)
    assert [(a.epoch, a.action) for a in report.actions] == [(alive, "wait")]
    assert p.state(alive) is EpochState.OPEN


def test_the_store_clock_probe_leaves_nothing_behind(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(**SHORT)
    p.begin("run-1")
    before = p.storage.list_dir(layout.TXLOG)
    now = store_now(p.storage)
    assert abs(now - time.time()) < 5
    assert p.storage.list_dir(layout.TXLOG) == before


# -- messages and configuration -----------------------------------------------------------

def test_pending_epoch_error_and_the_wait_action_name_the_abort_command(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    with pytest.raises(PendingEpochError) as info:
        p.begin("run-2")
    assert f"seatunnel-ckpt abort orders {epoch} --reason" in str(info.value)
    assert "recover --apply" not in str(info.value)
    with keeper(p, epoch):
        [wait] = recover(p, dry_run=True).actions
    assert f"abort orders {epoch} --reason" in wait.reason
    assert "is ALIVE" in wait.reason and "lease of 'ingest' (attempt 1 on " in wait.reason


@pytest.mark.parametrize(("settings", "needle"), [
    ({"lease_timeout_s": 0}, "lease_timeout_s"),
    ({"lease_timeout_s": float("nan")}, "lease_timeout_s"),
    ({"lease_renew_s": True}, "lease_renew_s"),
    ({"lease_renew_s": "30"}, "lease_renew_s"),
    ({"lease_timeout_s": 60, "lease_renew_s": 30}, "lease_timeout_s / 2"),
])
def test_lease_settings_are_validated(settings: dict[str, Any], needle: str) -> None:
    from airflow_seatunnel_ckpt.core import CheckpointConfig

    with pytest.raises(ConfigError, match=re.escape(needle)):
        CheckpointConfig.from_mapping({"storage_url": "memory://x", **settings})


def test_every_backend_reports_modification_times_by_its_own_clock(store_spec: StoreSpec) -> None:
    storage = store_spec.storage()
    storage.write_atomic("clock/a", b"1")
    first = storage.modified("clock/a")
    assert abs(first - time.time()) < 120  # this machine and the store agree roughly here
    time.sleep(1.05 - time.time() % 1)  # into the next whole second: object stores keep whole seconds
    storage.write_atomic("clock/a", b"2")
    assert storage.modified("clock/a") > first
    with pytest.raises(FileNotFoundError):
        storage.modified("clock/missing")
    assert store_now(storage) >= storage.modified("clock/a")


def test_a_store_that_cannot_tell_the_time_leaves_the_epoch_alone(
    fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_seatunnel_ckpt.core.errors import StorageError

    p = fast_spec.pipeline(**SHORT)
    epoch = p.begin("run-1").epoch
    time.sleep(0.55)

    def no_clock(self: Storage, path: str) -> float:
        raise StorageError(f"modification time of {path} unavailable")

    monkeypatch.setattr(type(p.storage), "modified", no_clock)
    report = recover(fast_spec.pipeline(**SHORT), dry_run=False)
    assert [(a.epoch, a.action) for a in report.actions] == [(epoch, "inspect")]
    assert "unavailable" in report.actions[0].error
    assert p.state(epoch) is EpochState.OPEN


# -- the holder's own timeout ---------------------------------------------------------------

def test_a_lease_renewed_for_a_longer_timeout_of_its_own_is_alive_for_recovery_and_the_cli(
    local_spec: StoreSpec, capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    import os

    from airflow_seatunnel_ckpt.cli import main

    p = local_spec.pipeline()  # lease_timeout_s=180: the default of the CLI and the recovery DAG
    epoch = p.begin("run-1").epoch
    # The stage renews every 120 s for a 600 s timeout (its own configuration).
    assert LeaseKeeper(p.storage, epoch, "ingest", 1, renew_s=120, timeout_s=600).renew()
    renewed = p.storage.modified(layout.lease_path(epoch, "ingest"))

    judged = liveness(p, epoch, now=renewed + 200)
    assert judged.liveness is Liveness.ALIVE, judged.describe()
    assert "the lease's timeout_s=600 (lease_timeout_s=180)" in judged.reason
    report = recover(local_spec.pipeline(), dry_run=False, now=renewed + 200)
    assert [(a.action, a.done) for a in report.actions] == [("wait", False)], report.to_dict()
    assert liveness(p, epoch, now=renewed + 601).liveness is Liveness.EXPIRED

    # The CLI judges by the store's own clock: the renewal is made 200 s old.
    lease_file = p.storage.full_path(layout.lease_path(epoch, "ingest"))
    os.utime(lease_file, (time.time() - 200, time.time() - 200))
    assert main(["--store", local_spec.sub_url("store"), "--json", "recover", "orders", "--apply"]) == 0
    [cli_report] = json.loads(capsys.readouterr().out)
    assert [(a["action"], a["done"]) for a in cli_report["actions"]] == [("wait", False)], cli_report
    assert p.state(epoch) is EpochState.OPEN


# -- a participant not begun yet ------------------------------------------------------------

def test_a_participant_queued_behind_a_pool_does_not_let_recovery_abort_its_running_run(
    fast_spec: StoreSpec,
) -> None:
    from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor

    p = fast_spec.pipeline()
    ensure_descriptor(p, dag_id="orders_dag", participants={
        "ingest": ParticipantDescriptor.from_spec({}, {}), "enrich": ParticipantDescriptor.from_spec({}, {})})
    epoch = p.begin("run-1").epoch
    prepare_participant(p, "run-1", Participant(), epoch=epoch)  # 'enrich' waits for a pool slot: no lease
    prepared_at = p.storage.modified(layout.record_path(epoch, "prepared-ingest"))
    long_after = prepared_at + p.config.prepared_timeout_s + p.config.lease_timeout_s + 60

    def run_is(finished: bool | None) -> Callable[[str, str], bool | None]:
        return lambda run_id, dag_id: finished

    report = recover(fast_spec.pipeline(), dry_run=False, now=long_after, run_finished=run_is(False))
    assert [(a.action, a.done) for a in report.actions] == [("wait", False)], report.to_dict()
    assert "['enrich'] not begun yet" in report.actions[0].reason
    assert p.state(epoch) is EpochState.PREPARED

    # 'enrich' starts and prepares: the epoch commits both.
    prepare_participant(p, "run-1", Participant(name="enrich", sinks={"enriched": [b"e1"]}), epoch=epoch)
    p.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    p.commit(epoch)
    assert published(p, "enriched") == {epoch: expected_files([b"e1"])}


def test_a_prepared_epoch_with_a_participant_not_begun_still_times_out_once_its_run_is_not_known_running(
    fast_spec: StoreSpec,
) -> None:
    from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor

    p = fast_spec.pipeline()
    ensure_descriptor(p, dag_id="orders_dag", participants={
        "ingest": ParticipantDescriptor.from_spec({}, {}), "enrich": ParticipantDescriptor.from_spec({}, {})})
    unknown = prepare_participant(p, "run-1", Participant()).epoch
    prepared_at = p.storage.modified(layout.record_path(unknown, "prepared-ingest"))
    late = prepared_at + p.config.prepared_timeout_s + 1
    # No orchestrator to ask (the CLI): the prepared timeout decides, as before.
    report = recover(fast_spec.pipeline(), dry_run=False, now=late)
    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(unknown, "abort-timeout", True)]
    # Its run is finished: aborted at once.
    finished = prepare_participant(p, "run-2", Participant()).epoch
    report = recover(fast_spec.pipeline(), dry_run=False, run_finished=lambda run_id, dag_id: True)
    assert [(a.epoch, a.action, a.done) for a in report.actions] == [(finished, "abort-dead-owner", True)]
