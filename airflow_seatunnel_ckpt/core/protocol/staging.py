"""Staged output: an attempt's manifests, checked against its staging (:func:`verify_staged`), and
the checkpoint's marker files."""

from __future__ import annotations

import json
from typing import Any

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.errors import (
    ConfigError,
    CorruptCheckpointError,
    FencedAttemptError,
    InvalidNameError,
    StorageError,
)
from airflow_seatunnel_ckpt.core.layout import validate_name
from airflow_seatunnel_ckpt.core.models import PartRef, PreparedRecord, SinkManifest
from airflow_seatunnel_ckpt.core.state.checkpoint import Problem
from airflow_seatunnel_ckpt.core.storage import FileInfo, Storage, backend_for, clean_relpath, refuse_password

# The markers restate a prepared record in the checkpoint directory, so a checkpoint can be
# read without the log; derived from the record alone, so rewriting them after a crash is
# harmless (decision 2).


def _write(storage: Storage, path: str, doc: dict[str, Any], epoch: int) -> PartRef:
    data = codec.encode_json(doc)
    storage.write_atomic(path, data)
    return PartRef(path, len(data), codec.crc32c(data), epoch)


def write_markers(storage: Storage, record: PreparedRecord) -> tuple[dict[str, PartRef], dict[str, PartRef]]:
    """Write the markers of ``record``; returns their references (by sink, by source)."""
    sinks = {
        sink.sink: _write(storage, layout.sink_marker_path(record.epoch, sink.sink),
                          {"type": "sink_prepared", "epoch": record.epoch, "participant": record.participant,
                           "attempt": record.attempt, "manifest": sink.to_dict()}, record.epoch)
        for sink in record.sinks}
    sources = {
        source: _write(storage, layout.source_meta_path(record.epoch, source),
                       {"type": "source_meta", "epoch": record.epoch, "source": source,
                        "attempt": record.attempt, "chain": [p.to_dict() for p in state.chain]}, record.epoch)
        for source, state in record.sources.items()}
    return sinks, sources


def inside_pipeline(path: str, what: str) -> str:
    """``path`` normalised, if it stays inside the pipeline's directory; else InvalidNameError."""
    try:
        return clean_relpath(path)
    except StorageError as exc:
        raise InvalidNameError(f"{what}: {exc}") from None


def _bookkeeping(name: str) -> bool:
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


#: The files the writer's job committed, with the size and CRC32C each executor computed
#: (``{"files": [{"path", "size", "crc32c"}]}``, by ``spark.sinks.staged_writer``).
FILES_LIST = "_seatunnel_files.json"


def manifest_of(storage: Storage, staging: str, sink: str, target_url: str, rows: int,
                fmt: str = "parquet") -> SinkManifest:
    """List what was staged in ``staging`` for ``sink`` as a manifest (data files, each with its CRC32C).

    Names are judged as Spark's file index judges them (``_SUCCESS``, ``_temporary/``,
    ``.part-0.crc`` are bookkeeping, ``_tenant=a`` is data). A :data:`FILES_LIST` the writer
    left is the file list and its checksums (a file a failed task left is not output).
    """
    found = {f.path: f for f in storage.walk(staging)
             if not any(map(_bookkeeping, f.path.split("/"))) and not f.path.endswith(".crc")}
    written = _files_list(storage, staging)
    if written is None:
        files = [FileInfo(f.path, f.size, storage.checksum(f"{staging}/{f.path}")) for f in found.values()]
    else:
        for f in written:
            if found.get(f.path) is None or found[f.path].size != f.size:
                where = storage.describe_path(f"{staging}/{f.path}")
                what = "is missing" if f.path not in found else f"is {found[f.path].size} bytes"
                raise CorruptCheckpointError(
                    f"{where}: the writer committed it with {f.size} bytes ({FILES_LIST}), but it {what}; "
                    "the staged output changed after the write -- run the stage again (a new attempt)", where)
        files = written
    return SinkManifest(validate_name(sink, "sink name"), target_url, staging, files, rows, fmt)


def _files_list(storage: Storage, staging: str) -> list[FileInfo] | None:
    """The writer's :data:`FILES_LIST` of ``staging``, checked; None if there is none."""
    path = f"{staging}/{FILES_LIST}"
    where = storage.describe_path(path)
    try:
        data = storage.read(path)
    except FileNotFoundError:
        return None
    try:
        entries = json.loads(data)["files"]
        if not isinstance(entries, list):
            raise TypeError("'files' is not a list")
        out = []
        for e in entries:
            size, crc = e["size"], e["crc32c"]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (size, crc)) or size < 0 \
                    or not 0 <= crc < 1 << 32:
                raise ValueError(f"bad size or crc32c in {e!r}")
            out.append(FileInfo(inside_pipeline(str(e["path"]), f"{FILES_LIST} entry"), size, crc))
    except (ValueError, TypeError, KeyError, InvalidNameError) as exc:
        raise CorruptCheckpointError(
            f"{where}: not a valid list of written files ({exc}); run the stage again (a new attempt)",
            where) from None
    return sorted(out, key=lambda f: f.path)


def check_manifest(sink: SinkManifest, epoch: int, attempt: int) -> None:
    """Refuse a manifest that names a bad sink or target, or files outside the attempt's staging."""
    validate_name(sink.sink, "sink name")
    try:
        refuse_password(sink.target_url, f"sink {sink.sink!r} target URL")
        # A target no backend can publish to: refuse before the decision. A table sink's
        # target names the table (``iceberg://<catalog>/<table>``); its format commits it.
        if "://" in sink.target_url and sink.table is None:
            backend_for(sink.target_url.split("://", 1)[0].lower())
    except StorageError as exc:
        raise ConfigError(str(exc)) from None
    own = layout.staging_dir(epoch, attempt, sink.sink)
    staging = inside_pipeline(sink.staging, f"sink {sink.sink!r} staging directory")
    if staging != own and not staging.startswith(own + "/"):
        raise FencedAttemptError(
            f"sink {sink.sink!r} staged at {sink.staging!r}, outside attempt {attempt}'s staging {own!r}")
    for f in sink.files:
        if not inside_pipeline(f.path, f"sink {sink.sink!r} staged file"):
            raise InvalidNameError(f"sink {sink.sink!r}: a staged file has an empty path")


def verify_staged(storage: Storage, sink: SinkManifest, deep: bool) -> list[Problem]:
    """Problems with the files ``sink`` staged: missing, another size, or (``deep``) another CRC32C."""
    problems = []
    for f in sink.files:
        path = f"{sink.staging}/{f.path}"
        # FileNotFoundError: missing, or removed meanwhile by an abort that won the decision.
        try:
            found = storage.file_info(path)  # one request on an object store: size and CRC32C
            size = found.size
            wrong_crc = (size == f.size and deep and f.crc32c is not None
                         and (found.crc32c if found.crc32c is not None else storage.checksum(path))
                         != f.crc32c)
        except FileNotFoundError:
            problems.append(Problem(storage.describe_path(path), "staged file is missing"))
            continue
        if size != f.size:
            problems.append(Problem(storage.describe_path(path),
                                    f"staged file is {size} bytes, manifest says {f.size}"))
        elif wrong_crc:
            problems.append(Problem(storage.describe_path(path),
                                    "staged file's checksum does not match the manifest"))
    return problems


def drop_staging(storage: Storage, epoch: int) -> None:
    """Remove every attempt's staging of ``epoch``."""
    storage.delete(layout.staging_epoch_dir(epoch), recursive=True)
