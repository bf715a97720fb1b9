"""What a running stage shows in its task log: Spark's progress while it runs, and the
rows read, kept and quarantined per source and written per sink once it ran.

A stage can run for minutes without a line of its own; :class:`StageProgress` is a daemon
thread that polls Spark's status tracker (tasks of the active stages, and the input
records of their finished tasks) every few seconds and logs a line only when something
changed. :func:`log_row_counts` logs the counts the runtime already has: the rows each
source handed to the stage (:attr:`BoundSource.rows_kept`), each quarantine sink's rows,
each sink's rows.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.protocol.lease import Periodic

if TYPE_CHECKING:
    from types import TracebackType

    from pyspark import SparkContext

    from airflow_seatunnel_ckpt.spark.context import BoundSource
    from airflow_seatunnel_ckpt.spark.sinks.files import Sink

log = logging.getLogger(__name__)

#: Seconds between two looks at Spark's status tracker while a stage runs.
DEFAULT_INTERVAL_S = 10.0


class StageProgress:
    """Log the progress of the Spark jobs a stage runs, from a daemon thread.

    Use as a context manager around the stage's Spark work, in the thread that runs it;
    leaving it stops the thread (also when the stage fails). The jobs this thread starts
    carry a job tag, so a session shared with other stages of the process shows only this
    stage's jobs. Each line names the Spark stages that are active, their tasks done of
    all, and the rows their finished tasks read::

        pipeline orders epoch 7: ingest running: Spark stage 3: 5/8 tasks done, 120000 rows read

    :param label: what the line starts with (pipeline, epoch, participant).
    :param interval: seconds between two looks; a line is logged only when something changed.
    """

    def __init__(self, sc: SparkContext, label: str, interval: float = DEFAULT_INTERVAL_S) -> None:
        self.sc = sc
        self.label = label
        self.interval = interval
        self._poller = Periodic(self._look, interval, f"stage-progress {label}")
        self._last = ""
        self.tag = f"seatunnel-ckpt-progress-{uuid.uuid4().hex}"

    def __enter__(self) -> StageProgress:
        self.sc.addJobTag(self.tag)  # thread-local: the jobs of the calling thread only
        self._poller.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop polling and wait (briefly) for the thread to end."""
        with contextlib.suppress(Exception):
            self.sc.removeJobTag(self.tag)
        self._poller.stop(timeout_s=max(self.interval, 1.0) + 5.0)

    def _look(self) -> None:
        """Log the progress if it changed since the last look."""
        try:
            line = self.describe()
        except Exception as exc:  # progress is a courtesy: never disturb the stage
            log.debug("%s: cannot read Spark's progress: %s", self.label, exc)
            return
        if line and line != self._last:
            log.info("%s running: %s", self.label, line)
        self._last = line or self._last

    def describe(self) -> str:
        """The active Spark stages' progress as one phrase ("" when none is active)."""
        tracker = self.sc.statusTracker()
        records = _input_records(self.sc)
        parts = []
        for stage_id in sorted(set(tracker.getActiveStageIds()) & self._tagged_stages()):
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            text = f"Spark stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks done"
            if info.numFailedTasks:
                text += f" ({info.numFailedTasks} failed)"
            if records.get(stage_id):
                text += f", {records[stage_id]} rows read"
            parts.append(text)
        return "; ".join(parts)

    def _tagged_stages(self) -> set[int]:
        """Spark stages of the jobs carrying this stage's tag."""
        tracker = self.sc.statusTracker()
        job_ids = self.sc._jsc.sc().statusTracker().getJobIdsForTag(self.tag)  # type: ignore[union-attr]
        stages: set[int] = set()
        for job_id in job_ids:
            info = tracker.getJobInfo(int(job_id))
            if info is not None:
                stages.update(int(s) for s in info.stageIds)
        return stages


def _input_records(sc: SparkContext) -> dict[int, int]:
    """Rows the finished tasks of each active Spark stage read (from files or tables, and
    from the shuffle of earlier stages), from the status store Spark's UI reads (kept
    without the UI too); empty if this Spark does not expose it."""
    try:
        stages = sc._jsc.sc().statusStore().activeStages()  # type: ignore[union-attr]
        return {int(s.stageId()): int(s.inputRecords()) + int(s.shuffleReadRecords())
                for s in _scala_items(stages)}
    except Exception:
        return {}


def _scala_items(seq: Any) -> Iterator[Any]:
    for i in range(seq.size()):
        yield seq.apply(i)


def log_row_counts(label: str, sources: Mapping[str, BoundSource], sinks: Mapping[str, Sink]) -> None:
    """Log, once the stage ran, rows read / kept / quarantined per source and rows per sink.

    A source's quarantined records (its ``<source>.bad_records`` sink) also get a WARNING
    with their count and where they are published, so they are not only a number.
    """
    parts = []
    for name, bound in sources.items():
        if not bound.was_read:
            parts.append(f"source {name}: not read")
            continue
        kept = bound.rows_kept
        quarantine = bound.quarantine
        quarantined = quarantine.rows if quarantine is not None and quarantine.written else 0
        assert quarantined is not None
        if kept is None:
            text = f"source {name}: read (rows not counted)"
        else:
            text = f"source {name}: {kept + quarantined} read, {kept} kept"
        if quarantine is not None:
            text += f", {quarantined} quarantined"
        parts.append(text)
        if quarantined:
            assert quarantine is not None
            log.warning(
                "%s: source %r: %d record(s) did not parse and were quarantined into sink %r "
                "(published with the epoch to %s); fix them and deliver them again under a new "
                "file name", label, name, quarantined, quarantine.name, quarantine.target_url)
    for name, sink in sinks.items():
        parts.append(f"sink {name}: {sink.rows} written" if sink.written else f"sink {name}: not written")
    if parts:
        log.info("%s rows: %s", label, "; ".join(parts))
