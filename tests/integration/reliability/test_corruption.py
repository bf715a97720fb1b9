"""Damaged files: flip a byte in, truncate, or delete each kind of file the protocol writes.

The world has three committed epochs (incremental key-group chains, so the newest
checkpoint references parts of older ones) and, for the in-flight cases, a fourth epoch
PREPARED. Each case damages one file and then lets the pipeline go on. The outcome must
be the recovery fallback of docs/ARCHITECTURE.md (decision 7), never a silent wrong
restore or a damaged publish:

* ``fallback``: the damage is detected (``verify`` names the file), the restore point is
  rebuilt from the log with exactly the state the intact checkpoint held, and the next
  runs publish every record exactly once;
* ``way-out``: the next run stops with an error that names the file and says what to do;
  nothing is published; after doing it (restore the file from a backup, or abort the
  epoch) the pipeline continues exactly once;
* ``harmless``: the file is not needed to go on (a log record of a committed epoch);
  reading it names the file, and the output stays exactly once.

CI runs every case on the local disk and a slice on S3 (all with ``RELIABILITY_FULL=1``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    CorruptCheckpointError,
    RecoveryError,
)
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.integration.reliability import invariants, report, synthetic
from tests.integration.reliability.conftest import BuiltWorlds, WorldFactory
from tests.integration.reliability.scenarios import _history, consumed_files, drain
from tests.integration.reliability.synthetic import World

FAULTS = ("flip", "truncate", "delete")


def damage(storage: Storage, path: str, fault: str) -> None:
    """Flip one bit in the middle, cut the file in half, or remove it."""
    if fault == "delete":
        storage.delete(path)
        return
    data = bytearray(storage.read(path))
    if fault == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[len(data) // 2 :]
    storage.write_atomic(path, bytes(data))


@dataclass(frozen=True)
class Case:
    kind: str
    outcome: str  #: "fallback", "way-out" or "harmless"
    in_flight: bool = False  #: damage a file of epoch 4 (PREPARED) rather than of epoch 3

    def path(self, world: World) -> str:
        p = world.pipeline()
        if self.in_flight:
            return {
                "begin record": layout.record_path(4, "begin"),
                "prepared record": layout.record_path(4, "prepared-ingest"),
                "staged file": "_staging/epoch=4/attempt=1/a/part-0.txt",
            }[self.kind]
        meta = p.checkpoints.read_metadata(3)
        parts = meta.operators[synthetic.OPERATOR].parts()
        return {
            "_metadata": layout.metadata_path(3),
            "keyed-state part": next(r.path for r in parts if r.epoch == 3),
            "keyed-state base part": next(r.path for r in parts if r.epoch < 3),
            "source-state part": meta.sources[synthetic.SOURCE].chain[-1].path,
            "sink marker": layout.sink_marker_path(3, "a"),
            "source _meta": layout.source_meta_path(3, synthetic.SOURCE),
            "begin record": layout.record_path(3, "begin"),
            "input plan record": layout.record_path(3, f"{synthetic.PLAN_PREFIX}{synthetic.PARTICIPANT}"),
            "prepared record": layout.record_path(3, "prepared-ingest"),
            "decision record": layout.record_path(3, "decision"),
            "committed record": layout.record_path(3, "committed"),
        }[self.kind]


CASES = [
    Case("_metadata", "fallback"),
    Case("source-state part", "fallback"),
    Case("sink marker", "fallback"),
    Case("keyed-state part", "way-out"),
    Case("keyed-state base part", "way-out"),
    Case("source _meta", "fallback"),
    Case("begin record", "harmless"),
    Case("input plan record", "harmless"),
    Case("prepared record", "harmless"),
    Case("decision record", "harmless"),
    Case("committed record", "harmless"),
    Case("begin record", "way-out", in_flight=True),
    Case("prepared record", "way-out", in_flight=True),
    Case("staged file", "way-out", in_flight=True),
]


def matrix() -> list[Any]:
    out = []
    for case in CASES:
        for fault in FAULTS:
            name = f"{'epoch4-' if case.in_flight else ''}{case.kind.replace(' ', '-')}-{fault}"
            out.append(pytest.param(case, fault, id=name))
    return out


#: S3 in CI: one case per outcome and kind of file that S3 stores differently.
S3_SLICE = {
    ("_metadata", "flip"),
    ("keyed-state part", "delete"),
    ("committed record", "delete"),
    ("prepared record", "truncate"),
    ("staged file", "truncate"),
}


def in_s3_slice(test: str, params: dict[str, object]) -> bool:
    case = params["case"]
    assert isinstance(case, Case)
    return (case.kind, params["fault"]) in S3_SLICE


def published_records(world: World) -> dict[str, Counter[str]]:
    out = invariants.published(world)
    return {
        sink: Counter(r for e, entry in by_epoch.items() if e >= 0 for r in entry["records"])
        for sink, by_epoch in out.items()
    }


def assert_exactly_once_from_the_output(world: World) -> None:
    """Exactly once judged from what users read (the log may hold the damaged record)."""
    out = invariants.published(world)
    inputs = Counter(world.input_records())
    for sink, by_epoch in out.items():
        got = Counter(r for e, entry in by_epoch.items() if e >= 0 for r in entry["records"])
        assert got == inputs, f"sink {sink}: lost {sorted(inputs - got)[:5]}, duplicated {sorted(got - inputs)[:5]}"
        for epoch, entry in by_epoch.items():
            assert entry["success"], f"sink {sink} epoch {epoch} has no _SUCCESS"
            assert Counter(entry["records"]) == Counter(out["a"][epoch]["records"]), f"epoch {epoch} differs by sink"
    p = world.pipeline()
    point = p.restore_point()
    state = synthetic.read_state(p, point.operators[synthetic.OPERATOR].chains, point.storage)
    assert {k: v for k, v in state.items() if v} == dict(Counter(synthetic.key_of(r) for r in inputs))


def _committed(world: World) -> None:
    _history(world)
    synthetic.run_dag_run(world, "run-3")
    world.add_input(2)


@pytest.fixture
def committed(make_world: WorldFactory, built_worlds: BuiltWorlds) -> World:
    """Three committed epochs and two new input files: built once per backend, restored for each case."""
    return built_worlds.get(make_world, "committed", _committed)


@pytest.mark.parametrize(("case", "fault"), matrix())
def test_damaged_file_is_detected_and_never_restored_or_published(
    committed: World, make_world: WorldFactory, case: Case, fault: str
) -> None:
    world = committed
    p = world.pipeline()
    if case.in_flight:
        synthetic.stage(world, "run-4", 1)
    good_point = p.restore_point()
    good_state = synthetic.read_state(p, good_point.operators[synthetic.OPERATOR].chains)
    good_sources = good_point.source_entries(synthetic.SOURCE)
    path = case.path(world)
    backup = p.storage.read(path)
    before = published_records(world)
    damage(p.storage, path, fault)
    where = p.storage.describe_path(path)

    if not case.in_flight and case.outcome in ("fallback", "way-out"):
        # The core's contract (docs/ARCHITECTURE.md, decision 7), with a deep restore: the fallback, or the way out.
        assert any(problem.path == where for problem in p.checkpoints.verify(3)), p.checkpoints.verify(3)
        if case.outcome == "fallback":
            point = p.restore_point()
            assert (point.epoch, point.how) == (3, "rebuilt-from-log")
            assert synthetic.read_state(p, point.operators[synthetic.OPERATOR].chains) == good_state
            assert point.source_entries(synthetic.SOURCE) == good_sources
        else:
            with pytest.raises(RecoveryError) as info:
                p.restore_point()
            assert where in str(info.value) and "Way out" in str(info.value), info.value
        # The next DAG run restores like the Spark runner does (``deep=False``: sizes only).
        # It either gets the same fallback, or it fails naming the damaged file (a flipped
        # byte is found only when the part is read), and publishes nothing.
        try:
            how = p.restore_point(deep=False).how
        except (CorruptCheckpointError, RecoveryError):
            how = "nowhere"
        try:
            synthetic.run_dag_run(world, "run-4")
            report.record(
                "corruption",
                backend=world.store_url.split(":")[0],
                file=case.kind,
                fault=fault,
                result=f"next run restored from {how}",
            )
            assert case.outcome == "fallback", "a damaged keyed-state part was restored"
        except (CorruptCheckpointError, RecoveryError) as exc:
            assert where in str(exc), exc
            assert not isinstance(exc, RecoveryError) or "Way out" in str(exc)
            assert published_records(world) == before
            assert synthetic.abort(world, "run-4")["action"] == "aborted"  # the run fails: its abort task
            p.storage.write_atomic(path, backup)  # the way out: restore the file from a backup
            report.record(
                "corruption",
                backend=world.store_url.split(":")[0],
                file=case.kind,
                fault=fault,
                result=f"next run stopped: {type(exc).__name__} naming the file; way out applied",
            )

    if case.in_flight and case.kind == "staged file":
        # The branch verifies the staged output before it lets a commit decision through.
        assert synthetic.decide_and_follow(world, "run-4")["decision"] == "abort"
        assert published_records(world) == before

    elif case.in_flight and case.kind == "prepared record":
        if fault != "delete":
            with pytest.raises(CorruptCheckpointError) as corrupt:
                synthetic.decide_and_follow(world, "run-4")
            assert where in str(corrupt.value)
            assert published_records(world) == before
        # The way out is automatic: recovery aborts the epoch once it is past its timeout.
        synthetic.recover(world, past_timeout=True)
        assert p.state(4).value == "ABORTED"

    elif case.in_flight and case.kind == "begin record":
        if fault != "delete":
            recovery = synthetic.recover(world, past_timeout=True)
            named = [a for a in recovery["actions"] if a["error"]]
            assert named and where in named[0]["error"] and "Way out" in named[0]["reason"], recovery
            with pytest.raises(CheckpointError) as blocked:
                synthetic.stage(world, "run-5", 1)
            assert "epoch 4" in str(blocked.value)
            assert published_records(world) == before
            # The way out: abort the epoch, as `seatunnel-ckpt abort orders 4` does.
            p.abort(4, "begin record damaged", by="operator")
        else:
            # A lost ``begin``: the epoch's age is unknown, so recovery treats it as timed out.
            synthetic.recover(world, past_timeout=True)
        assert p.state(4).value == "ABORTED"

    else:  # harmless: a log record of a committed epoch
        if case.kind in ("decision record", "committed record", "prepared record") and fault != "delete":
            with pytest.raises(CorruptCheckpointError) as corrupt:
                p.status(3)
            assert where in str(corrupt.value)
        if case.kind == "committed record" and fault == "delete":
            # Epoch 3 looks COMMITTING again: no new epoch may begin before it is finished.
            with pytest.raises(CheckpointError, match="COMMITTING"):
                synthetic.stage(world, "run-4", 1)
            synthetic.recover(world, past_timeout=True)

    # The pipeline goes on: recovery, fault-free runs until every input is published, GC.
    synthetic.recover(world, past_timeout=True)
    drain(world)
    assert set(world.input_files()) <= consumed_files(world)
    assert_exactly_once_from_the_output(world)
    if case.outcome != "harmless":
        problems = invariants.check_world(world, drained=True)
        assert not problems, problems
