"""The parse-time schema check agrees with Spark's own DDL parser."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_seatunnel_ckpt.spark.ddl import check_schema_ddl

pytestmark = [pytest.mark.spark]

VALID = [
    "order_id long, amount double",
    "order_id BIGINT NOT NULL, note STRING COMMENT 'free, text', ts TIMESTAMP",
    "price decimal(10, 2), code varchar(8), flag char(1), d date, b binary, t timestamp_ntz",
    "tags array<string>, attrs map<string, int>, customer struct<id: long, name: string>",
    "`order id` int, `a``b` string",
    "a: int, b: string",
    "struct<a: int, b: array<struct<c: double>>>",
    "i interval day to second, y interval year to month",
    "s string collate UTF8_LCASE",
    "x tinyint, y smallint, z integer, w real, v short, u byte",
    "",
]
INVALID = [
    "order_id long, amount dubble",
    "tags array<string, n int",
    "a int,, b int",
    "m map<string>",
]


@pytest.mark.parametrize("ddl", VALID)
def test_a_schema_spark_parses_passes_the_parse_time_check_with_the_same_columns(spark: Any, ddl: str) -> None:
    from pyspark.sql.types import StructType

    parsed = StructType.fromDDL(ddl)
    assert check_schema_ddl(ddl) == parsed.names


@pytest.mark.parametrize("ddl", INVALID)
def test_a_schema_spark_refuses_is_refused_at_parse_time(spark: Any, ddl: str) -> None:
    from pyspark.sql.types import StructType

    with pytest.raises(Exception):  # noqa: B017  (Spark's parse error class varies by release)
        StructType.fromDDL(ddl)
    with pytest.raises(ValueError):
        check_schema_ddl(ddl)
