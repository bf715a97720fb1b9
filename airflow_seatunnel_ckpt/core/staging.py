"""Staged output: where an attempt stages each sink, and checking it against its manifest.

Every attempt stages into its own ``_staging/epoch=<e>/attempt=<a>/<sink>/`` directory,
so a stale attempt can never overwrite the winner's files. A prepared record's manifest
names each staged file with its size and CRC32C; :func:`verify_staged` proves that
exactly those bytes are still there before the commit decision.
"""

from __future__ import annotations

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.checkpoint import Problem
from airflow_seatunnel_ckpt.core.errors import ConfigError, FencedAttemptError, InvalidNameError, StorageError
from airflow_seatunnel_ckpt.core.models import SinkManifest
from airflow_seatunnel_ckpt.core.names import validate_name
from airflow_seatunnel_ckpt.core.storage import FileInfo, Storage, backend_for, clean_relpath, refuse_password


def inside_pipeline(path: str, what: str) -> str:
    """``path`` normalised, if it stays inside the pipeline's directory; else InvalidNameError."""
    try:
        return clean_relpath(path)
    except StorageError as exc:
        raise InvalidNameError(f"{what}: {exc}") from None


def _bookkeeping(name: str) -> bool:
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def manifest_of(storage: Storage, staging: str, sink: str, target_url: str, rows: int,
                fmt: str = "parquet") -> SinkManifest:
    """List what was staged in ``staging`` for ``sink`` as a manifest (data files only).

    Names are judged as Spark's file index judges them: a file or directory whose name
    starts with ``.`` or with ``_`` but holds no ``=`` is bookkeeping of the writer
    (``_SUCCESS``, ``_committed_*``, ``_started_*``, ``_temporary/``, Hadoop's
    ``.part-0.crc``), and so is a ``*.crc`` file; a partition directory such as
    ``_tenant=a`` is data. Each file's CRC32C is recorded, so the commit decision and the
    publish can prove that exactly these bytes get published.
    """
    files = [FileInfo(f.path, f.size, storage.checksum(f"{staging}/{f.path}"))
             for f in storage.walk(staging)
             if not any(map(_bookkeeping, f.path.split("/"))) and not f.path.endswith(".crc")]
    return SinkManifest(validate_name(sink, "sink name"), target_url, staging, files, rows, fmt)


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
        # FileNotFoundError at either step: missing, or removed meanwhile by an
        # abort that won the decision while this verification ran.
        try:
            # One request on an object store: the size and the CRC32C it keeps.
            found = storage.file_info(path)
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
