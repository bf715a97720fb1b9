"""The state file format: framed, versioned, compressed, CRC32C-checked.

Layout of one file (all integers big-endian)::

    header   magic "STCK" | version u16 | flags u16 | payload kind u8 | reserved u8
             | epoch u64 | base epoch u64 | crc32c(header) u32                 (30 bytes)
    chunk*   raw length u32 | stored length u32 | crc32c(lengths + stored bytes) u32
             | stored bytes (one independent compressed frame)
    trailer  0 u32 | 0 u32 | total raw length u64 | chunk count u32
             | crc32c(every byte before this field) u32

Every chunk is verified before it is decompressed or handed on; the raw length bounds
decompression; the trailer makes truncated, reordered or dropped chunks detectable.
"""

from __future__ import annotations

import enum
import functools
import io
import json
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import crc32c as _crc32c
import zstandard

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError, IncompatibleFormatError

MAGIC = b"STCK"
FORMAT_VERSION = 1
#: 1 MiB keeps a chunk and its frame in the CPU cache while it is checksummed and copied:
#: faster than 4 MiB on both sides, for 0.1% more bytes (``bench/bench_core.py``).
DEFAULT_CHUNK_SIZE = 1024 * 1024
DEFAULT_MAX_CHUNK = 64 * 1024 * 1024

_HEADER = struct.Struct(">4sHHBBQQ")
_HEADER_CRC = struct.Struct(">I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
_CHUNK = struct.Struct(">III")
_TRAILER_TAIL = struct.Struct(">QI")
_U32 = struct.Struct(">I")

FLAG_DELTA = 0x1
_CODEC_SHIFT = 1
_CODEC_MASK = 0x3 << _CODEC_SHIFT
_KNOWN_FLAGS = FLAG_DELTA | _CODEC_MASK


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli), hardware accelerated where the CPU has it."""
    return int(_crc32c.crc32c(data, value))


class PayloadKind(enum.IntEnum):
    """What the decompressed payload holds."""

    JSON = 1
    ARROW = 2
    BYTES = 3
    RUN = 4  #: a sorted run of keyed state (``core/state/runs.py``)


class Codec(enum.IntEnum):
    """Compression of the stored chunks."""

    ZSTD = 0
    LZ4 = 1


@dataclass(frozen=True)
class FrameHeader:
    """The decoded fixed header of a state file."""

    version: int
    kind: PayloadKind
    codec: Codec
    delta: bool
    epoch: int
    base_epoch: int | None


def _compressor(codec: Codec, level: int) -> Callable[[bytes | memoryview], bytes]:
    if codec is Codec.ZSTD:
        return zstandard.ZstdCompressor(level=level).compress
    import lz4.frame

    return functools.partial(lz4.frame.compress, compression_level=max(0, level))


def _decompress(codec: Codec, stored: bytes | memoryview, raw_len: int, path: str,
                dctx: zstandard.ZstdDecompressor | None = None) -> bytes:
    try:
        if codec is Codec.ZSTD:
            # ``max_output_size`` only bounds frames that do not declare their size: a frame
            # declaring more than the chunk header allows is refused before it is allocated.
            declared = zstandard.frame_content_size(stored)
            if declared not in (-1, raw_len):
                raise CorruptCheckpointError(
                    f"{path}: a chunk's compressed frame declares {declared} bytes, its header "
                    f"{raw_len} (damaged file or decompression bomb)", path)
            out = (dctx or zstandard.ZstdDecompressor()).decompress(stored, max_output_size=raw_len)
        else:
            import lz4.frame

            out = lz4.frame.decompress(stored)
    except CorruptCheckpointError:
        raise
    except Exception as exc:
        raise CorruptCheckpointError(f"{path}: a chunk does not decompress: {exc}", path) from exc
    if len(out) != raw_len:
        raise CorruptCheckpointError(
            f"{path}: a chunk decompressed to {len(out)} bytes, the frame says {raw_len}", path)
    return bytes(out)


def encode_stream(chunks: Iterable[bytes], *, kind: PayloadKind, epoch: int = 0, base_epoch: int | None = None,
                  delta: bool = False, codec: Codec = Codec.ZSTD, level: int = 3,
                  chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
    """Frame a payload given as pieces, re-cut to ``chunk_size``; yields the file's bytes piece by piece."""
    writer = ChunkWriter(kind=kind, epoch=epoch, base_epoch=base_epoch, delta=delta, codec=codec, level=level)
    yield writer.header()
    for raw in _recut(chunks, chunk_size):
        head, stored = writer.framed(raw)
        if len(stored) < 65536:
            yield head + stored
        else:  # a large chunk is not copied into one buffer with its head
            yield head
            yield stored
    yield writer.trailer()


class ChunkWriter:
    """Frames a state file one caller-chosen chunk at a time (a sorted run's block is one chunk,
    so that a ranged read of it is verified by the chunk's own CRC32C and decoded alone)."""

    def __init__(self, *, kind: PayloadKind, epoch: int = 0, base_epoch: int | None = None,
                 delta: bool = False, codec: Codec = Codec.ZSTD, level: int = 3) -> None:
        flags = (FLAG_DELTA if delta else 0) | (int(codec) << _CODEC_SHIFT)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, flags, int(kind), 0, epoch, base_epoch or 0)
        self._header = header + _HEADER_CRC.pack(crc32c(header))
        self._running = crc32c(self._header)
        self._codec, self._level = codec, level
        self._comps = {level: _compressor(codec, level)}
        self._total = self._count = 0

    def header(self) -> bytes:
        """The file's fixed header (first bytes of the file)."""
        return self._header

    def chunk(self, raw: bytes | memoryview, *, level: int | None = None) -> bytes:
        """One chunk holding exactly ``raw`` (non-empty), framed; ``level`` overrides the file's."""
        head, stored = self.framed(raw, level=level)
        return head + stored

    def framed(self, raw: bytes | memoryview, *, level: int | None = None) -> tuple[bytes, bytes]:
        """:meth:`chunk` as its head and its stored (compressed) bytes, which follow the head."""
        if not len(raw):
            raise ValueError("a chunk needs at least one byte")
        level = self._level if level is None else level
        compress = self._comps.get(level)
        if compress is None:
            compress = self._comps[level] = _compressor(self._codec, level)
        stored = compress(raw)  # any buffer: the IPC payload is not copied first
        lengths = _CHUNK.pack(len(raw), len(stored), 0)[:8]
        head = lengths + _U32.pack(crc32c(stored, crc32c(lengths)))
        self._running = crc32c(stored, crc32c(head, self._running))
        self._total += len(raw)
        self._count += 1
        return head, stored

    def trailer(self) -> bytes:
        """The trailer closing the file (after the last chunk)."""
        end = _CHUNK.pack(0, 0, 0) + _TRAILER_TAIL.pack(self._total, self._count)
        return end + _U32.pack(crc32c(end, self._running))


def decode_chunk(data: bytes | memoryview, path: str, codec: Codec, *,
                 max_chunk: int = DEFAULT_MAX_CHUNK) -> bytes:
    """Verify (by the chunk's own CRC32C) and decompress exactly one chunk read alone (a ranged read)."""
    view = memoryview(data).cast("B")
    if len(view) < _CHUNK.size:
        raise CorruptCheckpointError(f"{path}: a block is truncated ({len(view)} bytes)", path)
    raw_len, stored_len, stored_crc = _CHUNK.unpack(view[:_CHUNK.size])
    if raw_len == 0 or raw_len > max_chunk or stored_len != len(view) - _CHUNK.size:
        raise CorruptCheckpointError(
            f"{path}: a block's chunk header claims {raw_len} raw / {stored_len} stored bytes, "
            f"the index gives it {len(view) - _CHUNK.size} (damaged file or index)", path)
    stored = view[_CHUNK.size:]
    if crc32c(stored, crc32c(view[:8])) != stored_crc:
        raise CorruptCheckpointError(f"{path}: checksum mismatch in a block", path)
    return _decompress(codec, stored, raw_len, path)


def _recut(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """Re-cut pieces into ``size``-byte chunks, slicing large pieces without copying."""
    buf = bytearray()
    for piece in chunks:
        view = memoryview(piece).cast("B")
        if buf:
            take = size - len(buf)
            buf += view[:take]
            view = view[take:]
            if len(buf) < size:
                continue
            yield bytes(buf)
            buf = bytearray()
        while len(view) >= size:
            yield view[:size]  # type: ignore[misc]
            view = view[size:]
        if len(view):
            buf += view
    if buf:
        yield bytes(buf)


def encode(payload: bytes, *, kind: PayloadKind = PayloadKind.BYTES, **options: Any) -> bytes:
    """Frame a whole payload held in memory."""
    return b"".join(encode_stream([payload], kind=kind, **options))


class _MemoryReader:
    """A reader over bytes already in memory that hands out zero-copy slices."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def read(self, n: int = -1) -> memoryview:
        end = len(self._view) if n < 0 else min(self._pos + n, len(self._view))
        piece = self._view[self._pos:end]
        self._pos = end
        return piece


def _read_exact(fh: IO[bytes] | _MemoryReader, n: int, path: str, what: str) -> bytes | memoryview:
    data = fh.read(n)
    if len(data) != n:
        raise CorruptCheckpointError(
            f"{path}: file is truncated (expected {n} more bytes of {what}, found {len(data)})", path)
    return data


def read_header(fh: IO[bytes], path: str) -> FrameHeader:
    """Read and verify the fixed header; refuses unknown formats and versions."""
    raw = fh.read(HEADER_SIZE)
    if len(raw) < 4 or raw[:4] != MAGIC:
        raise CorruptCheckpointError(
            f"{path}: not a checkpoint state file (bad magic {bytes(raw[:4])!r}, expected {MAGIC!r})", path)
    if len(raw) < HEADER_SIZE:
        raise CorruptCheckpointError(f"{path}: file is truncated inside the header", path)
    magic, version, flags, kind, _reserved, epoch, base = _HEADER.unpack(raw[: _HEADER.size])
    (stored_crc,) = _HEADER_CRC.unpack(raw[_HEADER.size:])
    if crc32c(raw[: _HEADER.size]) != stored_crc:
        raise CorruptCheckpointError(f"{path}: header checksum mismatch", path)
    if version > FORMAT_VERSION:
        raise IncompatibleFormatError(f"{path}: written by format version {version}, this release reads up to "
                                      f"{FORMAT_VERSION}; upgrade airflow-seatunnel-ckpt to read it", path)
    if version < 1 or flags & ~_KNOWN_FLAGS:
        raise IncompatibleFormatError(f"{path}: unknown format version {version} / flags {flags:#x}", path)
    try:
        kind_v = PayloadKind(kind)
        codec = Codec((flags & _CODEC_MASK) >> _CODEC_SHIFT)
    except ValueError as exc:
        raise IncompatibleFormatError(f"{path}: unknown payload kind or codec ({exc})", path) from exc
    return FrameHeader(version, kind_v, codec, bool(flags & FLAG_DELTA), epoch, base or None)


def decode_stream(fh: IO[bytes] | _MemoryReader, path: str, *, max_chunk: int = DEFAULT_MAX_CHUNK,
                  decompress: bool = True) -> tuple[FrameHeader, Iterator[bytes]]:
    """Verify and decode a state file from a stream: its header and an iterator of raw payload chunks.

    Every chunk is checked before it is yielded, the trailer and whole-file checksum at the
    end. With ``decompress=False`` the chunks are checked and skipped (yielded empty).
    """
    head_bytes = fh.read(HEADER_SIZE)
    header = read_header(io.BytesIO(head_bytes), path)
    running = crc32c(head_bytes)

    def chunks() -> Iterator[bytes]:
        nonlocal running
        total = count = 0
        dctx = zstandard.ZstdDecompressor() if header.codec is Codec.ZSTD else None
        while True:
            head = _read_exact(fh, 12, path, "a chunk header")
            raw_len, stored_len, stored_crc = _CHUNK.unpack(head)
            if raw_len == 0 and stored_len == 0 and stored_crc == 0:
                break
            if raw_len == 0 or raw_len > max_chunk or stored_len > max_chunk + 1024 + max_chunk // 100:
                raise CorruptCheckpointError(
                    f"{path}: chunk {count} claims {raw_len} raw / {stored_len} stored bytes, "
                    f"over the limit of {max_chunk} (damaged file or decompression bomb)", path)
            stored = _read_exact(fh, stored_len, path, f"chunk {count}")
            if crc32c(stored, crc32c(head[:8])) != stored_crc:
                raise CorruptCheckpointError(f"{path}: checksum mismatch in chunk {count}", path)
            running = crc32c(stored, crc32c(head, running))
            count += 1
            total += raw_len
            yield _decompress(header.codec, stored, raw_len, path, dctx) if decompress else b""
        tail = _read_exact(fh, _TRAILER_TAIL.size + 4, path, "the trailer")
        want_total, want_count = _TRAILER_TAIL.unpack(tail[: _TRAILER_TAIL.size])
        running = crc32c(tail[: _TRAILER_TAIL.size], crc32c(head, running))
        (file_crc,) = _U32.unpack(tail[_TRAILER_TAIL.size:])
        if file_crc != running:
            raise CorruptCheckpointError(f"{path}: whole-file checksum mismatch", path)
        if (want_total, want_count) != (total, count):
            raise CorruptCheckpointError(
                f"{path}: trailer says {want_count} chunks / {want_total} bytes, read {count} / {total}", path)
        if fh.read(1):
            raise CorruptCheckpointError(f"{path}: unexpected bytes after the trailer", path)

    return header, chunks()


def decode(data: bytes | bytearray | memoryview, path: str = "<bytes>", *,
           max_chunk: int = DEFAULT_MAX_CHUNK) -> tuple[FrameHeader, bytearray]:
    """Verify and decode a whole state file held in memory.

    One growing ``bytearray``: joining a list of chunks would hold them and the copy at once.
    """
    header, it = decode_stream(_MemoryReader(data), path, max_chunk=max_chunk)
    payload = bytearray()
    for chunk in it:
        payload += chunk
    return header, payload


def check_frame(data: bytes | bytearray | memoryview, path: str = "<bytes>", *,
                max_chunk: int = DEFAULT_MAX_CHUNK) -> FrameHeader:
    """Everything :func:`decode` checks but the decompression (about 20 times cheaper); the header."""
    header, it = decode_stream(_MemoryReader(data), path, max_chunk=max_chunk, decompress=False)
    for _ in it:
        pass
    return header


def encode_json(obj: Any, **options: Any) -> bytes:
    """Frame a JSON document (records, manifests, ``_metadata``)."""
    payload = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return encode(payload, kind=PayloadKind.JSON, **options)


def decode_json_payload(data: bytes, path: str = "<bytes>", *, max_chunk: int = DEFAULT_MAX_CHUNK) -> bytearray:
    """Verify a framed JSON document; its JSON text, unparsed (for a typed record's decode)."""
    header, payload = decode(data, path, max_chunk=max_chunk)
    if header.kind is not PayloadKind.JSON:
        raise CorruptCheckpointError(f"{path}: expected a JSON payload, found {header.kind.name}", path)
    return payload


def decode_json(data: bytes, path: str = "<bytes>", *, max_chunk: int = DEFAULT_MAX_CHUNK) -> Any:
    """Verify a framed JSON document and parse it (plain data only)."""
    payload = decode_json_payload(data, path, max_chunk=max_chunk)
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"{path}: payload is not valid JSON: {exc}", path) from exc


def arrow_ipc_pieces(table: Any) -> Iterator[bytes]:
    """Serialise a ``pyarrow.Table`` as an Arrow IPC stream, one record batch at a time."""
    import pyarrow as pa

    # Measured first, then written into a buffer of exactly that size: a growing
    # BufferOutputStream reallocates and copies as it goes (half the cost of a 1 MiB block).
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, table.schema) as writer:
        writer.write_table(table)
    buffer = pa.allocate_buffer(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buffer), table.schema) as writer:
        writer.write_table(table)
    # The IPC buffer is contiguous; hand it on without copying through Python.
    yield memoryview(buffer)  # type: ignore[misc]


def read_arrow(payload: bytes | bytearray | memoryview, path: str) -> Any:
    """Parse an Arrow IPC stream payload into a ``pyarrow.Table``."""
    import pyarrow as pa

    try:
        with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
            return reader.read_all()
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError variants
        raise CorruptCheckpointError(f"{path}: payload is not a valid Arrow IPC stream: {exc}", path) from exc
