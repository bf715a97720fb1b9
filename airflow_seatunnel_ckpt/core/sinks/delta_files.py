"""What a Parquet data file is to Delta: its directory, partition values and statistics.

All of it comes from the file's path in staging and its Parquet footer, never from the
data: committing an epoch reads O(files) footers and rewrites nothing (see :mod:`.delta`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_seatunnel_ckpt.core.errors import ConfigError, PublishError

#: Longest string whose min/max go into the statistics (as Delta's Spark writer: 32).
STRING_STATS_PREFIX = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def partition_dir(staged_path: str) -> str:
    """``<col>=<value>/...`` for a staged path below ``__partition_<col>=<value>/`` dirs, characters outside
    ``[A-Za-z0-9_.-]`` as ``_`` (only people read these names: Delta readers take values from the log)."""
    out = ""
    for part in staged_path.split("/")[:-1]:
        name, eq, value = part.partition("=")
        if eq and name.startswith("__partition_"):
            out += f"{name[len('__partition_'):]}={_UNSAFE.sub('_', value)[:64]}/"
    return out


def footer_stats(meta: pq.FileMetaData, schema: pa.Schema, partition_by: Sequence[str],
                 where: str) -> tuple[dict[str, Any], dict[str, str | None]]:
    """Delta statistics (numRecords, minValues, maxValues, nullCount) and partition values, from the Parquet
    footer; min/max only where they are safe for data skipping (docs/tables/delta.md, "Statistics")."""
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    bounds: dict[str, tuple[Any, Any]] = {}  # the footer's own values, for partition values
    columns = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
    for field in schema:
        j = columns.get(field.name)
        if j is None:  # nested: one footer column per leaf; left without statistics
            continue
        stats = [meta.row_group(g).column(j).statistics for g in range(meta.num_row_groups)]
        if all(s is not None and s.has_null_count for s in stats):
            nulls[field.name] = sum(s.null_count for s in stats if s is not None)
        bounded = [s for s in stats if s is not None and s.has_min_max]
        if bounded and len(bounded) == len(stats):
            low, high = min(s.min for s in bounded), max(s.max for s in bounded)
            bounds[field.name] = low, high
            encoded = _stat(field.type, low, floor=True), _stat(field.type, high, floor=False)
            if encoded[0] is not None and encoded[1] is not None:
                lows[field.name], highs[field.name] = encoded
    values: dict[str, str | None] = {}
    for column in partition_by:
        field = schema.field(column) if column in schema.names else None
        if field is None:
            raise ConfigError(f"{where} has no partition column {column!r} (columns: {schema.names})")
        if meta.num_rows and nulls.get(column) == meta.num_rows:
            values[column] = None
        elif column in bounds and bounds[column][0] == bounds[column][1] and nulls.get(column) == 0:
            values[column] = partition_value(field.type, bounds[column][0], where)
        else:
            raise PublishError(
                f"{where} does not hold exactly one value of partition column {column!r} in its footer "
                "statistics; a Delta data file belongs to one partition. Stage it with a DeltaSink "
                "(partitioned by hidden copies of the columns), then prepare the epoch again")
    return {"numRecords": meta.num_rows, "minValues": lows, "maxValues": highs, "nullCount": nulls}, values


def _stat(kind: pa.DataType, value: Any, floor: bool) -> Any:
    """``value`` as a Delta statistics JSON value, or None when it must be left out."""
    if pa.types.is_boolean(kind):
        return bool(value)
    if pa.types.is_integer(kind):
        return int(value)
    if pa.types.is_floating(kind):
        return float(value) if math.isfinite(value) else None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return value if isinstance(value, str) and len(value) <= STRING_STATS_PREFIX else None
    if pa.types.is_date(kind):
        return value.isoformat() if isinstance(value, dt.date) else None
    if pa.types.is_timestamp(kind) and isinstance(value, dt.datetime):
        # Delta keeps milliseconds: round the minimum down and the maximum up, so that a
        # reader skipping files on these bounds never skips a file holding a match.
        micros = value.microsecond % 1000
        if micros and not floor:
            value += dt.timedelta(microseconds=1000 - micros)
        value -= dt.timedelta(microseconds=value.microsecond % 1000)
        if kind.tz is not None:
            utc = value.astimezone(dt.UTC) if value.tzinfo else value
            return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    return None  # decimals (no exact JSON number), binary, nested: no bounds


def partition_value(kind: pa.DataType, value: Any, where: str) -> str:
    """A partition value in the Delta protocol's string form."""
    if pa.types.is_boolean(kind):
        return "true" if value else "false"
    if pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return str(value)
    if pa.types.is_floating(kind):
        return repr(float(value))
    if pa.types.is_decimal(kind) and isinstance(value, decimal.Decimal):
        return str(value)
    if pa.types.is_date(kind) and isinstance(value, dt.date):
        return value.isoformat()
    if pa.types.is_timestamp(kind) and isinstance(value, dt.datetime):
        if kind.tz is not None:
            utc = value.astimezone(dt.UTC) if value.tzinfo else value
            return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    raise ConfigError(f"{where}: Delta cannot partition by a column of type {kind}; partition by a string, "
                      "number, boolean, date or timestamp column")
