"""What a stage runtime does around the core, reduced to plain Python for the core tests.

A test epoch stages small files for its sinks, updates a keyed state (``key -> value``,
partitioned into key groups, written as full or delta Arrow parts exactly as the Spark
runtime does), records what it consumed, and prepares. :func:`run_epoch` then decides and
commits. Outcomes are read back from the store with :func:`published` and
:func:`restored_state`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from airflow_seatunnel_ckpt.core import (
    Decision,
    OperatorState,
    Pipeline,
    PreparedRecord,
    RestorePoint,
    layout,
)
from airflow_seatunnel_ckpt.core.models import ExpectationResult, PartRef
from airflow_seatunnel_ckpt.core.sinks.files import OWNER_MARKER
from airflow_seatunnel_ckpt.core.state.checkpoint import (
    TOMBSTONE,
    needs_full,
    read_chain,
    write_arrow_part,
)
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage

T = TypeVar("T")

KEY_GROUPS = 4
OPERATOR = "seen"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])

#: ``key -> new value``, or ``key -> None`` to delete the key.
Changes = Mapping[int, int | None]


def group_of(key: int, key_groups: int = KEY_GROUPS) -> int:
    return key % key_groups


def state_table(state: Mapping[int, int]) -> pa.Table:
    keys = sorted(state)
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([state[k] for k in keys], pa.int64())})


def table_state(table: pa.Table) -> dict[int, int]:
    rows = table.select(["k", "v"]).to_pydict()
    state = dict(zip(rows["k"], rows["v"], strict=True))
    assert len(state) == table.num_rows, "a key appears twice in restored state"
    return state


def delta_table(changes: Changes) -> pa.Table:
    keys = sorted(changes)
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "v": pa.array([changes[k] for k in keys], pa.int64()),
            TOMBSTONE: pa.array([changes[k] is None for k in keys], pa.bool_()),
        }
    )


def read_group(storage: Storage, chain: list[PartRef]) -> dict[int, int]:
    return table_state(read_chain(storage, chain, ["k"]))


def write_keyed_state(
    storage: Storage,
    epoch: int,
    attempt: int,
    base: OperatorState | None,
    base_storage: Storage | None,
    changes: Changes,
    *,
    incremental: bool = True,
    interval: int = 10,
    key_groups: int = KEY_GROUPS,
    operator: str = OPERATOR,
) -> OperatorState:
    """Write the parts of one epoch's keyed state; unchanged key groups keep their chains."""
    chains: dict[int, list[PartRef]] = {k: list(v) for k, v in (base.chains if base else {}).items()}
    by_group: dict[int, dict[int, int | None]] = {}
    for key, value in changes.items():
        by_group.setdefault(group_of(key, key_groups), {})[key] = value
    for group, group_changes in sorted(by_group.items()):
        chain = chains.get(group, [])
        path = layout.part_path(epoch, "operators", operator, group, attempt)
        if needs_full(chain, incremental, interval):
            current = read_group(base_storage or storage, chain) if chain else {}
            for key, value in group_changes.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            ref = write_arrow_part(storage, path, state_table(current), epoch=epoch, key_group=group)
            chains[group] = [ref]
        else:
            ref = write_arrow_part(
                storage,
                path,
                delta_table(group_changes),
                epoch=epoch,
                key_group=group,
                delta=True,
                base_epoch=chain[-1].epoch,
            )
            chains[group] = [*chain, ref]
    return OperatorState(key_groups, ["k"], chains, "key_value")


def restored_state(point: RestorePoint, operator: str = OPERATOR) -> dict[int, int]:
    """The whole keyed state a restore point gives back."""
    op = point.operators.get(operator)
    if op is None:
        return {}
    assert point.storage is not None
    state: dict[int, int] = {}
    for chain in op.chains.values():
        state.update(read_group(point.storage, chain))
    return state


@dataclass
class Participant:
    """One stage of the epoch: the sinks it writes, its keyed state and what it reads."""

    name: str = "ingest"
    sinks: dict[str, list[bytes]] = field(default_factory=lambda: {"orders": [b"o1", b"o22"]})
    changes: dict[int, int | None] | None = None
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The expectations' measured counts each sink's manifest records (by sink).
    expectations: dict[str, tuple[ExpectationResult, ...]] = field(default_factory=dict)


def target_url(pipeline: Pipeline, sink: str) -> str:
    """Where ``sink`` publishes: ``targets/<pipeline>/<sink>`` next to the store."""
    store_url = pipeline.storage.url.rsplit("/", 2)[0]
    return f"{store_url}/targets/{pipeline.name}/{sink}"


def stage(pipeline: Pipeline, epoch: int, attempt: int, sink: str, blobs: list[bytes]) -> None:
    for i, blob in enumerate(blobs):
        pipeline.storage.write_atomic(f"{pipeline.staging_path(epoch, attempt, sink)}/part-{i:05d}.bin", blob)


def prepare_participant(
    pipeline: Pipeline,
    run_id: str,
    participant: Participant,
    *,
    attempt: int = 1,
    base: RestorePoint | None = None,
    epoch: int | None = None,
) -> PreparedRecord:
    """Stage, write state parts and prepare one participant of ``run_id``'s epoch."""
    if epoch is None:
        epoch = pipeline.begin(run_id).epoch
    base = base if base is not None else pipeline.restore_point()
    manifests = []
    for sink, blobs in participant.sinks.items():
        stage(pipeline, epoch, attempt, sink, blobs)
        manifest = pipeline.manifest_for_staged(epoch, attempt, sink, target_url(pipeline, sink), len(blobs))
        manifests.append(dataclasses.replace(manifest, expectations=participant.expectations.get(sink, ())))
    operators = {}
    if participant.changes is not None:
        operators[OPERATOR] = write_keyed_state(
            pipeline.storage,
            epoch,
            attempt,
            base.operators.get(OPERATOR),
            base.storage,
            participant.changes,
            incremental=pipeline.config.incremental,
            interval=pipeline.config.full_checkpoint_interval,
        )
    return pipeline.prepare(
        epoch,
        participant.name,
        attempt,
        run_id=run_id,
        sinks=manifests,
        operators=operators,
        sources=participant.sources,
        base=base,
    )


def run_epoch(pipeline: Pipeline, run_id: str, *participants: Participant, attempt: int = 1) -> int:
    """A whole successful epoch: prepare every participant, decide commit, commit."""
    parts = participants or (Participant(),)
    epoch = pipeline.begin(run_id).epoch
    base = pipeline.restore_point()
    for participant in parts:
        prepare_participant(pipeline, run_id, participant, attempt=attempt, base=base, epoch=epoch)
    decision = pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    assert decision.decision is Decision.COMMIT
    pipeline.commit(epoch)
    return epoch


def published(pipeline: Pipeline, sink: str) -> dict[int, dict[str, bytes]]:
    """``epoch -> {file: bytes}`` of everything published for ``sink`` (``_SUCCESS`` excluded)."""
    target = open_storage(target_url(pipeline, sink), pipeline.storage.storage_options)
    out: dict[int, dict[str, bytes]] = {}
    for name in target.list_dir(""):
        if name == OWNER_MARKER:
            continue
        epoch = layout.parse_staging_epoch(name)
        assert epoch is not None, f"unexpected entry {name!r} in the target of {sink}"
        files = {f.path: target.read(f"{name}/{f.path}") for f in target.walk(name) if f.path != layout.SUCCESS}
        out[epoch] = files
    return out


def success_marker(pipeline: Pipeline, sink: str, epoch: int) -> bool:
    target = open_storage(target_url(pipeline, sink), pipeline.storage.storage_options)
    return target.exists(f"{layout.published_dir(epoch)}/{layout.SUCCESS}")


def expected_files(blobs: list[bytes]) -> dict[str, bytes]:
    return {f"part-{i:05d}.bin": blob for i, blob in enumerate(blobs)}


def staging_left(pipeline: Pipeline) -> list[str]:
    return [f.path for f in pipeline.storage.walk(layout.STAGING, include_temp=True)]


def records(pipeline: Pipeline, epoch: int) -> list[str]:
    return pipeline.storage.list_dir(layout.txlog_dir(epoch))


def flip_byte(storage: Storage, path: str, position: int | None = None) -> None:
    """Damage a stored file without changing its size (default: its middle byte)."""
    data = bytearray(storage.read(path))
    data[len(data) // 2 if position is None else position] ^= 0xFF
    storage.write_atomic(path, bytes(data))


def snapshot(root: Storage) -> dict[str, bytes]:
    """Every file below ``root`` (temp files too) with its content."""
    return {f.path: root.read(f.path) for f in root.walk("", include_temp=True)}


def at_once(calls: Sequence[Callable[[], T]]) -> list[T | BaseException]:
    """Run every call in its own thread, released together; each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[T | BaseException] = [RuntimeError("did not finish")] * len(calls)

    def run(i: int, call: Callable[[], T]) -> None:
        barrier.wait()
        try:
            outcomes[i] = call()
        except BaseException as exc:  # handed to the test, which asserts on it
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes
