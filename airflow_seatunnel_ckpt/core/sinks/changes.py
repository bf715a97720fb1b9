"""Change rows applied to a keyed table (``apply_changes``): SCD1 or SCD2, the same for every table sink.

A lake sink's commit reads the rows the table holds for the changes' keys, computes their
new rows with :func:`applied` and swaps them in, in its one commit; :func:`check_changes`
and :func:`check_table` run before the decision, :func:`restored_before` serves a replay.
docs/CDC.md ("Applying changes") is the user's view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.sinks.options import OPERATIONS, SCD2_COLUMNS, UNCHANGED_TOAST, ApplyChanges

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_seatunnel_ckpt.core.sinks.base import SinkCommit
START_AT, END_AT = SCD2_COLUMNS


def table_schema(apply: ApplyChanges, staged: pa.Schema) -> pa.Schema:
    """The table's schema for change rows of ``staged``'s schema (:meth:`ApplyChanges.table_columns`);
    an SCD2 table's ``__start_at``/``__end_at`` take the first ``sequence_by`` column's type."""
    import pyarrow as pa

    first = staged.field(apply.sequence_by[0]).type
    fields = {f.name: f for f in staged}
    fields.update({c: pa.field(c, first) for c in SCD2_COLUMNS})
    return pa.schema([fields[c] for c in apply.table_columns(list(staged.names))])


def identity(apply: ApplyChanges) -> list[str]:
    """The columns naming one row of the table: the keys (SCD1), the keys and ``__start_at`` (SCD2)."""
    return [*apply.keys, START_AT] if apply.history == "scd2" else list(apply.keys)


def check_staged_changes(request: SinkCommit, schema: pa.Schema, apply: ApplyChanges, where: str) -> None:
    """:func:`check_changes` over the epoch's staged change rows (``schema``: the staged files'), reading
    only their key, sequence and operation columns (a replay's: per replayed epoch)."""
    from airflow_seatunnel_ckpt.core.sinks import staged_parts

    check_columns(schema.names, apply, where)
    for epoch, rows in staged_parts(request, [*apply.keys, *apply.sequence_by, apply.operation]):
        check_changes(rows, apply, f"{where} (the change rows of epoch {epoch})")


def check_columns(columns: Sequence[str], apply: ApplyChanges, where: str,
                  holder: str = "the epoch's change rows") -> None:
    """ConfigError unless ``columns`` (those of ``holder``) hold the changes' key, sequence and operation columns."""
    missing = [c for c in [*apply.keys, *apply.sequence_by, apply.operation] if c not in columns]
    if missing:
        raise ConfigError(f"{where}: apply_changes column(s) {missing} are not in {holder} (columns: {list(columns)}); "
                          "stage the change rows (e.g. a postgres_cdc source's) or fix the sink's apply_changes "
                          "keys/sequence_by/operation")


def check_changes(rows: pa.Table, apply: ApplyChanges, where: str) -> None:
    """ConfigError for change rows the commit cannot apply: a missing key, sequence or operation
    column, a NULL key or sequence value, an operation outside insert|update|delete."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not rows.num_rows:
        return
    check_columns(rows.column_names, apply, where)
    for column in [*apply.keys, *apply.sequence_by]:
        nulls = rows.column(column).null_count
        if nulls:
            what = "key" if column in apply.keys else "sequence"
            raise ConfigError(f"{where}: apply_changes {what} column {column!r} is NULL in {nulls} change row(s); a "
                              "change without it cannot be placed or ordered. Filter or fill them in the stage")
    ops = rows.column(apply.operation)
    bad = rows.filter(pc.invert(pc.fill_null(pc.is_in(ops, value_set=pa.array(OPERATIONS)),
                                             False)))
    if bad.num_rows:
        example = bad.column(apply.operation)[0].as_py()
        raise ConfigError(f"{where}: apply_changes operation column {apply.operation!r} holds {example!r} in "
                          f"{bad.num_rows} change row(s), e.g. key {_key_of(bad.slice(0, 1).to_pylist()[0], apply)}; "
                          f"expected one of {list(OPERATIONS)}. Map the operations in the stage, or name the right "
                          "column in apply_changes.operation")


def check_table(columns: Sequence[str], apply: ApplyChanges, where: str) -> None:
    """ConfigError unless an existing table with ``columns`` is one changes are applied to with ``apply``."""
    have = set(columns)
    problems = []
    if apply.operation in have:
        problems.append(f"it has the operation column {apply.operation!r} (a table written by a plain upsert or "
                        "append of the change rows)")
    missing = [c for c in [*apply.keys, *apply.sequence_by] if c not in have]
    if missing:
        problems.append(f"it lacks the key/sequence column(s) {missing} that applying the changes compares")
    scd2 = [c for c in SCD2_COLUMNS if c in have]
    if apply.history == "scd2" and len(scd2) < len(SCD2_COLUMNS):
        problems.append(f"it lacks {[c for c in SCD2_COLUMNS if c not in have]}, which an scd2 table keeps for "
                        "each version")
    if apply.history == "scd1" and scd2:
        problems.append(f"it has {scd2}, the columns of an scd2 table's versions")
    if problems:
        raise ConfigError(f"{where}: the table does not hold applied changes of history {apply.history!r}: "
                          + "; ".join(problems) + f" (columns: {list(columns)}). Nothing was committed. Give the "
                          "sink a new table (it is created from the changes), or set apply_changes.history to the "
                          "table's")


def _key_of(row: dict[str, Any], apply: ApplyChanges) -> tuple[Any, ...]:
    return tuple(row[k] for k in apply.keys)


def _sequence_of(row: dict[str, Any], apply: ApplyChanges) -> tuple[Any, ...]:
    return tuple(row[c] for c in apply.sequence_by)


def applied(held: pa.Table, changes: Sequence[pa.Table], apply: ApplyChanges, schema: pa.Schema) -> pa.Table:
    """The rows of the changes' keys after applying ``changes`` to the table's rows ``held`` of them.

    ``changes``: each epoch's checked change rows, oldest first; a change not above the
    sequence the table holds for its key has no effect. The result (``schema``, the table's)
    holds every remaining row of those keys: the caller replaces all their rows with it.
    """
    import pyarrow as pa

    columns = list(schema.names)
    scd2 = apply.history == "scd2"
    rows: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in held.select([c for c in columns if c in held.column_names]).to_pylist():
        rows.setdefault(_key_of(row, apply), []).append({c: row.get(c) for c in columns})
    # Epoch after epoch, as the changes were committed (a replay gives the table of a fresh run, also when
    # a later epoch carried a change below an earlier one's, which had no effect then).
    ordered = [change for part in changes
               for change in sorted(_last_per_key(part, apply), key=lambda r: _sequence_of(r, apply))]
    for change in ordered:
        versions = rows.setdefault(_key_of(change, apply), [])
        if versions and not _above(change, versions, apply):
            continue
        current = next((v for v in versions if not scd2 or v[END_AT] is None), None)
        if change[apply.operation] == "delete":
            if apply.deletes and current is not None:
                if scd2:
                    current[END_AT] = change[apply.sequence_by[0]]
                else:
                    versions.remove(current)
            continue
        new = {c: change.get(c) for c in columns}
        for column in change.get(UNCHANGED_TOAST) or ():  # NULL in the change: the table's value stands
            if column in new and column not in SCD2_COLUMNS and current is not None:
                new[column] = current[column]
        if scd2:
            if current is not None:
                current[END_AT] = change[apply.sequence_by[0]]
            new[START_AT], new[END_AT] = change[apply.sequence_by[0]], None
            versions.append(new)
        else:
            versions[:] = [new]
    return pa.Table.from_pylist([v for versions in rows.values() for v in versions], schema=schema)


def _last_per_key(part: pa.Table, apply: ApplyChanges) -> list[dict[str, Any]]:
    """One epoch's change rows collapsed to the last per key (as the Spark side stages them); deletes
    left out first when they are ignored (``deletes: false``), so that the change before one counts."""
    last: dict[tuple[Any, ...], dict[str, Any]] = {}
    for change in part.to_pylist():
        if change[apply.operation] == "delete" and not apply.deletes:
            continue
        key = _key_of(change, apply)
        if key not in last or _sequence_of(change, apply) >= _sequence_of(last[key], apply):
            last[key] = change
    return list(last.values())


def _above(change: dict[str, Any], versions: list[dict[str, Any]], apply: ApplyChanges) -> bool:
    """Whether ``change`` is newer than everything the table holds for its key (``versions``, not empty)."""
    sequence = _sequence_of(change, apply)
    if any(_sequence_of(v, apply) >= sequence for v in versions):
        return False
    if apply.history == "scd2" and all(v[END_AT] is not None for v in versions):
        # A closed key: the change that closed it (its first sequence value) is the newest it saw.
        return bool(max(v[END_AT] for v in versions) < sequence[0])
    return True


def keys_of(parts: Sequence[pa.Table], apply: ApplyChanges, like: pa.Schema | None = None) -> pa.Table:
    """The distinct keys of the change rows ``parts`` (typed as in ``like``, the table's schema, if given)."""
    import pyarrow as pa

    keys = [part.select(apply.keys) for part in parts if part.num_rows]
    if like is not None:
        wanted = pa.schema([like.field(k) for k in apply.keys])
        keys = [k.cast(wanted) for k in keys]
    if not keys:
        return pa.schema([like.field(k) for k in apply.keys]).empty_table() if like is not None else pa.table({})
    return pa.concat_tables(keys, promote_options="permissive").group_by(apply.keys).aggregate([])


def restored_before(before: pa.Table, now: pa.Table, changed: pa.Table, apply: ApplyChanges) -> tuple[pa.Table,
                                                                                                      pa.Table]:
    """A replay from epoch N: ``(touched keys, ALL their rows of before)``, the base the replayed changes apply to
    (the touched keys as :func:`core.sinks.restored_before` finds them)."""
    from airflow_seatunnel_ckpt.core.sinks import restored_before as upsert_restored
    from airflow_seatunnel_ckpt.core.sinks import rows_of_keys

    touched, _ = upsert_restored(before, now, changed, list(apply.keys))
    return touched, before.filter(rows_of_keys(before, touched, apply.keys)) if before.num_rows else before
