"""State parts: one framed, checksummed file of Arrow or JSON, written and read whole.

Kept apart from :mod:`.checkpoint` so that sorted runs can use it while checkpoints read runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from airflow_seatunnel_ckpt.core import codec
from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import PartKind, PartRef
from airflow_seatunnel_ckpt.core.storage import Storage

#: Column marking removed keys in a delta part of key -> value state.
TOMBSTONE = "__deleted"


def write_part(storage: Storage, path: str, pieces: Iterable[bytes], *, kind: codec.PayloadKind, epoch: int,
               key_group: int = 0, delta: bool = False, base_epoch: int | None = None, level: int = 3,
               compression: codec.Codec = codec.Codec.ZSTD) -> PartRef:
    """Frame and write one state part atomically, streaming; returns its reference (size + CRC32C)."""
    written = Tally()
    storage.write_atomic(path, written(codec.encode_stream(pieces, kind=kind, epoch=epoch, base_epoch=base_epoch,
                                                           delta=delta, codec=compression, level=level)))
    return PartRef(path=path, size=written.size, crc32c=written.crc32c, epoch=epoch, key_group=key_group,
                   kind=PartKind.DELTA if delta else PartKind.FULL)


class Tally:
    """The size and CRC32C of the bytes passed through it so far (what a part's reference records)."""

    def __init__(self) -> None:
        self.size = self.crc32c = 0

    def __call__(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        for piece in pieces:
            self.size += len(piece)
            self.crc32c = codec.crc32c(piece, self.crc32c)
            yield piece


def write_arrow_part(storage: Storage, path: str, table: Any, **options: Any) -> PartRef:
    """Write a ``pyarrow.Table`` as one state part (Arrow IPC payload)."""
    return write_part(storage, path, codec.arrow_ipc_pieces(table), kind=codec.PayloadKind.ARROW, **options)


def write_json_part(storage: Storage, path: str, obj: Any, **options: Any) -> PartRef:
    """Write a JSON document as one state part."""
    payload = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return write_part(storage, path, [payload], kind=codec.PayloadKind.JSON, **options)


def read_part(storage: Storage, ref: PartRef, max_chunk: int = codec.DEFAULT_MAX_CHUNK,
              ) -> tuple[codec.FrameHeader, bytearray]:
    """Read one part, checking size and CRC32C against its reference, then its frame."""
    return codec.decode(read_checked(storage, ref), storage.describe_path(ref.path), max_chunk=max_chunk)


def check_part(storage: Storage, ref: PartRef, max_chunk: int = codec.DEFAULT_MAX_CHUNK) -> None:
    """Read one part and check size, CRC32C and frame against its reference, without decoding it."""
    codec.check_frame(read_checked(storage, ref), storage.describe_path(ref.path), max_chunk=max_chunk)


def read_checked(storage: Storage, ref: PartRef) -> bytes:
    """A part's bytes, whole, checked against its reference's size and CRC32C."""
    where = storage.describe_path(ref.path)
    try:
        data = storage.read(ref.path)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{where}: checkpoint part is missing", where) from None
    if len(data) != ref.size:
        raise CorruptCheckpointError(f"{where}: size is {len(data)} bytes, _metadata says {ref.size}", where)
    if codec.crc32c(data) != ref.crc32c:
        raise CorruptCheckpointError(f"{where}: checksum does not match the one recorded in _metadata", where)
    return data


def read_json_part(storage: Storage, ref: PartRef) -> Any:
    """Read a JSON state part."""
    header, payload = read_part(storage, ref)
    where = storage.describe_path(ref.path)
    if header.kind is not codec.PayloadKind.JSON:
        raise CorruptCheckpointError(f"{where}: expected a JSON part, found {header.kind.name}", where)
    try:
        return json.loads(payload)
    except ValueError as exc:
        raise CorruptCheckpointError(f"{where}: not valid JSON: {exc}", where) from exc


def read_arrow_part(storage: Storage, ref: PartRef) -> Any:
    """Read an Arrow state part as a ``pyarrow.Table``."""
    header, payload = read_part(storage, ref)
    where = storage.describe_path(ref.path)
    if header.kind is not codec.PayloadKind.ARROW:
        raise CorruptCheckpointError(f"{where}: expected an Arrow part, found {header.kind.name}", where)
    return codec.read_arrow(payload, where)


def key_array(table: Any, key_columns: list[str]) -> Any:
    """One array of keys for ``table``: the key column, or the columns joined for a composite key."""
    import pyarrow.compute as pc

    if len(key_columns) == 1:
        return table.column(key_columns[0])
    # A composite key is encoded injectively: each component becomes "N" when null, else
    # "V<length>:<value>". Joining with a separator instead would make ("a\x1fb", "c") and
    # ("a", "b\x1fc") one key, and any null component would make every such key equal.
    parts = []
    for name in key_columns:
        text = pc.cast(table.column(name), "string")
        length = pc.cast(pc.binary_length(text), "string")
        encoded = pc.binary_join_element_wise("V", length, ":", text, "")
        parts.append(pc.fill_null(encoded, "N"))
    return pc.binary_join_element_wise(*parts, "")


def apply_delta(base: Any, delta: Any, key_columns: list[str]) -> Any:
    """Apply one delta table to a base table: upsert by key, drop tombstoned keys."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if delta.num_rows == 0:
        return base
    keep = pc.invert(pc.is_in(key_array(base, key_columns), value_set=key_array(delta, key_columns)))
    if TOMBSTONE in delta.column_names:
        delta = delta.filter(pc.invert(pc.fill_null(delta.column(TOMBSTONE), False))).drop_columns([TOMBSTONE])
    # A delta may carry a column the base does not have yet (a new aggregate column): the
    # base's rows get nulls in it; or a value column widened since (int -> bigint): the
    # base's values are read as the wider type.
    columns = list(base.column_names) + [c for c in delta.column_names if c not in base.column_names]
    return pa.concat_tables([base.filter(keep), delta.select([c for c in columns if c in delta.column_names])],
                            promote_options="permissive").select(columns)
