"""Sorted runs: keyed state looked up by key, block by block, instead of loaded whole.

A key group's state is an ordered list of immutable runs (an LSM without a memtable,
docs/ARCHITECTURE.md decisions 25 and 28). A run is one state file (``core/codec.py``,
payload kind ``RUN``)::

    header | block chunk * | bloom chunk * | index chunk | trailer

A block is up to ``block_rows`` rows in key order (one Arrow IPC chunk, verified and decoded
alone); a bloom filter per block; the index (Arrow IPC) holds each block's first and last
key, rows and byte ranges, its metadata the data schema. ``PartRef.index`` says where it starts.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from airflow_seatunnel_ckpt.core import codec
from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import PartKind, PartRef
from airflow_seatunnel_ckpt.core.state.parts import TOMBSTONE, Tally, key_array, read_arrow_part, read_checked
from airflow_seatunnel_ckpt.core.storage import Storage


class BlockCache:
    """Decoded run indexes, filters and blocks, least recently used out, within a byte budget.

    Runs are immutable, so what a process decoded stays valid: a reused Spark Python worker
    looks up its old runs without reading them again (RocksDB's block cache). Lookups only.
    """

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self._items: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> Any:
        """The cached value, or None."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: tuple[Any, ...], value: Any, size: int) -> None:
        """Keep ``value`` (``size`` bytes), evicting the least recently used beyond the budget."""
        if size > self.budget or key in self._items:
            return
        self._items[key] = (value, size)
        self.used += size
        while self.used > self.budget:
            _, (_, dropped) = self._items.popitem(last=False)
            self.used -= dropped


#: The process's cache (per Spark Python worker): 256 MiB of decoded indexes and blocks.
BLOCK_CACHE = BlockCache(256 * 1024 * 1024)


EPOCH_COLUMN = "__epoch"
DEFAULT_BLOCK_ROWS = 65536
#: A block is cut smaller than ``block_rows`` when its rows would exceed this many bytes.
BLOCK_BYTES = 2 * 1024 * 1024
BLOOM_BITS_PER_KEY = 13
BLOOM_HASHES = 6
#: How filter bits are placed (``Bloom``), recorded in every run's index (another is refused).
BLOOM_LAYOUT = 2
#: Bloom filter bits are near-random (level 3 saves ~6%): the cheapest zstd pass.
BLOOM_CHUNK_LEVEL = -1
_TRAILER_SIZE = 24
_RUN_FORMAT = b"1"


def sort_keys(table: Any, key_columns: list[str]) -> Any:
    """The keys a run is ordered and searched by, as one array."""
    import pyarrow as pa

    keys = key_array(table, key_columns)
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys


_U = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of a 64-bit value (a new array)."""
    with np.errstate(over="ignore"):
        x = x + _U(0x9E3779B97F4A7C15)
        x ^= x >> _U(30)
        x *= _U(0xBF58476D1CE4E5B9)
        x ^= x >> _U(27)
        x *= _U(0x94D049BB133111EB)
        x ^= x >> _U(31)
    return x


def key_hashes(keys: Any) -> np.ndarray:
    """A stable 64-bit hash per key (persisted in blooms: never change it for a format).

    Integer-like keys hash their 64-bit value (a uint64 its bit pattern); any other key its
    bytes with FNV-1a 64 and its length (one numpy pass per byte position).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    t = keys.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t):
        if pa.types.is_date32(t):
            as_int = keys.cast(pa.int32()).cast(pa.int64())
        else:  # unsafe: uint64 keys of 2**63 and up keep their bits (a safe cast refuses them)
            as_int = pc.cast(keys, pa.int64(), safe=not pa.types.is_uint64(t))
        values = np.asarray((as_int.fill_null(0) if as_int.null_count else as_int).to_numpy(zero_copy_only=False),
                            dtype=np.int64)
        return _mix(values.view(np.uint64))
    data = pc.cast(keys, pa.large_binary()).fill_null(b"")
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int64)[data.offset: data.offset + len(data) + 1]
    raw = np.frombuffer(data.buffers()[2], dtype=np.uint8) if data.buffers()[2] is not None else np.zeros(1, np.uint8)
    starts, lens = offsets[:-1], np.diff(offsets)
    h = np.full(len(data), 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lens.max()) if len(lens) else 0):
            live = np.nonzero(lens > j)[0]
            h[live] = (h[live] ^ raw[starts[live] + j].astype(np.uint64)) * _U(0x100000001B3)
    return _mix(h ^ lens.astype(np.uint64))


@functools.cache
def _word_masks(hashes: int) -> np.ndarray:
    """Layout 2's 65,536 word masks: mask ``j`` sets bits ``(mix(j) >> 6i) & 63`` for
    ``i < hashes`` (fewer when two coincide). Part of the format: never change it."""
    mixed = _mix(np.arange(65536, dtype=np.uint64))
    masks = np.zeros(65536, dtype=np.uint64)
    for i in range(hashes):
        masks |= _U(1) << ((mixed >> _U(6 * i)) & _U(63))
    return masks


class Bloom:
    """A register-blocked bloom filter over key hashes, as RocksDB's and Impala's blocked filters.

    A key's bits all lie in one 64-bit word, ``((h mod 2**32) * words) >> 32``, and are the
    word mask ``_word_masks(hashes)[h >> 48]``: 0.8% false positives at 13 bits a key.
    """

    def __init__(self, bits: np.ndarray, nbits: int, hashes: int = BLOOM_HASHES) -> None:
        if nbits % 64 or not nbits:
            raise ValueError(f"a bloom filter holds whole 64-bit words, not {nbits} bits")
        self.bits, self.nbits, self.hashes = bits, nbits, hashes

    @classmethod
    def sized(cls, keys: int) -> Bloom:
        """An empty filter for up to ``keys`` keys at ~1% false positives."""
        words = max(1, (keys * BLOOM_BITS_PER_KEY + 63) // 64)
        return cls(np.zeros(words * 8, dtype=np.uint8), words * 64, BLOOM_HASHES)

    def _words(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's word and mask."""
        word = (hashes & _U(0xFFFFFFFF)).view(np.int64)
        word *= self.nbits // 64
        word >>= 32
        return word, _word_masks(self.hashes)[(hashes >> _U(48)).view(np.int64)]

    def add(self, hashes: np.ndarray) -> None:
        """Add keys (by hash)."""
        words = np.frombuffer(self.bits, dtype="<u8").copy()
        np.bitwise_or.at(words, *self._words(hashes))
        self.bits = words.view(np.uint8)

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Per key: False means certainly absent."""
        word, mask = self._words(hashes)
        return (np.frombuffer(self.bits, dtype="<u8")[word] & mask) == mask  # type: ignore[no-any-return]


def _blocks(pieces: Iterable[Any], block_rows: int) -> Iterator[Any]:
    """Re-cut sorted tables into blocks of at most ``block_rows`` rows and ~BLOCK_BYTES."""
    import pyarrow as pa

    buffered: list[Any] = []
    rows = 0
    limit = block_rows
    for piece in pieces:
        if not piece.num_rows:
            continue
        if not buffered and rows == 0 and piece.nbytes:
            limit = max(1, min(block_rows, int(BLOCK_BYTES * piece.num_rows / piece.nbytes)))
        buffered.append(piece)
        rows += piece.num_rows
        while rows >= limit:
            table = pa.concat_tables(buffered)
            yield table.slice(0, limit)
            rest = table.slice(limit)
            buffered, rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
    if rows:
        yield pa.concat_tables(buffered)


def write_run(storage: Storage, path: str, pieces: Iterable[Any], key_columns: list[str], schema: Any, *, epoch: int,
              key_group: int = 0, delta: bool = False, base_epoch: int | None = None,
              block_rows: int = DEFAULT_BLOCK_ROWS, level: int = 3,
              compression: codec.Codec = codec.Codec.ZSTD) -> PartRef:
    """Write sorted, key-unique ``pieces`` (ascending, non-overlapping) as one run, streaming."""
    import pyarrow as pa

    writer = codec.ChunkWriter(kind=codec.PayloadKind.RUN, epoch=epoch, base_epoch=base_epoch,
                               delta=delta, codec=compression, level=level)
    entries: dict[str, list[Any]] = {n: [] for n in ("first", "last", "offset", "length", "rows",
                                                     "bloom_offset", "bloom_length")}
    blooms: list[bytes] = []
    written = Tally()  # its size so far is the offset of the chunk being framed
    index_at = 0

    def framed() -> Iterator[bytes]:
        nonlocal index_at
        yield writer.header()
        for block in _blocks(pieces, block_rows):
            block = block.select(schema.names).cast(schema)
            keys = sort_keys(block, key_columns)
            bloom = Bloom.sized(block.num_rows)
            bloom.add(key_hashes(keys))
            blooms.append(bloom.bits.tobytes())
            chunk = writer.chunk(next(iter(codec.arrow_ipc_pieces(block))))
            for name, value in (("first", keys[0]), ("last", keys[-1]), ("offset", written.size),
                                ("length", len(chunk)), ("rows", block.num_rows)):
                entries[name].append(value)
            yield chunk
        for bits in blooms:
            chunk = writer.chunk(bits, level=BLOOM_CHUNK_LEVEL)
            entries["bloom_offset"].append(written.size)
            entries["bloom_length"].append(len(chunk))
            yield chunk
        index_at = written.size
        key_type = sort_keys(schema.empty_table(), key_columns).type
        index = pa.table({"first": pa.array([k.as_py() for k in entries["first"]], key_type),
                          "last": pa.array([k.as_py() for k in entries["last"]], key_type),
                          **{n: pa.array(entries[n], pa.int64())
                             for n in ("offset", "length", "rows", "bloom_offset", "bloom_length")}})
        meta = {b"run_format": _RUN_FORMAT, b"key_columns": json.dumps(key_columns).encode(),
                b"data_schema": schema.serialize().to_pybytes(), b"bloom_hashes": str(Bloom.sized(1).hashes).encode(),
                b"bloom_layout": str(BLOOM_LAYOUT).encode()}
        index = index.replace_schema_metadata(meta)
        yield writer.chunk(next(iter(codec.arrow_ipc_pieces(index))))
        yield writer.trailer()

    storage.write_atomic(path, written(framed()))
    return PartRef(path=path, size=written.size, crc32c=written.crc32c, epoch=epoch, key_group=key_group,
                   kind=PartKind.DELTA if delta else PartKind.FULL, index=index_at)


def _chunks_in(data: bytes, where: str, compression: codec.Codec, count: int) -> list[bytes]:
    """``count`` consecutive chunks at the start of ``data``, each verified and decoded."""
    out, pos = [], 0
    for _ in range(count):
        if len(data) < pos + 12:
            raise CorruptCheckpointError(f"{where}: run index is truncated", where)
        stored_len = int.from_bytes(data[pos + 4: pos + 8], "big")
        out.append(codec.decode_chunk(memoryview(data)[pos: pos + 12 + stored_len], where, compression))
        pos += 12 + stored_len
    return out


class RunReader:
    """One run (or an Arrow part without a run index, read whole) of a key group's chain."""

    def __init__(self, storage: Storage, ref: PartRef, key_columns: list[str], data: bytes | None = None) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        self.storage, self.ref, self.key_columns, self._data = storage, ref, key_columns, data
        self.where = storage.describe_path(ref.path)
        self.bytes_read = 0
        self._whole: Any = None
        if ref.index is None:  # a part of the FULL+DELTA format: one in-memory block
            table = read_arrow_part(storage, ref)
            table = table.take(pc.sort_indices(sort_keys(table, key_columns))) if table.num_rows else table
            keys = sort_keys(table, key_columns)
            self._whole, self.schema = table, table.schema
            rows = [table.num_rows] if table.num_rows else []
            self.index = pa.table({"first": keys[:1], "last": keys[-1:] if len(keys) else keys[:0],
                                   "offset": pa.array([0] * len(rows), pa.int64()),
                                   "length": pa.array([ref.size] * len(rows), pa.int64()),
                                   "rows": pa.array(rows, pa.int64())})
            self.bytes_read = ref.size
            return
        cached = BLOCK_CACHE.get(self._cache_key("index")) if data is None else None
        if cached is not None:
            self.codec, self.schema, self.index, self._hashes = cached
            return
        self._read_index()
        if data is None:
            BLOCK_CACHE.put(self._cache_key("index"),
                            (self.codec, self.schema, self.index, self._hashes), self.index.nbytes + 4096)

    def _read(self, start: int, end: int) -> bytes:
        if self._data is not None:
            return self._data[start:end]
        try:
            data = self.storage.read_range(self.ref.path, start, end)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{self.where}: checkpoint part is missing", self.where) from None
        self.bytes_read += len(data)
        if len(data) != end - start:
            raise CorruptCheckpointError(
                f"{self.where}: file is truncated (bytes {start}..{end} of {self.ref.size} recorded)", self.where)
        return data

    def _read_index(self) -> None:
        import io

        import pyarrow as pa

        ref = self.ref
        assert ref.index is not None
        if not codec.HEADER_SIZE <= ref.index <= ref.size - _TRAILER_SIZE:
            raise CorruptCheckpointError(f"{self.where}: run index offset {ref.index} is outside the file", self.where)
        self.codec = codec.read_header(io.BytesIO(self._read(0, codec.HEADER_SIZE)), self.where).codec
        tail = self._read(ref.index, ref.size)
        (first,) = _chunks_in(tail, self.where, self.codec, 1)
        index = codec.read_arrow(first, self.where)
        meta = index.schema.metadata or {}
        try:
            if meta[b"run_format"] != _RUN_FORMAT:
                raise CorruptCheckpointError(f"{self.where}: unknown run format {meta[b'run_format']!r}", self.where)
            self.schema = pa.ipc.read_schema(pa.py_buffer(meta[b"data_schema"]))
            hashes = int(meta[b"bloom_hashes"])
            layout = int(meta[b"bloom_layout"])
            if layout != BLOOM_LAYOUT:
                raise CorruptCheckpointError(
                    f"{self.where}: unknown bloom filter layout {layout} (written by a newer version? "
                    "upgrade airflow-seatunnel-ckpt to read it)", self.where)
        except (KeyError, ValueError, pa.ArrowInvalid) as exc:
            raise CorruptCheckpointError(f"{self.where}: run index is damaged ({exc})", self.where) from exc
        self.index = index.replace_schema_metadata(None)
        self._hashes = hashes

    @property
    def rows(self) -> int:
        """Rows in the run."""
        return int(sum(self.index.column("rows").to_pylist()))

    def _cache_key(self, what: Any) -> tuple[Any, ...]:
        return (self.storage.url_of(self.ref.path), self.ref.size, self.ref.crc32c, what)

    def block(self, i: int, cache: bool = False) -> Any:
        """Block ``i`` as a table: one verified ranged read (or, with ``cache``, the copy decoded before)."""
        if self._whole is not None:
            return self._whole
        if cache and (hit := BLOCK_CACHE.get(self._cache_key(i))) is not None:
            return hit
        table = self._read_block(i)
        if cache:
            BLOCK_CACHE.put(self._cache_key(i), table, table.nbytes)
        return table

    def _read_block(self, i: int) -> Any:
        start, length = (int(self.index.column(c)[i].as_py()) for c in ("offset", "length"))
        table = codec.read_arrow(codec.decode_chunk(self._read(start, start + length), self.where, self.codec),
                                 self.where)
        if table.num_rows != self.index.column("rows")[i].as_py():
            raise CorruptCheckpointError(f"{self.where}: block {i} has {table.num_rows} rows, the index says "
                                         f"{self.index.column('rows')[i].as_py()}", self.where)
        return table

    def blocks(self) -> Iterator[Any]:
        """Every block in key order (one at a time)."""
        for i in range(self.index.num_rows):
            yield self.block(i)

    def locate(self, keys: Any, hashes: np.ndarray | None = None) -> np.ndarray:
        """Per key, the block that may hold it, or -1; ``hashes``: the keys' :func:`key_hashes`, if known."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n, nblocks = len(keys), self.index.num_rows
        out = np.full(n, -1, dtype=np.int64)
        if not n or not nblocks:
            return out
        keys = keys.cast(self.index.schema.field("last").type)
        lasts = self.index.column("last").combine_chunks()
        if pa.types.is_integer(keys.type) and not keys.null_count and not lasts.null_count:
            # Integer keys: numpy's binary search of the blocks' last keys, O(n log blocks).
            wanted = keys.to_numpy()
            block = np.searchsorted(lasts.to_numpy(), wanted, side="left").astype(np.int64)
            inside = block < nblocks
            firsts = self.index.column("first").combine_chunks().to_numpy()
            inside &= wanted >= firsts[np.where(inside, block, 0)]
        else:
            # Any other orderable key type: sort the keys together with the blocks' last
            # keys; a key's block is the number of last keys sorting before it.
            both = pa.table({"k": pa.concat_arrays([keys, lasts]),
                             "f": np.concatenate([np.zeros(n, np.int8), np.ones(nblocks, np.int8)])})
            order = pc.sort_indices(both, [("k", "ascending"), ("f", "ascending")]).to_numpy()
            flags = both.column("f").to_numpy()[order]
            before = np.cumsum(flags) - flags
            block = np.empty(n + nblocks, np.int64)
            block[order] = before
            block = block[:n]
            inside = block < nblocks
            if inside.any():
                firsts = self.index.column("first").take(pa.array(np.where(inside, block, 0)))
                inside &= pc.fill_null(pc.greater_equal(keys, firsts), False).to_numpy(zero_copy_only=False)
        if self._whole is None and inside.any():
            inside &= self._bloom_says_maybe(keys, block, inside, hashes)
        out[inside] = block[inside]
        return out

    def _bloom_says_maybe(self, keys: Any, block: np.ndarray, inside: np.ndarray,
                          hashes: np.ndarray | None) -> np.ndarray:
        """Per key inside its block's range: whether the block's filter may hold it (adjacent filters in one read)."""
        maybe = np.zeros(len(keys), dtype=bool)
        where = np.nonzero(inside)[0]
        hashes = key_hashes(keys.take(where)) if hashes is None else hashes[where]
        wanted = np.unique(block[where])
        offsets = self.index.column("bloom_offset").to_numpy()
        lengths = self.index.column("bloom_length").to_numpy()
        filters = {int(b): BLOCK_CACHE.get(self._cache_key(("bloom", int(b)))) for b in wanted}
        missing = np.array([b for b, bits in filters.items() if bits is None], dtype=np.int64)
        for span in np.split(missing, np.nonzero(np.diff(missing) != 1)[0] + 1) if len(missing) else []:
            start = int(offsets[span[0]])
            data = self._read(start, int(offsets[span[-1]] + lengths[span[-1]]))
            for b in span:
                at = int(offsets[b]) - start
                bits = codec.decode_chunk(memoryview(data)[at: at + int(lengths[b])], self.where, self.codec)
                filters[int(b)] = bits
                BLOCK_CACHE.put(self._cache_key(("bloom", int(b))), bits, len(bits))
        for b, bits in filters.items():
            mine = block[where] == b
            try:
                bloom = Bloom(np.frombuffer(bits, dtype=np.uint8), len(bits) * 8, self._hashes)
            except ValueError as exc:
                raise CorruptCheckpointError(f"{self.where}: bloom filter of block {b} is damaged ({exc})",
                                             self.where) from exc
            maybe[where[mine]] = bloom.might_contain(hashes[mine])
        return maybe


def is_live(table: Any, min_epoch: int | None, run_epoch: int) -> Any:
    """Per row: neither a tombstone nor expired (rows older than ``min_epoch``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    live = pa.array(np.ones(table.num_rows, bool))
    if TOMBSTONE in table.column_names:
        live = pc.and_(live, pc.invert(pc.fill_null(table.column(TOMBSTONE), False)))
    if min_epoch is not None:
        # A row written before the TTL was on has no epoch: its run's epoch bounds it.
        written = (pc.fill_null(table.column(EPOCH_COLUMN), run_epoch) if EPOCH_COLUMN in table.column_names
                   else pa.array(np.full(table.num_rows, run_epoch, np.int64)))
        live = pc.and_(live, pc.greater_equal(written, min_epoch))
    return live


def read_run_table(storage: Storage, ref: PartRef) -> Any:
    """A whole run as one table, checked against its reference (size, whole-file CRC32C)."""
    import pyarrow as pa

    reader = RunReader(storage, ref, [], data=read_checked(storage, ref))
    tables = list(reader.blocks())
    return pa.concat_tables(tables) if tables else reader.schema.empty_table()
