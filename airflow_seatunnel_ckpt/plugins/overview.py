"""What the Checkpoints page shows of a store, a pipeline and an epoch (no web code: :mod:`.app`
renders it).

Every state and verdict comes from the functions the ``seatunnel-ckpt`` console uses, so the
page and the console cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.cli import epoch_entry, pipeline_summary, verify_epoch
from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.protocol import epoch_index
from airflow_seatunnel_ckpt.core.protocol.epoch_index import EpochSummary
from airflow_seatunnel_ckpt.core.protocol.lease import ExitRecord, SubmissionRecord
from airflow_seatunnel_ckpt.core.protocol.recovery import RunFinished, recover, resolve_epoch
from airflow_seatunnel_ckpt.core.store import StoredPipeline

ABORTABLE = frozenset({EpochState.OPEN, EpochState.PREPARED})


@dataclass
class EpochRow:
    """One epoch as the page lists it."""

    epoch: int
    state: str
    run_id: str = "-"
    logical_date: str = "-"
    dag_id: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    checkpoint_bytes: int | None = None
    decision: str = "-"
    participants: str = "-"  # each with its winning attempt (``ingest@2``), as the console shows them
    lease: str = ""  # OPEN epochs: holder, last renewal and the liveness verdict
    submissions: list[str] = field(default_factory=list)
    damaged: str = ""  # the damaged record's message (naming the file)
    expectations: list[dict[str, Any]] = field(default_factory=list)
    input: dict[str, str] = field(default_factory=dict)

    @property
    def abortable(self) -> bool:
        """Whether the page offers "abort" (an undecided epoch)."""
        return self.state in {s.value for s in ABORTABLE}

    @property
    def retryable(self) -> bool:
        """Whether the page offers "retry publish" (decided commit, not yet acknowledged)."""
        return self.state == EpochState.COMMITTING.value


def epoch_row(p: StoredPipeline, epoch: int, summary: EpochSummary | None = None) -> EpochRow:
    """One epoch's row: the console's ``epochs`` entry plus files, bytes and the lease, from the
    epoch index's ``summary`` of it, else from its records."""
    try:
        summary = summary or epoch_index.summarise(p, epoch)
    except CorruptCheckpointError:
        summary = None  # the console's entry names the damaged record
    data, table = epoch_entry(p, epoch, summary)
    row = EpochRow(epoch, data["state"], decision=str(table["decision"]))
    if "damaged" in data:  # the message names the file; shown once, in place of the run
        row.damaged, row.decision = data["damaged"], "?"
        return row
    summary = summary or epoch_index.summarise(p, epoch)  # (a damaged submission record: raises)
    row.participants = str(table["participants"])
    row.run_id = data.get("run_id") or "-"
    row.logical_date = data.get("logical_date") or "-"
    row.dag_id = summary.begin.dag_id if summary.begin else ""
    row.rows = dict(data.get("rows") or {})
    row.expectations = list(data.get("expectations") or [])
    row.input = dict(data.get("input") or {})
    row.files = summary.files_per_sink()
    row.checkpoint_bytes = summary.checkpoint_bytes
    row.submissions = [_describe_submission(record, ended, summary.state) for record, ended in summary.submissions]
    if row.state == EpochState.OPEN.value:
        resolution = resolve_epoch(p, epoch, dry_run=True)  # (what recovery would do, without asking Airflow)
        judged = resolution.judged
        if judged is None:
            row.lease = f"cannot judge: {resolution.error or resolution.reason}"
        else:
            holder = judged.lease.describe_holder() if judged.lease else "no lease yet"
            age = f", last renewal {judged.age_s:.0f}s ago" if judged.age_s is not None else ""
            row.lease = f"{holder}{age} -- {judged.liveness.value}"
    return row


@dataclass
class HistoryRow:
    """One operator action on an epoch, as the page's action history lists it."""

    epoch: int
    action: str = ""
    by: str = ""
    reason: str = ""
    at: float | None = None
    outcome: str = ""  # succeeded / refused / failed; "unknown" when none was recorded (interrupted)
    detail: str = ""
    damaged: str = ""  # a damaged or malformed action record's message (naming the file)


def action_history(p: StoredPipeline, epochs: list[int]) -> list[HistoryRow]:
    """The actions recorded on ``epochs`` with their outcomes, newest first (a damaged record: one row
    naming the file)."""
    rows = []
    for epoch in epochs:
        try:
            entries = p.txlog.actions(epoch)
        except CheckpointError as exc:
            rows.append(HistoryRow(epoch, damaged=str(exc)))
            continue
        for entry in entries:
            record, outcome = entry.record, entry.outcome
            rows.append(HistoryRow(
                epoch, record.action, record.by, record.reason, record.at,
                outcome.outcome.value if outcome else "unknown",
                outcome.detail if outcome else "no outcome recorded: the action was interrupted; the "
                                               "epoch's state shows what happened"))
    return sorted(rows, key=lambda r: (r.at or 0.0, r.epoch), reverse=True)


def _describe_submission(record: SubmissionRecord, ended: ExitRecord | None, state: EpochState) -> str:
    """``ingest attempt 2: spark-submit from host (launcher pid 7, local[1] (client mode)); exit 1, stopped: ...``."""
    text = (f"{record.participant} attempt {record.attempt}: {record.runtime or 'launched'} from {record.host} "
            f"(launcher pid {record.launcher_pid}, {record.target or 'target ?'})")
    if ended is None:
        if state in (EpochState.ABORTING, EpochState.ABORTED):
            return (f"{text}; no exit record: the epoch was aborted, so this attempt was stopped or lost "
                    "before it recorded an exit (it can no longer prepare)")
        if state.decided:
            return f"{text}; no exit record: the epoch was decided without it (another attempt prepared)"
        return f"{text}; no exit record (running, or lost: see the lease)"
    text += f"; exit code {ended.returncode}"
    return f"{text}, stopped: {ended.stopped}" if ended.stopped else text


@dataclass
class PipelineView:
    """Everything the pipeline page shows."""

    name: str
    owner_dag_id: str
    epochs: list[EpochRow]
    restore_point: dict[str, Any]
    verify: list[dict[str, Any]]
    recovery: dict[str, Any]
    history: list[HistoryRow] = field(default_factory=list)
    held_back: str = ""


def owner_dag_id(p: StoredPipeline) -> str:
    """The DAG owning the pipeline, for authorisation: its descriptor's owner, else the DAG
    that began its newest epoch; "" when neither is known."""
    try:
        descriptor = p.descriptor()
        if descriptor is not None:
            return descriptor.owner_dag_id
        epochs = p.newest_epochs(1)
        begin = p.txlog.read_begin(epochs[-1]) if epochs else None
    except CheckpointError:
        return ""
    return begin.dag_id if begin is not None else ""


def pipeline_view(store: CheckpointStore, name: str, last: int = 20,
                  run_finished: RunFinished | None = None) -> PipelineView:
    """The newest ``last`` epochs of ``name`` with verify results and recovery's dry run (which asks
    ``run_finished`` whether an epoch's DAG run is over, as the recovery DAG does)."""
    p = store.pipeline(name)
    epochs, held = epoch_index.newest(p, last)
    rows = [epoch_row(p, e, held.get(e)) for e in reversed(epochs)]
    try:
        restore = p.restore_point(deep=False).to_dict()
    except CheckpointError as exc:
        restore = {"error": str(exc)}
    verify = [verify_epoch(p, e) for e in reversed(epochs)]
    verify += [{"settled_record": exc.path, "ok": False, "verdict": "DAMAGED", "problems": [str(exc)]}
               for exc in p.txlog.settled.damaged()]
    recovery = recover(p, dry_run=True, run_finished=run_finished).to_dict()
    held = p.held_back(newest=max(epochs, default=0), known={row.epoch: row.state for row in rows})
    return PipelineView(name, owner_dag_id(p), rows, restore, verify, recovery, action_history(p, epochs),
                        held.describe() if held is not None else "")


def pipelines_summary(store: CheckpointStore) -> list[dict[str, Any]]:
    """Per pipeline: epoch count, newest committed epoch, the newest epoch's state and the owner DAG."""
    pipelines = [store.pipeline(name) for name in store.list_pipelines()]
    return [{**pipeline_summary(p), "owner_dag_id": owner_dag_id(p)} for p in pipelines]


def epochs_of_run(store: CheckpointStore, dag_id: str, run_id: str) -> list[tuple[str, EpochRow]]:
    """The epochs (per pipeline of ``store``) that the DAG run ``dag_id``/``run_id`` began."""
    out = []
    for name in store.list_pipelines():
        p = store.pipeline(name)
        try:
            epoch = p.epoch_for_run(run_id, dag_id or None)
        except CheckpointError:
            continue
        if epoch is not None:
            out.append((name, epoch_row(p, epoch)))
    return out
