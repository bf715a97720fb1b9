"""Airflow asset URIs of Iceberg tables: ``iceberg://<catalog>/<namespace>.<table>``, registered
through the provider info's ``asset-uris`` entry (docs/LINEAGE.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.lineage.naming import ICEBERG_SCHEME, dataset_name, iceberg_table_url

if TYPE_CHECKING:
    from urllib.parse import SplitResult

    from airflow.sdk import Asset


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Check and normalise an ``iceberg://<catalog>/<namespace>.<table>`` asset URI (Airflow's ``handler``)."""
    identifier = uri.path.strip("/")
    if not uri.netloc:
        raise ValueError(f"{ICEBERG_SCHEME}:// asset URI {uri.geturl()!r} names no catalog: "
                         f"use {ICEBERG_SCHEME}://<catalog>/<namespace>.<table>")
    if "/" in identifier or len([p for p in identifier.split(".") if p]) < 2:
        raise ValueError(f"{ICEBERG_SCHEME}:// asset URI {uri.geturl()!r} must name one table as "
                         f"<namespace>.<table> after the catalog, e.g. {ICEBERG_SCHEME}://default/sales.orders")
    return uri._replace(path=f"/{identifier}", query="")


def create_asset(*, catalog: str = "default", table: str, extra: dict[str, Any] | None = None) -> Asset:
    """The asset of Iceberg ``table`` (``namespace.name``) in catalog ``catalog`` (the ``factory``)."""
    from airflow.sdk import Asset

    return Asset(uri=iceberg_table_url(catalog, table), extra=extra)


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """The OpenLineage dataset of an ``iceberg://`` asset (the ``to_openlineage_converter``)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    name = dataset_name(asset.uri)
    return Dataset(namespace=name.namespace, name=name.name)
