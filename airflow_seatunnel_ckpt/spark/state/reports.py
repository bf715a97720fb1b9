"""The report protocol: each task of a state update writes a :class:`PartReport` (JSON, in the update's
:class:`ReportFolder`) once its part is complete; files, not an accumulator, so it works through Spark Connect too."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import PartRef, decode, encode
from airflow_seatunnel_ckpt.core.state.run_chain import live_runs
from airflow_seatunnel_ckpt.spark.state.settings import StateError, StoreLocation


@dataclass(frozen=True)
class PartReport:
    """What one task reports for its key group: its input and the part it wrote, if any."""

    key_group: int
    rows: int  #: input rows the task read
    changed: int  #: keys the task added or changed
    #: False when Spark ran the task under another partition index than its key group
    #: (e.g. a ``coalesce`` after the update); the driver then distrusts the reports of
    #: empty tasks, whose key group is only known from that index.
    aligned: bool = True
    part: PartRef | None = None  #: None: the key group is unchanged
    #: How many of the restored chain's newest runs ``part`` replaces (a compaction
    #: merged them with the epoch's changes); a FULL part replaces the whole chain.
    replaces: int = 0
    #: Bytes of state the task read (indexes, blooms, blocks; compaction included).
    read: int = 0
    #: A compaction's output: it replaces the restored chain's runs
    #: ``[merge_start, merge_end)`` in place (``part`` is then appended as usual).
    merged: PartRef | None = None
    merge_start: int = 0
    merge_end: int = 0

    @property
    def parts(self) -> list[PartRef]:
        """The parts the task wrote and reports (its new run, its compaction's output)."""
        return [p for p in (self.merged, self.part) if p is not None]

    @property
    def empty(self) -> bool:
        """Whether the task had no input rows."""
        return self.rows == 0


@dataclass(frozen=True)
class ReportFolder:
    """Where the tasks of one state update write their reports: a folder of the store that no other update (nor another
    attempt) writes to, below the attempt's staging directory (dropped with the epoch's staging)."""

    store: StoreLocation
    folder: str  #: relative to the pipeline root

    def add(self, reports: list[PartReport]) -> None:
        """Write each report as one file of its own (atomically: never read half-written)."""
        storage = self.store.open()
        for report in reports:
            name = f"kg-{report.key_group}-{secrets.token_hex(6)}.json"
            storage.write_atomic(f"{self.folder}/{name}", json.dumps(encode(report)).encode())

    def read(self) -> list[PartReport]:
        """Every report written so far, in no particular order (none when the folder is absent)."""
        storage = self.store.open()
        reports = []
        for info in storage.walk(self.folder):
            if not info.path.endswith(".json"):
                continue
            path = f"{self.folder}/{info.path}"
            try:
                reports.append(decode(PartReport, storage.read(path), storage.describe_path(path)))
            except CorruptCheckpointError as exc:
                raise StateError(f"keyed state: the task report {storage.describe_path(path)} cannot be read "
                                 f"({exc}); the stage's attempt wrote it itself: retry the stage") from exc
        return reports

    def remove(self) -> None:
        """Delete the folder (the reports were read into the operator's chains)."""
        self.store.open().delete(self.folder, recursive=True)


def choose_reports(reports: Iterable[PartReport]) -> tuple[dict[int, PartReport], set[int]]:
    """One report per key group, and the key groups whose report is untrusted (a task without input knows its key group
    only from its partition index)."""
    with_rows: dict[int, PartReport] = {}
    without_rows: dict[int, PartReport] = {}
    aligned = True
    for report in reports:
        target = without_rows if report.empty else with_rows
        target.setdefault(report.key_group, report)
        aligned = aligned and report.aligned
    chosen = {**without_rows, **with_rows}
    unsure = set() if aligned else set(without_rows) - set(with_rows)
    return chosen, unsure


def next_chain(restored: list[PartRef], report: PartReport, min_epoch: int | None = None) -> list[PartRef]:
    """A key group's chain after this epoch: a compaction's output replaces the runs it merged, a FULL part starts a new
    chain, a DELTA replaces the newest ``replaces`` runs (or extends the chain), no part keeps it; runs whose every key
    expired drop out."""
    if report.merged is not None:
        if not 0 <= report.merge_start < report.merge_end <= len(restored):
            # A task planned its merge on another chain than the one restored here: the
            # report cannot be applied (never the case when tasks and driver share settings).
            raise StateError(
                f"keyed state: key group {report.key_group} reported a compaction of runs "
                f"{report.merge_start}..{report.merge_end}, but its restored chain holds {len(restored)} "
                "runs; the update's tasks ran against another checkpoint -- retry the stage")
        restored = [*restored[:report.merge_start], report.merged, *restored[report.merge_end:]]
    before = restored[: len(restored) - report.replaces] if report.replaces else list(restored)
    ref = report.part
    chain = before if ref is None else [ref] if ref.kind == "full" else [*before, ref]
    return live_runs(chain, min_epoch)
