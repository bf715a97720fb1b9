"""The commit decision reads what is new in its epoch and trusts what committed checkpoints verified.

An epoch's ``_metadata`` lists every part of the state, most of them written by earlier
epochs (unchanged key groups, the full part and older deltas of a chain). Those were read
and checked by the decision of the epoch that wrote them and are listed, with size and
CRC32C, in the committed ``_metadata`` the new epoch built on: the decision does not read
them again. A part at such a path with another recorded checksum is new bytes and is read.
The deep ``verify`` (CLI, ``decide(..., verify_all=True)``) still reads every part.
"""

from __future__ import annotations

import dataclasses

import pytest

from airflow_seatunnel_ckpt.core import Decision, Pipeline
from airflow_seatunnel_ckpt.core.errors import NotPreparedError
from airflow_seatunnel_ckpt.core.models import OperatorState
from tests.core.conftest import StoreSpec
from tests.core.epochs import (
    OPERATOR,
    Participant,
    flip_byte,
    prepare_participant,
    restored_state,
    run_epoch,
    stage,
    target_url,
)


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs only cost time here (no power cuts are simulated)."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


def _first_epoch(spec: StoreSpec) -> tuple[Pipeline, OperatorState]:
    p = spec.pipeline()
    epoch = run_epoch(p, "run-1", Participant(changes={0: 10, 1: 11, 2: 12, 3: 13}))
    return p, p.checkpoints.read_metadata(epoch).operators[OPERATOR]


def test_decide_does_not_reread_parts_a_committed_checkpoint_verified(fast_spec: StoreSpec) -> None:
    p, base = _first_epoch(fast_spec)
    # Epoch 2 changes key group 1 only: groups 0, 2, 3 keep epoch 1's parts.
    record = prepare_participant(p, "run-2", Participant(changes={5: 15}))
    untouched = base.chains[0][0]
    assert record.operators[OPERATOR].chains[0] == [untouched]
    # Damage (same size) an old part only the deep verify reads: the default decision
    # does not read it -- which is what makes its cost follow the epoch, not the history.
    flip_byte(p.storage, untouched.path)
    with pytest.raises(NotPreparedError, match=untouched.path.rsplit("/", 1)[-1]):
        p.decide(record.epoch, Decision.COMMIT, "ok", by="test", verify_all=True)
    assert p.txlog.read_decision(record.epoch) is None
    decision = p.decide(record.epoch, Decision.COMMIT, "ok", by="test")
    assert decision.decision is Decision.COMMIT
    # The deep verify of the new checkpoint still finds the damaged part by name.
    problems = p.checkpoints.verify(record.epoch, deep=True)
    assert [x.path for x in problems] == [p.storage.describe_path(untouched.path)]


def test_decide_reads_a_part_whose_checksum_differs_from_the_committed_metadata(fast_spec: StoreSpec) -> None:
    p, base = _first_epoch(fast_spec)
    epoch = p.begin("run-2").epoch
    point = p.restore_point()
    # The new record names epoch 1's part of key group 0 with another CRC32C (the bytes
    # on the store did not change): the same path is not the same part, so the decision
    # reads it and finds that the bytes are not the ones the record names.
    old = base.chains[0][0]
    chains = {**base.chains, 0: [dataclasses.replace(old, crc32c=old.crc32c ^ 0x1)]}
    stage(p, epoch, 1, "orders", [b"o1"])
    manifest = p.manifest_for_staged(epoch, 1, "orders", target_url(p, "orders"), 1)
    p.prepare(epoch, "ingest", 1, run_id="run-2", sinks=[manifest],
              operators={OPERATOR: dataclasses.replace(base, chains=chains)}, base=point)
    with pytest.raises(NotPreparedError, match="checksum"):
        p.decide(epoch, Decision.COMMIT, "ok", by="test")
    assert p.txlog.read_decision(epoch) is None


def test_decide_still_reads_every_new_part_of_the_epoch(fast_spec: StoreSpec) -> None:
    p, _ = _first_epoch(fast_spec)
    record = prepare_participant(p, "run-2", Participant(changes={5: 15}))
    new = record.operators[OPERATOR].chains[1][-1]
    assert new.epoch == record.epoch
    flip_byte(p.storage, new.path)
    with pytest.raises(NotPreparedError, match="checksum"):
        p.decide(record.epoch, Decision.COMMIT, "ok", by="test")


def test_trusting_verified_parts_keeps_the_restored_state_exact(fast_spec: StoreSpec) -> None:
    p, _ = _first_epoch(fast_spec)
    expected = {0: 10, 1: 11, 2: 12, 3: 13}
    for i in range(2, 14):  # past full_checkpoint_interval: chains restart with full parts
        run_epoch(p, f"run-{i}", Participant(changes={i: i * 100, 0: None} if i == 5 else {i: i * 100}))
        expected[i] = i * 100
        if i == 5:
            expected.pop(0)
    newest = p.last_committed_epoch()
    assert newest is not None and p.checkpoints.verify(newest, deep=True) == []
    assert restored_state(p.restore_point()) == expected


def test_decide_checks_new_parts_without_decompressing_them(
        fast_spec: StoreSpec, decompressed: list[str]) -> None:
    """The decision reads each new part and checks its CRC32C and frame (a CRC32C pass);
    decompressing it (zstd, ~20 times the cost) is left to ``verify_all`` and restores."""
    p, _ = _first_epoch(fast_spec)
    record = prepare_participant(p, "run-2", Participant(changes={5: 15, 6: 16}))
    new = {part.path for chain in record.operators[OPERATOR].chains.values() for part in chain
           if part.epoch == record.epoch}
    assert new
    assert p.decide(record.epoch, Decision.COMMIT, "ok", by="test").decision is Decision.COMMIT
    assert not [path for path in decompressed if any(path.endswith(part) for part in new)]
    decompressed.clear()
    assert p.checkpoints.verify(record.epoch, deep=True) == []
    assert [path for path in decompressed if any(path.endswith(part) for part in new)]
