"""What a running stage shows in its task log: Spark's progress while it runs (:class:`StageProgress`), and the rows
read, kept and quarantined per source and written per sink once it ran (:func:`log_row_counts`)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.protocol.lease import Periodic

if TYPE_CHECKING:
    from types import TracebackType

    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.context import BoundSource
    from airflow_seatunnel_ckpt.spark.sinks.files import Sink

log = logging.getLogger(__name__)

#: Seconds between two looks at Spark's progress while a stage runs.
DEFAULT_INTERVAL_S = 10.0


class StageProgress:
    """Log the progress of the Spark jobs a stage runs, around its Spark work in the calling thread::

        pipeline orders epoch 7: ingest running: Spark stage 3: 5/8 tasks done, 120000 rows read

    A classic session's status tracker is polled for the jobs the thread tagged; Spark Connect streams each operation's
    progress (bytes, not rows). A line at most every ``interval`` seconds, only when something changed.
    """

    def __init__(self, session: SparkSession, label: str, interval: float = DEFAULT_INTERVAL_S) -> None:
        from airflow_seatunnel_ckpt.spark.session import is_classic

        self.session = session
        self.label = label
        self.interval = interval
        self._last = ""
        self._logged_at = 0.0
        self.tag = f"seatunnel-ckpt-progress-{uuid.uuid4().hex}"
        self._tracker: Any = None
        self._poller: Periodic | None = None
        if is_classic(session):
            from airflow_seatunnel_ckpt.spark.classic import StatusTracker

            self._tracker = StatusTracker(session)
            self._poller = Periodic(self._look, interval, f"stage-progress {label}")

    def __enter__(self) -> StageProgress:
        if self._tracker is not None:
            self._tracker.add_tag(self.tag)  # thread-local: the jobs of the calling thread only
            assert self._poller is not None
            self._poller.start()
        else:
            self.session.registerProgressHandler(self._on_progress)  # type: ignore[arg-type]  # any callable of its shape
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop logging (a classic session's polling thread is waited for, briefly)."""
        if self._tracker is None:
            with contextlib.suppress(Exception):
                self.session.removeProgressHandler(self._on_progress)  # type: ignore[arg-type]
            return
        with contextlib.suppress(Exception):
            self._tracker.remove_tag(self.tag)
        assert self._poller is not None
        self._poller.stop(timeout_s=max(self.interval, 1.0) + 5.0)

    def _look(self) -> None:
        """Log a classic session's progress if it changed since the last look."""
        try:
            self._log(self._tracker.describe(self.tag))
        except Exception as exc:  # progress is a courtesy: never disturb the stage
            log.debug("%s: cannot read Spark's progress: %s", self.label, exc)

    def _log(self, line: str) -> None:
        if line and line != self._last:
            log.info("%s running: %s", self.label, line)
        self._last = line or self._last

    def _on_progress(self, stages: Iterable[Any] | None, inflight_tasks: int, operation_id: str | None,
                     done: bool) -> None:
        """Connect's progress of one running operation: logged at most once per interval."""
        try:
            now = time.monotonic()
            if done or now - self._logged_at < self.interval:
                return
            parts = []
            for stage in stages or ():
                if stage.done:
                    continue
                text = f"Spark stage {stage.stage_id}: {stage.num_completed_tasks}/{stage.num_tasks} tasks done"
                if stage.num_bytes_read:
                    text += f", {stage.num_bytes_read} bytes read"
                parts.append(text)
            line = "; ".join(parts)
            if line:
                self._logged_at = now
            self._log(line)
        except Exception as exc:  # progress is a courtesy: never disturb the stage
            log.debug("%s: cannot read Spark's progress: %s", self.label, exc)


def log_row_counts(label: str, sources: Mapping[str, BoundSource], sinks: Mapping[str, Sink]) -> None:
    """Log, once the stage ran, rows read / kept / quarantined per source and rows per sink (quarantined records also as
    a WARNING naming where they are published)."""
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
            log.warning("%s: source %r: %d record(s) did not parse and were quarantined into sink %r "
                        "(published with the epoch to %s); fix them and deliver them again under a new "
                        "file name", label, name, quarantined, quarantine.name, quarantine.target_url)
    for name, sink in sinks.items():
        parts.append(f"sink {name}: {sink.rows} written" if sink.written else f"sink {name}: not written")
    if parts:
        log.info("%s rows: %s", label, "; ".join(parts))
