"""A synthetic pipeline on the core: the same store writes a PySpark stage makes, minus Spark.

One DAG run of the pipeline is the standard task shape, and each task is one function
here, so a test can run any of them in a child process and kill it there:

* :func:`stage` -- the stage task (prepare): ``begin``, restore, fix the input plan
  (write-once, as the Spark runner does), read only new input,
  update keyed state, stage two sinks into attempt staging, write the key-group parts,
  ``prepare``. Like :class:`SparkStageOperator` it returns the already prepared record
  when the participant is prepared, and a fenced attempt reports the winner.
* :func:`decide` -- the branch task (``Pipeline.decide``, abort when commit is refused)
* :func:`commit` -- the commit task, :func:`abort` -- the abort task (rolls a commit
  decision forward, like :class:`AbortEpochOperator`)
* :func:`recover`, :func:`retain` -- the recovery DAG's tasks

Input is a directory of small text files of record ids (``<file>:<n>``). The stage
consumes at most ``max_files`` new files per epoch, counts records per key (5 keys in 2
key groups, JSON state parts in full/delta chains) and writes every record to sink
``a`` (two files, split by parity) and ``b`` (one file), each line tagged with the
attempt that staged it, so a test can prove that only the winning attempt's output was
published and that both sinks of an epoch hold the same records.

Hook for the Spark variant: :func:`stage` runs ``STAGES[world.stage_kind]``. A
``"spark"`` entry that runs ``airflow_seatunnel_ckpt.spark.run_stage`` with the same
sources and sinks (and worlds made with ``stage_kind="spark"``) plugs into every crash,
concurrency and schedule test unchanged: the invariants read only the store and the
published output.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core import (
    CheckpointStore,
    Decision,
    OperatorState,
    Pipeline,
    codec,
    layout,
)
from airflow_seatunnel_ckpt.core.errors import (
    AlreadyExistsError,
    CorruptCheckpointError,
    DecisionConflictError,
    FencedAttemptError,
    NotPreparedError,
)
from airflow_seatunnel_ckpt.core.models import EpochState, PartRef
from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint
from airflow_seatunnel_ckpt.core.state.checkpoint import needs_full, read_json_part, write_json_part
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage

PIPELINE = "orders"
PARTICIPANT = "ingest"
SOURCE = "in"
OPERATOR = "counts"
SINKS = ("a", "b")
KEYS = 5
KEY_GROUPS = 2
#: Name prefix of the Spark runner's write-once input plan record (``spark/runner.py``).
PLAN_PREFIX = "plan-"


@dataclass(frozen=True)
class World:
    """Where one test's pipeline lives: store, sink targets and input (picklable)."""

    store_url: str
    target_url: str  #: sinks publish to ``<target_url>/<sink>/epoch=<e>/``
    input_dir: str  #: local directory of input files
    storage_options: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    max_files: int = 3
    #: Which entry of :data:`STAGES` runs the stage task (``"synthetic"``; ``"spark"`` once
    #: the Spark variant registers itself).
    stage_kind: str = "synthetic"

    def store(self) -> CheckpointStore:
        return CheckpointStore.from_url(self.store_url, self.storage_options, **self.settings)

    def pipeline(self) -> Pipeline:
        return self.store().pipeline(PIPELINE)

    def target(self, sink: str) -> str:
        return f"{self.target_url}/{sink}"

    def target_storage(self, sink: str) -> Storage:
        return open_storage(self.target(sink), self.storage_options)

    # -- input --------------------------------------------------------------------------
    def add_input(self, count: int, records: int = 4) -> list[str]:
        """Add ``count`` new input files of ``records`` records each; returns their names."""
        os.makedirs(self.input_dir, exist_ok=True)
        existing = self.input_files()
        start = int(existing[-1][3:8]) + 1 if existing else 1
        names = []
        for number in range(start, start + count):
            name = f"in-{number:05d}.txt"
            tmp = os.path.join(self.input_dir, f".{name}")
            with open(tmp, "w") as fh:
                fh.write("".join(f"{number}:{i}\n" for i in range(records)))
            os.rename(tmp, os.path.join(self.input_dir, name))
            names.append(name)
        return names

    def input_files(self) -> list[str]:
        if not os.path.isdir(self.input_dir):
            return []
        return sorted(n for n in os.listdir(self.input_dir) if n.startswith("in-"))

    def input_records(self, files: list[str] | None = None) -> list[str]:
        out = []
        for name in self.input_files() if files is None else files:
            with open(os.path.join(self.input_dir, name)) as fh:
                out += [line.strip() for line in fh if line.strip()]
        return out


def key_of(record: str) -> str:
    return f"k{int(record.split(':')[1]) % KEYS}"


def key_group(key: str) -> int:
    return int(key[1:]) % KEY_GROUPS


def read_state(pipeline: Pipeline, chains: dict[int, list[PartRef]], storage: Storage | None = None) -> dict[str, int]:
    """Counts per key from key-group chains: a full part, then deltas applied in order."""
    storage = storage or pipeline.storage
    counts: dict[str, int] = {}
    for chain in chains.values():
        for ref in chain:
            counts.update(read_json_part(storage, ref)["counts"])
    return counts


# -- the tasks of one DAG run ---------------------------------------------------------------


def stage(world: World, run_id: str, attempt: int) -> dict[str, Any]:
    """The stage task (phase one), run by the world's stage kind (:data:`STAGES`).

    Returns the epoch, the attempt whose output stands, and whether it was reused.
    """
    return STAGES[world.stage_kind](world, run_id, attempt)


def synthetic_stage(world: World, run_id: str, attempt: int) -> dict[str, Any]:
    """The synthetic stage: what the Spark runner writes, in the same order, without Spark."""
    p = world.pipeline()
    epoch = p.begin(run_id).epoch
    earlier = p.txlog.read_prepared(epoch, PARTICIPANT)
    if earlier is not None:
        return {"epoch": epoch, "attempt": earlier.attempt, "reused": True}
    base = p.restore_point(deep=False)
    new = _input_plan(world, p, epoch, attempt, base)
    records = world.input_records(new)

    # Sinks: like a Spark write with mode("overwrite") into this attempt's staging.
    manifests = []
    for sink in SINKS:
        staging = p.staging_path(epoch, attempt, sink)
        p.storage.delete(staging, recursive=True)
        if sink == "a":
            files = {f"part-{k}.txt": [r for r in records if int(r.split(":")[1]) % 2 == k] for k in (0, 1)}
        else:
            files = {"part-0.txt": records}
        for name, rows in files.items():
            p.storage.write_atomic(f"{staging}/{name}", "".join(f"{r},{attempt}\n" for r in rows).encode())
        p.storage.write_atomic(f"{staging}/_SUCCESS", b"")
        manifests.append(p.manifest_for_staged(epoch, attempt, sink, world.target(sink), rows=len(records)))

    # Keyed state: only key groups whose keys changed get a new part (full or delta).
    previous = base.operators.get(OPERATOR)
    chains = (
        {kg: list(previous.chains.get(kg, [])) for kg in range(KEY_GROUPS)}
        if previous
        else {kg: [] for kg in range(KEY_GROUPS)}
    )
    old = read_state(p, {k: v for k, v in chains.items() if v}, base.storage) if previous else {}
    delta = Counter(key_of(r) for r in records)
    for kg in range(KEY_GROUPS):
        changed = {k: old.get(k, 0) + n for k, n in delta.items() if key_group(k) == kg}
        if not changed and chains[kg]:
            continue
        path = layout.part_path(epoch, "operators", OPERATOR, kg, attempt)
        full = needs_full(chains[kg], p.config.incremental, p.config.full_checkpoint_interval)
        if full:
            state = {k: v for k, v in old.items() if key_group(k) == kg} | changed
            chains[kg] = [write_json_part(p.storage, path, {"counts": state}, epoch=epoch, key_group=kg)]
        else:
            ref = write_json_part(
                p.storage,
                path,
                {"counts": changed},
                epoch=epoch,
                key_group=kg,
                delta=True,
                base_epoch=chains[kg][-1].epoch,
            )
            chains[kg] = chains[kg] + [ref]
    operators = {OPERATOR: OperatorState(KEY_GROUPS, ["key"], chains, "key_value")}
    try:
        record = p.prepare(
            epoch,
            PARTICIPANT,
            attempt,
            run_id=run_id,
            sinks=manifests,
            operators=operators,
            sources={SOURCE: {"files": new}},
            base=base,
        )
    except FencedAttemptError:
        winner = p.status(epoch).prepared.get(PARTICIPANT)
        if winner is None:
            raise
        return {"epoch": epoch, "attempt": winner.attempt, "reused": True, "fenced": attempt}
    return {"epoch": epoch, "attempt": record.attempt, "reused": False, "rows": len(records)}


def _input_plan(world: World, p: Pipeline, epoch: int, attempt: int, base: RestorePoint) -> list[str]:
    """The epoch's input, fixed write-once by its first attempt (as the Spark runner does),
    so a retry reads the same files even when more input arrived in between."""
    path = layout.record_path(epoch, f"{PLAN_PREFIX}{PARTICIPANT}")
    try:
        return list(codec.decode_json(p.storage.read(path), path)["sources"][SOURCE]["files"])
    except FileNotFoundError:
        pass
    consumed = {f for entry in base.source_entries(SOURCE) for f in entry["offsets"]["files"]}
    files = [f for f in world.input_files() if f not in consumed][: world.max_files]
    plan = {
        "type": "input_plan",
        "epoch": epoch,
        "participant": PARTICIPANT,
        "attempt": attempt,
        "created_at": time.time(),
        "sources": {SOURCE: {"files": files}},
    }
    try:
        p.storage.create_exclusive(path, codec.encode_json(plan))
    except AlreadyExistsError:
        return _input_plan(world, p, epoch, attempt, base)
    return files


def decide(world: World, run_id: str, want: str = "commit") -> dict[str, Any]:
    """The branch task: record (or read) the one decision; commit refused means abort."""
    p = world.pipeline()
    epoch = p.epoch_for_run(run_id)
    if epoch is None:
        return {"epoch": None, "decision": None}
    status = p.status(epoch)
    if status.decision is not None:
        return {
            "epoch": epoch,
            "decision": status.decision.decision.value,
            "by": status.decision.by,
        }
    wanted = Decision.COMMIT if want == "commit" and status.state is EpochState.PREPARED else Decision.ABORT
    try:
        record = p.decide(epoch, wanted, f"{want} requested", by=f"branch {run_id}")
    except (NotPreparedError, CorruptCheckpointError) as exc:
        record = p.decide(epoch, Decision.ABORT, f"commit refused by verification: {exc}", by=f"branch {run_id}")
    return {"epoch": epoch, "decision": record.decision.value, "by": record.by}


def commit(world: World, run_id: str) -> dict[str, Any]:
    """The commit task."""
    p = world.pipeline()
    epoch = p.epoch_for_run(run_id)
    if epoch is None:
        raise NotPreparedError(f"run {run_id} has no epoch")
    result = p.commit(epoch)
    return {
        "epoch": epoch,
        "rows": result.rows,
        "already": result.already_committed,
        "how": [s.how for s in result.sinks],
    }


def abort(world: World, run_id: str) -> dict[str, Any]:
    """The abort task: abort, or roll a commit decision forward."""
    p = world.pipeline()
    epoch = p.epoch_for_run(run_id)
    if epoch is None:
        return {"epoch": None, "action": "none"}
    status = p.status(epoch)
    if status.decision is not None and status.decision.decision is Decision.COMMIT:
        p.commit(epoch)
        return {"epoch": epoch, "action": "rolled_forward"}
    if status.state is EpochState.ABORTED:
        return {"epoch": epoch, "action": "already_aborted"}
    try:
        p.abort(epoch, "upstream failed", by=f"abort {run_id}")
    except DecisionConflictError:
        p.commit(epoch)
        return {"epoch": epoch, "action": "rolled_forward"}
    return {"epoch": epoch, "action": "aborted"}


def recover(world: World, past_timeout: bool = True) -> dict[str, Any]:
    """The recovery task. ``past_timeout``: every undecided epoch is older than the timeout."""
    p = world.pipeline()
    now = time.time() + (10 * p.config.prepared_timeout_s if past_timeout else 0)
    report = p.recover(dry_run=False, now=now)
    return report.to_dict()


def retain(world: World, max_retain: int = 2) -> dict[str, Any]:
    """The retention task."""
    return world.pipeline().retain(max_retain=max_retain).to_dict()


def decide_and_follow(world: World, run_id: str) -> dict[str, Any]:
    """The branch task and whichever task it routes to (commit or abort)."""
    decided = decide(world, run_id)
    if decided["decision"] == "commit":
        return {**decided, **commit(world, run_id)}
    if decided["decision"] == "abort":
        return {**decided, **abort(world, run_id)}
    return decided


#: Stage implementations every scenario can run; the Spark runtime adds ``"spark"``.
STAGES: dict[str, Callable[..., dict[str, Any]]] = {"synthetic": synthetic_stage}

STEPS: dict[str, Callable[..., dict[str, Any]]] = {
    "stage": stage,
    "decide": decide,
    "commit": commit,
    "abort": abort,
    "recover": recover,
    "retain": retain,
    "decide_and_follow": decide_and_follow,
}


def run_dag_run(world: World, run_id: str, attempt: int = 1) -> dict[str, Any]:
    """One whole, fault-free DAG run in this process: stage, decide, commit or abort."""
    staged = stage(world, run_id, attempt)
    decided = decide(world, run_id)
    if decided["decision"] == "commit":
        return {**staged, **commit(world, run_id)}
    return {**staged, **abort(world, run_id)}


def to_json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)
