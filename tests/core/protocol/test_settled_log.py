"""The settled watermark: recovery, retention and restore cost O(open epochs), not O(all epochs).

Histories of thousands of finished epochs are written record by record (``begin``,
``decision``, ``committed``/``aborted``, ``retired``) exactly as the protocol leaves them,
so a test builds one in a second; the newest epochs are real ones with checkpoints and
published output. Store calls are counted on the ``Storage`` class (every backend goes
through it); tests assert the counts, never timings.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, RestorePoint, RestoreSource, codec, layout
from airflow_seatunnel_ckpt.core.errors import RecoveryError
from airflow_seatunnel_ckpt.core.models import BeginRecord, DecisionRecord
from airflow_seatunnel_ckpt.core.protocol import settled
from airflow_seatunnel_ckpt.core.protocol.settled import KEEP_VERSIONS, MIN_ADVANCE
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX, Storage, open_storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, at_once, flip_byte, prepare_participant, published, target_url

EMPTY_POINT = RestorePoint(None, RestoreSource.EMPTY)
LATER = 10 * 24 * 3600.0


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


@pytest.fixture
def settle_every_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Advance the watermark by any number of epochs (not in batches of MIN_ADVANCE)."""
    monkeypatch.setattr(settled, "MIN_ADVANCE", 1)


def _backends(cls: type[Storage]) -> list[type[Storage]]:
    return [cls] + [sub for child in cls.__subclasses__() for sub in _backends(child)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts of the store calls every backend makes (a backend's own overrides included)."""
    counts: Counter[str] = Counter()
    inside: set[str] = set()  # an override that calls its base's method is one call, not two
    for cls in _backends(Storage):
        for name in ("list_dir", "read", "exists", "walk", "create_exclusive"):
            if name not in vars(cls):
                continue
            original = vars(cls)[name]

            def counted(self: Storage, *args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
                if _name in inside:
                    return _original(self, *args, **kw)
                counts[_name] += 1
                inside.add(_name)
                try:
                    return _original(self, *args, **kw)
                finally:
                    inside.discard(_name)

            monkeypatch.setattr(cls, name, counted)
    yield counts


def write_record(p: Pipeline, epoch: int, name: str, payload: dict[str, Any]) -> None:
    p.storage.create_exclusive(layout.record_path(epoch, name), codec.encode_json(payload))


def settled_history(p: Pipeline, count: int, aborted_every: int = 7, retired: bool = True) -> None:
    """Epochs 1..count, final: every ``aborted_every``-th aborted, the others committed (and retired)."""
    for epoch in range(1, count + 1):
        write_record(p, epoch, "begin", BeginRecord(epoch, f"run-{epoch}", 1.0).to_dict())
        commit = epoch % aborted_every != 0
        decision = Decision.COMMIT if commit else Decision.ABORT
        write_record(p, epoch, "decision", DecisionRecord(epoch, decision, "history", "test", 1.0).to_dict())
        if commit:
            write_record(p, epoch, "committed", {"type": "committed", "epoch": epoch, "at": 1.0, "published": []})
            if retired:
                write_record(p, epoch, "retired", {"type": "retired", "epoch": epoch, "at": 1.0})
        else:
            write_record(p, epoch, "aborted", {"type": "aborted", "epoch": epoch, "at": 1.0})


def real_epoch(p: Pipeline, run_id: str, commit: bool = True, participant: Participant | None = None) -> int:
    """A real epoch with a checkpoint and published output; decided but left COMMITTING if not ``commit``."""
    epoch = p.begin(run_id).epoch
    prepare_participant(p, run_id, participant or Participant(), base=EMPTY_POINT, epoch=epoch)
    p.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    if commit:
        p.commit(epoch)
    return epoch


def history_size(spec: StoreSpec) -> int:
    """Thousands of epochs on disk; fewer in memory, whose every listing scans the whole store."""
    return 2000 if spec.backend == "file" else 500


def newest_settled(p: Pipeline) -> int:
    return p.txlog.settled.read().record.watermark


# -- cost --------------------------------------------------------------------------------


def test_recovery_and_retention_read_only_the_epochs_above_the_watermark(
        fast_spec: StoreSpec, calls: Counter[str]) -> None:
    p = fast_spec.pipeline(max_retain=2)
    settled_history(p, history_size(fast_spec))
    real = [real_epoch(p, f"real-{i}") for i in range(3)]
    p.recover(dry_run=False)  # the first run lists every epoch once and settles them
    open_epoch = p.begin("open-run").epoch

    calls.clear()
    report = fast_spec.pipeline(max_retain=2).recover(dry_run=False)
    recovery_calls = dict(calls)
    calls.clear()
    retention = fast_spec.pipeline(max_retain=2).retain()
    retention_calls = dict(calls)

    assert [(a.epoch, str(a.action)) for a in report.actions] == [(open_epoch, "wait")]
    # Thousands of settled epochs, yet a handful of calls: the settled and _txlog listings, the
    # newest settled version, the open epoch, staging, checkpoints.
    assert recovery_calls.get("list_dir", 0) <= 8, recovery_calls
    assert recovery_calls.get("read", 0) + recovery_calls.get("exists", 0) <= 8, recovery_calls
    assert retention.kept == real[-2:]
    assert retention.removed_checkpoints == [real[0]]
    # Retention reads the kept checkpoints and the retired one, not the 2,000 older epochs.
    assert retention_calls.get("list_dir", 0) <= 10, retention_calls
    assert retention_calls.get("read", 0) + retention_calls.get("exists", 0) <= 12, retention_calls
    assert newest_settled(p) == real[-1]


def test_restore_and_last_committed_read_only_the_epochs_above_the_watermark(
        fast_spec: StoreSpec, calls: Counter[str]) -> None:
    p = fast_spec.pipeline()
    history = history_size(fast_spec)
    settled_history(p, history)
    newest = real_epoch(p, "real")
    p.recover(dry_run=False)

    calls.clear()
    assert p.last_committed_epoch() == newest
    point = p.restore_point()
    assert point.epoch == newest and point.how is RestoreSource.PRIMARY
    assert calls.get("list_dir", 0) <= 10, dict(calls)
    calls.clear()
    assert p.committed_epochs()[-2:] == [history - 1 if history % 7 == 0 else history, newest]
    assert calls.get("list_dir", 0) <= 4 and calls.get("read", 0) <= 2, dict(calls)


def test_restore_fallback_reads_each_committed_record_once(fast_spec: StoreSpec, calls: Counter[str]) -> None:
    """Newest checkpoint and its log damaged, no older checkpoint intact, nothing published in
    between: the search back through 300 committed epochs is linear, not 300 x 300 reads."""
    p = fast_spec.pipeline()
    settled_history(p, 300, aborted_every=10**9, retired=False)  # committed, checkpoints gone
    newest = real_epoch(p, "real", participant=Participant(sinks={}))
    flip_byte(p.storage, layout.metadata_path(newest))
    flip_byte(p.storage, layout.record_path(newest, "prepared-ingest"))  # no rebuild from the log
    p.recover(dry_run=False)

    calls.clear()
    with pytest.raises(RecoveryError, match="without risking duplicates"):
        p.restore_point()
    assert calls["read"] < 3 * 300, dict(calls)


# -- safety ------------------------------------------------------------------------------


@pytest.mark.usefixtures("settle_every_epoch")
def test_open_and_late_decided_epochs_are_never_covered_by_the_watermark(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    settled_history(p, 20)
    committing = real_epoch(p, "committing", commit=False)  # decided commit, not published
    p.recover(dry_run=True)
    assert newest_settled(p) == 0  # a dry run writes nothing

    p.txlog.settled.advance(*p.txlog.view())
    assert newest_settled(p) == 20  # stops below the COMMITTING epoch
    assert p.txlog.states()[committing] is EpochState.COMMITTING

    p.recover(dry_run=False)  # publishes it, reads it again, settles it
    assert p.state(committing) is EpochState.COMMITTED
    assert newest_settled(p) == committing
    open_epoch = p.begin("late").epoch
    p.recover(dry_run=False)
    assert newest_settled(p) == committing
    assert p.txlog.states()[open_epoch] is EpochState.OPEN
    assert open_epoch not in p.txlog.settled.read().record.states()

    # Decided late (aborted after the watermark moved): reported as it is, then settled.
    p.abort(open_epoch, "its run is dead", by="test")
    assert p.txlog.states()[open_epoch] is EpochState.ABORTED
    p.recover(dry_run=False)
    assert newest_settled(p) == open_epoch
    assert p.txlog.settled.read().record.states()[open_epoch] is EpochState.ABORTED


@pytest.mark.usefixtures("settle_every_epoch")
def test_an_aborting_epoch_stops_the_watermark_though_later_ones_committed(fast_spec: StoreSpec) -> None:
    """A new epoch may begin while an older one is ABORTING; the watermark must not jump it."""
    p = fast_spec.pipeline()
    settled_history(p, 5)
    write_record(p, 6, "begin", BeginRecord(6, "run-6", 1.0).to_dict())
    write_record(p, 6, "decision", DecisionRecord(6, Decision.ABORT, "dead", "test", 1.0).to_dict())
    later = real_epoch(p, "after-aborting")

    p.txlog.settled.advance(*p.txlog.view())

    assert newest_settled(p) == 5
    assert p.txlog.states()[6] is EpochState.ABORTING
    assert p.txlog.states()[later] is EpochState.COMMITTED


@pytest.mark.usefixtures("settle_every_epoch")
def test_a_damaged_newest_settled_record_falls_back_and_loses_nothing(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    settled_history(p, 50)
    p.txlog.settled.advance(*p.txlog.view())
    newest = real_epoch(p, "real")
    p.recover(dry_run=False)
    versions = p.txlog.settled.versions()
    assert len(versions) == 2 and newest_settled(p) == newest
    flip_byte(p.storage, layout.settled_path(versions[-1]))
    committed = [e for e in range(1, 51) if e % 7] + [newest]

    seen = p.txlog.settled.read()
    assert seen.record.version == versions[0] and seen.record.watermark == 50
    assert [exc.path for exc in seen.damaged] == [p.storage.describe_path(layout.settled_path(versions[-1]))]
    assert p.committed_epochs() == committed
    assert p.last_committed_epoch() == newest
    assert p.restore_point().epoch == newest
    # The next run writes a newer version above the damaged one.
    p.begin("next")
    p.recover(dry_run=False)
    assert p.txlog.settled.read().record.version == versions[-1] + 1
    assert p.committed_epochs() == committed


def test_every_settled_record_damaged_falls_back_to_a_full_listing(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    settled_history(p, 30)
    p.txlog.settled.advance(*p.txlog.view())
    (version,) = p.txlog.settled.versions()
    p.storage.write_atomic(layout.settled_path(version), codec.encode_json(
        {"type": "settled", "version": version, "watermark": 30, "committed": [[1, 40]], "aborted": []}))

    seen = p.txlog.settled.read()
    assert seen.record.watermark == 0
    assert "committed range [1, 40]" in str(seen.damaged[0])
    assert p.committed_epochs() == [e for e in range(1, 31) if e % 7]


def test_concurrent_recoveries_advance_the_watermark_consistently(store_spec: StoreSpec) -> None:
    p = store_spec.pipeline()
    settled_history(p, 40)  # a settled past (on S3 each record is a conditional PUT)
    p.txlog.settled.advance(*p.txlog.view())  # v1 at 40
    for epoch in range(41, 81):  # 40 more, settled by the racing runs
        write_record(p, epoch, "begin", BeginRecord(epoch, f"run-{epoch}", 1.0).to_dict())
        write_record(p, epoch, "decision", DecisionRecord(epoch, Decision.ABORT, "x", "test", 1.0).to_dict())
        write_record(p, epoch, "aborted", {"type": "aborted", "epoch": epoch, "at": 1.0})

    outcomes = at_once([lambda: store_spec.pipeline().recover(dry_run=False) for _ in range(4)])

    assert not [o for o in outcomes if isinstance(o, BaseException)]
    record = p.txlog.settled.read().record
    assert record.watermark == 80
    truth = {e: p.state(e) for e in range(1, 81)}
    assert record.states() == truth  # no epoch skipped, none misfiled
    assert len(p.txlog.settled.versions()) <= KEEP_VERSIONS


def test_an_epoch_below_the_watermark_is_never_reported_open_or_unknown(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    settled_history(p, 30)
    newest = real_epoch(p, "real")
    p.recover(dry_run=False)

    report = p.recover(dry_run=False, now=time.time() + LATER)

    assert report.actions == []
    assert set(p.txlog.states()) == set(range(1, newest + 1))
    assert all(s.final for s in p.txlog.states().values())
    assert published(p, "orders")[newest]


def test_recovery_writes_no_settled_version_for_fewer_than_min_advance_new_final_epochs(
        fast_spec: StoreSpec) -> None:
    """Advances are batched: a small store, or a run that finished one epoch, writes nothing."""
    p = fast_spec.pipeline()
    settled_history(p, MIN_ADVANCE - 1)
    p.recover(dry_run=False)
    assert p.txlog.settled.versions() == []
    real_epoch(p, "real")  # now MIN_ADVANCE final epochs above watermark 0
    p.recover(dry_run=False)
    assert newest_settled(p) == MIN_ADVANCE


def test_verify_names_a_damaged_settled_record(fast_spec: StoreSpec, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_seatunnel_ckpt import cli

    p = fast_spec.pipeline()
    settled_history(p, 10)
    p.txlog.settled.advance(*p.txlog.view())
    (version,) = p.txlog.settled.versions()
    flip_byte(p.storage, layout.settled_path(version))

    code = cli.main(["--store", fast_spec.sub_url("store"), "verify", p.name, "--last", "1"])

    out = capsys.readouterr().out
    assert code == 1
    assert layout.settled_path(version) in out and "settled record" in out


def test_recovery_on_a_local_store_does_not_walk_the_settled_history(
        local_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp-file sweep walks everything but settled epoch directories."""
    from airflow_seatunnel_ckpt.core.storage.local import LocalStorage

    p = local_spec.pipeline()
    settled_history(p, 300)
    real_epoch(p, "real")
    p.recover(dry_run=False)
    debris = f"{layout.STAGING}/{TEMP_PREFIX}debris"
    p.storage.write_atomic(f"{layout.STAGING}/keep", b"x")
    with open(p.storage.full_path(debris), "wb") as fh:
        fh.write(b"x")
    walked: list[str] = []
    walk = LocalStorage.walk

    def recording(self: Storage, path: str = "", include_temp: bool = False) -> Any:
        walked.append(path)
        return walk(self, path, include_temp)

    monkeypatch.setattr(LocalStorage, "walk", recording)

    report = p.recover(dry_run=False, now=time.time() + LATER)

    assert [(a.action, a.done) for a in report.actions if a.action == "drop-temp"] == [("drop-temp", True)]
    assert not p.storage.exists(debris)
    assert "" not in walked and not [w for w in walked if w.startswith(f"{layout.TXLOG}/epoch-")], walked


def count_store_calls(monkeypatch: pytest.MonkeyPatch, names_listed: bool = False) -> Counter[str]:
    """Counts of every public store call, whichever backend makes it (from now until the test ends);
    ``names_listed``: also ``names listed``, the names the listings returned."""
    counts: Counter[str] = Counter()
    for cls in _backends(Storage):
        for name, original in list(vars(cls).items()):
            if name.startswith("_") or not callable(original):
                continue

            def counted(self: Storage, *args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
                counts[_name] += 1
                result = _original(self, *args, **kw)
                if names_listed and _name == "list_dir":
                    counts["names listed"] += len(result)
                return result

            monkeypatch.setattr(cls, name, counted)
    return counts


@pytest.fixture
def every_call(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of every public store call, whichever backend makes it."""
    return count_store_calls(monkeypatch)


def steady_state_recovery_calls(spec: StoreSpec, epochs: int, counts: Counter[str]) -> dict[str, int]:
    """The store calls of a recovery run once ``epochs`` real epochs are committed and settled."""
    p = spec.pipeline()
    for i in range(epochs):
        real_epoch(p, f"run-{i}")
    p.recover(dry_run=False)  # settles them all (and sweeps each once)
    assert newest_settled(p) == epochs
    counts.clear()
    report = spec.pipeline().recover(dry_run=False)
    assert report.actions == []
    return dict(counts)


def test_a_steady_state_recovery_makes_as_many_store_calls_at_200_epochs_as_at_25(
        make_local_spec: Callable[[], StoreSpec], every_call: Counter[str]) -> None:
    """Nothing of a settled epoch is looked at again: not its log, its checkpoint nor its run's index.

    Before, the temp-file sweep walked every checkpoint directory and the whole run index
    on every run: one walk per epoch (53 walks at 50 epochs, 403 at 400).
    """
    small = steady_state_recovery_calls(make_local_spec(), 25, every_call)
    large = steady_state_recovery_calls(make_local_spec(), 200, every_call)

    assert large == small, (small, large)
    assert sum(small.values()) <= 20, small


@pytest.mark.parametrize("run", ["recovery", "retention"])
def test_settling_removes_what_killed_writers_left_in_the_epochs_it_covers(
        local_spec: StoreSpec, settle_every_epoch: None, run: str) -> None:
    """Below the watermark nobody looks again: temp files there are swept before it covers them.

    A record write killed before its link leaves ``.tmp-*`` in the epoch's log directory; a
    first claim of a sink killed the same way leaves one at the sink's root. Before, an
    epoch settled with them (retention settles without any sweep; recovery swept only
    directories above the watermark, never sink roots), and they stayed forever.
    """
    import os

    p = local_spec.pipeline()
    epochs = [real_epoch(p, f"run-{i}") for i in range(3)]
    sink_root = open_storage(target_url(p, "orders"), p.storage.storage_options)
    stale = time.time() - 2 * p.config.prepared_timeout_s
    killed_record = f"{layout.txlog_dir(epochs[0])}/{TEMP_PREFIX}killed-record"
    killed_claim = f"{TEMP_PREFIX}killed-claim"
    in_flight = f"{layout.txlog_dir(epochs[2])}/{TEMP_PREFIX}in-flight"
    for storage, path, mtime in ((p.storage, killed_record, stale), (sink_root, killed_claim, stale),
                                 (p.storage, in_flight, time.time())):
        with open(storage.full_path(path), "wb") as fh:
            fh.write(b"half a record")
        os.utime(storage.full_path(path), (mtime, mtime))

    def settle() -> list[str]:
        if run == "recovery":
            report = p.recover(dry_run=False)
            return [a.reason.split(" is a temp file")[0] for a in report.actions if a.action == "drop-temp"]
        return p.retain().removed_temp_files

    removed = settle()
    assert not os.path.exists(p.storage.full_path(killed_record))
    assert not os.path.exists(sink_root.full_path(killed_claim))
    assert len(removed) == 2 and any("killed-claim" in r for r in removed), removed
    # Epoch 3 still holds a temp file younger than the timeout (its writer may be finishing):
    # the watermark stops before it, and the file stays.
    assert newest_settled(p) == epochs[1]
    assert os.path.exists(p.storage.full_path(in_flight))
    os.utime(p.storage.full_path(in_flight), (stale, stale))
    settle()
    assert not os.path.exists(p.storage.full_path(in_flight))
    assert newest_settled(p) == epochs[2]
    assert published(p, "orders").keys() == set(epochs)


def test_recovery_removes_a_killed_claims_temp_file_from_the_root_of_a_sink(local_spec: StoreSpec) -> None:
    """Epochs above the watermark too: a killed first claim's temp file at a sink root is swept."""
    import os

    p = local_spec.pipeline()
    epochs = [real_epoch(p, f"run-{i}") for i in range(2)]
    sink_root = open_storage(target_url(p, "orders"), p.storage.storage_options)
    killed_claim = sink_root.full_path(f"{TEMP_PREFIX}killed-claim")
    with open(killed_claim, "wb") as fh:
        fh.write(b"{")

    assert p.recover(dry_run=False).actions == []  # younger than the timeout: a claim may be in flight
    assert os.path.exists(killed_claim)
    report = p.recover(dry_run=False, now=time.time() + LATER)
    assert [(a.action, a.done) for a in report.actions] == [("drop-temp", True)]
    assert "killed-claim" in report.actions[0].reason
    assert not os.path.exists(killed_claim)
    assert newest_settled(p) == 0 and published(p, "orders").keys() == set(epochs)


def test_a_settled_record_as_the_previous_release_wrote_it_reads_and_a_bad_one_is_named(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    written = {"type": "settled", "version": 3, "watermark": 5, "committed": [[1, 2], [5, 5]],
               "aborted": [[3, 4]], "created_at": 1767225600}  # an integer time, as JSON may hold it
    p.storage.write_atomic(layout.settled_path(3), codec.encode_json(written))
    record = p.txlog.settled.read().record
    assert (record.version, record.watermark, record.created_at) == (3, 5, 1767225600.0)
    assert record.states() == {1: EpochState.COMMITTED, 2: EpochState.COMMITTED, 3: EpochState.ABORTED,
                               4: EpochState.ABORTED, 5: EpochState.COMMITTED}
    assert codec.decode_json(codec.encode_json(record.to_dict()), "x") == {**written, "created_at": 1767225600.0}
    for bad, why in [({**written, "version": 2}, "says version 2 but its file name says 3"),
                     ({**written, "aborted": [[2, 4]]}, "both committed and aborted"),
                     ({**written, "watermark": -1}, "watermark"),
                     ({**written, "committed": [[1, "2"]]}, "committed")]:
        p.storage.write_atomic(layout.settled_path(3), codec.encode_json(bad))
        seen = p.txlog.settled.read()
        assert seen.record.watermark == 0, bad
        assert why in str(seen.damaged[0]) and "Nothing is lost" in str(seen.damaged[0]), str(seen.damaged[0])
