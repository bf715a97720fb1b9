"""The file source over whole epochs, as a model: every input record reaches the sink once.

A hypothesis state machine delivers Parquet files into ``eu/dt=NN/`` and ``us/dt=NN/``
partitions of an input directory -- new partitions, late files into older ones, files
with old modification times, re-uploads of files already consumed -- changes the source's
options between epochs, and runs epochs. An epoch is what the stage runtime does, minus
Spark: begin, restore, plan the file source from the restore point and pin the plan
(:meth:`FileSource.plan_from`, :meth:`Pipeline.pin_inputs`), read the planned files with
pyarrow, stage their rows as one Parquet file of a file sink, prepare with the consumed
offsets, decide commit, commit. The sink is then read back from its published epoch
directories with pyarrow.

The model knows, from the documented options alone, which files an epoch may skip (a late
file in a partition ``ordered_prefixes`` passed, a file older than ``max_file_age``
before the newest consumed one, a re-upload under ``on_change="error"``) and which it owes:
a file the listing rules make visible to an epoch is owed from then on, whatever
``max_files_per_epoch`` postpones. Checked after every step:

* every record in the sink is there once (no file read twice, whatever the options did);
* no epoch is left undecided or COMMITTING, and the next epoch runs (an epoch refused with
  a :class:`SourceError` names a changed file; after the documented fix -- restoring the
  consumed content -- the next epoch commits);
* ``drain`` (run epochs until nothing is planned) delivers every owed record.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark.sources.files import FileSource, SourceError
from tests.core.epochs import Participant, prepare_participant, published
from tests.integration.properties.settings import model_settings

pytestmark = pytest.mark.properties

PREFIXES = ("eu", "us")
GLOBS = ["eu/dt=*/", "us/dt=*/"]
PARTITIONS = 6
#: The input's clock: every delivery moves it on by this many seconds.
TICK = 10
BASE_TIME = 1_790_000_000
#: Epochs a drain may run beyond one per pending file before the owed records must all be in the sink.
DRAIN_LIMIT = 10


@dataclass(frozen=True)
class Version:
    """One content of one input file: its records (unique ids) and modification time."""

    name: str
    number: int
    ids: tuple[int, ...]
    mtime: int
    data: bytes

    @property
    def prefix(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def partition(self) -> str:
        return "/".join(self.name.split("/")[:2])


def parquet_of(ids: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), buf)
    return buf.getvalue()


class FileSourceModel(RuleBasedStateMachine):
    """Deliveries, option changes and epochs of one file source into one file sink."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="file-source-model-"))
        self.input = self.root / "in"
        self.input.mkdir()
        self.pipeline: Pipeline = CheckpointStore(CheckpointConfig.from_mapping(
            {"storage_url": f"file://{self.root}/store", "full_checkpoint_interval": 3})).pipeline("orders")
        self.options: dict[str, Any] = {}
        self.current: dict[str, Version] = {}  # name -> the content in the directory now
        self.consumed: dict[str, Version] = {}  # name -> the content the sink last received
        self.by_id: dict[int, Version] = {}
        self.owed: set[int] = set()
        #: The highest ``max_file_age`` watermark any epoch planned or committed with.
        self.horizon: float | None = None
        self.next_id = 0
        self.clock = BASE_TIME
        self.runs = 0
        self.files_seq = 0

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- options -------------------------------------------------------------------------
    #: The options an example starts with (a subclass narrows them to one concern).
    PREFIXED: st.SearchStrategy[bool] = st.booleans()
    ORDERED: st.SearchStrategy[bool] = st.booleans()
    MAX_FILES: st.SearchStrategy[int | None] = st.sampled_from([None, 1, 2])
    AGE: st.SearchStrategy[int | None] = st.sampled_from([None, 25, 60])
    BACKFILL: st.SearchStrategy[int | None] = st.sampled_from([None, 2, 3])
    #: How old (in ticks) a delivered file's modification time may be.
    LATENESS: st.SearchStrategy[int] = st.sampled_from([0, 0, 0, 3, 8])
    WARM: st.SearchStrategy[bool] = st.booleans()
    #: The values ``max_file_age`` may change to between epochs.
    NEW_AGE: st.SearchStrategy[int | None] = st.sampled_from([None, 15, 25, 60, 200])
    #: Whether ``max_file_age`` may change between epochs.
    AGE_CHANGES = True
    #: Whether the other options and the files' content may change between epochs.
    CHANGES = True

    @initialize(data=st.data())
    def configure(self, data: st.DataObject) -> None:
        prefixed = data.draw(self.PREFIXED, "prefixed")
        ordered = prefixed and data.draw(self.ORDERED, "ordered")
        self.options = {"prefixes": GLOBS if prefixed else None, "ordered_prefixes": ordered,
                        "backfill_every": data.draw(self.BACKFILL, "backfill") if ordered else None,
                        "max_files_per_epoch": data.draw(self.MAX_FILES, "max_files"),
                        "max_file_age": data.draw(self.AGE, "max_file_age"),
                        "on_change": data.draw(st.sampled_from(["error", "reread"]), "on_change")}
        self.allowed({**self.options, "max_files_per_epoch": None})
        if data.draw(self.WARM, "warm start"):  # a pipeline that consumed a file below each prefix
            for prefix in PREFIXES:
                self.deliver_one(prefix, PARTITIONS // 2, 1, 0)
            self.run_epoch()

    def source(self) -> FileSource:
        return FileSource("files", f"file://{self.input}", **self.options)

    def allowed(self, before: dict[str, Any]) -> None:
        """Keep an option change only if the source accepts the options together (a
        combination the source refuses with a ConfigError is not a state to run)."""
        try:
            self.source()
        except ConfigError:
            self.options = before

    @precondition(lambda self: self.CHANGES)
    @rule(max_files=st.sampled_from([None, 1, 2, 3]))
    def change_max_files(self, max_files: int | None) -> None:
        before = dict(self.options)
        self.options["max_files_per_epoch"] = max_files
        self.allowed(before)

    @precondition(lambda self: self.AGE_CHANGES)
    @rule(data=st.data())
    def change_max_file_age(self, data: st.DataObject) -> None:
        """Widen, narrow or remove ``max_file_age`` ("changing it later is allowed")."""
        age = data.draw(self.NEW_AGE, "new max_file_age")
        old = self.options["max_file_age"]
        before = dict(self.options)
        self.options["max_file_age"] = age
        self.allowed(before)
        if self.options is before:
            return
        if age is not None and (old is None or age < old):
            # A narrower window is the user's choice: owed files outside it are let go.
            watermark = self.watermark()
            for version in self.pending_versions():
                if watermark is not None and version.mtime < watermark:
                    self.owed.difference_update(version.ids)

    @precondition(lambda self: self.CHANGES)
    @rule(on_change=st.sampled_from(["error", "reread"]))
    def change_on_change(self, on_change: str) -> None:
        self.options["on_change"] = on_change
        if on_change == "error":
            for version in self.changed_versions():
                self.owed.difference_update(version.ids)

    @precondition(lambda self: self.CHANGES and self.options["ordered_prefixes"])
    @rule(backfill=st.sampled_from([None, 2, 3]))
    def change_backfill_every(self, backfill: int | None) -> None:
        before = dict(self.options)
        self.options["backfill_every"] = backfill
        self.allowed(before)

    # -- deliveries ----------------------------------------------------------------------
    def write(self, name: str, ids: tuple[int, ...], mtime: int) -> Version:
        number = self.current[name].number + 1 if name in self.current else 1
        version = Version(name, number, ids, mtime, parquet_of(ids))
        path = self.input / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp"  # hidden while written: never listed half-written
        tmp.write_bytes(version.data)
        os.utime(tmp, ns=(mtime * 10**9, mtime * 10**9))
        os.replace(tmp, path)
        self.current[name] = version
        for i in ids:
            self.by_id[i] = version
        return version

    def new_ids(self, count: int) -> tuple[int, ...]:
        ids = tuple(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def deliver_one(self, prefix: str, partition: int, rows: int, lateness: int) -> None:
        self.clock += TICK
        self.files_seq += 1
        name = f"{prefix}/dt={partition:02d}/part-{self.files_seq:05d}.parquet"
        self.write(name, self.new_ids(rows), self.clock - lateness * TICK)

    def deliver_some(self, data: st.DataObject, least: int) -> None:
        files = data.draw(st.lists(st.tuples(st.sampled_from(PREFIXES), st.integers(0, PARTITIONS - 1),
                                             st.integers(1, 3), self.LATENESS), min_size=least, max_size=3), "files")
        for prefix, partition, rows, lateness in files:
            self.deliver_one(prefix, partition, rows, lateness)

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """New files in any partitions (late ones if a partition was passed); lateness (in
        ticks): a copy that kept an older modification time."""
        self.deliver_some(data, 1)

    @rule(data=st.data(), count=st.integers(1, 3))
    def deliver_and_run(self, data: st.DataObject, count: int) -> None:
        """Files arriving between epochs, as they do in production."""
        for _ in range(count):
            self.deliver_some(data, 0)
            self.run_epoch()

    @precondition(lambda self: self.CHANGES and bool(self.current))
    @rule(data=st.data(), rows=st.integers(1, 3))
    def reupload(self, data: st.DataObject, rows: int) -> None:
        """New content under a name already delivered (consumed or not)."""
        name = data.draw(st.sampled_from(sorted(self.current)))
        old = self.current[name]
        if self.consumed.get(name) != old:
            self.owed.difference_update(old.ids)  # replaced before it was read: those rows are gone
        self.clock += TICK
        self.write(name, self.new_ids(rows), self.clock)

    # -- what the options let an epoch skip ------------------------------------------------
    def pending_versions(self) -> list[Version]:
        return [v for name, v in sorted(self.current.items()) if self.consumed.get(name) != v]

    def changed_versions(self) -> list[Version]:
        return [v for v in self.pending_versions() if v.name in self.consumed]

    def watermark(self) -> float | None:
        """How old a file may be and still be read: the window of ``max_file_age`` now, and
        never below a window applied before (what left the consumed-file index cannot be
        told from a file never read, so files older than that stay ignored)."""
        age = self.options["max_file_age"]
        if age is None or not self.consumed:
            return self.horizon
        now = max(v.mtime for v in self.consumed.values()) - age
        return now if self.horizon is None else max(now, self.horizon)

    def floor(self, prefix: str) -> str | None:
        """The partition of the greatest name consumed below ``prefix`` (ordered_prefixes)."""
        names = [n for n in self.consumed if n.startswith(prefix + "/")]
        return "/".join(max(names).split("/")[:2]) if names else None

    def listed(self, version: Version, backfill: bool) -> bool:
        if not self.options["ordered_prefixes"] or backfill:
            return True
        floor = self.floor(version.prefix)
        return floor is None or version.partition >= floor

    def mark_owed(self, backfill: bool) -> None:
        """Owe every pending file the documented listing rules make visible to this epoch."""
        watermark = self.horizon = self.watermark()
        for version in self.pending_versions():
            if version.name in self.consumed and self.options["on_change"] != "reread":
                continue  # a changed file under on_change="error": refused or not read
            if watermark is not None and version.mtime < watermark:
                continue
            # A file only a backfill epoch lists is owed when no cap can postpone it past that epoch.
            if not self.listed(version, False) and not (backfill and self.options["max_files_per_epoch"] is None):
                continue
            self.owed.update(version.ids)

    # -- epochs --------------------------------------------------------------------------
    def refused(self, epoch: int, exc: SourceError) -> None:
        """An epoch the source refused: it must name a file changed after it was consumed.
        The epoch is aborted and the documented fix applied: the consumed content restored."""
        changed = self.changed_versions()
        assert changed, f"epoch {epoch} was refused with no file changed after it was consumed: {exc}"
        assert any(v.name in str(exc) for v in changed), f"the refusal names no changed file: {exc}"
        self.pipeline.abort(epoch, "the source refused the epoch", by="model")
        for version in changed:
            self.owed.difference_update(version.ids)
            kept = self.consumed[version.name]
            self.write(version.name, kept.ids, kept.mtime)
            self.current[version.name] = kept

    def run_epoch(self) -> list[str]:
        """One epoch through the core; the files it consumed."""
        source = self.source()
        self.runs += 1
        run_id = f"run-{self.runs}"
        epoch = self.pipeline.begin(run_id).epoch
        point = self.pipeline.restore_point()
        self.mark_owed(source.backfill_due(point.epoch, epoch))
        try:
            plan = self.pipeline.pin_inputs(epoch, "ingest", 1, lambda: {"files": source.plan_from(point, epoch)})
        except SourceError as exc:
            self.refused(epoch, exc)
            return self.run_epoch()  # the next epoch after the fix runs
        offsets = plan["files"]
        files = list(offsets["files"])
        tables = [pq.read_table(self.input / f) for f in files]
        rows = pa.concat_tables(tables) if tables else pa.table({"id": pa.array([], pa.int64())})
        blobs = [parquet_of(tuple(rows.column("id").to_pylist()))] if rows.num_rows else []
        participant = Participant(sinks={"out": blobs}, sources={"files": offsets})
        prepare_participant(self.pipeline, run_id, participant, base=point, epoch=epoch)
        decision = self.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="model")
        assert decision.decision is Decision.COMMIT
        self.pipeline.commit(epoch)
        for i in rows.column("id").to_pylist():
            version = self.by_id[i]
            self.consumed[version.name] = version
        self.horizon = self.watermark()  # the window the committed index may have forgotten below
        return files

    @rule(count=st.integers(1, 4))
    def epochs(self, count: int) -> None:
        """``count`` epochs in a row (a compaction of the consumed-file index every third)."""
        for _ in range(count):
            self.run_epoch()

    @rule()
    def drain(self) -> None:
        """Run epochs until nothing more is planned: every owed record is then in the sink."""
        idle = 0
        for _ in range(len(self.pending_versions()) + DRAIN_LIMIT):
            idle = 0 if self.run_epoch() else idle + 1
            if idle > (self.options["backfill_every"] or 0):
                break
        missing = sorted(self.owed - set(self.sink_ids()))
        assert not missing, (
            f"records {missing[:10]} of files {sorted({self.by_id[i].name for i in missing})} were visible to an "
            f"epoch but never reached the sink (options {self.options}, consumed "
            f"{sorted(self.consumed)})")

    # -- invariants ----------------------------------------------------------------------
    def sink_ids(self) -> list[int]:
        ids: list[int] = []
        for files in published(self.pipeline, "out").values():
            for data in files.values():
                ids += pq.read_table(pa.BufferReader(data)).column("id").to_pylist()
        return ids

    @invariant()
    def every_record_in_the_sink_once(self) -> None:
        twice = {i: n for i, n in Counter(self.sink_ids()).items() if n > 1}
        assert not twice, (
            f"records delivered more than once: {dict(list(twice.items())[:10])} from files "
            f"{sorted({self.by_id[i].name for i in twice})} (options {self.options})")

    @invariant()
    def no_epoch_left_unfinished(self) -> None:
        unfinished = [(s.epoch, s.state.value) for s in self.pipeline.list_epochs()
                      if s.state not in (EpochState.COMMITTED, EpochState.ABORTED)]
        assert not unfinished, f"epochs left unfinished: {unfinished}"


class OrderedPrefixesModel(FileSourceModel):
    """Glob prefixes listed in partition order, several of them (eu/ and us/)."""

    WARM = st.just(True)

    PREFIXED = st.just(True)
    ORDERED = st.just(True)
    BACKFILL = st.just(None)
    AGE = st.just(None)
    LATENESS = st.just(0)
    AGE_CHANGES = False
    CHANGES = False


class CappedWindowModel(FileSourceModel):
    """``max_files_per_epoch`` postponing files while ``max_file_age`` keeps a window."""

    WARM = st.just(True)

    PREFIXED = st.just(False)
    MAX_FILES = st.sampled_from([1, 2])
    AGE = st.sampled_from([25, 60])
    LATENESS = st.sampled_from([0, 8])
    AGE_CHANGES = False
    CHANGES = False


class ChangingWindowModel(FileSourceModel):
    """``max_file_age`` narrowed, widened and removed between epochs."""

    WARM = st.just(True)

    PREFIXED = st.just(False)
    MAX_FILES = st.just(None)
    AGE = st.sampled_from([15, 25])
    NEW_AGE = st.sampled_from([None, 200])
    LATENESS = st.sampled_from([0, 8])
    CHANGES = False


FileSourceModel.TestCase.settings = model_settings(fast_examples=6, fast_steps=15)
OrderedPrefixesModel.TestCase.settings = model_settings(fast_examples=10, fast_steps=10)
CappedWindowModel.TestCase.settings = model_settings(fast_examples=10, fast_steps=10)
ChangingWindowModel.TestCase.settings = model_settings(fast_examples=10, fast_steps=10)

test_file_source_delivers_every_record_once = FileSourceModel.TestCase
test_ordered_prefixes_deliver_every_record_once = OrderedPrefixesModel.TestCase
test_capped_epochs_in_an_age_window_deliver_every_record_once = CappedWindowModel.TestCase
test_changing_the_age_window_delivers_every_record_once = ChangingWindowModel.TestCase
