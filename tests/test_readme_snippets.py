"""The documentation's code that readers copy (docs/REFERENCE.md), run as written against real tables."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_reference_offline_duckdb_snippet_reads_an_iceberg_table_from_the_installed_extension_wheels(
        tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", pa.schema([("order_id", pa.int64())]))
    table.append(pa.table({"order_id": pa.array([1, 2, 3], pa.int64())}))
    table = catalog.load_table("shop.orders")

    [snippet] = [b for b in _python_blocks((REPO / "docs" / "REFERENCE.md").read_text()) if "duckdb_ext" in b]
    assert "INSTALL" not in snippet  # nothing is downloaded
    *body, last = [line for line in snippet.strip().splitlines() if line.strip()]
    namespace: dict[str, object] = {"table": table}
    exec("\n".join([*body, "result = " + last]), namespace)  # the reference's own text, its last value kept
    assert namespace["result"].fetchone() == (3,)  # type: ignore[attr-defined]
