"""The state file format: round trips, and every kind of damage is refused with the file named."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.core import codec
from airflow_seatunnel_ckpt.core.codec import PayloadKind
from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError, IncompatibleFormatError

PATH = "memory://store/orders/checkpoint_7/operators/seen/part-3-1"


def decode_all(data: bytes) -> bytes:
    return codec.decode(data, PATH)[1]


def must_refuse(data: bytes, what: str, *, by_framing: bool = True) -> CorruptCheckpointError:
    """Refused by ``decode``, and -- unless only decompression can tell -- by ``check_frame`` too."""
    with pytest.raises(CorruptCheckpointError) as info:
        decode_all(data)
    assert info.value.path == PATH, what
    assert PATH in str(info.value), what
    if by_framing:
        with pytest.raises(CorruptCheckpointError) as checked:
            codec.check_frame(data, PATH)
        assert PATH in str(checked.value), what
    return info.value


# -- round trips --------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    payload=st.binary(max_size=5000),
    chunk_size=st.integers(min_value=1, max_value=2048),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
    epoch=st.integers(min_value=0, max_value=2**63),
    base=st.one_of(st.none(), st.integers(min_value=1, max_value=2**63)),
    delta=st.booleans(),
)
def test_any_payload_round_trips_whatever_the_chunking(
    payload: bytes, chunk_size: int, cuts: list[int], epoch: int, base: int | None, delta: bool
) -> None:
    bounds = sorted({0, len(payload), *(min(c, len(payload)) for c in cuts)})
    pieces = [payload[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    framed = b"".join(
        codec.encode_stream(
            pieces,
            kind=PayloadKind.BYTES,
            epoch=epoch,
            base_epoch=base,
            delta=delta,
            chunk_size=chunk_size,
        )
    )

    header, decoded = codec.decode(framed, PATH)

    assert decoded == payload
    assert (header.kind, header.epoch, header.base_epoch, header.delta) == (
        PayloadKind.BYTES,
        epoch,
        base,
        delta,
    )
    assert header.version == codec.FORMAT_VERSION


@settings(max_examples=50, deadline=None)
@given(payload=st.binary(max_size=20000), chunk_size=st.integers(min_value=1, max_value=4096))
def test_streaming_decode_yields_the_payload_in_chunks_of_at_most_chunk_size(payload: bytes, chunk_size: int) -> None:
    framed = codec.encode(payload, chunk_size=chunk_size)
    _, chunks = codec.decode_stream(io.BytesIO(framed), PATH)
    pieces = list(chunks)
    assert b"".join(pieces) == payload
    assert all(0 < len(p) <= chunk_size for p in pieces)


def test_encoding_is_deterministic() -> None:
    payload = os.urandom(1000) * 5
    assert codec.encode(payload, epoch=3) == codec.encode(payload, epoch=3)


def test_chunks_written_at_their_own_levels_decode_as_one_file() -> None:
    """A sorted run stores its near-random bloom filter chunks at a cheap level: same format."""
    writer = codec.ChunkWriter(kind=PayloadKind.RUN, epoch=4, level=3)
    pieces = [b"the quick brown fox " * 50, os.urandom(4096), b"jumps " * 30]
    chunks = [writer.chunk(pieces[0]), writer.chunk(pieces[1], level=-1), writer.chunk(pieces[2], level=1)]
    data = writer.header() + b"".join(chunks) + writer.trailer()
    assert decode_all(data) == b"".join(pieces)
    for chunk, piece in zip(chunks, pieces, strict=True):
        assert codec.decode_chunk(chunk, PATH, codec.Codec.ZSTD) == piece


# -- damage -------------------------------------------------------------------------------


def sample_frames() -> dict[str, bytes]:
    compressible = b"the quick brown fox " * 40
    return {
        "empty": codec.encode(b""),
        "one-byte": codec.encode(b"x", epoch=1),
        "compressible": codec.encode(compressible, epoch=2, base_epoch=1, delta=True),
        "multi-chunk": codec.encode(os.urandom(150) + compressible[:150], epoch=9, chunk_size=64),
        "json": codec.encode_json({"epoch": 3, "files": ["a", "b"]}),
    }


@pytest.mark.parametrize("name", sorted(sample_frames()))
def test_every_single_byte_flip_is_detected(name: str) -> None:
    framed = sample_frames()[name]
    for position in range(len(framed)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(framed)
            damaged[position] ^= mask
            must_refuse(bytes(damaged), f"{name}: flip {mask:#x} at byte {position} of {len(framed)}")


@pytest.mark.parametrize("name", sorted(sample_frames()))
def test_every_truncation_is_detected(name: str) -> None:
    framed = sample_frames()[name]
    for length in range(len(framed)):
        must_refuse(framed[:length], f"{name}: truncated to {length} of {len(framed)} bytes")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=st.binary(max_size=600),
    chunk_size=st.integers(min_value=1, max_value=256),
    data=st.data(),
)
def test_any_flip_or_truncation_of_any_frame_is_detected(payload: bytes, chunk_size: int, data: st.DataObject) -> None:
    framed = codec.encode(payload, chunk_size=chunk_size)
    position = data.draw(st.integers(min_value=0, max_value=len(framed) - 1))
    mask = data.draw(st.integers(min_value=1, max_value=255))
    damaged = bytearray(framed)
    damaged[position] ^= mask
    must_refuse(bytes(damaged), f"flip {mask:#x} at {position}")
    must_refuse(framed[: data.draw(st.integers(min_value=0, max_value=len(framed) - 1))], "truncation")


def test_trailing_garbage_is_refused() -> None:
    framed = codec.encode(b"payload")
    error = must_refuse(framed + b"\x00", "one trailing byte")
    assert "after the trailer" in str(error)
    must_refuse(framed + framed, "two frames back to back")


def test_reordered_chunks_are_refused() -> None:
    framed = codec.encode(b"A" * 64 + b"B" * 64, chunk_size=64)
    header, rest = framed[: codec.HEADER_SIZE], framed[codec.HEADER_SIZE :]
    first_len = 12 + struct.unpack(">I", rest[4:8])[0]
    second_len = 12 + struct.unpack(">I", rest[first_len + 4 : first_len + 8])[0]
    first, second, tail = (
        rest[:first_len],
        rest[first_len : first_len + second_len],
        rest[first_len + second_len :],
    )
    must_refuse(header + second + first + tail, "chunks swapped")
    must_refuse(header + first + tail, "a chunk dropped")


def test_a_file_that_is_not_a_state_file_is_refused() -> None:
    assert "not a checkpoint state file" in str(must_refuse(b"PAR1....", "parquet magic"))
    must_refuse(b"", "empty file")
    must_refuse(json.dumps({"epoch": 1}).encode(), "plain json")


def _header(version: int = codec.FORMAT_VERSION, flags: int = 0, kind: int = int(PayloadKind.BYTES)) -> bytes:
    raw = struct.pack(">4sHHBBQQ", codec.MAGIC, version, flags, kind, 0, 5, 0)
    return raw + struct.pack(">I", codec.crc32c(raw))


def test_a_newer_format_version_is_refused_with_an_upgrade_hint_naming_the_file() -> None:
    body = codec.encode(b"payload")[codec.HEADER_SIZE :]
    with pytest.raises(IncompatibleFormatError) as info:
        codec.decode(_header(version=codec.FORMAT_VERSION + 1) + body, PATH)
    assert info.value.path == PATH
    assert PATH in str(info.value)
    assert f"version {codec.FORMAT_VERSION + 1}" in str(info.value)
    assert "upgrade" in str(info.value)


@pytest.mark.parametrize(
    ("header", "what"),
    [
        (_header(version=0), "version 0"),
        (_header(flags=0x80), "unknown flag bit"),
        (_header(flags=0x3 << 1), "unknown codec"),
        (_header(kind=99), "unknown payload kind"),
    ],
)
def test_unknown_versions_flags_codecs_and_kinds_are_refused(header: bytes, what: str) -> None:
    body = codec.encode(b"payload")[codec.HEADER_SIZE :]
    with pytest.raises(IncompatibleFormatError) as info:
        codec.decode(header + body, PATH)
    assert info.value.path == PATH, what


def _chunk(raw_len: int, stored: bytes) -> bytes:
    lengths = struct.pack(">II", raw_len, len(stored))
    return lengths + struct.pack(">I", codec.crc32c(stored, codec.crc32c(lengths))) + stored


def test_a_chunk_claiming_a_huge_decompressed_size_is_refused_before_allocating() -> None:
    stored = zstandard.ZstdCompressor().compress(b"small")
    framed = _header() + _chunk(2**32 - 1, stored) + b"\x00" * 28
    tracemalloc.start()
    try:
        error = must_refuse(framed, "raw length 4 GiB")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "over the limit" in str(error)
    assert peak < 1 << 20


def test_a_decompression_bomb_inside_a_small_chunk_is_refused_before_allocating() -> None:
    # The chunk header says 100 bytes; the zstd frame inside declares 256 MiB of zeros.
    bomb = zstandard.ZstdCompressor(level=3).compress(bytes(256 << 20))
    assert len(bomb) < 64 * 1024
    framed = _header() + _chunk(100, bomb) + b"\x00" * 28
    tracemalloc.start()
    try:
        error = must_refuse(framed, "zstd bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "decompression bomb" in str(error) or "does not decompress" in str(error)
    assert peak < 4 << 20


def test_a_frame_without_declared_size_cannot_inflate_past_its_chunk_header() -> None:
    bomb = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(bytes(16 << 20))
    must_refuse(_header() + _chunk(100, bomb) + b"\x00" * 28, "undeclared-size bomb")


def test_the_decompression_limit_is_configurable() -> None:
    framed = codec.encode(os.urandom(4096), chunk_size=4096)
    with pytest.raises(CorruptCheckpointError, match="over the limit of 1024"):
        codec.decode(framed, PATH, max_chunk=1024)
    assert len(codec.decode(framed, PATH, max_chunk=4096)[1]) == 4096


# -- payload kinds ------------------------------------------------------------------------


def test_json_documents_round_trip_and_are_marked_json() -> None:
    document = {"epoch": 4, "files": [{"path": "part-0", "size": 10}], "note": "ünïcode"}
    framed = codec.encode_json(document)
    assert codec.read_header(io.BytesIO(framed), PATH).kind is PayloadKind.JSON
    assert codec.decode_json(framed, PATH) == document


def test_decode_json_refuses_other_payload_kinds_and_invalid_json() -> None:
    with pytest.raises(CorruptCheckpointError, match="expected a JSON payload"):
        codec.decode_json(codec.encode(b"{}", kind=PayloadKind.ARROW), PATH)
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        codec.decode_json(codec.encode(b"{not json", kind=PayloadKind.JSON), PATH)


def test_json_refuses_values_that_are_not_plain_data() -> None:
    with pytest.raises(ValueError):
        codec.encode_json({"x": float("nan")})
    with pytest.raises(TypeError):
        codec.encode_json({"x": object()})


def test_arrow_tables_round_trip_through_ipc() -> None:
    table = pa.table({"key": pa.array([3, 1, 2], pa.int64()), "name": ["c", "a", None]})
    framed = b"".join(codec.encode_stream(codec.arrow_ipc_pieces(table), kind=PayloadKind.ARROW))
    header, payload = codec.decode(framed, PATH)
    assert header.kind is PayloadKind.ARROW
    assert codec.read_arrow(payload, PATH).equals(table)


class Exploit:
    ran = False

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, ("import tests.core.test_codec as m; m.Exploit.ran = True",))


def test_a_pickled_payload_is_never_unpickled() -> None:
    framed = codec.encode(pickle.dumps(Exploit()), kind=PayloadKind.ARROW)
    _, payload = codec.decode(framed, PATH)
    with pytest.raises(CorruptCheckpointError, match="not a valid Arrow IPC stream"):
        codec.read_arrow(payload, PATH)
    framed_json = codec.encode(pickle.dumps(Exploit()), kind=PayloadKind.JSON)
    with pytest.raises(CorruptCheckpointError):
        codec.decode_json(framed_json, PATH)
    assert Exploit.ran is False


# -- streaming ----------------------------------------------------------------------------


def test_a_large_payload_streams_through_encode_and_decode_in_bounded_memory(
    tmp_path: Path,
) -> None:
    chunk = 1 << 20
    pieces = 48
    block = os.urandom(4096) * (chunk // 4096)
    path = tmp_path / "big.state"

    def produce() -> object:
        for i in range(pieces):
            yield block[:-1] + bytes([i])

    tracemalloc.start()
    try:
        with open(path, "wb") as out:
            for piece in codec.encode_stream(produce(), kind=PayloadKind.BYTES, chunk_size=chunk):  # type: ignore[arg-type]
                out.write(piece)
        _, write_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        total = count = 0
        with open(path, "rb") as fh:
            _, chunks = codec.decode_stream(fh, str(path))
            for i, raw in enumerate(chunks):
                assert raw[-1] == i
                total += len(raw)
                count += 1
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (total, count) == (pieces * chunk, pieces)
    # One chunk in flight (raw + compressed + slack), not the 48 MiB payload.
    assert write_peak < 8 * chunk
    assert read_peak < 8 * chunk


def test_check_frame_verifies_everything_but_the_compressed_stream() -> None:
    """The commit decision's check: checksums, lengths and trailer, no decompression. A
    chunk whose stored bytes are not a zstd frame but carry a correct CRC32C (only a broken
    writer makes one) passes the frame check; decoding refuses it."""
    payload = os.urandom(300) + b"abc" * 300
    framed = codec.encode(payload, epoch=4, chunk_size=256)
    assert codec.check_frame(framed, PATH) == codec.decode(framed, PATH)[0]
    stored = b"not a zstd frame"
    lengths = struct.pack(">II", 64, len(stored))
    bad = lengths + struct.pack(">I", codec.crc32c(stored, codec.crc32c(lengths))) + stored
    forged = codec.ChunkWriter(kind=PayloadKind.BYTES)
    forged._running = codec.crc32c(bad, forged._running)  # a writer that framed garbage
    forged._total, forged._count = 64, 1
    data = forged.header() + bad + forged.trailer()
    codec.check_frame(data, PATH)
    must_refuse(data, "stored bytes that do not decompress", by_framing=False)
