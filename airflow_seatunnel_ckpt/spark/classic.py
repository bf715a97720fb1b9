"""What a stage does only on a classic (py4j) SparkSession: the one module that reaches into the driver's JVM, imported
only once :func:`~.session.is_classic` said so (tests/test_layers.py checks no other module does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Observation, SparkSession


def context_running() -> bool:
    """Whether this process already runs a SparkContext (a classic session, maybe another thread's)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


def observed(observation: Observation) -> bool:
    """Whether an action already filled ``observation`` in (its ``get`` would block until then)."""
    jo = observation._jo
    return jo is not None and bool(jo.future().isCompleted())


def set_python_exec(session: SparkSession, python: str) -> None:
    """Make ``python`` the interpreter of every Python worker ``session`` starts (see ``session.stage_session``: PySpark
    ignores ``spark.pyspark.python`` in-process)."""
    session.sparkContext.pythonExec = python


def shipped_file(name: str) -> str:
    """The local path of a file ``spark-submit --files`` shipped (the application's SparkContext must be up: the caller
    creates its session first)."""
    from pyspark import SparkFiles

    return SparkFiles.get(name)


class StatusTracker:
    """The Spark stages of one tag's jobs, from the driver's status tracker (classic only)."""

    def __init__(self, session: SparkSession) -> None:
        self.sc = session.sparkContext

    def add_tag(self, tag: str) -> None:
        """Tag the jobs the calling thread starts from now on."""
        self.sc.addJobTag(tag)

    def remove_tag(self, tag: str) -> None:
        """Stop tagging the calling thread's jobs."""
        self.sc.removeJobTag(tag)

    def describe(self, tag: str) -> str:
        """The active Spark stages of ``tag``'s jobs as one phrase ("" when none is active)."""
        tracker = self.sc.statusTracker()
        records = self._input_records()
        parts = []
        for stage_id in sorted(set(tracker.getActiveStageIds()) & self._tagged_stages(tag)):
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

    def _tagged_stages(self, tag: str) -> set[int]:
        """Spark stages of the jobs carrying ``tag``."""
        tracker = self.sc.statusTracker()
        job_ids = self.sc._jsc.sc().statusTracker().getJobIdsForTag(tag)
        stages: set[int] = set()
        for job_id in job_ids:
            info = tracker.getJobInfo(int(job_id))
            if info is not None:
                stages.update(int(s) for s in info.stageIds)
        return stages

    def _input_records(self) -> dict[int, int]:
        """Rows the finished tasks of each active Spark stage read (input and shuffle), from the status store Spark's UI
        reads; empty if this Spark does not expose it."""
        try:
            stages = self.sc._jsc.sc().statusStore().activeStages()
            return {int(s.stageId()): int(s.inputRecords()) + int(s.shuffleReadRecords())
                    for s in _scala_items(stages)}
        except Exception:
            return {}


def _scala_items(seq: Any) -> Iterator[Any]:
    for i in range(seq.size()):
        yield seq.apply(i)
