"""A key group's chain of sorted runs (oldest first): bounded lookups, budgeted compaction, TTL.

Compaction (docs/ARCHITECTURE.md decision 25) is one streaming k-way merge of a window of
neighbouring runs (:func:`plan_compaction`) within a per-epoch byte budget
(:func:`compaction_cap`); a merge from the chain's first run writes a FULL run without
tombstones and expired keys, any other a DELTA run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from airflow_seatunnel_ckpt.core.models import PartRef
from airflow_seatunnel_ckpt.core.state.parts import TOMBSTONE
from airflow_seatunnel_ckpt.core.state.runs import EPOCH_COLUMN, RunReader, is_live, key_hashes, sort_keys
from airflow_seatunnel_ckpt.core.storage import Storage

#: Runs of similar size that trigger a merge.
DEFAULT_FANOUT = 4
#: What an epoch's merges may write, as a fraction of the state's bytes.
DEFAULT_BUDGET = 0.08
#: Key groups merge in turns: each in one epoch out of this many.
DEFAULT_TURNS = 4
#: A key group may always merge this many bytes in its turn: below it, a run's fixed
#: costs (a file, its header, index and filters) outweigh any byte budget.
DEFAULT_MERGE_FLOOR = 64 * 1024
#: A chain longer than this merges whole, whatever the budget (a safety bound).
MAX_RUNS = 64


def live_runs(chain: Sequence[PartRef], min_epoch: int | None) -> list[PartRef]:
    """``chain`` without the runs whose every row is expired (a run's epoch bounds its rows').

    Parts read whole (a rescale's) stay: such a chain must keep its FULL part first.
    """
    if min_epoch is None:
        return list(chain)
    return [ref for ref in chain if ref.epoch >= min_epoch or ref.index is None]


def lookup(storage: Storage, chain: Sequence[PartRef], key_columns: list[str], keys: Any, *,
           min_epoch: int | None = None) -> tuple[np.ndarray, Any, int]:
    """Find unique ``keys`` in the chain: ``(positions, rows, bytes read)``.

    ``positions`` index ``keys`` for each key whose newest row is live (not a tombstone,
    not expired); ``rows`` holds those rows in the same order (None when none).
    """
    import pyarrow as pa

    pending = np.arange(len(keys), dtype=np.int64)
    hashes: np.ndarray | None = None  # of every key, computed once for all the runs
    positions: list[np.ndarray] = []
    found: list[Any] = []
    read = 0
    for ref in reversed(live_runs(chain, min_epoch)):
        if not len(pending):
            break
        reader = RunReader(storage, ref, key_columns)
        sub = keys.take(pa.array(pending))
        if hashes is None and reader.index.num_rows:
            hashes = key_hashes(keys)
        blocks = reader.locate(sub, None if hashes is None else hashes[pending])
        resolved = np.zeros(len(pending), dtype=bool)
        candidates = np.nonzero(blocks >= 0)[0]
        ordered = candidates[np.argsort(blocks[candidates], kind="stable")]
        ids = blocks[ordered]
        for group in np.split(ordered, np.nonzero(np.diff(ids))[0] + 1) if len(ordered) else []:
            table = reader.block(int(blocks[group[0]]), cache=True)
            block_keys = sort_keys(table, key_columns)
            at = _positions_in(block_keys, sub.take(pa.array(group)).cast(block_keys.type))
            hit = at >= 0
            rows = table.take(pa.array(at[hit]))
            live = np.asarray(is_live(rows, min_epoch, ref.epoch).to_numpy(zero_copy_only=False), dtype=bool)
            resolved[group[hit]] = True
            positions.append(pending[group[hit]][live])
            found.append(rows.filter(pa.array(live)))
        read += reader.bytes_read
        pending = pending[~resolved]
    if not positions or not sum(len(p) for p in positions):
        return np.zeros(0, dtype=np.int64), None, read
    rows = pa.concat_tables([t for t in found if t.num_rows], promote_options="permissive")
    return np.concatenate(positions), rows, read


def _positions_in(block_keys: Any, wanted: Any) -> np.ndarray:
    """Per wanted key, its row in the block (sorted, unique keys), or -1.

    Integer keys are binary-searched: ``index_in`` would hash the whole block for every lookup.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_integer(block_keys.type) and not block_keys.null_count and len(block_keys):
        stored = block_keys.to_numpy()
        query = wanted.to_numpy(zero_copy_only=False)
        at = np.minimum(np.searchsorted(stored, query), len(stored) - 1)
        return np.where(stored[at] == query, at, -1).astype(np.int64)
    found = pc.index_in(wanted, value_set=block_keys)
    return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def plan_compaction(sizes: Sequence[int], cap: int | None, fanout: int = DEFAULT_FANOUT,
                    soft_runs: int = 2 * DEFAULT_FANOUT, max_runs: int = MAX_RUNS) -> tuple[int, int] | None:
    """Which runs of a chain with run ``sizes`` (oldest first) to merge: ``(start, end)``, at most ``cap`` bytes.

    Preferred: the size-tiered window (``fanout`` neighbours within ``fanout`` times of each
    other, widened left over older runs not larger) merging the most runs; else, above
    ``soft_runs`` runs, the cheapest window of ``fanout`` (at least 2) neighbours that fits;
    above ``max_runs`` the whole chain, cap or not.
    """
    n = len(sizes)
    if n > max_runs:
        return 0, n
    if cap is None or n < 2:
        return None
    best: tuple[int, int, int, int] | None = None
    for end in range(fanout, n + 1):
        start = end - fanout
        window = sizes[start:end]
        total = sum(window)
        if max(window) > fanout * max(1, min(window)) or total > cap:
            continue
        while start > 0 and sizes[start - 1] <= total and total + sizes[start - 1] <= cap:
            start -= 1
            total += sizes[start]
        candidate = (end - start, -total, start, end)
        if best is None or candidate > best:
            best = candidate
    if best is not None:
        return best[2], best[3]
    if n > soft_runs:
        for width in range(min(fanout, n), 1, -1):
            total, start = min((sum(sizes[i:i + width]), i) for i in range(n - width + 1))
            if total <= cap:
                return start, start + width
    return None


def compaction_cap(chains: Mapping[int, Sequence[PartRef]], key_groups: int, key_group: int, epoch: int, *,
                   budget: float = DEFAULT_BUDGET, turns: int = DEFAULT_TURNS, floor: int = DEFAULT_MERGE_FLOOR,
                   changes: int = 0, min_epoch: int | None = None) -> int | None:
    """The most bytes ``key_group`` may merge in ``epoch`` (None: not its turn).

    Key groups with ``(epoch + key_group) % turns == 0`` share ``budget`` times the state's
    bytes; or merge ``turns`` times their ``changes`` (the new run's bytes), so compaction
    keeps up with any input rate; at least ``floor``. A pure function of the restored
    checkpoint and the epoch: every attempt of an epoch plans the same merges.
    """
    turns = max(1, min(turns, key_groups))
    if (epoch + key_group) % turns:
        return None
    in_turn = sum(1 for g in range(key_groups) if (epoch + g) % turns == 0)
    state = sum(ref.size for chain in chains.values() for ref in live_runs(chain, min_epoch))
    return max(floor, int(budget * state / in_turn), turns * changes)


def merged_schema(schemas: Sequence[Any], drop_tombstones: bool) -> Any:
    """One schema for a merge's output: the newest source's columns first, then older ones'."""
    import pyarrow as pa

    schema = pa.unify_schemas(list(reversed(schemas)), promote_options="permissive")
    if drop_tombstones and TOMBSTONE in schema.names:
        schema = schema.remove(schema.get_field_index(TOMBSTONE))
    return schema


def conform(table: Any, schema: Any) -> Any:
    """``table`` with ``schema``'s columns, in its order and types: missing ones null (a column added later)."""
    import pyarrow as pa

    for field in schema:
        if field.name not in table.column_names:
            table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)


def merge_sorted(sources: Sequence[Iterator[Any]], key_columns: list[str], schema: Any, *, epochs: Sequence[int],
                 drop_dead: bool, min_epoch: int | None) -> Iterator[Any]:
    """K-way merge of sorted block streams (oldest source first): newest row per key wins.

    Each round emits the rows up to the smallest last key of the current blocks (one block
    per source in memory). Expired rows are always dropped, tombstones only with ``drop_dead``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    def advance(i: int) -> Any:
        for block in sources[i]:
            if block.num_rows:
                return block
        return None

    current = [advance(i) for i in range(len(sources))]
    while any(c is not None for c in current):
        active = [i for i, c in enumerate(current) if c is not None]
        lasts = [sort_keys(current[i].slice(current[i].num_rows - 1), key_columns) for i in active]
        bound = pc.min(pa.concat_arrays([x.cast(lasts[0].type) for x in lasts]))
        pieces = []
        for i in active:
            block = current[i]
            upto = int(pc.sum(pc.less_equal(sort_keys(block, key_columns), bound)).as_py() or 0)
            piece = block.slice(0, upto)
            tomb = piece.column(TOMBSTONE) if TOMBSTONE in piece.column_names else None
            piece = conform(piece, schema)
            if min_epoch is not None and EPOCH_COLUMN in schema.names:
                # Rows written before the TTL was on carry their run's epoch (an upper bound).
                j = schema.get_field_index(EPOCH_COLUMN)
                piece = piece.set_column(j, EPOCH_COLUMN, pc.fill_null(piece.column(j), epochs[i]))
            if tomb is not None and TOMBSTONE not in schema.names:
                piece = piece.append_column(TOMBSTONE, tomb)
            pieces.append(piece.append_column("__rank", pa.array(np.full(piece.num_rows, i, np.int32))))
            current[i] = block.slice(upto) if upto < block.num_rows else advance(i)
        combined = pa.concat_tables(pieces, promote_options="permissive")
        combined = combined.append_column("__k", sort_keys(combined, key_columns))
        combined = combined.sort_by([("__k", "ascending"), ("__rank", "descending")])
        keys = combined.column("__k").combine_chunks()
        first = np.ones(len(keys), dtype=bool)
        if len(keys) > 1:
            first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
        out = combined.filter(pa.array(first))
        if drop_dead:
            out = out.filter(is_live(out, min_epoch, max(epochs)))
        elif min_epoch is not None and EPOCH_COLUMN in out.column_names:
            out = out.filter(pc.greater_equal(out.column(EPOCH_COLUMN), min_epoch))
        yield conform(out.drop_columns(["__k", "__rank"]), schema)
