"""The consumed-file index of a file source: sorted Arrow segments and a time watermark.

A chain ``[directory, *segments, *deltas]`` (the directory part named with the token
``index``) answers "was this listed file consumed, and with which identity?" for the listed
names only, reading just the segments whose key range covers one; :meth:`FileIndex.compact`
merges the deltas and drops files below the watermark. docs/FILE_SOURCES.md has the layout.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pydantic

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import RECORD, Record

#: Rows per base segment: small enough that a lookup touching one segment stays cheap,
#: large enough that a million files make a directory of a few dozen entries.
SEGMENT_ROWS = 32_768
#: The path token of a directory part (``part-0-<attempt>-index``).
DIRECTORY_TOKEN = "index"
#: The directory's format name and version (a future shape is refused, not misread).
FORMAT = "file-index"
VERSION = 1


def schema() -> Any:
    """The Arrow schema of segments and deltas."""
    import pyarrow as pa

    return pa.schema([("path", pa.string()), ("size", pa.int64()), ("mtime", pa.float64()),
                      ("etag", pa.string()), ("epoch", pa.int64())])


def mtime_seconds(value: Any) -> float | None:
    """A modification time as POSIX seconds: numbers as they are, RFC 3339 strings parsed;
    None when unknown or unparseable (such a file is never aged out)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def same_file(consumed: Mapping[str, Any] | None, listed: Mapping[str, Any]) -> bool:
    """Whether a listed file is the one consumed under its name: the same size, then the ETag where both have
    one, else the mtime where both have one (an unknown consumed identity never counts as changed)."""
    if consumed is None:
        return True
    size = consumed.get("size")
    if size is not None and listed.get("size") is not None and int(size) != int(listed["size"]):
        return False
    if consumed.get("etag") and listed.get("etag"):
        return str(consumed["etag"]) == str(listed["etag"])
    old, new = mtime_seconds(consumed.get("mtime")), mtime_seconds(listed.get("mtime"))
    if old is not None and new is not None:
        return old == new
    return True


def rows_table(rows: Iterable[tuple[str, Mapping[str, Any] | None, int]]) -> Any:
    """An index table, sorted by path, from ``(path, identity or None, epoch)`` rows; a
    path listed twice keeps its latest epoch's identity (a re-read file)."""
    import pyarrow as pa

    latest: dict[str, tuple[Mapping[str, Any] | None, int]] = {}
    for path, ident, epoch in rows:
        if path not in latest or epoch >= latest[path][1]:
            latest[path] = (ident, epoch)
    paths = sorted(latest)
    idents = [latest[p][0] or {} for p in paths]
    return pa.table({
        "path": pa.array(paths, pa.string()),
        "size": pa.array([None if i.get("size") is None else int(i["size"]) for i in idents], pa.int64()),
        "mtime": pa.array([mtime_seconds(i.get("mtime")) for i in idents], pa.float64()),
        "etag": pa.array([None if not i.get("etag") else str(i["etag"]) for i in idents], pa.string()),
        "epoch": pa.array([latest[p][1] for p in paths], pa.int64()),
    }, schema=schema())


def rows_from_entries(entries: Sequence[Mapping[str, Any]], where: str) -> Any:
    """An index table from history entries ``{"epoch", "offsets": {"files", "identity"}}``
    (a history in the shape before the index, or rebuilt from the transaction log)."""
    rows: list[tuple[str, Mapping[str, Any] | None, int]] = []
    for entry in entries:
        offsets = entry.get("offsets") or {}
        files = offsets.get("files", [])
        identity = offsets.get("identity") or {}
        if not isinstance(files, list) or not isinstance(identity, dict):
            raise CorruptCheckpointError(
                f"{where}: committed offsets of epoch {entry.get('epoch')} have no file list: {entry!r}", where)
        epoch = int(entry.get("epoch") or 0)
        rows += [(str(f), identity.get(f), epoch) for f in files]
    return rows_table(rows)


def identity_of(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The identity dict of one index row (None when nothing is known about the file)."""
    ident = {k: row[k] for k in ("size", "mtime", "etag") if row.get(k) is not None}
    return ident or None


@pydantic.dataclasses.dataclass(config=RECORD)
class Segment(Record):
    """One base segment as the directory describes it (the part's checksum is in the chain)."""

    path: str
    first: str  #: smallest path in the segment
    last: str  #: largest path in the segment
    rows: int
    oldest: float | None  #: smallest known mtime (None: no file's mtime is known)
    newest: float | None  #: largest known mtime
    undated: int = 0  #: files whose mtime is unknown (never aged out)

    def covers(self, path: str) -> bool:
        """Whether ``path`` falls in the segment's key range."""
        return self.first <= path <= self.last


class FileIndex:
    """What a file source consumed, inside the watermark window (see the module docstring).

    :param segments: the base segments with a loader each (reads the part when called).
    :param deltas: the tables of the epochs since the base, oldest first.
    :param aged_below: the highest watermark a compaction dropped files below (None: none).
    :param max_file_age: the ``max_file_age`` of the compaction that set ``aged_below``.
    """

    def __init__(self, segments: Sequence[tuple[Segment, Callable[[], Any]]], deltas: Sequence[Any],
                 newest_mtime: float | None, aged_below: float | None = None,
                 max_file_age: float | None = None) -> None:
        self.segments = list(segments)
        self.deltas = [d for d in deltas if d.num_rows]
        newest = [newest_mtime] + [_max(d.column("mtime")) for d in self.deltas]
        known = [m for m in newest if m is not None]
        self.newest_mtime: float | None = max(known) if known else None
        self.aged_below = aged_below
        self.max_file_age = max_file_age
        self.segments_read = 0  #: segments loaded by lookups so far (for tests and benches)
        self._loaded: dict[int, Any] = {}

    @classmethod
    def from_table(cls, table: Any) -> FileIndex:
        """An index over one in-memory table (a history in the shape before the index)."""
        if table.num_rows == 0:
            return cls([], [], None)
        seg = describe(table, "<memory>")
        return cls([(seg, lambda: table)], [], seg.newest)

    def watermark(self, max_file_age: float | None) -> float | None:
        """``max_file_age`` before the newest consumed file (None: no age limit or nothing
        seen yet): what compaction ages by."""
        if max_file_age is None or self.newest_mtime is None:
            return None
        return self.newest_mtime - max_file_age

    def listing_watermark(self, max_file_age: float | None) -> float | None:
        """Listed files modified before this are ignored: :meth:`watermark`, never below
        ``aged_below`` (a file older than that may have been consumed and forgotten, so a
        wider window than the index kept would read it again)."""
        marks = [m for m in (self.watermark(max_file_age), self.aged_below) if m is not None]
        return max(marks) if marks else None

    def greatest_path(self, under: str = "", matches: Callable[[str], bool] | None = None) -> str | None:
        """The greatest file name the index holds (None: none), or the greatest that starts with ``under`` and
        ``matches`` accepts (reading the segments that may hold it, greatest first)."""
        import pyarrow.compute as pc

        if not under and matches is None:
            names = [seg.last for seg, _ in self.segments]
            names += [pc.max(d.column("path")).as_py() for d in self.deltas]
            return max(names) if names else None
        best: str | None = None
        for table in self.deltas:
            best = _greatest_in(table, under, matches, best)
        candidates = sorted((i for i, (seg, _) in enumerate(self.segments) if _may_hold(seg, under)),
                            key=lambda i: self.segments[i][0].last, reverse=True)
        for i in candidates:
            if best is not None and self.segments[i][0].last <= best:
                break  # every later candidate's names are smaller still
            best = _greatest_in(self._load(i), under, matches, best)
        return best

    def _load(self, i: int) -> Any:
        """Segment ``i``'s table, read once per index."""
        if i not in self._loaded:
            self._loaded[i] = self.segments[i][1]()
            self.segments_read += 1
        return self._loaded[i]

    def lookup(self, paths: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """The consumed identity of each of ``paths`` that the index holds (absent: not
        consumed, or aged out). Reads only the segments whose key range covers a path."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = sorted(set(paths))
        if not wanted:
            return {}
        needle = pa.array(wanted, pa.string())
        found: dict[str, tuple[int, dict[str, Any] | None]] = {}
        tables = [self._load(i) for i, (seg, _) in enumerate(self.segments) if _covers_any(seg, wanted)]
        for table in tables + self.deltas:
            hits = table.filter(pc.is_in(table.column("path"), value_set=needle))
            for row in hits.to_pylist():
                if row["path"] not in found or row["epoch"] >= found[row["path"]][0]:
                    found[row["path"]] = (row["epoch"], identity_of(row))
        return {p: ident for p, (_, ident) in found.items()}

    def table(self) -> Any:
        """Every row of the index, one per path (the latest epoch's), sorted by path."""
        import pyarrow as pa

        tables = [load() for _, load in self.segments] + self.deltas
        return _latest(pa.concat_tables(tables) if tables else schema().empty_table())

    def entries(self) -> list[dict[str, Any]]:
        """The index as history entries ``{"epoch", "offsets": {"files", "identity"}}``,
        oldest epoch first (what a restore point hands to sources that want entries)."""
        by_epoch: dict[int, dict[str, Any]] = {}
        for row in self.table().to_pylist():
            offsets = by_epoch.setdefault(int(row["epoch"]), {"files": [], "identity": {}})
            offsets["files"].append(row["path"])
            ident = identity_of(row)
            if ident is not None:
                offsets["identity"][row["path"]] = ident
        return [{"epoch": e, "offsets": by_epoch[e]} for e in sorted(by_epoch)]

    def compact(self, max_file_age: float | None) -> tuple[list[Segment | Any], float | None, float | None]:
        """The base after merging the deltas and dropping aged-out files: items each an unchanged
        :class:`Segment` (carried by reference) or a table to write as a new segment, the newest mtime, and
        the new ``aged_below``."""
        import pyarrow as pa
        import pyarrow.compute as pc

        watermark = self.watermark(max_file_age)
        delta = _latest(pa.concat_tables(self.deltas)) if self.deltas else schema().empty_table()
        delta_paths = delta.column("path").to_pylist()
        kept: list[Segment | Any] = []
        touched = [delta]
        for seg, load in self.segments:
            if watermark is not None and not seg.undated and seg.newest is not None and seg.newest < watermark:
                continue  # every file in it aged out
            aging = watermark is not None and seg.oldest is not None and seg.oldest < watermark
            if not aging and not _covers_any(seg, delta_paths):
                kept.append(seg)
                continue
            touched.append(load())
        merged = _latest(pa.concat_tables(touched))
        if watermark is not None:
            mtime = merged.column("mtime")
            merged = merged.filter(pc.or_(pc.is_null(mtime), pc.greater_equal(mtime, watermark)))
        for start in range(0, merged.num_rows, SEGMENT_ROWS):
            kept.append(merged.slice(start, SEGMENT_ROWS))
        aged_below = max((m for m in (watermark, self.aged_below) if m is not None), default=None)
        return kept, self.newest_mtime, aged_below


def describe(table: Any, path: str) -> Segment:
    """The directory entry of a sorted, non-empty segment table written at ``path``."""
    paths = table.column("path")
    mtime = table.column("mtime")
    return Segment(path, paths[0].as_py(), paths[-1].as_py(), table.num_rows, _min(mtime), _max(mtime),
                   mtime.null_count)


def directory_doc(segments: Sequence[Segment], newest_mtime: float | None, aged_below: float | None = None,
                  max_file_age: float | None = None) -> dict[str, Any]:
    """The JSON document of a directory part (with the window its compaction applied)."""
    return {"format": FORMAT, "version": VERSION, "newest_mtime": newest_mtime, "aged_below": aged_below,
            "max_file_age": max_file_age, "segments": [s.to_dict() for s in segments]}


@dataclass(frozen=True)
class Directory:
    """What a directory part records: the segments, the newest mtime, the window applied."""

    segments: list[Segment]
    newest_mtime: float | None
    aged_below: float | None = None
    max_file_age: float | None = None


def parse_directory(doc: Any, where: str) -> Directory:
    """The segments, newest mtime and window a directory part records."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{where}: not a file-index directory part", where)
    if doc.get("version") != VERSION:
        raise CorruptCheckpointError(
            f"{where}: file-index version {doc.get('version')!r}, this release reads version {VERSION}; "
            "upgrade the package that reads this checkpoint", where)
    segments = doc.get("segments")
    if not isinstance(segments, list):
        raise CorruptCheckpointError(f"{where}: file-index directory has no 'segments' list", where)
    window = {k: doc.get(k) for k in ("newest_mtime", "aged_below", "max_file_age")}
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))) for v in window.values()):
        raise CorruptCheckpointError(f"{where}: file-index directory has a non-numeric time in {window!r}", where)
    floats = {k: None if v is None else float(v) for k, v in window.items()}
    return Directory([Segment.from_dict(s, where) for s in segments], **floats)


def _latest(table: Any) -> Any:
    """One row per path (the highest epoch), sorted by path."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    table = table.sort_by([("path", "ascending"), ("epoch", "descending")])
    paths = table.column("path")
    if table.num_rows > 1:
        import pyarrow as pa

        # Sorted by path, then newest epoch first: keep each path's first row.
        previous = pa.concat_arrays([pa.array([None], pa.string()), paths.combine_chunks().slice(0, len(paths) - 1)])
        first = pc.fill_null(pc.not_equal(paths.combine_chunks(), previous), True)
        table = table.filter(first)
    return table


def _may_hold(seg: Segment, under: str) -> bool:
    """Whether the segment's key range holds names that start with ``under`` (they form
    one contiguous range of the sort order)."""
    return seg.last >= under and (seg.first <= under or seg.first.startswith(under))


def _greatest_in(table: Any, under: str, matches: Callable[[str], bool] | None, best: str | None) -> str | None:
    """The greatest of ``best`` and the names in ``table`` that start with ``under`` and match."""
    import pyarrow.compute as pc

    paths = table.column("path")
    if under:
        paths = paths.filter(pc.starts_with(paths, under))
    names: list[str] = paths.to_pylist()
    for name in sorted(names, reverse=True):
        if best is not None and name <= best:
            break
        if matches is None or matches(name):
            return name
    return best


def _covers_any(seg: Segment, sorted_paths: Sequence[str]) -> bool:
    """Whether any of ``sorted_paths`` (sorted) falls in the segment's key range."""
    i = bisect.bisect_left(sorted_paths, seg.first)
    return i < len(sorted_paths) and sorted_paths[i] <= seg.last


def _max(column: Any) -> float | None:
    import pyarrow.compute as pc

    value = pc.max(column).as_py()
    return None if value is None else float(value)


def _min(column: Any) -> float | None:
    import pyarrow.compute as pc

    value = pc.min(column).as_py()
    return None if value is None else float(value)
